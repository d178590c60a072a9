"""The train stage's research options within one round, behind the calls the stage makes: the EMA teacher's
moving average (``--ema-decay``, :mod:`.ema`), the learned value head (``--value-estimate head``,
:mod:`.value_head`), the format probe (``--format-probe-every``, :mod:`.format_probe`) and the format repair
(``--format-guard repair``, :mod:`.format_repair`). Each is None when off.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from sdarflow.extensions.ema import EMA_DIR, EmaWeights, previous_average, with_ema_step
from sdarflow.extensions.format_probe import LINEAGE_KEY as PROBE_LINEAGE
from sdarflow.extensions.format_probe import round_probe, with_probe
from sdarflow.extensions.format_repair import repair_pairs
from sdarflow.extensions.value_head import ValueHead, fit_round, policy_states
from sdarflow.train.format_guard import lineage_rates


class RoundOptions:
    """The options of a round whose student is ``model``: the moving average the input ``adapter`` carries (or the
    start weights), and the value head it carries (or a new one)."""

    def __init__(self, cfg, model, adapter: str | None) -> None:
        self.cfg = cfg  # resolved (train.rl_setup.resolve_objective)
        self.ema = (
            EmaWeights(model, cfg.ema_decay, previous_average(adapter, model)) if cfg.ema_decay else None
        )
        self.head = ValueHead.load(adapter) if cfg.value_estimate == "head" else None
        self.probe = None

    def repairs(self, rows: list[dict], policy, shaping) -> list:
        """``--format-guard repair`` on an RL round: SFT pairs of its repairable malformed turns (their counts go to
        the shaping's metrics)."""
        if not (shaping and self.cfg.format_guard == "repair"):
            return []
        pairs, metrics = repair_pairs(rows, policy.tokenizer, policy.eos_id)
        shaping.metrics.update(metrics)
        return pairs

    def state_values(self, engine, pad_id: int, rows: list[dict]):
        """(each row's state value from the head refitted on this round, or None; the fit's metrics; whether the
        round is a ``--value-warmup-rounds`` one, which updates no policy weight)."""
        if not self.head:
            return None, {}, False
        return fit_round(
            self.head, policy_states(engine, pad_id, self.cfg.micro_batch_tokens), self.cfg, rows
        )

    @contextlib.contextmanager
    def probing(self, rows: list[dict], policy, engine, data, schedule, active: bool):
        """Inside, :attr:`probe` is the round's format probe (None when off, or when not ``active``)."""
        if not active:
            yield
            return
        with round_probe(self.cfg, rows, policy, engine, data, schedule, self.ema) as self.probe:
            yield

    def start(self, model, state) -> dict[str, float]:
        """The probe's baseline metrics before the first step, measured against the lineage's earlier rates."""
        return (
            self.probe.start(model, state, lineage_rates(self.cfg.adapter, PROBE_LINEAGE))
            if self.probe
            else {}
        )

    def on_step(self, writer, model, state):
        """The trainer's on_step: the probe first, then ``writer`` (the metrics line), then the average's step."""
        return with_probe(with_ema_step(writer, self.ema), self.probe, model, state)

    def lineage(self, state, warmup: bool) -> dict:
        """The probe rates train_summary.json carries for the next round: this run's, or on a warm-up round its
        input's, passed on."""
        if not (self.probe or warmup):
            return {}
        return {
            PROBE_LINEAGE: state.probe_rates if self.probe else lineage_rates(self.cfg.adapter, PROBE_LINEAGE)
        }

    def save(self, out: Path) -> None:
        """The average (``ema/``) and the head beside the published weights."""
        if self.ema:
            self.ema.save(out / EMA_DIR)
        if self.head:
            self.head.save(out)
