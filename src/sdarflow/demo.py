"""``sdarflow demo``: build the tiny base model if needed, run the SDAR training DAG through the KFP local runner
on the embedded defaults, and write ``summary.json``: the run report's figures and the last round's outputs (each
one validated)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from sdarflow import storage
from sdarflow.errors import SdarflowError
from sdarflow.evaluate.metrics import REPORT_KIND
from sdarflow.extensions.options import option_settings
from sdarflow.model_cache import local_model
from sdarflow.pipeline_config import PipelineConfig, generate_uris, new_run_id, run_uri, stage_uri
from sdarflow.provenance import provenance
from sdarflow.schema import RESCORED_SCHEMA, TRAJECTORY_SCHEMA
from sdarflow.sizes import SIZES, build_model
from sdarflow.start_point import default_preset, start_point

log = logging.getLogger(__name__)


class RunnerOutput:
    """stdout while the KFP local runner runs the demo's DAG, without the runner's plumbing (each task's executor
    input as JSON, component-loading lines, artifact reprs: ~1500 lines a demo). Lines it does not know pass."""

    PLUMBING = (
        "Looking for component",
        "Loading KFP component",
        "Wrote executor output file",
        "Streamed logs:",
    )

    MAX_SKIPPED = 400  # a block longer than this is not the runner's: stop dropping (a traceback must show)

    def __init__(self, out) -> None:
        self.out, self._partial, self._skip, self._skipped = out, "", "", 0

    def write(self, text: str) -> int:
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            if self._keep(line):
                self.out.write(line + "\n")
        return len(text)

    def _keep(self, line: str) -> bool:
        self._skipped = self._skipped + 1 if self._skip else 0
        if self._skipped > self.MAX_SKIPPED:
            self._skip = ""
        if self._skip == "input":  # the JSON the child logged at column 0, indented 4 by the runner
            self._skip = "" if line.rstrip() == "    }" else "input"
            return False
        if self._skip == "outputs":  # artifact reprs, up to the runner's separator line
            if not line.startswith("----"):
                return False
            self._skip = ""
            return True
        if line.endswith("Got executor_input:"):
            self._skip = "input"
            return False
        if "- INFO - Task " in line and (line.endswith(" outputs:") or line.endswith(" has no outputs")):
            self._skip = "outputs" if line.endswith(" outputs:") else ""
            return False
        return bool(line.strip()) and not any(p in line for p in self.PLUMBING)

    def flush(self) -> None:
        self.out.flush()


@contextlib.contextmanager
def quiet_runner() -> Iterator[None]:
    """The demo's stdout through ``RunnerOutput``, without the local runner's warnings about settings it ignores
    (display names, the cluster image): the demo runs the cluster's pipeline on purpose."""
    output = RunnerOutput(sys.stdout)
    with warnings.catch_warnings(), contextlib.redirect_stdout(output):
        warnings.filterwarnings("ignore", message=r"Task '.*': settings \[.*\] have no effect")
        warnings.filterwarnings("ignore", message=r"You may be attem\w* to run a task that uses custom")
        try:
            yield
        finally:
            output.write("\n")


def run_demo(
    out: str | Path,
    storage_root: str | None = None,
    rounds: int = 2,
    preset: str | None = None,
    base_model: str | None = None,
    shards: int = 1,
    options: str = "",
) -> dict:
    import kfp.local

    from pipelines.training import build_training_pipeline

    out = Path(out).absolute()
    t0 = time.perf_counter()
    # a bad option, preset or model fails before anything is written
    option_settings(options.split("+") if options else [], "demo --options")
    base, sizes = base_and_sizes(out, base_model, preset)
    out.mkdir(parents=True, exist_ok=True)
    storage_root = storage_root or str(out / "store")
    run_id = new_run_id()
    log.info("demo: run %s, %d round(s), storage %s", run_id, rounds, storage_root)

    settings = {"storage": storage_root, "base_model": str(base), "run_id": run_id, **sizes["pipeline"]}
    settings["options"] = options
    env = settings.get("env") or PipelineConfig().env
    settings.update(start_point(base, sizes, env, run_uri(storage_root, run_id), run_id))
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(out / "kfp-local"))
    pipeline = build_training_pipeline(rounds, shards)
    try:
        with quiet_runner():
            pipeline(**settings)
    except RuntimeError as err:  # the KFP local runner reports a failed task this way; its log is above
        first = str(err).splitlines()[0]
        raise SdarflowError(
            f"demo pipeline failed: {first}; fix: see the failing task's error above"
        ) from err

    summary = collect_summary(storage_root, run_id, rounds, str(base), shards)
    # the run report the pipeline's last task published, also as a file beside summary.json
    (out / "run_report.html").write_bytes(storage.read_member(summary["run_report"], "report.html"))
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    # what made these figures: the code, the base model's build and content id, the machine (its CPU kind: the
    # toy's build and so every figure differ between x86 CPU kinds)
    summary["made_by"] = provenance(str(base))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    log.info("demo finished in %.0f s: %s", summary["seconds"], out / "summary.json")
    return summary


def base_and_sizes(out: Path, base_model: str | None, preset: str | None) -> tuple[Path, dict]:
    """The base model's folder (a known model imported, or the preset's tiny model built into ``out``) and the
    preset's sizes (by default ``default_preset``'s)."""
    if base_model:
        base = Path(local_model(base_model))
        return base, SIZES[preset or default_preset(base)]
    preset = preset or "demo"
    return build_model(preset, out / "base-model", "demo"), SIZES[preset]


def collect_summary(storage_root: str, run_id: str, rounds: int, base_model: str, shards: int = 1) -> dict:
    """The run report's JSON (``run_report.json``, published by the pipeline's last task) with the base model and
    the last round's output URIs, each validated; with shards, ``trajectories`` lists the shards' URIs."""
    last = rounds - 1
    uri = {
        stage: stage_uri(storage_root, run_id, last, stage)
        for stage in ("extract-skills", "rescore", "train", "evaluate")
    }
    gen_uris = generate_uris(storage_root, run_id, last, shards)
    storage.read_table(gen_uris, kind="trajectories", schema=TRAJECTORY_SCHEMA)
    storage.read_table(uri["rescore"], kind="rescored", schema=RESCORED_SCHEMA)
    storage.read_manifest(uri["extract-skills"], "skills")
    storage.read_manifest(uri["train"], "adapter")
    storage.read_manifest(uri["evaluate"], REPORT_KIND)
    report = run_uri(storage_root, run_id, "report")
    return {
        **json.loads(storage.read_member(report, "run_report.json")),
        "base_model": base_model,
        "trajectories": gen_uris[0] if shards == 1 else gen_uris,
        "skills": uri["extract-skills"],
        "rescored": uri["rescore"],
        "adapter": uri["train"],
        "eval_report": uri["evaluate"],
        "registry": storage.join(storage_root, "registry"),
        "run_report": report,
    }
