"""What several commands share: JSON/YAML output, ``KEY=VALUE`` flags, the demo presets' names, study flags."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sdarflow.errors import ConfigError

# sdarflow.sizes.SIZES' names (a test keeps them equal; importing it here would slow every --help)
PRESET_NAMES = ("demo", "smoke", "gpu")
PRESET_HELP = "sizes: demo (2 CPU cores, ~15 min), smoke (tests), gpu (one GPU machine with sdarflow[gpu])"


def output_flag(p: argparse.ArgumentParser, help: str, **kwargs: Any) -> None:
    """The one spelling of "where this command writes" across commands: ``--output``, as the stages spell it.
    ``--out``, the old spelling of demo, study, build-model, plan and the pipeline and registry commands, stays an
    alias for this release (``dest`` is still ``out``)."""
    default = kwargs.get("default")
    shown = f"{help} (default {default})" if default else help
    p.add_argument(
        "--output", "--out", dest="out", metavar="PATH", help=f"{shown}; --out: the old spelling", **kwargs
    )


def policy_name_flag(p: argparse.ArgumentParser, help: str, **kwargs: Any) -> None:
    """``--policy-name``, as the pipeline and evaluate spell the registry's adapter name; ``--name``, the registry
    commands' old spelling, stays an alias for this release (``dest`` is ``name``)."""
    p.add_argument("--policy-name", "--name", dest="name", help=f"{help}; --name: the old spelling", **kwargs)


def emit(obj: Any, as_json: bool = True) -> None:
    """A command's result on stdout (JSON, or YAML), so scripts can read it; logs go to stderr."""
    if as_json:
        sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(obj, sort_keys=False))


def pairs(values: list[str] | None, flag: str) -> dict[str, str]:
    """``KEY=VALUE`` flags as a dict; a value may itself contain '='."""
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r} is not KEY=VALUE; fix: e.g. {flag} train=8")
        out[key.strip()] = value.strip()
    return out


def study_flags(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """--methods and --seeds, shared by ``sdarflow study`` and ``pipeline compile --pipeline study``."""
    from sdarflow.study import DEFAULT_METHODS, DEFAULT_SEEDS
    from sdarflow.training_options import OPTIONS

    p.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        metavar="METHOD[+OPTION...]",
        help=f"{prefix}must include grpo (the baseline); +OPTION adds a training option ({', '.join(OPTIONS)}), "
        f"e.g. grpo+scpo",
    )
    p.add_argument(
        "--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS), help=f"{prefix}seeds per method"
    )
