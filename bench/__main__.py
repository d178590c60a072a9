"""``python -m bench [--quick] [names...]``: run the benchmarks, write bench/results/*.json, and rewrite the
result tables of README.md and docs/*.md from the results (``python -m bench.tables``)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

BENCHMARKS = [
    "startup",
    "data_plane",
    "train_step",
    "rescoring",
    "rollout",
    "generation",
    "pipeline_overhead",
    "plan_check",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller micro-benchmark sizes (rounds stay at the demo's size): ~2.5 hours on 2 cores",
    )
    parser.add_argument("names", nargs="*", choices=[*BENCHMARKS, []], help="benchmarks to run (default all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TQDM_DISABLE", "1")  # tables, not progress bars
    for name in args.names or BENCHMARKS:
        importlib.import_module(f"bench.{name}").run(quick=args.quick)
    from bench import tables

    tables.update()
    print("\nREADME.md, docs/*.md: result tables rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
