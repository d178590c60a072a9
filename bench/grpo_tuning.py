"""GRPO's setting, chosen on ``valid`` and reported on ``test``: one GRPO study per candidate setting (the same base
model, seeds and rounds), the candidate with the best pooled valid pass@1 selected, and the selected one's GRPO-vs-base
intervals on test (and ood) reported with the study's cluster-robust statistics.

    python -m bench.grpo_tuning [--seeds 0 1 2] [--rounds 3] [--work DIR] [--base-model DIR]

Writes ``bench/results/grpo_tuning.json`` (every candidate's valid and test figures, the selection and the split it
was made on, with provenance). About 7 minutes per (candidate, seed) on 2 CPU cores, plus about a minute per round
and seed for the base model's rollouts on each round's games (the study's train-success reference).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from bench.common import demo_model, write_result

# the demo preset's setting (lr 2e-3) and a faster one; stage settings on top of the preset's
CANDIDATES: dict[str, dict] = {"lr 2e-3 (preset)": {}, "lr 5e-3": {"train": {"lr": 0.005}}}
SELECT_ON = "valid"


def _figures(study: dict) -> dict:
    grpo = study["methods"]["grpo"]
    return {
        "valid_pass@1": grpo["valid_pass@1"],
        "test_pass@1": grpo["test_pass@1"],
        "ood_pass@1": grpo["ood_pass@1"],
        "grpo_vs_base": study["paired"]["grpo_vs_base"],
        "base": study["base"],
        "per_seed_test_pass@1": {
            str(r["seed"]): r["eval"]["test"]["pass_at_k"]["1"]
            for r in study["runs"]
            if r["method"] == "grpo"
        },
    }


def select(candidates: dict[str, dict], split: str = SELECT_ON) -> str:
    """The candidate with the best pooled pass@1 on ``split`` (the first listed on a tie)."""
    return max(candidates, key=lambda name: candidates[name][f"{split}_pass@1"]["value"])


def main(argv: list[str] | None = None) -> int:
    from sdarflow.study import StudySettings, run_study

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--work", default="", help="folder of the candidates' studies (default: a temporary one)")
    p.add_argument("--base-model", default="", help="default: the demo's base model (built if absent)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    base = args.base_model or demo_model()
    candidates = {}
    with tempfile.TemporaryDirectory(prefix="sdarflow-tuning-") as tmp:
        work = Path(args.work or tmp)
        for i, (name, settings) in enumerate(CANDIDATES.items()):
            s = StudySettings(
                ["grpo"], args.seeds, args.rounds, str(work / f"candidate-{i}"), base, stage_settings=settings
            )
            candidates[name] = {"stage_settings": settings, **_figures(run_study(s))}
    selected = select(candidates)
    chosen = candidates[selected]
    result = {
        "selected_on": SELECT_ON,
        "reported_on": "test",
        "selected": selected,
        "seeds": args.seeds,
        "rounds": args.rounds,
        "grpo_vs_base": chosen["grpo_vs_base"],
        "candidates": candidates,
        "seconds": time.perf_counter() - t0,
    }
    rows = [
        (name, f"valid {c['valid_pass@1']['value']:.3f}", f"test {c['test_pass@1']['value']:.3f}")
        for name, c in candidates.items()
    ]
    for split, d in chosen["grpo_vs_base"].items():
        rows.append(
            (
                f"selected vs base, {split}",
                f"{d['mean_diff']:+.3f}",
                json.dumps([round(x, 3) for x in d["ci95"]]),
            )
        )
    write_result("grpo_tuning", result, rows, base=base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
