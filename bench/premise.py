"""SDAR's premise on a model, measured as discrimination: does the teacher (the same weights with privileged context
in its prompt) rank the policy's good turns above its bad ones?

The model plays ``--tasks`` train tasks x ``--samples`` from ``--first-task`` (generate, its own prompt format,
expert labels on: each turn records whether its action was the expert's; with ``--adapter``, e.g. a warm start,
that policy: pass the warm start's task count as ``--first-task`` so it plays tasks its SFT never saw). Its rollouts
then go through the rescore stage itself, once per teacher context and skill place, so rescore's guards run (a
teacher prompt left unchanged, or skills that never reach it, is refused and reported as refused, not scored):

- ``skills``: the env's SDAR reference library where it has one (``sdarflow.skills.library.reference_library``:
  search-qa), else the seed library the model was built with, else one mined from expert walkthroughs; retrieved
  by keyword;
- ``solution``: the task's gold solution (``--teacher-context solution``): a teacher better by construction;
- ``other solution``: the solution of another task of the split (the rows' task ids shifted by one in sorted order,
  a bijection, so the task units stay intact): text of the same kind that is not about this task, the control a
  solution must beat for reading to be what helps.

Each row of the result: the gate ``sigmoid(beta (q - s))`` and the gap ``q - s`` (turn means over response tokens)
on expert-matching turns minus the others, and on successful episodes' turns minus failed ones', each with a 95%
interval from a bootstrap over tasks (``sdarflow.teacher.discrimination``; "n/a" below 5 tasks on a side).

    python -m bench.premise --model smollm2-135m-instruct --env search-qa [--adapter DIR --first-task 32]
        [--tasks 32 --samples 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.common import write_result

PLACES = ("prefix", "user")  # the reference's place, and inside the user message
CONTEXTS = ("skills", "solution", "other solution")
WALKTHROUGHS = (
    24  # train tasks whose walkthroughs a seed library is mined from, where the env has no reference
)


def skills_library(env: str, model: str, work: Path) -> tuple[str, str]:
    """(folder, name) of the skills teacher's library: the env's reference library, else the seed library the
    model was built with (a model sdarflow built), else one mined from expert walkthroughs."""
    from sdarflow.skills.library import reference_library
    from sdarflow.train.warmstart import SEED_SKILLS, expert_steps, seed_library

    if (folder := reference_library(env)) is not None:
        return str(folder), "the SDAR reference"
    if (Path(model) / SEED_SKILLS).is_dir():
        return str(Path(model) / SEED_SKILLS), "the model's seed"
    return str(seed_library(expert_steps(env, WALKTHROUGHS)[1]).save(work / "seed-skills")), "a mined seed"


def other_tasks(rollouts: str, out: str) -> str:
    """``rollouts`` with every row's task id replaced by the next task's in sorted order (the last by the first):
    a derangement, so the solution teacher reads another task's solution, and a bijection, so each task keeps its
    turns together for the bootstrap over tasks."""
    import pyarrow as pa

    from sdarflow import storage
    from sdarflow.schema import TRAJECTORY_SCHEMA

    table = storage.read_table(rollouts, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    ids = sorted(set(table["task_id"].to_pylist()))
    if len(ids) < 2:
        raise SystemExit("premise: the other-solution control needs at least 2 tasks; fix: --tasks 2 or more")
    shifted = dict(zip(ids, ids[1:] + ids[:1], strict=True))
    column = pa.array([shifted[t] for t in table["task_id"].to_pylist()], type=pa.string())
    table = table.set_column(table.schema.get_field_index("task_id"), "task_id", column)
    storage.write_table(table, out, kind="trajectories", schema=TRAJECTORY_SCHEMA, config_hash="premise-other",
                        inputs=[rollouts], overwrite=True)  # fmt: skip
    return out


def discrimination_of(rescored: str) -> dict:
    """The rescored rows' discrimination (both contrasts, gate and gap) as JSON, and their mean gap per token."""
    from sdarflow import storage
    from sdarflow.algo import Objective
    from sdarflow.schema import RESCORED_SCHEMA
    from sdarflow.teacher.discrimination import discrimination, turn_scores

    cols = ["task_id", "success", "expert_match", "old_logprobs", "teacher_logprobs"]
    t = storage.read_table(rescored, kind="rescored", schema=RESCORED_SCHEMA).select(cols).to_pydict()
    turns = turn_scores(t["task_id"], t["success"], t["expert_match"], t["old_logprobs"], t["teacher_logprobs"],
                        Objective.gate_beta)  # fmt: skip
    table = discrimination(turns)
    tokens = [q - s for old, new in zip(t["old_logprobs"], t["teacher_logprobs"], strict=True)
              for s, q in zip(old, new, strict=True)]  # fmt: skip
    return {
        "gap_mean": sum(tokens) / max(1, len(tokens)),
        **{
            f"{name}/{q}": {"diff": c.diff, "ci95": c.ci95, "tasks": [c.tasks_a, c.tasks_b], "text": c.text()}
            for name, by_q in table.items()
            for q, c in by_q.items()
        },
    }


def measure(
    context: str, place: str, rollouts: dict, skills: str, model: str, adapter: str, work: Path
) -> dict:
    """One (context, place) through the rescore stage: its discrimination, or the guard's refusal."""
    from sdarflow.stages import rescore
    from sdarflow.teacher.report import TeacherSanityError

    slug = f"{context.replace(' ', '-')}-{place}"
    try:
        out = rescore.run(
            rescore.RescoreConfig(
                input=[rollouts["other" if context == "other solution" else "own"]], skills=skills, model=model,
                adapter=adapter, output=str(work / f"rescore-{slug}"), skill_place=place,
                teacher_context="skills" if context == "skills" else "solution", ref_logprobs=False,
                allow_unpublished=True, overwrite=True,
            )
        )  # fmt: skip
    except TeacherSanityError as err:  # a guard refused this teacher: what the stage would do in a run
        return {"context": context, "place": place, "refused": str(err).splitlines()[0]}
    return {"context": context, "place": place, **discrimination_of(out["uri"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder or a known model's name")
    ap.add_argument("--adapter", default="", help="the policy's adapter (e.g. an SFT warm start)")
    ap.add_argument("--env", default="search-qa")
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--first-task", type=int, default=0, help="the first train task played")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="", help="work folder (default bench/work/premise-<env>)")
    args = ap.parse_args(argv)

    from sdarflow.model_cache import local_model
    from sdarflow.stages import generate

    model = local_model(args.model)
    work = Path(args.work or Path(__file__).parent / "work" / f"premise-{args.env}").absolute()
    generated = generate.run(
        generate.GenerateConfig(
            model=model, adapter=args.adapter, env=args.env, tasks=args.tasks, first_task=args.first_task,
            group_size=args.samples, seed=args.seed, engine="hf", allow_unpublished=True, overwrite=True, output=str(work / "rollouts"),
        )
    )  # fmt: skip
    rollouts = {"own": generated["uri"], "other": other_tasks(generated["uri"], str(work / "rollouts-other"))}
    skills, library = skills_library(args.env, model, work)
    rows = [
        measure(context, place, rollouts, skills, model, args.adapter, work)
        for place in PLACES
        for context in CONTEXTS
    ]
    result = {
        "env": args.env,
        "model": args.model,
        "adapter": args.adapter,
        "tasks": args.tasks,
        "first_task": args.first_task,
        "samples": args.samples,
        "skills_library": library,
        "rollouts": {k: v for k, v in generated["metrics"].items() if k.startswith("rollout/")},
        "rows": rows,
    }
    table = [("context", "place", "gate: expert - other", "gate: success - failure", "mean q - s")]
    for r in rows:
        if "refused" in r:
            table.append((r["context"], r["place"], "refused", r["refused"], ""))
        else:
            gap = f"{r['gap_mean']:+.3f}"
            table.append((r["context"], r["place"], r["expert/gate"]["text"], r["success/gate"]["text"], gap))
    write_result(f"premise_{args.env}", result, table, base=model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
