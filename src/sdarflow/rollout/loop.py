"""The batched multi-turn rollout loop: every live episode is stepped together, one engine call per turn.

Each agent turn becomes one trajectory row (the turn-level contract in ``sdarflow.schema``); episode-level fields
(``episode_return``, ``success``, ``num_turns``) are filled in when the episode ends.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from sdarflow.envs import Env, EnvSuite, Task
from sdarflow.rollout.engine import Engine
from sdarflow.rollout.prompt import build_messages, dumps, parse_action

log = logging.getLogger(__name__)

FORMAT_ERROR_OBS = "Invalid command format. Reply with one short command."


@dataclass
class SamplingParams:
    max_turns: int
    max_new_tokens: int = 24
    temperature: float = 1.0
    top_p: float = 1.0
    history_turns: int = 4
    seed: int = 0


@dataclass
class Episode:
    task: Task
    group_id: str
    traj_id: str
    env: Env
    instruction: str
    observation: str
    actions: list[str] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    total: float = 0.0
    won: bool = False
    done: bool = False
    format_errors: int = 0


def sample_seed(*parts: object) -> int:
    """A 63-bit seed derived from (run seed, episode, turn, ...), stable across processes and batch layouts."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def rollout(
    engine: Engine,
    suite: EnvSuite,
    tasks: list[Task],
    group_size: int,
    params: SamplingParams,
    tokenizer,
    *,
    run_id: str,
    round_: int,
    policy_version: str,
    desc: str = "rollout",
) -> tuple[list[dict], list[Episode]]:
    """Run ``group_size`` episodes per task; return turn rows and the finished episodes."""
    episodes = []
    for task in tasks:
        group_id = f"{run_id}/r{round_}/{task.task_id}"
        for g in range(group_size):
            env = suite.make(task)
            reset = env.reset()
            episodes.append(
                Episode(task, group_id, f"{group_id}/g{g}", env, reset.instruction, reset.observation)
            )
    bar = tqdm(total=len(episodes), desc=desc, unit="ep", leave=False)
    for turn in range(params.max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        _step_turn(engine, live, turn, params, tokenizer, run_id, round_, policy_version)
        finished = [e for e in live if e.done]
        bar.update(len(finished))
        solved = sum(e.won for e in episodes)
        bar.set_postfix(turn=turn + 1, solved=solved)
    for ep in episodes:
        if not ep.done:  # ran out of turns
            ep.done = True
            bar.update(1)
        _finish(ep)
    bar.close()
    rows = [{**row, "env": suite.name} for ep in episodes for row in ep.rows]
    return rows, episodes


def _step_turn(engine, live, turn, params, tokenizer, run_id, round_, policy_version) -> None:
    messages = [build_messages(e.instruction, e.actions, e.observation, params.history_turns) for e in live]
    prompts = [encode_prompt(tokenizer, m) for m in messages]
    seeds = [sample_seed(params.seed, e.traj_id, turn) for e in live]
    samples = engine.generate(
        prompts,
        seeds,
        max_new_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
    )
    for ep, msgs, prompt, sample in zip(live, messages, prompts, samples, strict=True):
        action, ok = parse_action(sample.text, sample.finished)
        if ok:
            step = ep.env.step(action)
            ep.observation, reward, ep.won, ep.done = step.observation, step.reward, step.won, step.done
            ep.actions.append(action)
        else:
            # A malformed response is not executed: the agent is told and the turn is spent.
            ep.observation, reward = FORMAT_ERROR_OBS, 0.0
            ep.format_errors += 1
        ep.total += reward
        if turn + 1 >= params.max_turns:
            ep.done = True
        ep.rows.append(
            {
                "run_id": run_id,
                "round": round_,
                "task_id": ep.task.task_id,
                "group_id": ep.group_id,
                "traj_id": ep.traj_id,
                "turn": turn,
                "task_type": ep.task.task_type,
                "split": ep.task.split,
                "prompt_token_ids": prompt,
                "response_token_ids": sample.token_ids,
                "response_text": sample.text,
                "rollout_logprobs": sample.logprobs,
                "reward": float(reward),
                "format_ok": ok,
                "policy_version": policy_version,
                "prompt_messages": dumps(msgs),
            }
        )


def _finish(ep: Episode) -> None:
    ep.env.close()
    for row in ep.rows:
        row["episode_return"] = float(ep.total)
        row["success"] = bool(ep.won)
        row["num_turns"] = len(ep.rows)


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
