"""The solution-reading teacher (``rescore --teacher-context solution``): each train row's teacher sees its task's
gold solution, as OPSD's teacher sees the reference answer. It is a positive control (a teacher better by
construction, so a null result points at the pipeline or the student, not the teacher) and what users with gold
demonstrations train with. The solution comes from the env suite's ``solution(task_id, split)``
(:class:`sdarflow.envs.base.Solutions`) and goes where skills go (``--skill-place``), never into a rollout.
"""

from __future__ import annotations

from sdarflow.errors import ConfigError

SOLUTION_HEADER = "Solution of this task, the expert's actions in order:"


def solution_text(steps: list[str]) -> str:
    """The teacher's privileged text for a solution: the header, then one numbered action per line."""
    return "\n".join([SOLUTION_HEADER, *(f"{i}. {step}" for i, step in enumerate(steps, 1))])


def task_solutions(rows: list[dict]) -> list[str]:
    """Each row's solution text (rows with ``env``, ``task_id`` and ``split``), every task's looked up once.
    ConfigError (one line) for an env without ``solution`` or a task it gives no actions for."""
    from sdarflow.envs import get_suite

    suites: dict[str, object] = {}
    texts: dict[tuple[str, str, str], str] = {}
    for row in rows:
        key = (row["env"], row["split"], row["task_id"])
        if key in texts:
            continue
        if row["env"] not in suites:  # a suite may build an index or games: once per env
            suites[row["env"]] = get_suite(row["env"])
        suite = suites[row["env"]]
        if not hasattr(suite, "solution"):
            raise ConfigError(
                f"rescore --teacher-context solution: env {row['env']!r} has no solution(task_id, split); fix: "
                f"implement it (docs/environments.md), or use --teacher-context skills"
            )
        steps = suite.solution(row["task_id"], row["split"])
        if not steps:
            raise ConfigError(
                f"rescore --teacher-context solution: env {row['env']!r} gave no solution for task "
                f"{row['task_id']}; fix: make its solution() return the task's actions, or use --teacher-context "
                f"skills"
            )
        texts[key] = solution_text(list(steps))
    return [texts[(r["env"], r["split"], r["task_id"])] for r in rows]
