"""Format collapse: an injected drift, then GRPO rounds with the format guard off and with
``--format-guard repair`` (and its per-step probe, ``--format-probe-every``).

Two drifts. ``--drift sft`` (on ``tool-use``) is the failure mode seen in RL on tool-using agents, one wrong token
in the call wrapper: from the SFT base model a LoRA is fine-tuned on the base's own well-formed calls with
``"tool"`` misspelled ``"tol"`` in ``--drift-share`` of them, and both arms start from that adapter. ``--drift lr``
(any env) is a collapse inside a round: both arms start from the base and train at an aggressive ``--lr``, at which
one optimizer step can break the policy's output format. Both arms train the same rounds (same seeds, same new
tasks each round); the curves are the per-round rollouts' format-error rate and success, and each round's probe
rates per step. Results go to ``bench/results/format_collapse[_<drift>_<env>].json``. Not part of ``make bench``:

    python -m bench.format_collapse --rounds 4
    python -m bench.format_collapse --drift lr --env textworld-cooking --lr 0.05 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from bench.common import write_result
from sdarflow import storage
from sdarflow.extensions.format_probe import PROBE_KEY, REMEDY_KEY, ROLLBACK_KEY
from sdarflow.pipeline_config import PipelineConfig, stage_config
from sdarflow.rounds import Carry, run_round
from sdarflow.schema import TRAJECTORY_SCHEMA
from sdarflow.stages import generate, train
from sdarflow.train.warmstart import SEED_SKILLS, BaseModelSpec, build_base_model

DRIFT = ('"tool"', '"tol"')  # the one-token slip in the call wrapper


def run_config(model: str, root: str, args, start: str = "", guard: str = "off") -> PipelineConfig:
    """The pipeline config both arms (and the base policy's rollouts) play: round r plays the split's tasks after
    the SFT's and r - 1 rounds' (``stage_config``); an arm starts from ``start`` and trains with ``guard``."""
    train = {"lr": args.lr, "max_steps": args.steps, "format_guard": guard}
    if guard != "off":
        train["format_probe_every"] = args.probe_every
    return PipelineConfig(
        storage=root,
        base_model=model,
        run_id=f"fc-{guard}",
        seed_skills=f"{model}/{SEED_SKILLS}",
        start_adapter=start,
        env=args.env,
        method="grpo",
        seed=args.seed,
        tasks=args.tasks,
        group_size=args.group_size,
        stage_settings={"generate": {"first_task": args.base_tasks}, "train": train},
    )


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


def drifted(model: str, base_gen: str, root: str, args) -> str:
    """The SFT drift: a LoRA fine-tuned on the base's rollouts with the call key misspelled in some of them."""
    from sdarflow.models import load_policy

    policy = load_policy(model)
    drift_data = drifted_dataset(
        base_gen, f"{root}/drift-data", policy.tokenizer, policy.eos_id, args.drift_share, args.seed
    )
    return train.run(
        train.TrainConfig(
            input=[drift_data], model=model, output=f"{root}/drifted", mode="sft", max_steps=args.drift_steps,
            lr=args.lr, seed=args.seed,
        )
    )["uri"]  # fmt: skip


def rollout_figures(gen: dict) -> dict:
    m = gen["metrics"]
    return {"success": m["rollout/success"], "format_error_rate": m["rollout/format_error_rate"]}


def arm(model: str, start: str, guard: str, root: str, args) -> list[dict]:
    """RL rounds from ``start`` (an adapter, or the base) with ``--format-guard guard``; each round's rollout
    metrics and train's probe rates, then the last adapter's rollouts. Round 0 is the base policy's rollouts."""
    pc, carry, curve = run_config(model, root, args, start, guard), Carry(), []
    for r in range(1, args.rounds + 1):
        rnd = run_round(pc, r, carry)
        carry, tr = rnd.carry(), rnd.train
        steps = [json.loads(line) for line in storage.read_member(tr["uri"], "metrics.jsonl").splitlines()]
        curve.append(
            {
                **rollout_figures(rnd.generate),
                "train_sft_steps": tr["metrics"].get("train/sft_steps", 0.0),
                "repaired_turns": tr["metrics"].get("format/repaired_turns"),
                "start_probe_error_rate": tr["metrics"].get("format/start_probe_error_rate"),
                "probe_error_rates": [x.get(PROBE_KEY) for x in steps],
                # the remedy's SFT steps, the start probe's included
                "remedy_steps": tr["metrics"].get("format/start_remedy_steps", 0)
                + sum(x.get(REMEDY_KEY, 0) for x in steps),
                "rollbacks": [x["step"] for x in steps if ROLLBACK_KEY in x],  # steps whose probe rolled back
            }
        )
        c = curve[-1]
        logging.warning(
            "%s round %d: success %.3f, format errors %.3f", guard, r, c["success"], c["format_error_rate"]
        )
    last = generate.run(stage_config(pc, "generate", args.rounds + 1, adapter=carry.adapter))
    return [*curve, rollout_figures(last)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.format_collapse")
    p.add_argument(
        "--drift", choices=("sft", "lr"), default="sft", help="sft: a misspelled call key; lr: --lr"
    )
    p.add_argument("--env", default="tool-use")
    p.add_argument(
        "--model", default="", help="a base model for --env; empty: build one into the work folder"
    )
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--base-tasks", type=int, default=BaseModelSpec().tasks)
    p.add_argument("--drift-share", type=float, default=0.5)
    p.add_argument("--drift-steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--probe-every", type=int, default=1, help="the repair arm's --format-probe-every")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="", help="work folder (default: a temporary one)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sdarflow-fc-") as tmp:
        root = args.work or tmp
        model = args.model or str(
            build_base_model(Path(root) / "base", BaseModelSpec(env=args.env, tasks=args.base_tasks))
        )
        base = generate.run(stage_config(run_config(model, root, args), "generate", 0))
        start = drifted(model, base["uri"], root, args) if args.drift == "sft" else ""
        arms = {guard: arm(model, start, guard, root, args) for guard in ("off", "repair")}
        base_m = rollout_figures(base)
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
    name = (
        "format_collapse"
        if args.drift == "sft"
        else f"format_collapse_{args.drift}_{args.env.replace('-', '_')}"
    )
    write_result(name, result, rows, base=model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
