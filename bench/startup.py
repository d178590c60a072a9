"""Start-up: ``sdarflow --help``, and each KFP component's start before real work (a fresh interpreter importing
what the task runs before its stage's ``run``: KFP's executor, the component, ``sdarflow.kfp_runtime`` and the
stage module). Medians of 5 fresh processes."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import write_result
from sdarflow.stages import STAGES, module_name

HELP_TARGET_S, COMPONENT_TARGET_S = 0.5, 3.0


def _seconds(argv: list[str], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _component_start(stage: str) -> float:
    component = "components." + stage.replace("-", "_")
    code = f"import kfp.dsl.executor_main, {component}, sdarflow.kfp_runtime, {module_name(stage)}"
    return _seconds([sys.executable, "-c", code])


def run(quick: bool = True) -> dict:
    cli = shutil.which("sdarflow", path=str(Path(sys.executable).parent)) or "sdarflow"  # this venv's
    help_s = _seconds([cli, "--help"])
    components = {stage: _component_start(stage) for stage in STAGES}
    result = {
        "help_seconds": help_s,
        "component_start_seconds": components,
        "targets": {
            "help_seconds": f"<= {HELP_TARGET_S}",
            "component_start_seconds": f"<= {COMPONENT_TARGET_S}",
        },
    }
    rows = [("sdarflow --help (s)", f"{help_s:.2f}")]
    rows += [(f"component {stage} start (s)", f"{s:.2f}") for stage, s in components.items()]
    write_result("startup", result, rows)
    return result
