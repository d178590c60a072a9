"""Format collapse on ``tool-use`` (issue 18): an injected drift in the call wrapper, then RL rounds with the format
guard off and with ``--format-guard repair``.

The drift is the failure mode seen in RL on tool-using agents: one wrong token in the call wrapper. Starting from
the SFT base model on ``tool-use``, a LoRA is fine-tuned on the base's own well-formed calls with ``"tool"``
misspelled ``"tol"`` in ``--drift-share`` of them, so the policy starts emitting malformed calls. From that adapter both arms
train the same GRPO rounds (same seeds, same new tasks each round); the per-round rollouts' format-error rate and
success are the curves. Results go to ``bench/results/format_collapse.json``. Not part of ``make bench``:

    python -m bench.format_collapse --rounds 4
"""

from __future__ import annotations

import argparse
import logging
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from bench.common import rl_round, write_result
from sdarflow import storage
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.stages import generate, train
from sdarflow.train.warmstart import BaseModelSpec, build_base_model

DRIFT = ('"tool"', '"tol"')  # the one-token slip in the call wrapper


def _generate(model: str, adapter: str, out: str, r: int, args) -> dict:
    cfg = generate.GenerateConfig(
        env="tool-use",
        model=model,
        adapter=adapter,
        output=out,
        tasks=args.tasks,
        group_size=args.group_size,
        first_task=args.base_tasks + r * args.tasks,  # new tasks every round, after the SFT's
        seed=args.seed,
        round=r,
        run_id="fc",
    )
    return generate.run(cfg)


def drifted_dataset(gen_uri: str, out: str, tokenizer, eos_id: int, share: float, seed: int) -> str:
    """The well-formed calls of ``gen_uri`` as SFT targets (marked solved: the SFT mode trains on solved rows),
    ``share`` of them with the call wrapper's key misspelled."""
    rows = storage.read_table(gen_uri, kind="trajectories", schema=TRAJECTORY_SCHEMA).to_pylist()
    rng = random.Random(seed)
    for r in rows:
        r["success"] = bool(r["format_ok"]) and DRIFT[0] in r["response_text"]
        if r["success"] and rng.random() < share:
            r["response_text"] = r["response_text"].replace(*DRIFT)
            r["response_token_ids"] = tokenizer(r["response_text"], add_special_tokens=False)["input_ids"] + [
                eos_id
            ]
            r["rollout_logprobs"] = [0.0] * len(r["response_token_ids"])
    table = pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
    storage.write_table(
        table, out, kind="trajectories", schema=TRAJECTORY_SCHEMA, config_hash="drift", inputs=[gen_uri]
    )
    return out


def arm(model: str, drifted: str, guard: str, root: str, args) -> list[dict]:
    """RL rounds from the drifted adapter with ``--format-guard guard``; each round's rollout metrics."""
    adapter, skills, curve = drifted, f"{model}/seed_skills", []
    for r in range(args.rounds + 1):
        out = f"{root}/{guard}/round={r}"
        gen = _generate(model, adapter, f"{out}/gen", r + 1, args)
        m = gen["metrics"]
        curve.append({"success": m["rollout/success"], "format_error_rate": m["rollout/format_error_rate"]})
        logging.warning("%s round %d: success %.3f, format errors %.3f", guard, r, *curve[-1].values())
        if r == args.rounds:
            return curve
        train_kw = {"method": "grpo", "seed": args.seed, "lr": args.lr, "max_steps": args.steps}
        tr, skills = rl_round(gen["uri"], model, adapter, skills, out, format_guard=guard, **train_kw)
        curve[-1]["train_sft_steps"] = tr["metrics"].get("train/sft_steps", 0.0)
        curve[-1]["repaired_turns"] = tr["metrics"].get("format/repaired_turns")
        adapter = tr["uri"]
    return curve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.format_collapse")
    p.add_argument("--model", default="", help="a tool-use base model; empty: build one into the work folder")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--base-tasks", type=int, default=BaseModelSpec().tasks)
    p.add_argument("--drift-share", type=float, default=0.5)
    p.add_argument("--drift-steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="", help="work folder (default: a temporary one)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sdarflow-fc-") as tmp:
        root = args.work or tmp
        model = args.model or str(
            build_base_model(Path(root) / "base", BaseModelSpec(env="tool-use", tasks=args.base_tasks))
        )
        from sdarflow.models import load_policy

        policy = load_policy(model)
        base = _generate(model, "", f"{root}/base-gen", 0, args)
        drift_data = drifted_dataset(
            base["uri"], f"{root}/drift-data", policy.tokenizer, policy.eos_id, args.drift_share, args.seed
        )
        drifted = train.run(
            train.TrainConfig(
                input=[drift_data], model=model, output=f"{root}/drifted", mode="sft", max_steps=args.drift_steps,
                lr=args.lr, seed=args.seed,
            )
        )["uri"]  # fmt: skip
        arms = {guard: arm(model, drifted, guard, root, args) for guard in ("off", "repair")}
        base_m = {
            "success": base["metrics"]["rollout/success"],
            "format_error_rate": base["metrics"]["rollout/format_error_rate"],
        }
    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "work"},
        "base_policy": base_m,
        "rounds": arms,
        "seconds": time.perf_counter() - t0,
    }
    rows = [
        (
            "base policy",
            f"success {base_m['success']:.2f}",
            f"format errors {base_m['format_error_rate']:.2f}",
        )
    ]
    for guard, curve in arms.items():
        rows.append((f"guard {guard}: success", *(f"{c['success']:.2f}" for c in curve)))
        rows.append((f"guard {guard}: format errors", *(f"{c['format_error_rate']:.2f}" for c in curve)))
    write_result("format_collapse", result, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
