"""The demo's result, committed: ``make demo``'s run (or one already made, ``--from DIR``) as
``bench/results/demo.json``: the base model's and each round's held-out pass@1 with intervals, and each round
against the base model task by task as the promotion gate compares them (difference and one-sided 95% bound), and
each round's skill library scored against the env (right, wrong, recipe-blind rules).

    python -m bench.demo_result [--from demo-output | --base-model DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.common import write_result


def _skills(root: str, run_id: str, rounds: int) -> list[dict]:
    """Each round's skill library against the env's ground truth (extract-skills' metrics)."""
    from sdarflow import storage
    from sdarflow.pipeline_config import stage_uri

    return [
        storage.read_manifest(stage_uri(root, run_id, r, "extract-skills")).get("metrics", {})
        for r in range(rounds)
    ]


def _vs_base(root: str, run_id: str, rounds: int) -> list[dict]:
    from sdarflow.evaluate.compare import difference
    from sdarflow.pipeline_config import run_uri, stage_uri
    from sdarflow.registry.intake import load_report

    base = load_report(run_uri(root, run_id, "base", "evaluate"))["splits"]
    out = []
    for r in range(rounds):
        splits = load_report(stage_uri(root, run_id, r, "evaluate"))["splits"]
        out.append({split: difference(splits[split], base[split], 1).to_dict() for split in ("test", "ood")})
    return out


def main(argv: list[str] | None = None) -> int:
    from sdarflow.demo import run_demo

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--from", dest="source", default="", help="a finished demo's --output folder (default: run one)"
    )
    p.add_argument("--base-model", default=None, help="run the demo on this base model (default: build it)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sdarflow-demo-") as tmp:
        out = Path(args.source or tmp)
        summary = (
            json.loads((out / "summary.json").read_text())
            if args.source
            else run_demo(out, base_model=args.base_model)
        )
        root = str(out / "store")
        result = {
            "rounds": summary["rounds"],
            "base": summary["base"],
            "per_round": summary["per_round"],
            "vs_base": _vs_base(root, summary["run_id"], summary["rounds"]),
            "skills": _skills(root, summary["run_id"], summary["rounds"]),
            "seconds": summary.get("seconds"),
        }
        rows = [("base", f"test pass@1 {summary['base']['test_pass@1']:.3f}")]
        rows += [(f"round {r['round']}", f"test pass@1 {r['test_pass@1']:.3f}") for r in summary["per_round"]]
        write_result("demo", result, rows, base=summary["base_model"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
