"""What made a result: the code (sdarflow's version, git commit and uncommitted changes), the base model (its build
spec hash and content fingerprint), the command line and the machine. Every committed result and every study cell
records it; a study reuses a cell only when ``reuse_key`` matches, so a cell made by other code, another base build
or another machine is never mixed into a new table.

Identical results need the same seed, the same code, the same base build, the same CPU kind (or GPU), the same
torch and the same number of torch threads (the order of float reductions); change any of them and a number may
move within its noise.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from sdarflow import __version__

_SOURCE = Path(__file__).resolve().parent


def _git(source: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):  # no git, or an installed wheel (no checkout)
        return None
    return out.stdout


def code(source: Path = _SOURCE) -> dict[str, Any]:
    """sdarflow's version, the git commit of ``source`` (outside a checkout: ``$SDARFLOW_COMMIT``, set by the
    images, else None) and a hash of the uncommitted changes outside ``bench/results`` (None when there are none)."""
    commit = _git(source, "rev-parse", "HEAD")
    # results written into the checkout are outputs, not code: a benchmark that commits one must not change the
    # code its next run (or a study reusing its cells) is keyed on
    diff = _git(source, "diff", "HEAD", "--", ":(top)", ":(top,exclude)bench/results") if commit else None
    return {
        "sdarflow": __version__,
        "commit": commit.strip() if commit else os.environ.get("SDARFLOW_COMMIT") or None,
        "uncommitted": hashlib.sha256(diff.encode()).hexdigest()[:12] if diff else None,
    }


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next(
        (ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine()
    )


def machine() -> dict[str, Any]:
    """The machine a result was measured on."""
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu": _cpu_model(),
        # the vector kernels ATen picked (AVX2, AVX512, ...): they set the order of float reductions, so two CPUs
        # of one name (cloud VMs often report "AMD EPYC") give other bits where this differs
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def base_model(path: str | None) -> dict[str, Any] | None:
    """The base model by its build (the spec hash ``build-model`` recorded) and its content (config and weights'
    fingerprint), not only by its path; a known model's name is read in its imported folder."""
    if not path:
        return None
    from sdarflow.model_cache import local_model
    from sdarflow.models.gguf_import import KNOWN
    from sdarflow.stages.common import content_id
    from sdarflow.train.warmstart import BUILD_FILE

    folder = local_model(path) if path in KNOWN else path
    info = Path(folder) / BUILD_FILE
    spec_hash = json.loads(info.read_text()).get("spec_hash") if info.is_file() else None
    return {"path": str(path), "spec_hash": spec_hash, "content_id": content_id(str(folder))}


def provenance(base: str | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    """Everything above for one result; ``argv`` defaults to this process's command line."""
    # orig_argv keeps "-m bench.x" (sys.argv[0] would be the module's file)
    command = argv if argv is not None else [Path(sys.orig_argv[0]).name, *sys.orig_argv[1:]]
    return {**code(), "base_model": base_model(base), "command": shlex.join(command), "machine": machine()}


def reuse_key(p: dict[str, Any]) -> dict[str, Any]:
    """What must match for a result to stand for a new run: code, base model content and the machine's compute
    (not the command line, the base model's path or the OS kernel's version)."""
    m = p["machine"]
    base = p.get("base_model") or {}
    return {
        "code": [p["sdarflow"], p["commit"], p["uncommitted"]],
        "base_model": [base.get("spec_hash"), base.get("content_id")],
        "machine": [m["cpu"], m.get("cpu_capability"), m["torch"], m["torch_threads"], m["cuda"]],
    }
