"""Learning check (issue 3): several rounds of an RL method from the SFT base on ``textworld-cooking``, per seed.

Each round: generate (train split) -> extract-skills -> rescore -> train, continuing the same LoRA adapter; the
train-split success of each round's rollouts is the learning curve (round 0 = the base policy). Results go to
``bench/results/learning_check.json``. Not part of ``make bench --quick``: it takes minutes per seed.

    python -m bench.learning_check --model demo-output/base-model --seeds 0 1 2 --rounds 6
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

from bench.common import rl_round, write_result
from sdarflow.stages import generate


def one_seed(
    model: str, seed: int, rounds: int, method: str, tasks: int, group: int, root: str, **train_kw
) -> list:
    adapter, skills = "", f"{model}/seed_skills"
    curve = []
    for r in range(rounds + 1):
        out = f"{root}/seed={seed}/round={r}"
        gen = generate.run(
            generate.GenerateConfig(
                model=model,
                adapter=adapter,
                output=f"{out}/gen",
                tasks=tasks,
                group_size=group,
                seed=seed,
                round=r,
                run_id=f"lc{seed}",
            )
        )
        curve.append(gen["metrics"]["rollout/success"])
        logging.warning("seed %d round %d (%s): train success %.3f", seed, r, method, curve[-1])
        if r == rounds:
            break
        tr, skills = rl_round(gen["uri"], model, adapter, skills, out, method=method, seed=seed, **train_kw)
        adapter = tr["uri"]
    return curve


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
