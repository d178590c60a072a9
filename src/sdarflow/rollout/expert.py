"""The env's expert walkthrough played as a rollout: the turn rows a policy's rollout writes, with the expert's
action as the response (``generate --policy expert``, then ``train --mode sft``: RL then starts with successes).

Prompts are built as the policy's rollout builds them; the response is the action in the prompt format (in
``reference``, an empty ``<think></think>``: a walkthrough holds no reasoning) followed by the end-of-turn token.
The expert is not a model, so its rows carry no behaviour log-probs (NaN, refused by rescore).
"""

from __future__ import annotations

import math
import time

from sdarflow import progress
from sdarflow.envs import EnvSuite, Task
from sdarflow.rollout.episode import Episode, RolloutParams, RolloutResult, RolloutStats, Sample
from sdarflow.rollout.loop import action_parser, finish, messages_of, turn_row
from sdarflow.rollout.prompt import encode_prompt, format_response

EXPERT_POLICY = "expert"


def expert_rollout(
    suite: EnvSuite,
    tasks: list[Task],
    params: RolloutParams,
    tokenizer,
    eos_id: int,
    *,
    run_id: str,
    round_: int,
) -> RolloutResult:
    """One walkthrough per task, at most ``params.max_turns`` turns; an env without an expert (``expert_action``
    None from the start) gives an episode without rows."""
    t0 = time.perf_counter()
    stats, episodes = RolloutStats(), []
    parse = action_parser(suite, params.prompt_format)
    for i, task in enumerate(progress.bar(tasks, desc="expert walkthroughs", unit="ep")):
        group_id = f"{run_id}/r{round_}/{task.task_id}"
        ep = Episode(task, group_id, f"{group_id}/{EXPERT_POLICY}", i, "", "")
        env = suite.make(task)
        try:
            _play(env, ep, params, tokenizer, eos_id, parse, (run_id, round_, EXPERT_POLICY))
        finally:
            env.close()
        stats.env_steps += ep.env_steps
        episodes.append(ep)
    rows = finish(episodes, suite.name)
    stats.seconds = time.perf_counter() - t0
    return RolloutResult(rows, episodes, stats)


def _play(env, ep: Episode, params: RolloutParams, tokenizer, eos_id: int, parse, lineage) -> None:
    reset = env.reset()
    ep.instruction, ep.observation = reset.instruction, reset.observation
    listed = params.prompt_format == "reference" and hasattr(env, "admissible_commands")
    for turn in range(params.max_turns):
        if (action := env.expert_action()) is None:
            return
        ep.admissible = tuple(env.admissible_commands()) if listed else None
        msgs = messages_of(ep, params)
        text = format_response(action, params.prompt_format)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos_id]
        step = env.step(action)
        ep.observation, ep.won, ep.total = step.observation, step.won, ep.total + step.reward
        ep.actions.append(action)
        ep.env_steps += 1
        sample = Sample(ids, [math.nan] * len(ids), text, True)
        ok = parse(text, True)[1]
        ep.rows.append(
            turn_row(ep, turn, msgs, encode_prompt(tokenizer, msgs), sample, step.reward, ok, lineage)
        )
        if step.done:
            return
