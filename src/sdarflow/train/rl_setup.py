"""What an RL round trains with, from the train config and its rows: the preset's KL and penalty resolved, each
row's advantage with the chosen credit and filter, and the format-collapse check. The SFT mode uses none of it.

The presets are the SDAR reference scripts' objective settings per environment family: every reference script
(``examples/<method>_trainer/run_<env>*.sh`` in ZJU-REAL/SDAR) trains with a KL loss to the reference policy
(``low_var_kl``) and an invalid-action penalty whose coefficients depend on the environment family; everything
else in the objective (entropy 0.001, dual clip 3, lambda 0.01, beta 5, Skill-SD 0.001, RLSD warm-down 100) is the
same in all of them and lives as the train config's defaults. ``auto`` picks the family of the environment that
generated the training rows."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from fractions import Fraction

import torch

from sdarflow.errors import ConfigError
from sdarflow.train.format_guard import check_round
from sdarflow.train.samples import (
    ROW_FILTERS,
    TOKEN_ADVANTAGES,
    advantage_stats,
    make_samples,
    row_advantages,
    row_scores,
)
from sdarflow.train.sft import sft_pairs_from_rows
from sdarflow.train.trainer import TrainData

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
ENV_FAMILY: dict[str, str] = {
    "textworld-cooking": "alfworld",
    "textworld-cooking-score": "alfworld",
    "tool-use": "webshop",
    "search-qa": "search",
}
DEFAULT_FAMILY = "alfworld"


def preset_family(preset: str, envs: set[str]) -> str:
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


@dataclass
class Shaping:
    advantages: list[float]  # per row
    dropped: list[bool]  # per row: left out of the update by the filter
    format_rates: list[float]  # this lineage's format-error rate per round, this round's last
    metrics: dict[str, float]
    warmup: bool = False  # a --value-warmup-rounds round: the value head is fitted, the policy is not updated


def resolve_objective(cfg, rows: list[dict]):
    """(cfg with --preset's KL and penalty filled in, RL step) for an RL run; the SFT mode uses neither. Round r
    trains at RL step r + 1, so RLSD's weight decays across a pipeline's rounds as across the reference's steps."""
    if cfg.mode != "rl":
        return dataclasses.replace(cfg, kl_coef=0.0, invalid_action_penalty=0.0), 0
    preset = PRESETS[preset_family(cfg.preset, {r["env"] for r in rows})]
    kl_coef = preset.kl_coef if cfg.kl_coef is None else cfg.kl_coef
    needs = {f"kl_coef = {kl_coef}": "--kl-coef 0"} if kl_coef != 0 else {}  # what needs them: its fix
    if cfg.advantage == "progress":
        needs["--advantage progress"] = "--advantage outcome"
    missing = sum(r["ref_logprobs"] is None for r in rows if r["response_token_ids"])
    if needs and missing:
        raise ConfigError(
            f"train: {' and '.join(needs)} need{'s' if len(needs) == 1 else ''} reference log-probs, but {missing} "
            f"rescored row(s) have none (rescored with --no-ref-logprobs); fix: rescore with --ref-logprobs or "
            f"pass {' and '.join(needs.values())}"
        )
    penalty = (
        preset.invalid_action_penalty if cfg.invalid_action_penalty is None else cfg.invalid_action_penalty
    )
    return dataclasses.replace(cfg, kl_coef=kl_coef, invalid_action_penalty=penalty), rl_step_of(rows)


def rl_step_of(rows: list[dict]) -> int:
    """The RL step the rows train at (the reference's global step): their round + 1."""
    return max((int(r["round"]) for r in rows), default=0) + 1


def rl_shaping(cfg, rows: list[dict], values: torch.Tensor | None = None, warm: bool = False) -> Shaping:
    """The round's advantages and dropped rows (cfg resolved by :func:`resolve_objective`; FormatCollapse on a
    spike with ``--format-guard fail``). ``values`` (a learned head's, ``--value-estimate head``) drive the filter in
    place of the group's estimate; ``warm`` marks a warm-up round, which updates no policy weight."""
    rates, metrics = check_round(rows, cfg.adapter, cfg.format_guard)
    penalty, coef = cfg.invalid_action_penalty, reward_coef(cfg, rows)
    advantages = row_advantages(
        rows, cfg.norm_by_std, penalty, cfg.adv_stats == "episode", cfg.credit, coef, cfg.episode_weight
    )
    dropped = ROW_FILTERS.get(cfg.filter)(rows, row_scores(rows, penalty, coef), values)
    metrics.update(advantage_stats(rows, advantages))
    if cfg.filter != "none":
        metrics["filter/dropped_share"] = sum(dropped) / max(1, len(rows))
    kept = [r for r, d in zip(rows, dropped, strict=True) if r["response_token_ids"] and not d]
    if not warm and cfg.filter != "none" and rows and not kept:
        raise ConfigError(
            f"train: --filter {cfg.filter} dropped every row of this round ({len(rows)}); fix: pass --filter "
            f"none for it, or generate more rollouts per task (a larger group shares more states)"
        )
    return Shaping(advantages, dropped, rates, metrics, warm)


def reward_coef(cfg, rows: list[dict]) -> float:
    """The turn reward's weight in the GRPO score: ``--reward-coef`` with ``--reward perplexity-delta``, else 0."""
    if cfg.reward == "outcome":
        return 0.0
    if all(r["ppl_delta"] is None for r in rows):
        raise ConfigError(
            "train: --reward perplexity-delta needs the rescored ppl_delta column, but every row's is null (not "
            "rescored with --ppl-delta, or every episode took one turn: a last turn has none); fix: rescore with "
            "--ppl-delta, or pass --reward outcome"
        )
    return cfg.reward_coef


def train_inputs(
    cfg, rows: list[dict], shaping: Shaping | None, policy, rl_step: int, repaired: list, replayed: list
) -> TrainData:
    """The trainer's data. SFT steps train on the successful rows (``--sft-ratio``) and the ``replayed`` earlier
    successes (``--replay``); with ``repaired`` malformed turns (``--format-guard repair``), on those too, at least
    once every ``--format-repair-every`` RL steps (only on them when ``--sft-ratio`` is 0)."""
    sft = [*sft_pairs_from_rows(rows), *replayed]
    floor = Fraction(0)
    if repaired:
        sft = [*sft, *repaired] if cfg.sft_ratio > 0 else repaired
        floor = Fraction(1, cfg.format_repair_every)
    samples = make_samples(rows, shaping.advantages, shaping.dropped) if shaping else []
    token_advantages = TOKEN_ADVANTAGES.get(cfg.advantage)(cfg)
    return TrainData(samples, sft, policy.tokenizer.pad_token_id, rl_step, floor, token_advantages)
