"""Learning check: several rounds of an RL method from the SFT base on ``textworld-cooking``, per seed.

Each round: generate -> extract-skills -> rescore -> train (``sdarflow.rounds``, the pipeline's round), continuing
the same LoRA adapter; the train-split success of each round's rollouts is the learning curve (round 0 = the base
policy; the last point is the final adapter's rollouts). With ``--fixed-tasks`` every round replays the same tasks
(``round_tasks=same``): the overfit check, the first thing an RL framework shows (can the method raise success on
tasks it sees again?); without it each round plays new tasks. Each round also records why the update was what it
was: the share of groups whose advantages are all zero (no gradient), the auxiliary term's gradient share, the
gate, and how many of each task's episodes it solved (so the tasks a seed forgot, solved in at least half their
episodes after some round and in none at the end, are named). Results go to
``bench/results/learning_check_<method>[_fixed].json`` with a PNG of the curves beside it, rewritten after every round
(``complete`` false until the last), so a run stopped short keeps the rounds it played. Not part of ``make bench
--quick``: it takes minutes per round.

    python -m bench.learning_check --method grpo --fixed-tasks --tasks 16 --seeds 0 1 2 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable

from bench.common import RESULTS, demo_model, replace_file, write_result
from sdarflow import storage
from sdarflow.pipeline_config import PipelineConfig, stage_config
from sdarflow.provenance import provenance
from sdarflow.rollout.report import group_episodes
from sdarflow.rounds import Carry, run_round
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.sizes import SIZES
from sdarflow.stages import generate
from sdarflow.study import round_record
from sdarflow.study_report import CURVE_KEYS, curve, curves_png
from sdarflow.train.warmstart import SEED_SKILLS

SETTINGS = ("rounds", "tasks", "group_size", "lr", "train_steps", "lora_rank")  # recorded with the result


def one_seed(
    args: argparse.Namespace, model: str, seed: int, root: str, done: Callable[[list[dict]], None]
) -> list[dict]:
    """Each round's record (``sdarflow.study.round_record``: train success of its rollouts, round 0 the base
    policy's, and its update's diagnostics), ``args.rounds`` rounds continuing one LoRA, then the final adapter's
    rollouts as one more record; ``done`` gets the records so far after each round."""
    pc = PipelineConfig(
        storage=root, base_model=model, run_id=f"lc{seed}", seed_skills=f"{model}/{SEED_SKILLS}",
        method=args.method, seed=seed, tasks=args.tasks, group_size=args.group_size, lr=args.lr,
        train_steps=args.train_steps, lora_rank=args.lora_rank, max_turns=0,
        round_tasks="same" if args.fixed_tasks else "next", stage_settings=stage_settings(args),
    )  # fmt: skip
    carry, records = Carry(), []
    for r in range(args.rounds):
        rnd = run_round(pc, r, carry)
        carry = rnd.carry()
        records.append(round_record(r, rnd) | {"solved_by_task": solved_by_task(rnd.generate["uri"])})
        logging.warning(
            "seed %d round %d (%s): train success %.3f, zero-advantage groups %.2f, %.0f s",
            seed, r, args.method, records[-1]["train_success"], records[-1]["zero_adv_group_share"] or 0,
            sum(rnd.seconds.values()),
        )  # fmt: skip
        done(records)
    last = generate.run(stage_config(pc, "generate", args.rounds, adapter=carry.adapter))
    final = {"round": args.rounds, "train_success": last["metrics"]["rollout/success"]}
    return [*records, final | {"solved_by_task": solved_by_task(last["uri"])}]


def solved_by_task(uri: str) -> dict[str, int]:
    """How many of each task's episodes a round's rollouts (a trajectories dataset) solved: where a curve's mean
    hides tasks learned and tasks forgotten."""
    rows = storage.read_table(uri, kind="trajectories", schema=TRAJECTORY_SCHEMA).to_pylist()
    episodes = group_episodes(rows)
    counts = dict.fromkeys(sorted({turns[0]["task_id"] for turns in episodes}), 0)
    for turns in episodes:
        counts[turns[0]["task_id"]] += any(turn["success"] for turn in turns)
    return counts


def forgotten(records: list[dict], group_size: int) -> list[str]:
    """The tasks a seed solved in at least half their episodes after some round and in none at the end."""
    rounds = [rec["solved_by_task"] for rec in records]
    return sorted(
        t for t in rounds[-1] if rounds[-1][t] == 0 and any(2 * rnd.get(t, 0) >= group_size for rnd in rounds)
    )


def stage_settings(args: argparse.Namespace) -> dict:
    """The demo preset's stage settings with ``--train`` (JSON) on top of its train settings."""
    settings = {k: dict(v) for k, v in SIZES["demo"]["pipeline"]["stage_settings"].items()}
    settings["train"] = {**settings.get("train", {}), **json.loads(args.train)}
    return settings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.learning_check")
    p.add_argument("--model", default="", help="base model folder; default: the demo's (built if absent)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--method", default="sdar")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--fixed-tasks", action="store_true", help="every round replays round 0's tasks")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--train-steps", type=int, default=8)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--train", default="{}", help='more train settings as JSON, e.g. {"epochs": 2}')
    p.add_argument("--name", default="", help="result name; default learning_check_<method>[_fixed]")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    model = args.model or demo_model()
    made_by = provenance(model)  # the code this run ran: the checkout may move during its hours
    name = args.name or f"learning_check_{args.method}" + ("_fixed" if args.fixed_tasks else "")
    t0, runs = time.perf_counter(), {}

    def save(seed: int, records: list[dict], *, complete: bool) -> None:
        runs[seed] = records
        save_result(args, name, runs, complete, time.perf_counter() - t0, model, made_by)

    with tempfile.TemporaryDirectory(prefix="sdarflow-lc-") as root:
        for i, seed in enumerate(args.seeds):
            records = one_seed(args, model, seed, root, lambda rs, s=seed: save(s, rs, complete=False))
            save(seed, records, complete=i == len(args.seeds) - 1)
    return 0


def save_result(
    args: argparse.Namespace, name: str, runs: dict, complete: bool, seconds: float, model: str, made_by: dict
) -> None:
    """Write the result (and its PNG) of the seeds' records so far: after every round, so a run stopped short
    (a machine's time ran out) still leaves its rounds, marked as stopped; the mean, the bar and the curves are
    over the rounds every seed has reached."""
    curves = {s: [r["train_success"] for r in records] for s, records in runs.items()}
    mean_by_round = [statistics.mean(x) for x in zip(*curves.values(), strict=complete)]
    common = [records[: len(mean_by_round)] for records in runs.values()]
    base, final = mean_by_round[0], mean_by_round[-1]
    result = {
        "method": args.method,
        "fixed_tasks": args.fixed_tasks,
        "settings": {k: getattr(args, k) for k in SETTINGS} | {"train": json.loads(args.train)},
        "train_success_by_round": curves,
        "mean_by_round": mean_by_round,
        "rounds_by_seed": runs,
        "base_mean": base,
        "final_mean": final,
        # with new tasks every round, the last round's tasks were never solved before: only fixed tasks can be lost
        **(
            {"forgotten_tasks": {s: forgotten(records, args.group_size) for s, records in runs.items()}}
            if args.fixed_tasks
            else {}
        ),
        # the overfit check's bar: at least twice the base's success, or +0.3, after every round asked for
        "passed": final >= min(2 * base, base + 0.3) if complete else None,
        "seconds": seconds,
        "seeds": args.seeds,
        "complete": complete,  # False: written after a round, the run still going or stopped there
    }
    # the study report's curves (mean and min-max band over seeds), one panel per diagnostic
    study = {"methods": {args.method: {"curves": {k: curve(common, k) for k in CURVE_KEYS}}}}
    replace_file(RESULTS / f"{name}.png", curves_png(study))
    write_result(
        name,
        result,
        [(f"seed {s}", " ".join(f"{x:.2f}" for x in c)) for s, c in curves.items()],
        base=model,
        made_by=made_by,
    )


if __name__ == "__main__":
    raise SystemExit(main())
