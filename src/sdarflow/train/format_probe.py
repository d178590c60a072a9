"""The format guard's per-step check (``--format-probe-every N``): a collapse can happen inside one round, between
two optimizer steps, where the round's rollouts (generated before the update) cannot show it.

Before the first step and after every ``N`` steps, the policy greedily answers a fixed sample of the round's prompts
(:data:`PROBES` turns with a response, the same every time) and the env parses the answers; the share it rejects is
the probe's format-error rate. It is compared with the probes before it (:func:`format_guard.format_spike`): the
earlier rounds' of the adapter's lineage (``train_summary.json`` keeps them under :data:`LINEAGE_KEY`, so a round
that starts collapsed is caught before its first step), then this round's. A spike warns, fails the round in one
line (``--format-guard fail``: nothing is published), or with ``repair`` triggers the remedy at once: SFT steps on
the round's SFT stream (the repaired malformed turns, plus the successful rows with ``--sft-ratio``; the successful
rows alone when no turn is repairable, as in TextWorld), each followed by a probe, until the rate is no longer a
spike or after :data:`REMEDY_STEPS`, besides the steps at the ``--format-repair-every`` cadence.

Greedy answers change only when the weights do, and the rates live in the checkpointed
:class:`~sdarflow.train.schedule.TrainState`, so a resumed run takes the same probes and remedies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sdarflow.train.format_guard import FormatCollapse, format_spike, suites_of

log = logging.getLogger(__name__)

PROBES = 16
PROBE_KEY = "format/probe_error_rate"  # in the step record of every probe
LINEAGE_KEY = "format_probe_rates"  # in train_summary.json: the lineage's probe rates, oldest first
REMEDY_KEY = "format/remedy_steps"  # in the step record after which the remedy ran: its SFT steps
AFTER_KEY = "format/probe_error_rate_after_remedy"
REMEDY_STEPS = 4  # the remedy's SFT steps after one probe at most


def probe_rows(rows: list[dict], n: int = PROBES) -> list[dict]:
    """``n`` of the rows with a response, evenly spaced in (group, episode, turn) order: the same rows for the
    same data, from every part of it."""
    ordered = sorted(
        (r for r in rows if r["response_token_ids"]), key=lambda r: (r["group_id"], r["traj_id"], r["turn"])
    )
    if len(ordered) <= n:
        return ordered
    return [ordered[i * len(ordered) // n] for i in range(n)]


class FormatProbe:
    """The per-step probe of one round; ``remedy(state)`` (``--format-guard repair``) takes one SFT step."""

    def __init__(self, rows: list[dict], tokenizer, eos_id: int, mode: str, every: int, remedy=None) -> None:
        from sdarflow.rollout.engine import action_tokens
        from sdarflow.rollout.loop import action_parser

        self.rows = probe_rows(rows)
        suites = suites_of(self.rows)
        self.parsers = {env: action_parser(suite) for env, suite in suites.items()}
        self.max_new_tokens = max((action_tokens(s, 0) for s in suites.values()), default=1)
        self.tokenizer, self.eos_id = tokenizer, eos_id
        self.mode, self.every, self.remedy = mode, every, remedy

    def rate(self, model) -> float:
        """The share of the probe rows whose greedy answer the env rejects (ended at the token limit included)."""
        from sdarflow.rollout.hf_engine import HFEngine

        was_training = model.training
        try:  # HFEngine puts the model in eval mode
            engine = HFEngine(model, self.tokenizer, self.eos_id, batch_size=len(self.rows))
            prompts = [list(r["prompt_token_ids"]) for r in self.rows]
            samples = engine.generate(
                prompts, [0] * len(prompts), max_new_tokens=self.max_new_tokens, temperature=0.0
            )
        finally:
            model.train(was_training)
        bad = sum(
            not self.parsers[r["env"]](s.text, s.finished)[1] for r, s in zip(self.rows, samples, strict=True)
        )
        return bad / max(1, len(self.rows))

    def start(self, model, state, lineage: list[float]) -> dict[str, float]:
        """The probe before any update, against the probes of the adapter's ``lineage`` (a round that starts
        collapsed is caught here); its metrics. A resumed run took it already: its rates are in ``state``."""
        if state.probe_rates:
            return {}
        state.probe_rates.extend(lineage)
        record = {"step": 0}
        self.check(model, state, record)
        return {f"format/start_{k.removeprefix('format/')}": v for k, v in record.items() if k != "step"}

    def after_step(self, model, state, record: dict) -> None:
        """Every ``every`` steps, :meth:`check` into the step's record."""
        if record["step"] % self.every == 0:
            self.check(model, state, record)

    def check(self, model, state, record: dict) -> None:
        """Probe, record the rate, and act on a spike against the probes before it."""
        rate = self.rate(model)
        baseline = format_spike(state.probe_rates, rate)
        state.probe_rates.append(rate)
        record[PROBE_KEY] = rate
        if baseline is None:
            return
        message = (
            f"format collapse at step {record['step']}: {rate:.1%} of {len(self.rows)} probe answers did not "
            f"parse, against {baseline:.1%} in the probes before"
        )
        if self.mode == "fail":
            raise FormatCollapse(
                f"{message}; fix: retrain this round with a lower --lr, or pass --format-guard repair to train the "
                f"malformed turns back"
            )
        if self.mode != "repair" or self.remedy is None:
            log.warning("train: %s (--format-guard %s: training on)", message, self.mode)
            return
        losses = []
        while baseline is not None and len(losses) < REMEDY_STEPS:  # repair until the probe recovers
            losses.append(self.remedy(state)["loss/total"])
            rate = self.rate(model)
            baseline = format_spike(state.probe_rates, rate)
            state.probe_rates.append(rate)
        record.update(
            {REMEDY_KEY: len(losses), AFTER_KEY: rate, "format/remedy_loss": sum(losses) / len(losses)}
        )
        log.warning("train: %s; took %d repair SFT step(s): %.1f%% after", message, len(losses), 100 * rate)


def with_probe(on_step: Callable[[dict], None] | None, probe: FormatProbe | None, model, state):
    """``on_step`` with the probe run first, so the step's record carries its rate."""
    if probe is None:
        return on_step

    def step(record: dict) -> None:
        probe.after_step(model, state, record)
        if on_step:
            on_step(record)

    return step


def round_probe(cfg, rows: list[dict], policy, engine, data, hp, schedule) -> FormatProbe | None:
    """The round's probe with ``--format-probe-every`` (None when 0, or with the guard off). With ``repair`` its
    remedy takes extra steps of the round's SFT stream (:func:`sdarflow.train.trainer.extra_sft_step`)."""
    from sdarflow.train.trainer import extra_sft_step

    if not cfg.format_probe_every or cfg.format_guard == "off":
        return None
    remedy = None
    if cfg.format_guard == "repair" and data.sft_pairs:

        def remedy(state) -> dict:
            return extra_sft_step(engine, data, hp, state, schedule.lr_at(state.step))

    return FormatProbe(
        rows, policy.tokenizer, policy.eos_id, cfg.format_guard, cfg.format_probe_every, remedy
    )
