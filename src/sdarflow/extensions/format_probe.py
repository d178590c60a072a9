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
spike or after :data:`REMEDY_STEPS`, besides the steps at the ``--format-repair-every`` cadence. When the remedy
does not mend the spike (or there is nothing to train it on), the round rolls back (:class:`Rollback`) to the
weights, optimizer state and EMA teacher of its last probe that was not a spike, and goes on with the next batches:
the steps that broke the format are not retaken, as language-model pretraining restarts before a loss spike and
skips its batches.

Greedy answers change only when the weights do, and the rates live in the checkpointed
:class:`~sdarflow.train.schedule.TrainState`, so a resumed run takes the same probes and remedies. The rollback
target is kept outside the checkpoint, but the state records the steps after which the weights were the target
(kept or restored): a run resumed from such a step keeps its weights as the target again (its EMA average one update
later than the one kept), so it rolls back as the uninterrupted run; resumed from another step (one that did not
probe, or trained on after a spike), the target starts again at the first probe that is not a spike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from sdarflow.extensions.format_repair import suites_of
from sdarflow.train.format_guard import FormatCollapse, format_spike
from sdarflow.train.report import REMEDY_KEY, ROLLBACK_KEY

log = logging.getLogger(__name__)

PROBES = 16
PROBE_KEY = "format/probe_error_rate"  # in the step record of every probe
LINEAGE_KEY = "format_probe_rates"  # in train_summary.json: the lineage's probe rates, oldest first
AFTER_KEY = "format/probe_error_rate_after_remedy"
AFTER_ROLLBACK_KEY = "format/probe_error_rate_after_rollback"
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


class Rollback:
    """The engine's trainable weights and optimizer state (``engine.save``) at the last probe that was not a spike,
    in ``folder``, and the EMA teacher's average then (``ema``, in memory: LoRA-sized); ``restore`` puts both back.
    Collective under DeepSpeed, like the probe: every rank calls it.

    The probe runs before the step's EMA update, so the kept average is the one before that step, and the update
    that follows a restore adds the restored weights: the average is what it was at the kept step, as if the steps
    rolled back had not been taken (with ``--format-probe-every`` above 1 the steps between two probes moved it).
    Back to the start probe (step 0, before any update), that update adds the start weights once more."""

    def __init__(self, engine, folder: Path, ema=None) -> None:
        self.engine, self.folder, self.ema = engine, folder, ema
        self.step: int | None = None
        self.average: dict | None = None

    def keep(self, step: int) -> None:
        self.engine.save(self.folder)
        # a copy of the mapping is enough: an update replaces its tensors, never writes into them
        if self.ema:
            self.average = dict(self.ema.average)
        self.step = step

    def restore(self) -> int | None:
        """The step whose state is now back, or None when no probe of this run has passed yet."""
        if self.step is not None:
            self.engine.load(self.folder)
            if self.ema:
                self.ema.average = dict(self.average)
        return self.step


class FormatProbe:
    """The per-step probe of one round; ``remedy(state)`` (``--format-guard repair``) takes one SFT step, and
    ``rollback`` (with ``repair``) undoes the steps since the last good probe when the remedy does not mend."""

    def __init__(
        self,
        rows: list[dict],
        tokenizer,
        eos_id: int,
        mode: str,
        every: int,
        remedy=None,
        rollback=None,
        reduce_sum: Callable[[dict], dict] = lambda counts: counts,
    ) -> None:
        from sdarflow.rollout.engine import action_tokens
        from sdarflow.rollout.loop import action_parser

        self.rows = probe_rows(rows)
        suites = suites_of(self.rows)
        self.parsers = {env: action_parser(suite) for env, suite in suites.items()}
        self.max_new_tokens = max((action_tokens(s, 0) for s in suites.values()), default=1)
        self.tokenizer, self.eos_id = tokenizer, eos_id
        self.mode, self.every, self.remedy, self.rollback = mode, every, remedy, rollback
        self.reduce_sum = reduce_sum

    def rate(self, model) -> float:
        """The share of the probe rows whose greedy answer the env rejects (ended at the token limit included),
        over every rank (``reduce_sum``): ranks act on one rate, so they stay in step through remedy and rollback
        even where their greedy answers differ (bf16 kernels)."""
        from sdarflow.rollout.hf_engine import HFEngine

        was_training = model.training
        try:  # HFEngine puts the model in eval mode
            engine = HFEngine(model, self.tokenizer, self.eos_id, batch_size=len(self.rows))
            prompts = [list(r["prompt_token_ids"]) for r in self.rows]
            samples = engine.generate(
                prompts,
                [0] * len(prompts),
                max_new_tokens=self.max_new_tokens,
                temperature=0.0,
                logprobs=False,
            )
        finally:
            model.train(was_training)
        bad = sum(
            not self.parsers[r["env"]](s.text, s.finished)[1] for r, s in zip(self.rows, samples, strict=True)
        )
        counts = self.reduce_sum({"bad": float(bad), "answers": float(len(self.rows))})
        return counts["bad"] / max(1.0, counts["answers"])

    def start(self, model, state, lineage: list[float]) -> dict[str, float]:
        """The probe before any update, against the probes of the adapter's ``lineage`` (a round that starts
        collapsed is caught here); its metrics. A resumed run took it already: its rates are in ``state``, and
        its rollback target is its weights when the checkpoint's step left them the target."""
        if state.probe_rates:
            if self.rollback and state.rollback_at and state.rollback_at[0] == state.step:
                self.rollback.keep(state.rollback_at[1])
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
        if baseline is not None:
            self._on_spike(model, state, record, rate, baseline)
        elif self.rollback:
            self._keep(state, record["step"])

    def _on_spike(self, model, state, record: dict, rate: float, baseline: float) -> None:
        message = (
            f"format collapse at step {record['step']}: {rate:.1%} of {len(self.rows)} probe answers did not "
            f"parse, against {baseline:.1%} in the probes before"
        )
        if self.mode == "fail":
            raise FormatCollapse(
                f"{message}; fix: retrain this round with a lower --lr, or pass --format-guard repair to train the "
                f"malformed turns back"
            )
        if self.mode != "repair":
            log.warning("train: %s (--format-guard %s: training on)", message, self.mode)
            return
        losses = []
        while self.remedy and baseline is not None and len(losses) < REMEDY_STEPS:  # until the probe recovers
            losses.append(self.remedy(state)["loss/total"])
            baseline = self._reprobe(model, state, record, AFTER_KEY)
        if losses:
            record.update({REMEDY_KEY: len(losses), "format/remedy_loss": sum(losses) / len(losses)})
            message += f"; took {len(losses)} repair SFT step(s): {record[AFTER_KEY]:.1%} after"
        back = self.rollback.restore() if self.rollback and baseline is not None else None
        if back is not None:
            record[ROLLBACK_KEY] = back
            state.rollback_at = (record["step"], back)
            after = self._reprobe(model, state, record, AFTER_ROLLBACK_KEY)
            message += f"; rolled back to the weights of step {back}: {record[AFTER_ROLLBACK_KEY]:.1%} after"
            if after is not None:  # the kept weights passed: only nondeterministic kernels fail them now
                message += ", still a spike"
        elif baseline is not None:
            message += "; no earlier probe passed to roll back to, training on"
        elif self.rollback:  # the remedy mended it: the new target
            self._keep(state, record["step"])
        log.warning("train: %s", message)

    def _keep(self, state, step: int) -> None:
        self.rollback.keep(step)
        state.rollback_at = (step, step)

    def _reprobe(self, model, state, record: dict, key: str) -> float | None:
        """Probe again after a remedy step or a rollback, into ``record[key]``: the spike's baseline, or None once
        it has passed."""
        rate = self.rate(model)
        baseline = format_spike(state.probe_rates, rate)
        state.probe_rates.append(rate)
        record[key] = rate
        return baseline


def with_probe(on_step: Callable[[dict], None] | None, probe: FormatProbe | None, model, state):
    """``on_step`` with the probe run first, so the step's record carries its rate."""
    if probe is None:
        return on_step

    def step(record: dict) -> None:
        probe.after_step(model, state, record)
        if on_step:
            on_step(record)

    return step


@contextlib.contextmanager
def round_probe(
    cfg, rows: list[dict], policy, engine, data, schedule, ema=None
) -> Iterator[FormatProbe | None]:
    """The round's probe with ``--format-probe-every`` (None when 0, or with the guard off). With ``repair`` its
    remedy takes extra steps of the round's SFT stream (:func:`sdarflow.train.trainer.extra_sft_step`) and its
    rollback target (with ``ema``'s average) lives in a scratch folder, removed on exit."""
    from sdarflow.train.trainer import extra_sft_step

    if not cfg.format_probe_every or cfg.format_guard == "off" or not probe_rows(rows):
        yield None  # (no row with a response: train says so)
        return
    remedy = rollback = None
    if cfg.format_guard == "repair":
        if data.sft_pairs:

            def remedy(state) -> dict:
                return extra_sft_step(engine, data, cfg, state, schedule.lr_at(state.step))

        rollback = Rollback(engine, _scratch(engine), ema)
    try:
        yield FormatProbe(
            rows,
            policy.tokenizer,
            policy.eos_id,
            cfg.format_guard,
            cfg.format_probe_every,
            remedy,
            rollback,
            engine.all_reduce_sum,
        )
    finally:
        if rollback and engine.rank == 0:
            shutil.rmtree(rollback.folder, ignore_errors=True)


def _scratch(engine) -> Path:
    """A folder every worker of this launch names alike (ZeRO writes each rank's partition into one folder): the
    launcher's MASTER_PORT is unique per launch on a node; one process makes its own."""
    if engine.world_size > 1:
        return Path(tempfile.gettempdir()) / f"sdarflow-rollback-{os.environ['MASTER_PORT']}"
    return Path(tempfile.mkdtemp(prefix="sdarflow-rollback-"))
