"""The training options of docs/training.md "Beyond SDAR" by name: the one table of what each option sets,
read by a study row (``grpo+scpo``, ``sdar+ema+filter``) and by the training pipeline's ``options`` parameter
(``scpo+ema``)."""

from __future__ import annotations

from typing import Any

from sdarflow.algo import METHODS
from sdarflow.errors import ConfigError

# Option name -> the stage settings it stands for.
OPTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "scpo": {"train": {"credit": "scpo"}},
    "progress": {"train": {"advantage": "progress"}},
    "filter": {"train": {"filter": "negative-value"}},
    # FORCE: the filter on a learned value head, fitted alone in the first round
    "force": {"train": {"filter": "negative-value", "value_estimate": "head", "value_warmup_rounds": 1}},
    "ema": {"train": {"ema_decay": 0.99}, "rescore": {"teacher": "ema"}},
    "ppl": {"train": {"reward": "perplexity-delta"}, "rescore": {"ppl_delta": True}},  # envs with a reference
}


def option_settings(options: list[str], where: str) -> dict[str, dict[str, Any]]:
    """The stage settings of ``options`` (later ones win); ConfigError naming ``where`` for an unknown or repeated
    one."""
    unknown = [o for o in options if o not in OPTIONS]
    if unknown or len(set(options)) != len(options):
        raise ConfigError(
            f"{where} names unknown or repeated option(s) {unknown or options}; fix: use each of "
            f"{', '.join(OPTIONS)} at most once (e.g. scpo+ema)"
        )
    settings: dict[str, dict[str, Any]] = {}
    for o in options:
        for stage, values in OPTIONS[o].items():
            settings[stage] = {**settings.get(stage, {}), **values}
    return settings


def split_method(name: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """A study row's name -> (method, the stage settings of its options): ``grpo+scpo`` -> ("grpo", {"train":
    {"credit": "scpo"}}); ConfigError for an unknown method or option."""
    method, *options = name.split("+")
    if method not in METHODS:
        raise ConfigError(
            f"study: unknown method {method!r} in {name!r}; fix: start the row with one of {', '.join(METHODS)}"
        )
    return method, option_settings(options, f"study: {name!r}")
