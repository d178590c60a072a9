"""What a rollout is made of and produces: the generation engine's interface (prompts as token ids in; sampled
tokens, their log-probs and text out), the rollout's settings (``RolloutParams``), each episode's state as it is
played, and the result (rows, episodes, timing) with the stage metrics derived from it.

Engines expose their tokenizer, EOS id and context length (so prompts are checked before any generation) and
``close()``. Log-probs are of the raw policy (temperature 1, float32 ``log_softmax``), the same quantity the trainer
computes, so the engine/trainer gap measures numerical drift rather than a definitional difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sdarflow.envs import Task


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finished: bool  # ended with EOS rather than hitting max_new_tokens


class GenerationEngine(Protocol):
    name: str  # the engine's name in ``rollout.engine.GENERATION_ENGINES``
    tokenizer: object
    eos_id: int
    max_context: int  # tokens of prompt + response the model accepts

    def close(self) -> None: ...

    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        min_new_tokens: int = 0,  # EOS is not sampled before this many tokens (fixed-length benchmarks)
    ) -> list[Sample]: ...


@dataclass
class RolloutParams:
    """Per-rollout settings. step_timeout_s: limit on one env call (0 = none); env_workers: env calls run at
    once (for suites with ``thread_safe = True``; others get 1); max_prompt_tokens: the engine's context minus
    max_new_tokens (0 = unchecked); env_process: envs run in a worker process and two halves of the episodes
    take turns, one generating while the other's env steps run (``rollout.envhost``; the stages' ``--envs``);
    prompt_format: ``rollout.prompt.PROMPT_FORMATS`` (``reference`` asks the envs for their admissible actions);
    expert_labels: each turn row records the env's expert action at its state and whether the policy's action was it
    (``expert_action``, ``expert_match``; envs without an expert give nulls)."""

    max_turns: int
    max_new_tokens: int = 24
    temperature: float = 1.0
    top_p: float = 1.0
    history_turns: int = 4
    prompt_format: str = "command"
    seed: int = 0
    step_timeout_s: float = 60.0
    env_workers: int = 1
    max_prompt_tokens: int = 0
    env_process: bool = False
    expert_labels: bool = False


@dataclass
class Episode:
    task: Task
    group_id: str
    traj_id: str
    index: int  # its env's address in the rollout's env host
    instruction: str
    observation: str
    actions: list[str] = field(default_factory=list)
    admissible: tuple[str, ...] | None = None  # the env's admissible actions now, when the prompt lists them
    expert: str | None = None  # the expert's action now, when the rollout records expert labels
    rows: list[dict] = field(default_factory=list)
    total: float = 0.0
    won: bool = False
    done: bool = False
    format_errors: int = 0
    env_steps: int = 0
    error: str | None = None  # the env raised or hung: the episode ended as failed
    hung: bool = False  # its env call is still running in an abandoned thread: never touch the env again
    context_exceeded: bool = False  # the next prompt no longer fit the engine's context
    max_turns: int | None = None  # the env's own turn limit, where it has one
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
            # the mean episode return: the success rate under a win reward, more where an env gives partial credit
            "rollout/mean_return": sum(e.total for e in eps) / n,
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
