"""How many solved tasks a skill rule needs before it is right: the measurement behind ``extract.MIN_SUPPORT``.

Two sources of successful episodes, each scored against the env's ground truth (``sdarflow.skills.accuracy``):

- ``walkthroughs``: the expert walkthroughs the base model is built from, subsampled to ``k`` solved tasks per
  task type (``--draws`` random draws per ``k``); every action in them is right, so a wrong or recipe-blind rule
  here comes from too few tasks to tell one direction's action from another's;
- ``rollouts``: every trajectory dataset under ``--from`` (a demo's or a study's output; a policy's successes,
  with the stray actions a policy takes), each extracted on its own at each minimum support.

For each minimum support the extractor runs with no previous library (the merge would hide its mistakes), and the
table counts right, wrong and recipe-blind rules over all libraries, and the task-type skills (and their steps)
published: what a higher support costs.

    python -m bench.skill_support --from demo-output [--from DIR ...]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from bench.common import write_result

SUPPORTS = (1, 2, 3, 5, 8)  # minimum supports tried on the rollouts
TASKS = (2, 3, 5, 8, 12, 16)  # solved tasks per type drawn from the walkthroughs


def _walkthrough_draws(draws: int, seed: int = 0) -> dict[int, list]:
    """Per k, ``draws`` samples of k solved tasks per task type from the base model's walkthroughs."""
    from sdarflow.train.warmstart import BaseModelSpec, expert_steps

    spec = BaseModelSpec()
    _, episodes = expert_steps(spec.env, spec.tasks)
    by_type: dict[str, list] = {}
    for e in episodes:
        if e.success:
            by_type.setdefault(e.task_type, []).append(e)
    rng = random.Random(seed)
    return {
        k: [[e for eps in by_type.values() for e in rng.sample(eps, min(k, len(eps)))] for _ in range(draws)]
        for k in TASKS
    }


def _rollouts(folders: list[str]) -> list[list]:
    """Every trajectory dataset under these folders, as episodes."""
    from sdarflow import storage
    from sdarflow.schema import TRAJECTORY_SCHEMA
    from sdarflow.skills.extract import episodes_from_rows

    out = []
    for manifest in sorted(m for f in folders for m in Path(f).rglob("_manifest.json")):
        if storage.read_manifest(str(manifest.parent)).get("kind") == "trajectories":
            table = storage.read_table(str(manifest.parent), kind="trajectories", schema=TRAJECTORY_SCHEMA)
            out.append(episodes_from_rows(table.to_pylist()))
    return out


def _score(sets: list[list], min_support: int) -> dict[str, int]:
    from sdarflow.envs import get_suite
    from sdarflow.skills.accuracy import VERDICTS, score_library
    from sdarflow.skills.extract import extract_skills

    truth = get_suite("textworld-cooking").skill_truth()
    total = dict.fromkeys((*VERDICTS, "skills", "steps"), 0)
    for episodes in sets:
        lib = extract_skills(episodes, min_support=min_support)
        scored = score_library(lib, truth)
        for v in VERDICTS:
            total[v] += scored[v]
        total["skills"] += len(lib.task_specific())  # what a higher support costs: skills not published
        total["steps"] += sum(len(s.steps) for s in lib.task_specific())
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="sources", action="append", default=[], help="a demo's or study's output")
    p.add_argument("--draws", type=int, default=20, help="walkthrough samples per k")
    args = p.parse_args(argv)
    walk = _walkthrough_draws(args.draws)
    rollouts = _rollouts(args.sources)
    result = {
        "draws": args.draws,
        "rollout_datasets": len(rollouts),
        "sources": args.sources,
        "walkthroughs": {str(k): _score(walk[k], 1) for k in TASKS},
        "rollouts": {str(m): _score(rollouts, m) for m in SUPPORTS},
    }
    rows = [(f"walkthroughs, {k} tasks per type", result["walkthroughs"][str(k)]) for k in TASKS]
    rows += [(f"rollouts, min_support {m}", result["rollouts"][str(m)]) for m in SUPPORTS]
    write_result("skill_support", result, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
