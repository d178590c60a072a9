"""Learning check: several rounds of an RL method from the SFT base on ``textworld-cooking``, per seed.

Each round: generate (the train split's next tasks) -> extract-skills -> rescore -> train (``sdarflow.rounds``, the
pipeline's round), continuing the same LoRA adapter; the train-split success of each round's rollouts is the
learning curve (round 0 = the base policy). Results go to ``bench/results/learning_check.json``. Not part of ``make bench --quick``: it takes minutes per seed.

    python -m bench.learning_check --model demo-output/base-model --seeds 0 1 2 --rounds 6
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

from bench.common import write_result
from sdarflow.pipeline_config import PipelineConfig, stage_config
from sdarflow.rounds import Carry, run_round
from sdarflow.stages import generate
from sdarflow.train.warmstart import SEED_SKILLS


def one_seed(
    model: str, seed: int, rounds: int, method: str, tasks: int, group: int, root: str, lr: float
) -> list:
    """Train-split success of each round's rollouts (round 0: the base policy's), ``rounds`` rounds of
    ``method`` continuing one LoRA, every round on new tasks."""
    pc = PipelineConfig(
        storage=root, base_model=model, run_id=f"lc{seed}", seed_skills=f"{model}/{SEED_SKILLS}", method=method,
        seed=seed, tasks=tasks, group_size=group, lr=lr,
    )  # fmt: skip
    carry, curve = Carry(), []
    for r in range(rounds):
        rnd = run_round(pc, r, carry)
        carry = rnd.carry()
        curve.append(rnd.generate["metrics"]["rollout/success"])
        logging.warning("seed %d round %d (%s): train success %.3f", seed, r, method, curve[-1])
    last = generate.run(stage_config(pc, "generate", rounds, adapter=carry.adapter))  # the last adapter's
    return [*curve, last["metrics"]["rollout/success"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.learning_check")
    p.add_argument("--model", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--method", default="sdar")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sdarflow-lc-") as root:
        curves = {
            s: one_seed(
                args.model, s, args.rounds, args.method, args.tasks, args.group_size, root, lr=args.lr
            )
            for s in args.seeds
        }
    result = {
        "method": args.method,
        "model": args.model,
        "rounds": args.rounds,
        "tasks": args.tasks,
        "group_size": args.group_size,
        "lr": args.lr,
        "train_success_by_round": curves,
        "gain_last_vs_base": {s: c[-1] - c[0] for s, c in curves.items()},
        "seconds": time.perf_counter() - t0,
    }
    write_result(
        f"learning_check_{args.method}",
        result,
        [(f"seed {s}", " ".join(f"{x:.2f}" for x in c)) for s, c in curves.items()],
        base=args.model,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
