"""A training run's per-step records: the progress line a pod log shows, ``metrics.jsonl`` (one flushed line per
step) and the run's summary metrics."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

# The format probe's (extensions.format_probe) keys in the record of a step after which it repaired or rolled back.
REMEDY_KEY = "format/remedy_steps"  # the remedy's SFT steps
ROLLBACK_KEY = "format/rolled_back_to_step"  # after a spike the remedy did not mend: the step returned to


def progress_line(r: dict) -> str:
    def f(key: str, digits: int) -> str:
        v = r.get(key)
        return "-" if v is None else f"{v:.{digits}f}"

    return (
        f"step {r['step']} {r.get('kind', 'rl')} | loss {f('loss/total', 4)} | pg {f('loss/pg', 4)} | "
        f"gate {f('sdar/gate_mean', 3)} | gap {f('sdar/teacher_gap_mean', 3)} | kl {f('actor/kl_loss', 4)} | "
        f"ent {f('actor/entropy', 3)} | clip {f('actor/clipfrac', 3)} | "
        f"grad {f('grad_norm', 3)} | lr {f('lr', 6)} | {r['seconds']:.2f} s/it"
    )


def finite(v) -> bool:
    """A finite number (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _line(record: dict) -> str:
    # inf/nan are not JSON (browsers and the KFP UI reject them): write null, the step's "skipped" says why.
    safe = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    return json.dumps(safe, sort_keys=True) + "\n"


def jsonl_writer(path: Path, history: list[dict] | None = None) -> Callable[[dict], None]:
    """Write ``history`` (steps restored from a checkpoint) to ``path``, then append one flushed JSON line per
    step, so a watcher (or a crash) sees every finished step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(map(_line, history or [])))

    def write(record: dict) -> None:
        with path.open("a") as f:
            f.write(_line(record))

    return write


# Per-step quantities a mean does not summarize: the run's totals, its overall rate and its final learning rate.
_TOTALS = ("seconds", "tokens")
# The format probe's remedy SFT steps and rollbacks are counted, not averaged.
_NOT_AVERAGED = ("step", "epoch", "position", "lr", "tokens_per_s", *_TOTALS, REMEDY_KEY, ROLLBACK_KEY)


def run_summary(history: list[dict]) -> dict[str, float]:
    """The run's summary: each loss/diagnostic metric's mean over the steps that have a finite value; total
    ``seconds`` and ``tokens``, their ratio ``tokens_per_s``, the final ``lr``; step, skipped and SFT counts (the
    SFT stream's interleaved steps; the probe's remedy steps and rollbacks are counted apart, where any ran)."""
    values: dict[str, list[float]] = {}
    for h in history:
        for k, v in h.items():
            if finite(v):
                values.setdefault(k, []).append(float(v))
    out = {
        (f"train/{k}" if "/" not in k else k): sum(v) / len(v)
        for k, v in values.items()
        if k not in _NOT_AVERAGED
    }
    for key in _TOTALS:
        out[f"train/{key}"] = sum(values.get(key, []))
    if out["train/seconds"] > 0:
        out["train/tokens_per_s"] = out["train/tokens"] / out["train/seconds"]
    if history and history[-1].get("lr") is not None:
        out["train/lr"] = float(history[-1]["lr"])
    out["train/steps"] = float(len(history))
    out["train/skipped_steps"] = float(sum(bool(h.get("skipped")) for h in history))
    out["train/sft_steps"] = float(sum(h.get("kind") == "sft" for h in history))
    if REMEDY_KEY in values:
        out[REMEDY_KEY] = sum(values[REMEDY_KEY])
    if ROLLBACK_KEY in values:
        out["format/rollbacks"] = float(len(values[ROLLBACK_KEY]))
    return out
