"""The EMA teacher: an exponential moving average of the student's LoRA weights, published beside the adapter as a
second PEFT adapter (``ema/``) that rescore's ``--teacher ema`` scores the teacher pass with.

A teacher that is the current student (plus skills) moves with every update, so the distillation target drifts
with the policy it corrects; an average over the recent students is a steadier target (mean-teacher
self-distillation, as in BYOL and DINO). The average is updated after every optimizer step, kept in float32 on the
CPU (LoRA weights are small), carried from round to round in the adapter, and saved with each checkpoint, so a
resumed run continues the same average.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file

log = logging.getLogger(__name__)

EMA_DIR = "ema"  # inside a published adapter: the teacher's adapter folder
PEFT_WEIGHTS = "adapter_model.safetensors"
EMA_ADAPTER = "ema"  # the PEFT adapter name the teacher pass runs under


def ema_update(average: torch.Tensor, value: torch.Tensor, decay: float) -> torch.Tensor:
    """``decay * average + (1 - decay) * value`` (no gradient): one step of the moving average."""
    return decay * average.detach() + (1.0 - decay) * value.detach().to(average.dtype)


def _trainable(model) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


class EmaWeights:
    """The moving average of ``model``'s trainable weights, starting at ``previous`` (the input adapter's average)
    or, for a lineage without one, at the weights the student starts this round with."""

    def __init__(self, model, decay: float, previous: dict[str, torch.Tensor] | None = None) -> None:
        self.model, self.decay = model, decay
        current = {n: p.detach().float().cpu().clone() for n, p in _trainable(model).items()}
        self.average = current if previous is None else _matching(previous, current)

    def update(self) -> None:
        for name, p in _trainable(self.model).items():
            self.average[name] = ema_update(self.average[name], p.detach().float().cpu(), self.decay)

    def save(self, folder: Path) -> None:
        """The average as a PEFT adapter folder (the student's adapter config, the averaged LoRA weights)."""
        self.model.save_pretrained(folder, state_dict={**self.model.state_dict(), **self.average})


def with_ema_step(on_step, ema: EmaWeights | None):
    """The trainer's on_step callback: ``on_step`` (the metrics line; None on ranks that write none), then one
    step of the average."""

    def step(record: dict) -> None:
        if on_step:
            on_step(record)
        if ema:
            ema.update()

    return step


def _matching(previous: dict[str, torch.Tensor], current: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from sdarflow.errors import ModelError

    if set(previous) != set(current) or any(previous[k].shape != current[k].shape for k in current):
        raise ModelError(
            "the adapter's EMA teacher (ema/) does not match its LoRA weights (another rank or target modules); "
            "fix: start the lineage again, or pass --ema-decay 0"
        )
    return {k: v.float().clone() for k, v in previous.items()}


def previous_average(adapter_dir: str | None, model) -> dict[str, torch.Tensor] | None:
    """The EMA carried by the input adapter (``ema/`` in its folder), keyed like ``model``'s parameters; None when
    there is no adapter or it has no EMA (its lineage starts the average now)."""
    if not adapter_dir or not (Path(adapter_dir) / EMA_DIR / PEFT_WEIGHTS).is_file():
        return None
    saved = load_file(str(Path(adapter_dir) / EMA_DIR / PEFT_WEIGHTS))
    # PEFT saves a weight under its live name without the adapter's name (get_peft_model_state_dict removes
    # ".default"): "...lora_A.default.weight" -> "...lora_A.weight", "...lora_embedding_A.default" -> "..._A"
    name = f".{model.active_adapter}"
    live = {n.replace(name, ""): n for n in _trainable(model)}
    return {live.get(k, k): v for k, v in saved.items()}


@contextlib.contextmanager
def ema_teacher(model, adapter_dir: str | None) -> Iterator[None]:
    """Inside, ``model`` (the student: a PEFT model with its adapter) runs with its adapter's EMA (``ema/``)
    loaded as a second LoRA adapter instead; the student's adapter is active again on exit.

    Without an adapter (round 0) the student is the base model, and so is its average. An adapter without an
    average (trained with --ema-decay 0, or before it existed: a pipeline's start adapter) is where train starts
    one, at the current weights, so the teacher is the student this round (a warning says so)."""
    folder = Path(adapter_dir) / EMA_DIR if adapter_dir else None
    if folder is None or not (folder / PEFT_WEIGHTS).is_file():
        if folder is not None:
            log.warning(
                "rescore --teacher ema: %s has no %s/ yet; the teacher is the current student",
                adapter_dir,
                EMA_DIR,
            )
        yield
        return
    from peft import PeftModel

    from sdarflow.errors import ModelError

    if not isinstance(model, PeftModel):
        raise ModelError(
            f"rescore --teacher ema: the adapter {adapter_dir} was merged into the model's weights, so its EMA "
            f"cannot run beside it; fix: pass the adapter as a PEFT folder (unmerged), or --teacher current"
        )
    student = model.active_adapter
    model.load_adapter(str(folder), adapter_name=EMA_ADAPTER)
    model.set_adapter(EMA_ADAPTER)
    try:
        yield
    finally:
        model.set_adapter(student)
        model.delete_adapter(EMA_ADAPTER)
