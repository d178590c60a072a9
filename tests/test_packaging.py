"""Packaging: pyproject.toml asks for compatible ranges (``pip install sdarflow`` into an existing environment) that
admit every version requirements.lock pins, and a non-editable ``pip install .`` resolves against those versions
and runs."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split(";")[0].strip().split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_dependencies_are_ranges_that_admit_the_lock():
    lock = _lock()
    for spec in PROJECT["dependencies"]:
        req = Requirement(spec)
        assert not any(s.operator == "==" for s in req.specifier), f"{spec}: a range, not a pin"
        assert req.specifier, f"{spec}: give the tested version as its lower bound"
        pinned = lock[re.sub(r"[-_.]+", "-", req.name).lower()]
        assert req.specifier.contains(pinned.split("+")[0], prereleases=True), (
            f"{spec} excludes the lock's {pinned}"
        )


def test_the_version_is_the_packages():
    from sdarflow import __version__

    assert PROJECT["version"] == __version__


@pytest.mark.slow
def test_pip_install_into_a_fresh_venv_resolves_and_runs(tmp_path, pip_install_into_a_user_env):
    """A new venv that sees this environment's packages (a .pth file, as an existing environment would have them):
    ``pip install .`` (no index, no build isolation) must find every requirement satisfied by the ranges, build the
    wheel and give a working ``sdarflow``."""
    venv = pip_install_into_a_user_env(tmp_path / "venv", str(ROOT))
    version = subprocess.run([str(venv / "bin" / "sdarflow"), "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == f"sdarflow {PROJECT['version']}"
    # the installed package, not the checkout: components and pipelines ship in the same wheel
    code = "import sdarflow, components, pipelines.training; print(sdarflow.__file__)"
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert where.returncode == 0, where.stderr[-2000:]
    assert str(venv) in where.stdout
