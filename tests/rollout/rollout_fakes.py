"""Small fakes for rollout-loop tests: a character tokenizer, scripted engines, and suites whose envs misbehave."""

from __future__ import annotations

import threading

from sdarflow.envs import Reset, Step, Task
from sdarflow.rollout.episode import RolloutParams, Sample
from sdarflow.rollout.loop import run_rollout


class CharTokenizer:
    """One token per character: prompt lengths are character counts."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + (
            "<assistant>" if add_generation_prompt else ""
        )

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 256 for c in text]}


class ScriptedEngine:
    """Answers every prompt with ``reply(seed)``, each token at log-prob ``logprob``; records calls.
    ``seeded=False`` ignores seeds (the bug)."""

    name = "scripted"

    def __init__(
        self,
        reply=lambda seed: f"go {seed % 7}",
        seeded: bool = True,
        max_context: int = 0,
        logprob: float = -1.0,
    ):
        self.reply, self.seeded, self.calls, self.logprob = reply, seeded, [], logprob
        self.tokenizer, self.eos_id, self.max_context = CharTokenizer(), 0, max_context

    def generate(self, prompts, seeds, *, max_new_tokens, temperature, top_p=1.0):
        self.calls.append(len(prompts))
        out = []
        for seed in seeds:
            text = self.reply(seed if self.seeded else 0)
            out.append(Sample([ord(c) for c in text], [self.logprob] * len(text), text, True))
        return out

    def close(self):
        pass


class CountEnv:
    """Wins after ``goal`` well-formed steps. ``fail_on``: the step (1-based) that raises; ``hang``: an event the
    step waits on (set it to release the thread); ``obs_growth``: characters added to the observation per step."""

    def __init__(self, task, goal=3, fail_on=None, fail_reset=False, hang=None, obs_growth=0):
        self.task, self.goal, self.fail_on, self.fail_reset = task, goal, fail_on, fail_reset
        self.hang, self.obs_growth = hang, obs_growth
        self.steps, self.closed = 0, False
        self.max_turns = goal + 5  # the turn limit the loop reads from the env

    def reset(self):
        if self.fail_reset:
            raise OSError("simulator did not start")
        self.steps = 0
        return Reset(instruction=f"count to {self.goal}", observation="0")

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_on:
            raise RuntimeError(f"simulator crashed on {action!r}")
        if self.hang is not None:
            self.hang.wait(30)
        won = self.steps >= self.goal
        return Step(str(self.steps) + "x" * self.obs_growth * self.steps, float(won), won, won)

    def expert_action(self):
        return "go"

    def close(self):
        self.closed = True


class FakeSuite:
    """Tasks ``fake-<i>``; ``bad`` maps a task index to CountEnv keyword arguments (how that task misbehaves)."""

    name = "fake"
    thread_safe = True

    def __init__(self, bad: dict[int, dict] | None = None, goal: int = 3, instruction_chars: int = 0):
        self.bad, self.goal, self.envs = bad or {}, goal, []
        self.instruction_chars = instruction_chars

    def tasks(self, split, n=None, start=0):
        return [Task(f"fake-{i}", "count", split) for i in range(n or 3)]

    def make(self, task):
        env = CountEnv(task, self.goal, **self.bad.get(int(task.task_id.split("-")[1]), {}))
        if self.instruction_chars:
            env.reset = lambda: Reset("y" * self.instruction_chars, "0")
        self.envs.append(env)
        return env


class JsonSuite(FakeSuite):
    """A suite with its own action format: only ``{"do": ...}`` is well formed."""

    format_hint = "Reply with JSON."

    def parse_action(self, text, finished):
        ok = text.startswith('{"do": ') and text.endswith("}")
        return text, ok and finished


def never_released() -> threading.Event:
    return threading.Event()


def run(suite, engine=None, n_tasks=3, group_size=2, **params):
    """``run_rollout`` of ``group_size`` episodes on each of ``n_tasks`` tasks (5 turns, 2 s per env call unless
    ``params`` say otherwise); returns (result, engine)."""
    engine = engine or ScriptedEngine()
    settings = {"max_turns": 5, "step_timeout_s": 2.0, **params}
    result = run_rollout(
        engine,
        suite,
        suite.tasks("train", n_tasks),
        group_size,
        RolloutParams(**settings),
        engine.tokenizer,
        run_id="t",
        round_=0,
        policy_version="base",
    )
    return result, engine
