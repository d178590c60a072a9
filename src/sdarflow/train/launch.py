"""Process setup of the train stage: deterministic mode (bit-exact kill/resume on CPU), the single-process
distributed environment DeepSpeed needs, and the multi-GPU path: the stage re-launches itself through ``torchrun``
with one process per GPU, passing its config as a YAML file (the KFP component has no command line to repeat);
rank 0 publishes, and the parent reads the published manifest back as the stage result.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from sdarflow import stopping
from sdarflow.errors import SdarflowError

log = logging.getLogger(__name__)

# Set by torchrun / the deepspeed launcher in every worker; its presence means "already launched".
LAUNCHED_ENV = "LOCAL_RANK"


class LaunchError(SdarflowError):
    """The multi-process training launch failed."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_process_group_env() -> None:
    """Without a launcher, describe a one-process group so DeepSpeed can initialize (a no-op under a launcher)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )


def resolve_engine(engine: str, device_count: int, env: Mapping[str, str] = os.environ) -> str:
    """The training engine ``auto`` stands for: deepspeed when this node has more than one GPU (it relaunches one
    worker per GPU) or this process is one of several launched workers (a TrainJob rank), else torch."""
    if engine != "auto":
        return engine
    return "deepspeed" if device_count > 1 or int(env.get("WORLD_SIZE", "1")) > 1 else "torch"


def should_relaunch(engine: str, device_count: int, env: Mapping[str, str] = os.environ) -> bool:
    """True when this process should start one worker per GPU instead of training itself."""
    if device_count <= 1 or LAUNCHED_ENV in env:
        return False
    if engine != "deepspeed":
        log.warning(
            "%d GPUs visible but engine %r trains on one; pass --engine deepspeed to use all",
            device_count,
            engine,
        )
        return False
    return True


def launcher_command(
    config_path: str | Path, nproc: int, master_port: int, python: str = sys.executable
) -> list[str]:
    """The ``torchrun`` command that runs ``sdarflow train --config CONFIG`` once per GPU on this node."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",  # single node: a local rendezvous, no external store
        f"--nproc-per-node={nproc}",
        f"--master-port={master_port}",
        "-m",
        "sdarflow.cli",
        "train",
        "--config",
        str(config_path),
    ]


def relaunch(config: dict, output: str, nproc: int) -> dict:
    """Run the train stage in ``nproc`` worker processes; return the stage result read from the published output."""
    import yaml

    from sdarflow import storage

    with tempfile.TemporaryDirectory(prefix="sdarflow-launch-") as tmp:
        path = Path(tmp) / "train.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=True))
        cmd = launcher_command(path, nproc, free_port())
        log.info("multi-GPU: launching %d workers: %s", nproc, " ".join(cmd))
        code = stopping.run_child(cmd).returncode  # a stopped launch stops torchrun, which stops its workers
    if code != 0:
        raise LaunchError(
            f"multi-GPU training exited with code {code}; fix: read the worker logs above "
            f"(rerun with the same --checkpoint-dir to resume)"
        )
    manifest = storage.read_manifest(output)
    metrics = manifest.get("metrics", {})
    return {"uri": output, "steps": int(metrics.get("train/steps", 0)), "metrics": metrics, "workers": nproc}


@contextlib.contextmanager
def deterministic_mode(enabled: bool) -> Iterator[None]:
    """Deterministic kernels and one intra-op thread (reduction order then never depends on the thread count);
    restored afterwards, because both settings are process-wide."""
    if not enabled:
        yield
        return
    # cuBLAS needs this before its first use to be deterministic (ignored on CPU).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (torch.are_deterministic_algorithms_enabled(), torch.get_num_threads())
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.set_num_threads(before[1])
