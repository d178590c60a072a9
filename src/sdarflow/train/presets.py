"""The SDAR reference scripts' objective settings per environment family, and how a run picks its family.

Every reference script (``examples/<method>_trainer/run_<env>*.sh`` in ZJU-REAL/SDAR) trains with a KL loss to the
reference policy (``low_var_kl``) and an invalid-action penalty whose coefficients depend on the environment
family; everything else in the objective (entropy 0.001, dual clip 3, lambda 0.01, beta 5, Skill-SD 0.001, RLSD
warm-down 100) is the same in all of them and lives as the train config's defaults. ``auto`` picks the family of
the environment that generated the training rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sdarflow.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preset:
    kl_coef: float  # actor_rollout_ref.actor.kl_loss_coef
    invalid_action_penalty: float  # actor_rollout_ref.actor.invalid_action_penalty_coef
    scripts: str  # the reference scripts these values come from


PRESETS: dict[str, Preset] = {
    "alfworld": Preset(0.01, 0.1, "examples/*_trainer/run_alfworld*.sh"),
    "webshop": Preset(0.01, 0.1, "examples/*_trainer/run_webshop*.sh"),
    "search": Preset(0.001, 0.01, "examples/*_trainer/run_search*.sh"),
}
PRESET_CHOICES: tuple[str, ...] = ("auto", *PRESETS)
# Built-in environments and the reference family each stands in for; plug-in envs fall back to DEFAULT_FAMILY.
ENV_FAMILY: dict[str, str] = {"textworld-cooking": "alfworld", "tool-use": "webshop", "search-qa": "search"}
DEFAULT_FAMILY = "alfworld"


def resolve(preset: str, envs: set[str]) -> str:
    """The reference family of a run: ``preset`` itself, or for ``auto`` the family of the rows' environment."""
    if preset != "auto":
        return preset
    families = {ENV_FAMILY.get(e, DEFAULT_FAMILY) for e in envs}
    if len({(PRESETS[f].kl_coef, PRESETS[f].invalid_action_penalty) for f in families}) > 1:
        raise ConfigError(
            f"train --preset auto: the input mixes environments {sorted(envs)} from different reference families "
            f"{sorted(families)}; fix: pass --preset {'|'.join(PRESETS)}"
        )
    unknown = sorted(e for e in envs if e not in ENV_FAMILY)
    if unknown:
        log.info("train: env(s) %s have no reference family; using %s settings", unknown, DEFAULT_FAMILY)
    return min(families) if families else DEFAULT_FAMILY
