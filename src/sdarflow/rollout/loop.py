"""The batched multi-turn rollout loop: one engine call per turn for every live episode (or for each of two
lanes of them, taking turns with their env steps in a worker process).

Each agent turn becomes one trajectory row (``sdarflow.schema``); the episode's fields are filled in when it ends.
Env calls run under a watchdog (``rollout.envhost``): an env that raises or hangs past ``step_timeout_s`` ends its
episode as failed and the run goes on. Groups whose samples are token-identical at temperature > 0 although such a
repeat was unlikely (a seeding bug seen in other RL systems) are flagged and counted. ``expert_rollout`` plays
the env's expert walkthrough into the same rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from sdarflow import progress
from sdarflow.envs import EnvSuite, Task
from sdarflow.errors import ConfigError
from sdarflow.rollout.envhost import Outcome, ProcessEnvs, open_envs
from sdarflow.rollout.episode import (
    Episode,
    GenerationEngine,
    RolloutParams,
    RolloutResult,
    RolloutStats,
    Sample,
)
from sdarflow.rollout.prompt import (
    build_messages,
    dumps,
    encode_prompt,
    format_response,
    parse_action,
    parse_reference,
)
from sdarflow.schema import EXPERT_POLICY

log = logging.getLogger(__name__)

FORMAT_ERROR_OBS = "Invalid command format. Reply with one short command."
MAX_GROUP_WARNINGS = 5  # one line per flagged group up to this many, then a count
# a group's samples all alike is flagged only when one sample's tokens had less than this chance to come again
REPEAT_PROBABILITY = 1e-3
ActionParser = Callable[[str, bool], tuple[str, bool]]


def sample_seed(*parts: object) -> int:
    """A 63-bit seed derived from (seed, episode key, turn, ...), stable across processes, batch layouts and runs."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def action_parser(suite: EnvSuite, prompt_format: str = "command") -> ActionParser:
    """The suite's ``parse_action`` if it defines one, else the short lower-case command parser; in the
    ``reference`` format it reads the action inside the reply's ``<action>`` tag (``parse_reference``)."""
    inner = getattr(suite, "parse_action", None) or parse_action
    if prompt_format == "reference":
        return lambda text, finished: parse_reference(text, finished, inner)
    return inner


def messages_of(ep: Episode, params: RolloutParams) -> list[dict]:
    """The episode's next prompt, as ``build_messages`` shapes it for the rollout's format."""
    return build_messages(
        ep.instruction, ep.actions, ep.observation, params.history_turns, params.prompt_format, ep.admissible
    )


def run_rollout(
    engine: GenerationEngine,
    suite: EnvSuite,
    tasks: list[Task],
    group_size: int,
    params: RolloutParams,
    tokenizer,
    *,
    run_id: str,
    round_: int,
    policy_version: str,
    desc: str = "rollout",
) -> RolloutResult:
    """Run ``group_size`` episodes per task; ConfigError before the first engine call if a prompt cannot fit.

    With ``params.env_process`` the episodes form two lanes: while one lane generates, the other's env calls run
    in the env worker, so neither the engine nor the envs wait for the other (each episode sees the same turns,
    prompts and seeds as in one lane). The lanes interleave episodes, so with two or more per task the first lane
    holds every task and its first prompts are checked before any engine call."""
    t0 = time.perf_counter()
    episodes: list[Episode] = []
    for task in tasks:
        group_id = f"{run_id}/r{round_}/{task.task_id}"
        for g in range(group_size):
            key = f"r{round_}/{task.task_id}/g{g}"
            episodes.append(Episode(task, group_id, f"{group_id}/g{g}", len(episodes), "", "", seed_key=key))
    if params.env_workers > 1 and not getattr(suite, "thread_safe", False):
        log.info("%s: env calls one at a time (the suite does not declare thread_safe)", suite.name)
        params = dataclasses.replace(params, env_workers=1)
    envs = open_envs(
        suite,
        [e.task for e in episodes],
        params.step_timeout_s,
        params.env_workers,
        not params.env_process,
        frozenset(
            info
            for info, wanted in (
                ("admissible", params.prompt_format == "reference"),
                ("expert", params.expert_labels),
            )
            if wanted
        ),
    )
    for ep in episodes:
        ep.max_turns = envs.max_turns[ep.index]
    lineage = (run_id, round_, policy_version)
    try:
        return _Rollout(engine, suite, envs, episodes, params, tokenizer, lineage).run(t0, desc)
    finally:
        envs.shutdown()


@dataclass
class _InFlight:
    """A lane's batch of env calls between ``submit`` and its result: resets, or one turn's steps."""

    lane: int
    episodes: list[Episode]
    turn: int = -1  # -1: resets
    messages: list = field(default_factory=list)
    prompts: list = field(default_factory=list)
    samples: list = field(default_factory=list)
    parsed: list = field(default_factory=list)
    # positions in ``episodes`` whose action was well formed, so reaches the env
    stepping: list[int] = field(default_factory=list)


class _Rollout:
    """One rollout's episodes, envs and engine, turn by turn (see ``run_rollout``)."""

    def __init__(self, engine, suite, envs, episodes, params, tokenizer, lineage) -> None:
        self.engine, self.suite, self.envs, self.episodes = engine, suite, envs, episodes
        self.params, self.tokenizer, self.stats = params, tokenizer, RolloutStats()
        self.parse = action_parser(suite, params.prompt_format)
        self.lineage, self.hint = lineage, getattr(suite, "format_hint", FORMAT_ERROR_OBS)
        two = isinstance(envs, ProcessEnvs) and len(episodes) > 1
        self.lanes = [episodes[0::2], episodes[1::2]] if two else [episodes]
        self.bar = None  # made once the first prompts are known to fit

    def run(self, t0: float, desc: str) -> RolloutResult:
        episodes, params, stats = self.episodes, self.params, self.stats
        first = _InFlight(0, self.lanes[0])
        self.envs.submit("reset", [(e.index, None) for e in first.episodes])
        self.land(first)
        done = sum(e.done for e in episodes)
        self.bar = progress.bar(total=len(episodes), initial=done, desc=desc, unit="ep")
        try:
            self.turns(t0, desc)
        finally:
            self.bar.close()
        rows = finish(episodes, self.suite.name)
        _close(episodes, self.envs)
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
        return RolloutResult(rows, episodes, stats)

    def land(self, batch: _InFlight) -> None:
        """Wait for a batch's env results and apply them to its episodes."""
        start = time.perf_counter()
        outcomes = self.envs.result()
        self.stats.env_seconds += time.perf_counter() - start
        if batch.turn < 0:
            for ep, out in zip(batch.episodes, outcomes, strict=True):
                if out.ok:
                    ep.instruction, ep.observation = out.value.instruction, out.value.observation
                    ep.admissible, ep.expert = out.value.admissible, out.value.expert
                else:
                    _fail(ep, out, "reset")
            self.check_first_prompts(batch.episodes)
        else:
            self.apply_steps(batch, outcomes)
        if self.bar is not None:
            self.bar.update(sum(e.done for e in self.episodes) - self.bar.n)

    def turns(self, t0: float, desc: str) -> None:
        """Each lane generates, then hands its actions to the envs while the next lane generates."""
        engine, envs, episodes, params, stats = self.engine, self.envs, self.episodes, self.params, self.stats
        ticker = progress.Ticker()
        in_flight = None
        if len(self.lanes) > 1:  # the second lane's resets run during the first lane's first generation
            in_flight = _InFlight(1, self.lanes[1])
            envs.submit("reset", [(e.index, None) for e in in_flight.episodes])
        # an engine that starts lazily (vllm): its start-up is not generation time
        if hasattr(engine, "start"):
            begin = time.perf_counter()
            engine.start()
            stats.engine_start_seconds = time.perf_counter() - begin
        for turn in range(params.max_turns):
            if in_flight is None and all(e.done for e in episodes):
                break
            tokens = 0
            for lane, lane_episodes in enumerate(self.lanes):
                if in_flight is not None and in_flight.lane == lane:  # one lane: its results come first
                    self.land(in_flight)
                    in_flight = None
                batch = self.generate(lane, lane_episodes, turn)
                if in_flight is not None:
                    self.land(in_flight)
                    in_flight = None
                if batch is not None:
                    tokens += sum(len(s.token_ids) for s in batch.samples)
                    actions = [(batch.episodes[i].index, batch.parsed[i][0]) for i in batch.stepping]
                    envs.submit("step", actions)
                    in_flight = batch
            if ticker():
                elapsed = time.perf_counter() - t0 - stats.engine_start_seconds
                log.info(
                    "%s turn %d | live %d/%d | solved %d | %d tokens | %.0f tok/s | env wait %.1f s",
                    desc, turn + 1, sum(not e.done for e in episodes), len(episodes), sum(e.won for e in episodes),
                    tokens, sum(len(r["response_token_ids"]) for e in episodes for r in e.rows) / max(elapsed, 1e-9),
                    stats.env_seconds,
                )  # fmt: skip
        if in_flight is not None:
            self.land(in_flight)

    def check_first_prompts(self, batch: list[Episode]) -> None:
        """Refuse to start when a task's first prompt cannot fit the context: later prompts are only longer."""
        params = self.params
        if params.max_prompt_tokens <= 0:
            return
        for ep in batch:
            if ep.done:
                continue
            n = len(encode_prompt(self.tokenizer, messages_of(ep, params)))
            if n > params.max_prompt_tokens:
                _close(self.episodes, self.envs)
                raise ConfigError(
                    f"task {ep.task.task_id}: the first prompt is {n} tokens, over the {params.max_prompt_tokens} "
                    f"the engine allows (its context minus max_new_tokens={params.max_new_tokens}); fix: use a model "
                    f"with a longer context, lower --max-new-tokens, or shorten the env's instructions"
                )

    def generate(self, lane: int, episodes: list[Episode], turn: int) -> _InFlight | None:
        """One engine call for the lane's live episodes; their actions, parsed, await the env (None: none live)."""
        params, stats = self.params, self.stats
        live = [e for e in episodes if not e.done]
        messages = [messages_of(e, params) for e in live]
        prompts = [encode_prompt(self.tokenizer, m) for m in messages]
        fits = [params.max_prompt_tokens <= 0 or len(p) <= params.max_prompt_tokens for p in prompts]
        for ep, ok, prompt in zip(live, fits, prompts):
            if not ok:  # the history grew past the context: end the episode rather than crash the engine
                ep.done = ep.context_exceeded = True
                log.warning(
                    "episode %s: prompt of %d tokens exceeds the context; ended", ep.traj_id, len(prompt)
                )
        live, messages, prompts = (
            [x for x, ok in zip(seq, fits) if ok] for seq in (live, messages, prompts)
        )  # fmt: skip
        if not live:
            return None
        start = time.perf_counter()
        samples = self.engine.generate(
            prompts,
            [sample_seed(params.seed, e.seed_key, turn) for e in live],
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
        )
        stats.engine_seconds += time.perf_counter() - start
        parsed = [self.parse(s.text, s.finished) for s in samples]
        stepping = [i for i, (_, ok) in enumerate(parsed) if ok]
        stats.env_steps += len(stepping)
        return _InFlight(lane, live, turn, messages, prompts, samples, parsed, stepping)

    def apply_steps(self, batch: _InFlight, outcomes: list[Outcome]) -> None:
        """The turn's rows, from each episode's sample and env outcome (or its format error)."""
        outcomes = dict(zip(batch.stepping, outcomes, strict=True))
        turn, params = batch.turn, self.params
        for i, (ep, msgs, prompt, sample) in enumerate(
            zip(batch.episodes, batch.messages, batch.prompts, batch.samples, strict=True)
        ):
            action, ok = batch.parsed[i]
            expert, reward = ep.expert, 0.0  # the expert's action at the state this turn's prompt shows
            if not ok:  # a malformed response is not executed: the agent is told and the turn is spent
                ep.observation = self.hint
                ep.format_errors += 1
            elif outcomes[i].ok:
                step = outcomes[i].value
                ep.observation, reward, ep.won, ep.done = step.observation, step.reward, step.won, step.done
                ep.admissible, ep.expert = step.admissible, step.expert
                ep.actions.append(action)
                ep.env_steps += 1
            else:
                _fail(ep, outcomes[i], "step")
            ep.total += reward
            # Malformed turns never reach the env, so its own turn limit cannot end an agent stuck producing them.
            if turn + 1 >= min(params.max_turns, ep.max_turns or params.max_turns):
                ep.done = True
            row = turn_row(ep, turn, msgs, prompt, sample, reward, ok, self.lineage)
            if self.params.expert_labels:
                row.update(expert_labels(expert, action if ok else None))
            ep.rows.append(row)


def _close(episodes: list[Episode], envs) -> None:
    """Close every env that can still be touched (a hung one's thread may still be inside it)."""
    todo = [ep for ep in episodes if not (ep.hung or ep.closed)]
    envs.submit("close", [(ep.index, None) for ep in todo])
    for ep, out in zip(todo, envs.result(), strict=True):
        ep.closed = True
        if not out.ok:
            log.warning("episode %s: env close failed: %s", ep.traj_id, out.error)


def _fail(ep: Episode, out: Outcome, what: str) -> None:
    ep.error, ep.done, ep.won = f"{what}: {out.error}", True, False
    ep.hung = out.timed_out
    log.warning("episode %s failed in env %s: %s", ep.traj_id, what, out.error)


def turn_row(ep: Episode, turn: int, msgs, prompt, sample, reward: float, ok: bool, lineage) -> dict:
    """One turn's trajectory row (``schema.TRAJECTORY_SCHEMA``) before its episode ends (``finish`` adds the
    episode's fields)."""
    run_id, round_, policy_version = lineage
    return {
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


def expert_labels(expert: str | None, action: str | None) -> dict:
    """A turn's ``expert_action`` (None: the env has no expert) and ``expert_match``: whether the parsed action
    (None: malformed) is the expert's, compared as the env reads commands (case and spacing aside)."""
    if expert is None:
        return {"expert_action": None, "expert_match": None}
    same = action is not None and " ".join(action.lower().split()) == " ".join(expert.lower().split())
    return {"expert_action": expert, "expert_match": same}


def finish(episodes: list[Episode], env: str) -> list[dict]:
    """End every episode (those still going ran out of turns) and return all rows with the episode's return,
    success and length filled in."""
    for ep in episodes:
        ep.done = True
        for row in ep.rows:
            row.update(episode_return=float(ep.total), success=bool(ep.won), num_turns=len(ep.rows), env=env)
    return [row for ep in episodes for row in ep.rows]


def identical_groups(episodes: list[Episode]) -> list[str]:
    """Ids of groups (>= 2 episodes) whose episodes produced the same response tokens on every turn although their
    probability under the policy (temperature 1) was below ``REPEAT_PROBABILITY``: a confident policy repeats its
    likely replies, a seeding bug repeats any reply. An episode without log-probs is judged on its tokens alone."""
    groups: dict[str, set] = defaultdict(set)
    sizes: dict[str, int] = defaultdict(int)
    likely: dict[str, bool] = {}
    for ep in episodes:
        if ep.rows:
            groups[ep.group_id].add(tuple(tuple(r["response_token_ids"]) for r in ep.rows))
            sizes[ep.group_id] += 1
            lps = [x for r in ep.rows for x in r["rollout_logprobs"]]
            complete = len(lps) == sum(len(r["response_token_ids"]) for r in ep.rows)
            likely[ep.group_id] = complete and math.fsum(lps) >= math.log(REPEAT_PROBABILITY)
    return sorted(
        gid for gid, sigs in groups.items() if sizes[gid] >= 2 and len(sigs) == 1 and not likely[gid]
    )


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
    """The env's expert walkthrough played as a rollout (``generate --policy expert``, then ``train --mode sft``:
    RL then starts with successes): one walkthrough per task, at most ``params.max_turns`` turns, with the turn
    rows a policy's rollout writes; an env without an expert (``expert_action`` None from the start) gives an
    episode without rows. The response is the action in the prompt format (in ``reference``, an empty
    ``<think></think>``: a walkthrough holds no reasoning) followed by the end-of-turn token; the expert is not a
    model, so its rows carry no behaviour log-probs (NaN, refused by rescore)."""
    t0 = time.perf_counter()
    stats, episodes = RolloutStats(), []
    parse = action_parser(suite, params.prompt_format)
    for i, task in enumerate(progress.bar(tasks, desc="expert walkthroughs", unit="ep")):
        group_id = f"{run_id}/r{round_}/{task.task_id}"
        ep = Episode(task, group_id, f"{group_id}/{EXPERT_POLICY}", i, "", "")
        env = suite.make(task)
        try:
            _play_expert(env, ep, params, tokenizer, eos_id, parse, (run_id, round_, EXPERT_POLICY))
        finally:
            env.close()
        stats.env_steps += ep.env_steps
        episodes.append(ep)
    rows = finish(episodes, suite.name)
    stats.seconds = time.perf_counter() - t0
    return RolloutResult(rows, episodes, stats)


def _play_expert(env, ep: Episode, params: RolloutParams, tokenizer, eos_id: int, parse, lineage) -> None:
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
