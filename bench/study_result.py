"""Commit a method study: ``sdarflow study``'s ``DIR/study.json`` as ``bench/results/study_NAME.json``, with the
provenance the study recorded (code, base model, command, machine) lifted to the top as every result has it, and its
learning curves (the study report's) as ``study_NAME.png``; its table (README.md or docs/*.md) is then rendered by
``python -m bench.tables`` (markers ``study_NAME``).

    python -m bench.study_result DIR NAME [--reanalyse]

``--reanalyse`` recomputes the figures from the study's cells (``DIR/cells/*/cell.json``: every run's evaluations
and rounds) with this checkout's analysis (``sdarflow.study_report.analyze``), for a study that finished before the
analysis gained a figure; the cells' provenance stays the study's, and ``analysed_by`` records this code's. The
study folder's own study.json and reports are left as the study wrote them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.common import RESULTS, replace_file
from sdarflow.study_report import curves_png


def reanalysed(folder: Path, study: dict) -> dict:
    """study.json recomputed from the cells in ``folder`` with the settings the study recorded."""
    from sdarflow.provenance import code
    from sdarflow.study import BASE_CELL, CELL_FILE, cell_name
    from sdarflow.study_report import analyze

    settings = study["settings"]

    def cell(method: str, seed: int) -> dict:
        path = folder / "cells" / cell_name(method, seed) / CELL_FILE
        if not path.is_file():
            raise SystemExit(
                f"error: {path} is missing; fix: pass the study's --output folder (with its cells/), or finish the "
                f"study first (sdarflow study with the same --output resumes)"
            )
        return json.loads(path.read_text())

    base = [cell(BASE_CELL, seed) for seed in settings["seeds"]]
    cells = [cell(m, seed) for m in settings["methods"] for seed in settings["seeds"]]
    return analyze(settings, base, cells) | {"analysed_by": code()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("study", help="the study's --output folder (holding study.json)")
    p.add_argument("name", help="the result's name: bench/results/study_NAME.json")
    p.add_argument(
        "--reanalyse", action="store_true", help="recompute the figures from the cells with this code"
    )
    args = p.parse_args(argv)
    folder = Path(args.study)
    study = json.loads((folder / "study.json").read_text())
    if args.reanalyse:
        study = reanalysed(folder, study)
    made_by = dict(study["settings"]["provenance"])
    result = {
        "benchmark": f"study_{args.name}",
        "machine": made_by.pop("machine"),
        "provenance": made_by,
        **study,
    }
    path = RESULTS / f"study_{args.name}.json"
    replace_file(path, (json.dumps(result, indent=2, sort_keys=True) + "\n").encode())
    replace_file(path.with_suffix(".png"), curves_png(study))
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
