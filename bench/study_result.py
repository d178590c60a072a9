"""Commit a method study: ``sdarflow study``'s ``DIR/study.json`` as ``bench/results/study_NAME.json``, with the
provenance the study recorded (code, base model, command, machine) lifted to the top as every result has it; its
table (README.md or docs/*.md) is then rendered by ``python -m bench.tables`` (markers ``study_NAME``).

    python -m bench.study_result DIR NAME
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.common import RESULTS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", help="the study's --output folder (holding study.json)")
    p.add_argument("name", help="the result's name: bench/results/study_NAME.json")
    args = p.parse_args(argv)
    study = json.loads((Path(args.study) / "study.json").read_text())
    made_by = dict(study["settings"]["provenance"])
    result = {
        "benchmark": f"study_{args.name}",
        "machine": made_by.pop("machine"),
        "provenance": made_by,
        **study,
    }
    path = RESULTS / f"study_{args.name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
