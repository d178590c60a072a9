"""The reference scripts' per-environment settings and how a run picks them."""

from __future__ import annotations

import pytest

from sdarflow.errors import ConfigError
from sdarflow.train.rl_setup import PRESETS, preset_family


def test_reference_values():
    # examples/*_trainer/run_{alfworld,webshop,search}*.sh: kl_loss_coef and invalid_action_penalty_coef
    assert (PRESETS["alfworld"].kl_coef, PRESETS["alfworld"].invalid_action_penalty) == (0.01, 0.1)
    assert (PRESETS["webshop"].kl_coef, PRESETS["webshop"].invalid_action_penalty) == (0.01, 0.1)
    assert (PRESETS["search"].kl_coef, PRESETS["search"].invalid_action_penalty) == (0.001, 0.01)


@pytest.mark.parametrize(
    ("envs", "family"),
    [
        ({"textworld-cooking"}, "alfworld"),
        ({"textworld-cooking-score"}, "alfworld"),  # the same games, another reward
        ({"tool-use"}, "webshop"),
        ({"search-qa"}, "search"),
        ({"my-plugin-env"}, "alfworld"),
        ({"textworld-cooking", "tool-use"}, "alfworld"),  # different envs, same settings
        (set(), "alfworld"),
    ],
)
def test_auto_follows_the_env(envs, family):
    assert preset_family("auto", envs) == family


def test_explicit_preset_wins_and_mixed_families_fail_with_the_fix():
    assert preset_family("search", {"textworld-cooking"}) == "search"
    with pytest.raises(ConfigError, match="fix: pass --preset"):
        preset_family("auto", {"search-qa", "textworld-cooking"})
