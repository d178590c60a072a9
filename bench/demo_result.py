"""The demo's result, committed: ``make demo``'s run (or one already made, ``--from DIR``) as
``bench/results/demo.json``, from its run report: the base model's and each round's held-out pass@1 with intervals,
each round against the base model task by task as the promotion gate compares them (difference and one-sided 95%
bound), and each round's skill library scored against the env (right, wrong, recipe-blind rules).

    python -m bench.demo_result [--from demo-output | --base-model DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.common import write_result


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
        # the run report's figures: each round's evaluation (against the base model, task by task) and skills
        per_round = [{k: r[k] for k in ("round", "eval", "skills")} for r in summary["rounds"]]
        result = {"base": summary["base"], "per_round": per_round, "seconds": summary.get("seconds")}
        rows = [("base", f"test pass@1 {summary['base']['test']['pass@1']:.3f}")]
        rows += [(f"round {r['round']}", f"test pass@1 {r['eval']['test']['pass@1']:.3f}") for r in per_round]
        write_result("demo", result, rows, base=summary["base_model"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
