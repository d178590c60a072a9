"""The research options' train flags (:class:`TrainOptions`, which the train stage's config extends), and the
options by name (docs/training.md "Beyond SDAR"): the one table of what each option sets, read by a study row
(``grpo+scpo``, ``sdar+ema+filter``) and by the training pipeline's ``options`` parameter (``scpo+ema``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sdarflow.algo import METHODS
from sdarflow.config import opt
from sdarflow.errors import ConfigError
from sdarflow.extensions.format_probe import PROBES
from sdarflow.extensions.value_head import ESTIMATES
from sdarflow.train.samples import CREDIT_ASSIGNERS, REWARDS, ROW_FILTERS, TOKEN_ADVANTAGES

log = logging.getLogger(__name__)


@dataclass
class TrainOptions:
    """The research options' flags of ``sdarflow train``, all off by default. The checks read the train stage's
    own fields too (engine, ZeRO stage, LoRA), so they run from its ``validate``."""

    credit: str = opt(
        "outcome",
        "turn credit: outcome (GRPO, every turn its episode's advantage) or scpo (a failed episode's turns shared "
        "with a successful sibling take the sibling's advantage)",
        choices=CREDIT_ASSIGNERS.names(),
    )
    advantage: str = opt(
        "outcome",
        "outcome (GRPO) or progress: + progress_coef * (old - reference log-prob) per token (needs ref_logprobs)",
        choices=TOKEN_ADVANTAGES.names(),
    )
    progress_coef: float = opt(0.1, "weight of the progress term (with --advantage progress)", ge=0)
    reward: str = opt(
        "outcome",
        "outcome (the episode's return) or perplexity-delta: + reward_coef * the turn's ppl_delta (rescore "
        "--ppl-delta) in its GRPO score",
        choices=REWARDS,
    )
    reward_coef: float = opt(1.0, "weight of the turn reward (with --reward perplexity-delta)", ge=0)
    filter: str = opt(
        "none",
        "negative-value: drop turns whose state's value (--value-estimate) is below the value of the group's start",
        choices=ROW_FILTERS.names(),
    )
    value_estimate: str = opt(
        "group",
        "--filter negative-value: group (the Monte-Carlo return of the group's rollouts through the state) or head "
        "(a linear value head on the policy's hidden state, refitted every round, carried in the adapter)",
        choices=ESTIMATES,
    )
    value_warmup_rounds: int = opt(
        0,
        "--value-estimate head: the first this many rounds fit only the head (the policy is not updated)",
        ge=0,
    )
    ema_decay: float = opt(
        0.0,
        "EMA teacher: after every optimizer step the adapter's ema/ (the teacher of rescore --teacher ema) moves "
        "to decay * ema + (1 - decay) * student; e.g. 0.99; 0 = off (LoRA only)",
        ge=0,
        le=1,
    )
    format_probe_every: int = opt(
        0,
        "--format-guard: also check within the round, before the first step and after every this many steps "
        f"(greedy answers to {PROBES} of the round's prompts, parsed by the env); 0 = per round only",
        ge=0,
    )

    def validate_options(self) -> None:
        if self.ema_decay and (
            self.zero_stage == 3 and self.engine != "torch" or not (self.lora_rank or self.adapter)
        ):
            raise ConfigError(
                "train: --ema-decay averages LoRA weights every step, which needs a LoRA adapter whose weights every "
                "rank holds; fix: train a LoRA (--lora-rank > 0) with --engine torch or --zero-stage 2, or pass "
                "--ema-decay 0"
            )
        if self.format_probe_every and self.zero_stage == 3 and self.engine != "torch":
            raise ConfigError(
                "train: --format-probe-every generates with the training model, which under ZeRO-3 hangs when "
                "ranks stop generating at different lengths (its layers are gathered by every rank together); fix: "
                "--zero-stage 2, or --format-probe-every 0"
            )
        if self.format_probe_every and (self.format_guard == "off" or self.mode == "sft"):
            log.warning("train: --format-probe-every has no effect with --format-guard off or --mode sft")
        if (self.value_estimate == "head" or self.value_warmup_rounds) and (
            self.filter != "negative-value" or self.value_estimate != "head"
        ):
            raise ConfigError(
                "train: --value-estimate head and --value-warmup-rounds fit the value head of the negative-value "
                "filter; fix: pass --filter negative-value --value-estimate head, or leave both unset"
            )


# Option name -> the stage settings it stands for.
OPTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "scpo": {"train": {"credit": "scpo"}},
    "progress": {"train": {"advantage": "progress"}},
    "filter": {"train": {"filter": "negative-value"}},
    # FORCE: the filter on a learned value head, fitted alone in the first round
    "force": {"train": {"filter": "negative-value", "value_estimate": "head", "value_warmup_rounds": 1}},
    "ema": {"train": {"ema_decay": 0.99}, "rescore": {"teacher": "ema"}},
    "ppl": {"train": {"reward": "perplexity-delta"}, "rescore": {"ppl_delta": True}},  # envs with a reference
    # the teacher contexts that are controls (docs/training.md "Teacher contexts"): production refuses what they train
    "solution": {"rescore": {"teacher_context": "solution"}},
    "synthetic": {"rescore": {"teacher_context": "synthetic"}},
    "synthetic-noise": {"rescore": {"teacher_context": "synthetic", "synthetic_label_noise": 0.5}},
}


def option_settings(options: list[str], where: str) -> dict[str, dict[str, Any]]:
    """The stage settings of ``options``; ConfigError naming ``where`` for an unknown or repeated one, or two that
    set one field to different values (solution+synthetic: which teacher would the row's name mean?)."""
    unknown = [o for o in options if o not in OPTIONS]
    if unknown or len(set(options)) != len(options):
        raise ConfigError(
            f"{where} names unknown or repeated option(s) {unknown or options}; fix: use each of "
            f"{', '.join(OPTIONS)} at most once (e.g. scpo+ema)"
        )
    settings: dict[str, dict[str, Any]] = {}
    set_by: dict[tuple[str, str], str] = {}
    for o in options:
        for stage, values in OPTIONS[o].items():
            for key, value in values.items():
                other = set_by.setdefault((stage, key), o)
                if settings.get(stage, {}).get(key, value) != value:
                    raise ConfigError(
                        f"{where}: options {other} and {o} set {stage} {key} differently; fix: keep one of them"
                    )
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
