"""SDAR's premise on a model: is the teacher (the same weights, with skills in the prompt) better than the student
on the model's own turns, and on its successful ones in particular?

The model plays ``--tasks`` train tasks x ``--samples`` (generate, its own prompt format; with ``--adapter``, the
warm-started policy). Every turn is then scored twice, as rescore scores it: the student's log-probs ``s_t`` of the
response under the rollout's prompt, and the teacher's ``q_t`` under that prompt with the retrieved skills put in
front (keyword retrieval, the ``prefix`` place). The table reports the mean of ``q_t - s_t`` over response tokens,
per task first and then over tasks (a t interval over tasks: the task is the unit the turns share), split by
successful and failed episodes, for each skill library:

- ``seed``: extracted from the env's expert walkthroughs, as the demo's base model's seed library is;
- ``reference``: the SDAR reference's hand-written library, where the env has a counterpart
  (``sdarflow.skills.library.reference_library``: search-qa has the reference's search skills);
- ``llm``: written by the model itself with the LLM extractor (engine backend) from the walkthroughs' episodes;
- ``random``: the reference library (the seed library where there is none) with every skill's text replaced by
  random tokens of the same number (the control: any text in front of the prompt moves the log-probs; skills help
  only if they beat it).

    python -m bench.premise --model smollm2-135m-instruct --env search-qa [--adapter DIR] [--tasks 16 --samples 4]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from pathlib import Path

from bench.common import write_result
from sdarflow.report import signed_with_interval

WALKTHROUGHS = 24  # train tasks whose walkthroughs the seed and llm libraries are extracted from


def libraries(env: str, model: str, tokenizer, work: Path, seed: int) -> dict:
    """Skill libraries by name (see the module doc)."""
    from sdarflow.skills.library import SkillLibrary, reference_library
    from sdarflow.stages import extract_skills as extract_stage
    from sdarflow.stages import generate
    from sdarflow.train.warmstart import expert_steps, seed_library

    _, episodes = expert_steps(env, WALKTHROUGHS)
    libs = {"seed": seed_library(episodes)}
    if (folder := reference_library(env)) is not None:
        libs["reference"] = SkillLibrary.load(folder)
    walk = generate.run(
        generate.GenerateConfig(
            model=model, policy="expert", env=env, tasks=WALKTHROUGHS, output=str(work / "walkthroughs")
        )
    )["uri"]
    llm = extract_stage.run(
        extract_stage.ExtractSkillsConfig(
            input=[walk], extractor="llm", llm_backend="engine", model=model, output=str(work / "llm-skills")
        )
    )["uri"]
    libs["llm"] = SkillLibrary.load(llm)
    libs["random"] = random_control(libs.get("reference", libs["seed"]), tokenizer, seed)
    return libs


def random_control(lib, tokenizer, seed: int):
    """``lib`` with each skill's text replaced by as many random (non-special) tokens as it has."""
    import copy

    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    out = copy.deepcopy(lib)
    for skill in out.skills.values():
        n = len(tokenizer(skill.text, add_special_tokens=False)["input_ids"])
        skill.text = tokenizer.decode([rng.choice(vocab) for _ in range(n)])
    return out


SCORE_TOKENS = 8192  # tokens per forward pass: the 49k-token vocabulary's float32 log-probs stay ~1.6 GB


def logprobs(policy, prompts: list[list[int]], rows: list[dict], desc: str) -> list[list[float]]:
    from sdarflow.teacher.rescore import score

    responses = [r["response_token_ids"] for r in rows]
    return score(policy.model, prompts, responses, policy.tokenizer.pad_token_id or 0, SCORE_TOKENS, desc)


def gaps(rows: list[dict], lib, policy, student: list[list[float]]) -> list[list[float]]:
    """Per row, ``q_t - s_t`` for each response token (teacher with ``lib``'s keyword-retrieved skills, prefix)."""
    from sdarflow.skills.retrieve import get_strategy
    from sdarflow.teacher.rescore import teacher_prompts

    teach = teacher_prompts(rows, lib, get_strategy("keyword"), policy.tokenizer, "prefix")
    teacher = logprobs(policy, teach.prompts, rows, "teacher")
    return [[q - s for q, s in zip(qs, ss, strict=True)] for qs, ss in zip(teacher, student, strict=True)]


def summarize(rows: list[dict], row_gaps: list[list[float]]) -> dict:
    """Mean gap per token, per outcome: per task first (tokens pooled within a task), then over tasks."""
    from sdarflow.evaluate.compare import mean_interval

    out = {}
    for outcome in ("success", "failure"):
        by_task: dict[str, list[float]] = defaultdict(list)
        for r, g in zip(rows, row_gaps, strict=True):
            if r["success"] == (outcome == "success"):
                by_task[r["task_id"]] += g
        per_task = [sum(v) / len(v) for v in by_task.values() if v]
        if per_task:
            lo, hi = mean_interval(per_task)
            out[outcome] = {"gap": sum(per_task) / len(per_task), "ci95": [lo, hi], "tasks": len(per_task),
                            "turns": sum(r["success"] == (outcome == "success") for r in rows)}  # fmt: skip
        else:
            out[outcome] = {"gap": None, "ci95": None, "tasks": 0, "turns": 0}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder or a known model's name")
    ap.add_argument("--adapter", default="", help="the policy's adapter (e.g. an SFT warm start)")
    ap.add_argument("--env", default="search-qa")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="", help="work folder (default bench/work/premise-<env>)")
    args = ap.parse_args(argv)

    from sdarflow import storage
    from sdarflow.model_cache import local_model
    from sdarflow.models import load_policy
    from sdarflow.schema import TRAJECTORY_SCHEMA
    from sdarflow.stages import generate

    model = local_model(args.model)
    work = Path(args.work or Path(__file__).parent / "work" / f"premise-{args.env}").absolute()
    rollouts = generate.run(
        generate.GenerateConfig(
            model=model, adapter=args.adapter, env=args.env, tasks=args.tasks, group_size=args.samples,
            seed=args.seed, engine="hf", allow_unpublished=True, output=str(work / "rollouts"),
        )
    )  # fmt: skip
    rows = storage.read_table(rollouts["uri"], kind="trajectories", schema=TRAJECTORY_SCHEMA).to_pylist()
    policy = load_policy(model, args.adapter or None)
    libs = libraries(args.env, model, policy.tokenizer, work, args.seed)
    student = logprobs(policy, [r["prompt_token_ids"] for r in rows], rows, "student")
    result = {
        "env": args.env,
        "model": args.model,
        "adapter": args.adapter,
        "rollouts": {k: v for k, v in rollouts["metrics"].items() if k.startswith("rollout/")},
        "libraries": {
            name: {
                "version": lib.version,
                "skills": len(lib.skills),
                **summarize(rows, gaps(rows, lib, policy, student)),
            }
            for name, lib in libs.items()
        },
    }
    table = [("library", "success gap [95%]", "tasks", "failure gap [95%]", "tasks")]
    for name, r in result["libraries"].items():
        cells = []
        for outcome in ("success", "failure"):
            d = r[outcome]
            shown = "-" if d["gap"] is None else signed_with_interval(d["gap"], d["ci95"], d["tasks"])
            cells += [shown, d["tasks"]]
        table.append((name, *cells))
    write_result(f"premise_{args.env}", result, table, base=model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
