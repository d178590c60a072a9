"""What happens at each optimizer step, as pure functions of the step counters: the learning rate (warmup, then
constant), whether the step is an RL or an SFT step (``sft_ratio``), and which rows an epoch visits in which order.
No RNG state: a resumed run needs only the counters in :class:`TrainState` to continue exactly where it stopped.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Literal

StepKind = Literal["rl", "sft"]
Mode = Literal["rl", "sft"]


@dataclass(frozen=True)
class WarmupConstant:
    """``lr * min(1, (start + step + 1) / warmup_steps)``: linear warmup over ``warmup_steps`` steps, then
    constant; ``start`` is the optimizer steps taken before this run (a carried optimizer's)."""

    lr: float
    warmup_steps: int = 0
    start: int = 0

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based: the step about to be taken)."""
        if self.warmup_steps <= 0:
            return self.lr
        return self.lr * min(1.0, (self.start + step + 1) / self.warmup_steps)

    def state_dict(self) -> dict:
        return {"kind": "warmup_constant", **asdict(self)}


def step_kinds(sft_ratio: float, mode: Mode = "rl") -> Iterator[StepKind]:
    """The endless sequence of step kinds: in ``rl`` mode, after RL step k (1-based) come
    ``floor(k * r) - floor((k - 1) * r)`` SFT steps, so ``r = 0.25`` gives one SFT step after every 4 RL steps and
    ``r = 2`` two after each. In ``sft`` mode every step is SFT."""
    if mode == "sft":
        yield from itertools.repeat("sft")
    # Fraction, not float: 0.1 * 10 must be exactly 1 so the pattern never drifts over a long run.
    r = Fraction(str(sft_ratio))
    for k in itertools.count(1):
        yield "rl"
        yield from itertools.repeat("sft", math.floor(k * r) - math.floor((k - 1) * r))


def total_steps(mode: Mode, epochs: int, mini_batches: int, sft_ratio: float, max_steps: int) -> int:
    """Optimizer steps of a run: ``max_steps`` if set (epochs cycle), else ``epochs * mini_batches`` passes of the
    main data plus, in ``rl`` mode, the SFT steps interleaved after them."""
    if max_steps > 0:
        return max_steps
    main = epochs * mini_batches
    if mode == "sft":
        return main
    return main + math.floor(main * Fraction(str(sft_ratio)))


def epoch_order(n: int, seed: int, epoch: int, stream: str) -> list[int]:
    """A permutation of ``range(n)`` that depends only on (stream, seed, epoch), so resuming needs no RNG state."""
    order = list(range(n))
    random.Random(f"{stream}:{seed}:{epoch}").shuffle(order)
    return order


def mini_batch(n: int, n_mini: int, seed: int, done: int, stream: str) -> tuple[int, int, list[int]]:
    """(epoch, position, indices) of the ``done``-th mini-batch (0-based) of a stream of ``n`` rows split into
    ``n_mini`` strided mini-batches per epoch."""
    epoch, position = divmod(done, n_mini)
    return epoch, position, epoch_order(n, seed, epoch, stream)[position::n_mini]


@dataclass
class TrainState:
    """Counters of a run: everything besides weights, optimizer and RNG that a checkpoint must restore."""

    step: int = 0  # optimizer steps taken (RL + SFT, skipped ones included)
    rl_steps: int = 0
    sft_steps: int = 0
    nonfinite_in_row: int = 0
    history: list[dict] = field(default_factory=list)
    # the format probe's rates so far, the start's first
    probe_rates: list[float] = field(default_factory=list)
    # (step, kept step): after this step the weights were the format rollback's target, kept at that step's probe
    rollback_at: tuple[int, int] | None = None
    # {"step", "approx_kl"}: the step --target-kl stopped the run before (not applied), and the KL it compared
    # (that step's, or with --target-kl-window the mean over the window)
    kl_stop: dict | None = None

    def cursor(self, rl_mini: int, sft_mini: int) -> dict[str, int]:
        """The data cursor: epoch and position in the shuffled order of each stream, and the step."""
        rl_epoch, rl_pos = divmod(self.rl_steps, max(1, rl_mini))
        sft_epoch, sft_pos = divmod(self.sft_steps, max(1, sft_mini))
        return {
            "step": self.step,
            "epoch": rl_epoch,
            "position": rl_pos,
            "sft_epoch": sft_epoch,
            "sft_position": sft_pos,
        }

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainState:
        return cls(
            step=int(d["step"]),
            rl_steps=int(d["rl_steps"]),
            sft_steps=int(d["sft_steps"]),
            nonfinite_in_row=int(d["nonfinite_in_row"]),
            history=list(d.get("history", [])),
            probe_rates=[float(x) for x in d.get("probe_rates", [])],
            rollback_at=tuple(int(x) for x in d["rollback_at"]) if d.get("rollback_at") else None,
            kl_stop=d.get("kl_stop"),
        )
