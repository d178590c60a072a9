"""The batched multi-turn rollout loop: every live episode is stepped together, one engine call per turn.

Each agent turn becomes one trajectory row (the turn-level contract in ``sdarflow.schema``); episode-level fields
(``episode_return``, ``success``, ``num_turns``) are filled in when the episode ends. The action format is the
suite's (its ``parse_action`` when it has one). Env calls run under a watchdog (``rollout.envcall``): an env that
raises or hangs past ``step_timeout_s`` ends its episode as failed and the run goes on. Groups whose samples are
token-identical at temperature > 0 (a seeding bug seen in other RL systems) are flagged and counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from sdarflow import progress
from sdarflow.envs import Env, EnvSuite, Task
from sdarflow.errors import ConfigError
from sdarflow.rollout.engine import Engine
from sdarflow.rollout.envcall import Outcome, call_all
from sdarflow.rollout.prompt import build_messages, dumps, encode_prompt, parse_action

log = logging.getLogger(__name__)

FORMAT_ERROR_OBS = "Invalid command format. Reply with one short command."
MAX_GROUP_WARNINGS = 5  # one line per flagged group up to this many, then a count
ActionParser = Callable[[str, bool], tuple[str, bool]]


@dataclass
class SamplingParams:
    """Per-rollout settings. step_timeout_s: limit on one env call (0 = none); env_workers: env calls run at
    once (for suites with ``thread_safe = True``; others get 1); max_prompt_tokens: the engine's context minus max_new_tokens (0 = unchecked)."""

    max_turns: int
    max_new_tokens: int = 24
    temperature: float = 1.0
    top_p: float = 1.0
    history_turns: int = 4
    seed: int = 0
    step_timeout_s: float = 60.0
    env_workers: int = 1
    max_prompt_tokens: int = 0


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
    env_steps: int = 0
    error: str | None = None  # the env raised or hung: the episode ended as failed
    hung: bool = False  # its env call is still running in an abandoned thread: never touch the env again
    context_exceeded: bool = False  # the next prompt no longer fit the engine's context
    # What the sampling seeds derive from (with the run's seed and the turn): the round, task and sample index, not
    # the run id, so the same seed reproduces the same rollouts in another run.
    seed_key: str = ""
    closed: bool = False


@dataclass
class RolloutStats:
    seconds: float = 0.0  # wall time, without the engine's start-up
    engine_start_seconds: float = 0.0
    engine_seconds: float = 0.0
    env_seconds: float = 0.0  # wall time spent waiting on env resets and steps
    env_steps: int = 0
    identical_groups: list[str] = field(default_factory=list)


@dataclass
class RolloutResult:
    rows: list[dict]
    episodes: list[Episode]
    stats: RolloutStats

    def metrics(self) -> dict[str, float]:
        """Stage metrics (every value a float, for KFP Metrics)."""
        eps, rows, s = self.episodes, self.rows, self.stats
        n = max(1, len(eps))
        tokens = sum(len(r["response_token_ids"]) for r in rows)
        return {
            "rollout/episodes": float(len(eps)),
            "rollout/success": sum(e.won for e in eps) / n,
            "rollout/mean_turns": sum(len(e.rows) for e in eps) / n,
            "rollout/format_error_rate": sum(not r["format_ok"] for r in rows) / max(1, len(rows)),
            "rollout/tokens": float(tokens),
            "rollout/tokens_per_s": tokens / max(s.seconds, 1e-9),
            "rollout/engine_tokens_per_s": tokens / max(s.engine_seconds, 1e-9),
            "rollout/env_steps": float(s.env_steps),
            "rollout/env_steps_per_s": s.env_steps / max(s.seconds, 1e-9),
            "rollout/env_errors": float(sum(e.error is not None for e in eps)),
            "rollout/context_exceeded": float(sum(e.context_exceeded for e in eps)),
            "rollout/identical_groups": float(len(s.identical_groups)),
            "rollout/seconds": s.seconds,
            "rollout/engine_seconds": s.engine_seconds,
            "rollout/engine_start_seconds": s.engine_start_seconds,
            "rollout/env_seconds": s.env_seconds,
        }


def sample_seed(*parts: object) -> int:
    """A 63-bit seed derived from (seed, episode key, turn, ...), stable across processes, batch layouts and runs."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def action_parser(suite: EnvSuite) -> ActionParser:
    """The suite's ``parse_action`` if it defines one, else the short lower-case command parser."""
    return getattr(suite, "parse_action", None) or parse_action


def rollout(
    engine: Engine,
    suite: EnvSuite,
    tasks: list[Task],
    group_size: int,
    params: SamplingParams,
    tokenizer,
    **kw: object,
) -> tuple[list[dict], list[Episode]]:
    """:func:`run_rollout` returning only (rows, episodes) (same keyword arguments)."""
    result = run_rollout(engine, suite, tasks, group_size, params, tokenizer, **kw)
    return result.rows, result.episodes


def run_rollout(
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
) -> RolloutResult:
    """Run ``group_size`` episodes per task; ConfigError before the first engine call if a prompt cannot fit."""
    t0 = time.perf_counter()
    stats = RolloutStats()
    episodes = []
    for task in tasks:
        group_id = f"{run_id}/r{round_}/{task.task_id}"
        episodes += [
            Episode(
                task,
                group_id,
                f"{group_id}/g{g}",
                suite.make(task),
                "",
                "",
                seed_key=f"r{round_}/{task.task_id}/g{g}",
            )
            for g in range(group_size)
        ]
    if params.env_workers > 1 and not getattr(suite, "thread_safe", False):
        log.info("%s: env calls one at a time (the suite does not declare thread_safe)", suite.name)
        params = dataclasses.replace(params, env_workers=1)
    outcomes = _env_calls(stats, params, [e.env.reset for e in episodes])
    for ep, out in zip(episodes, outcomes):
        if out.ok:
            ep.instruction, ep.observation = out.value.instruction, out.value.observation
        else:
            _fail(ep, out, "reset")
    _check_first_prompts(episodes, params, tokenizer)
    if hasattr(engine, "start"):  # an engine that starts lazily (vllm): its start-up is not generation time
        begin = time.perf_counter()
        engine.start()
        stats.engine_start_seconds = time.perf_counter() - begin
    parse, hint = action_parser(suite), getattr(suite, "format_hint", FORMAT_ERROR_OBS)
    ctx = (run_id, round_, policy_version, parse, hint)
    bar = progress.bar(total=len(episodes), desc=desc, unit="ep")
    bar.update(sum(e.done for e in episodes))
    ticker = progress.Ticker()
    for turn in range(params.max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        tokens = _step_turn(engine, live, turn, params, tokenizer, stats, ctx)
        bar.update(sum(e.done for e in live))
        solved = sum(e.won for e in episodes)
        bar.set_postfix(turn=turn + 1, solved=solved, refresh=False)
        if not ticker():
            continue
        elapsed = time.perf_counter() - t0 - stats.engine_start_seconds
        log.info(
            "%s turn %d | live %d/%d | solved %d | %d tokens | %.0f tok/s | env %.1f s",
            desc, turn + 1, len(live), len(episodes), solved, tokens,
            sum(len(r["response_token_ids"]) for e in episodes for r in e.rows) / max(elapsed, 1e-9),
            stats.env_seconds,
        )  # fmt: skip
    for ep in episodes:
        if not ep.done:  # ran out of turns
            ep.done = True
            bar.update(1)
        _finish(ep, params)
    bar.close()
    stats.identical_groups = identical_groups(episodes) if params.temperature > 0 else []
    for gid in stats.identical_groups[:MAX_GROUP_WARNINGS]:
        log.warning(
            "group %s: all samples are token-identical at temperature %g; check per-sample seeds",
            gid,
            params.temperature,
        )
    if len(stats.identical_groups) > MAX_GROUP_WARNINGS:
        log.warning("%d groups in all are token-identical", len(stats.identical_groups))
    stats.seconds = time.perf_counter() - t0 - stats.engine_start_seconds
    rows = [{**row, "env": suite.name} for ep in episodes for row in ep.rows]
    return RolloutResult(rows, episodes, stats)


def _env_calls(stats: RolloutStats, params: SamplingParams, calls: list) -> list[Outcome]:
    start = time.perf_counter()
    outcomes = call_all(calls, params.step_timeout_s, params.env_workers)
    stats.env_seconds += time.perf_counter() - start
    return outcomes


def _fail(ep: Episode, out: Outcome, what: str) -> None:
    ep.error, ep.done, ep.won = f"{what}: {out.error}", True, False
    ep.hung = out.error.startswith("TimeoutError")
    log.warning("episode %s failed in env %s: %s", ep.traj_id, what, out.error)


def _check_first_prompts(episodes: list[Episode], params: SamplingParams, tokenizer) -> None:
    """Refuse to start when a task's first prompt cannot fit the context: later prompts are only longer."""
    if params.max_prompt_tokens <= 0:
        return
    for ep in episodes:
        if ep.done:
            continue
        msgs = build_messages(ep.instruction, [], ep.observation, params.history_turns)
        n = len(encode_prompt(tokenizer, msgs))
        if n > params.max_prompt_tokens:
            for other in episodes:
                _finish(other, params)
            raise ConfigError(
                f"task {ep.task.task_id}: the first prompt is {n} tokens, over the {params.max_prompt_tokens} "
                f"the engine allows (its context minus max_new_tokens={params.max_new_tokens}); fix: use a model "
                f"with a longer context, lower --max-new-tokens, or shorten the env's instructions"
            )


def _step_turn(engine, live, turn, params, tokenizer, stats, ctx) -> int:
    """One engine call for every live episode, then their env steps; returns the tokens generated."""
    run_id, round_, policy_version, parse, hint = ctx
    messages = [build_messages(e.instruction, e.actions, e.observation, params.history_turns) for e in live]
    prompts = [encode_prompt(tokenizer, m) for m in messages]
    fits = [params.max_prompt_tokens <= 0 or len(p) <= params.max_prompt_tokens for p in prompts]
    for ep, ok, prompt in zip(live, fits, prompts):
        if not ok:  # the history grew past the context: end the episode rather than crash the engine
            ep.done = ep.context_exceeded = True
            log.warning("episode %s: prompt of %d tokens exceeds the context; ended", ep.traj_id, len(prompt))
    live, messages, prompts = (
        [x for x, ok in zip(seq, fits) if ok] for seq in (live, messages, prompts)
    )  # fmt: skip
    if not live:
        return 0
    start = time.perf_counter()
    samples = engine.generate(
        prompts,
        [sample_seed(params.seed, e.seed_key, turn) for e in live],
        max_new_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
    )
    stats.engine_seconds += time.perf_counter() - start
    parsed = [parse(s.text, s.finished) for s in samples]
    stepping = [i for i, (_, ok) in enumerate(parsed) if ok]
    # Bind each env and action now: a lambda over the loop variable would see only the last one.
    calls = [lambda env=live[i].env, a=parsed[i][0]: env.step(a) for i in stepping]
    outcomes = dict(zip(stepping, _env_calls(stats, params, calls)))
    stats.env_steps += len(stepping)
    for i, (ep, msgs, prompt, sample) in enumerate(zip(live, messages, prompts, samples, strict=True)):
        action, ok = parsed[i]
        reward = 0.0
        if not ok:  # a malformed response is not executed: the agent is told and the turn is spent
            ep.observation = hint
            ep.format_errors += 1
        elif outcomes[i].ok:
            step = outcomes[i].value
            ep.observation, reward, ep.won, ep.done = step.observation, step.reward, step.won, step.done
            ep.actions.append(action)
            ep.env_steps += 1
        else:
            _fail(ep, outcomes[i], "step")
        ep.total += reward
        # Malformed turns never reach the env, so its own turn limit cannot end an agent stuck producing them.
        if turn + 1 >= min(params.max_turns, getattr(ep.env, "max_turns", None) or params.max_turns):
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
    return sum(len(s.token_ids) for s in samples)


def _finish(ep: Episode, params: SamplingParams) -> None:
    if not (ep.hung or ep.closed):
        out = call_all([ep.env.close], params.step_timeout_s)[0]
        if not out.ok:
            log.warning("episode %s: env close failed: %s", ep.traj_id, out.error)
        ep.closed = True
    for row in ep.rows:
        row["episode_return"] = float(ep.total)
        row["success"] = bool(ep.won)
        row["num_turns"] = len(ep.rows)


def identical_groups(episodes: list[Episode]) -> list[str]:
    """Ids of groups (>= 2 episodes) whose episodes produced exactly the same response tokens on every turn."""
    groups: dict[str, set] = defaultdict(set)
    sizes: dict[str, int] = defaultdict(int)
    for ep in episodes:
        if ep.rows:
            groups[ep.group_id].add(tuple(tuple(r["response_token_ids"]) for r in ep.rows))
            sizes[ep.group_id] += 1
    return sorted(gid for gid, sigs in groups.items() if sizes[gid] >= 2 and len(sigs) == 1)
