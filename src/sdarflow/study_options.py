"""The training options a study row may add to its method (``grpo+scpo``, ``sdar+ema+filter``): the one table of
what each option name sets, read by ``sdarflow study`` and the study pipeline."""

from __future__ import annotations

from typing import Any

from sdarflow.algo import METHODS
from sdarflow.errors import ConfigError

# Training options a study row may add to its method, as in `grpo+scpo` or `sdar+ema+filter`: the stage settings
# each stands for. A row is relative to plain grpo like every method.
OPTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "scpo": {"train": {"credit": "scpo"}},
    "progress": {"train": {"advantage": "progress"}},
    "filter": {"train": {"filter": "negative-value"}},
    "ema": {"train": {"ema_decay": 0.99}, "rescore": {"teacher": "ema"}},
    "ppl": {"train": {"reward": "perplexity-delta"}, "rescore": {"ppl_delta": True}},  # envs with a reference
}


def split_method(name: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """A study row's name -> (method, the stage settings of its options): ``grpo+scpo`` -> ("grpo", {"train":
    {"credit": "scpo"}}); ConfigError for an unknown method or option."""
    method, *options = name.split("+")
    if method not in METHODS:
        raise ConfigError(f"study: unknown method {method!r} in {name!r}; choose from {', '.join(METHODS)}")
    unknown = [o for o in options if o not in OPTIONS]
    if unknown or len(set(options)) != len(options):
        raise ConfigError(
            f"study: {name!r} names unknown or repeated option(s) {unknown or options}; options: "
            f"{', '.join(OPTIONS)} (e.g. grpo+scpo)"
        )
    settings: dict[str, dict[str, Any]] = {}
    for o in options:
        for stage, values in OPTIONS[o].items():
            settings[stage] = {**settings.get(stage, {}), **values}
    return method, settings
