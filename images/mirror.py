"""Copy every third-party image sdarflow runs or builds on into your registry, and print how to pin the copies.

The images are named in two places only: the manifests' runtime images (vLLM, MinIO) in ``k8s/images``, and the
Dockerfiles' base images as ``*_IMAGE`` build arguments. Each is copied with ``skopeo copy --all`` (every
architecture, digests kept) to ``<mirror>/<its repository path>:<its tag>``; then pin the copies with the lines
printed: ``kustomize edit set image`` for the manifests, ``make images BUILD_ARGS=...`` for the builds, and
``registry serve-config --image`` for generated serving manifests. Run ``make mirror-images MIRROR=...``.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OURS = "ghcr.io/sdarflow/"  # built by `make images`, not mirrored
BASE_ARG = re.compile(r"^ARG (\w+_IMAGE)=(\S+)$", re.MULTILINE)


def runtime_images(root: Path = ROOT) -> list[str]:
    """``name:tag`` of each third-party image the manifests run (k8s/images pins them)."""
    pins = yaml.safe_load((root / "k8s" / "images" / "kustomization.yaml").read_text())["images"]
    return [f"{p['name']}:{p['newTag']}" for p in pins if not p["name"].startswith(OURS)]


def base_images(root: Path = ROOT) -> dict[str, str]:
    """Build argument -> default of each ``*_IMAGE`` base image argument of the Dockerfiles (one value per name)."""
    found: dict[str, str] = {}
    for dockerfile in sorted((root / "images").glob("Dockerfile.*")):
        if dockerfile.suffix == ".dockerignore":
            continue
        for name, image in BASE_ARG.findall(dockerfile.read_text()):
            if found.setdefault(name, image) != image:
                raise SystemExit(f"error: {name} is {found[name]} and {image} in images/; fix: make them one")
    return found


def repository(image: str) -> tuple[str, str]:
    """``image``'s registry host (``docker.io`` for Docker Hub) and repository path with its tag (an official
    Docker Hub image under ``library/``)."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return "docker.io", image if rest else f"library/{image}"


def mirrored(image: str, mirror: str) -> str:
    """``image`` in ``mirror``, under its repository path."""
    return f"{mirror.rstrip('/')}/{repository(image)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--to", required=True, metavar="REGISTRY/PREFIX", help="e.g. registry.example.com/mirror"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the copy commands, run nothing")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[\w.-]+(:\d+)?(/[\w.-]+)*", args.to):
        print(
            f"error: --to {args.to!r} is not REGISTRY[/PREFIX]; fix: e.g. registry.example.com/mirror",
            file=sys.stderr,
        )
        return 2
    bases = base_images()
    images = [*runtime_images(), *bases.values()]
    copies = [
        ["skopeo", "copy", "--all", f"docker://{'/'.join(repository(i))}", f"docker://{mirrored(i, args.to)}"]
        for i in images
    ]
    if not args.dry_run and shutil.which("skopeo") is None:
        print(
            "error: skopeo is not installed; fix: install it (apt install skopeo) or use --dry-run",
            file=sys.stderr,
        )
        return 2
    for command in copies:
        print(shlex.join(command), flush=True)
        if not args.dry_run:
            subprocess.run(command, check=True)
    print("\nPin the copies:")
    for image in runtime_images():
        name = image.rpartition(":")[0]
        print(f"  (cd k8s/images && kustomize edit set image {name}={mirrored(image, args.to)})")
    build_args = " ".join(f"--build-arg {name}={mirrored(image, args.to)}" for name, image in bases.items())
    print(f'  make images IMAGE_REPO=... BUILD_ARGS="{build_args}"')
    vllm = next((i for i in runtime_images() if i.startswith("vllm/")), None)
    if vllm:
        print(f"  sdarflow registry serve-config ... --image {mirrored(vllm, args.to)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
