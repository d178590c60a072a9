"""Training engines behind one interface (:class:`TrainEngine`), so the training loop never branches on the engine:

- ``torch``: plain ``torch.optim.AdamW`` with ``clip_grad_norm_``; one process.
- ``deepspeed``: a DeepSpeed engine (ZeRO stage 2 or 3) wrapping the same AdamW; bf16 on GPU, fp32 on CPU; one
  process, or one per GPU under a launcher (see :mod:`sdarflow.train.launch`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from sdarflow.errors import CheckpointError, ConfigError
from sdarflow.names import NameRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    grad_norm: float  # global L2 norm before clipping; inf/nan when the step was skipped
    applied: bool  # False: non-finite gradient, weights and optimizer state untouched


class TrainEngine(Protocol):
    name: str
    rank: int
    world_size: int
    device: torch.device
    forward_model: object  # what the loss functions call for log-probs
    # The trainable weights whole on this rank, which the gradient share is measured over (empty where ZeRO-3
    # partitions them: no rank holds a whole gradient before the step).
    grad_params: list[torch.Tensor]

    def backward(self, loss: torch.Tensor) -> None: ...
    def step(self, lr: float) -> StepResult: ...
    def zero_grad(self) -> None: ...
    def save(self, path: Path) -> None: ...
    def load(self, path: Path) -> None: ...
    def gathered(self) -> contextlib.AbstractContextManager: ...
    def master_weights(self) -> dict[str, torch.Tensor]: ...
    def optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]: ...
    def load_optimizer_state(self, state: dict[str, dict[str, torch.Tensor]]) -> None: ...
    def barrier(self) -> None: ...
    def all_reduce_sum(self, values: dict[str, float]) -> dict[str, float]: ...


def adamw(model: torch.nn.Module, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay
    )


ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


def _check_state_names(model: torch.nn.Module, state: dict) -> dict[str, torch.nn.Parameter]:
    """The trainable parameters by name; CheckpointError unless ``state`` holds exactly those."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    differ = sorted(set(state) ^ set(params))
    if differ:
        raise CheckpointError(
            f"the carried optimizer state does not match the trained weights (e.g. {differ[:3]}); fix: continue "
            f"from an adapter of the same --lora-rank/--lora-targets, or train without --carry-optimizer"
        )
    return params


class TorchEngine:
    """Single-process AdamW; the model stays where it is (moved to CUDA by :func:`make_engine` if present)."""

    name = "torch"
    rank = 0
    world_size = 1

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float
    ) -> None:
        self.model = model
        self.forward_model = model
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.device = next(model.parameters()).device
        self._params = [p for g in optimizer.param_groups for p in g["params"]]
        self.grad_params = self._params

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, lr: float) -> StepResult:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # max_norm inf: measure without clipping (clip_grad_norm_ still returns the total norm)
        max_norm = self.max_grad_norm if self.max_grad_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(self._params, max_norm))
        applied = math.isfinite(norm)
        if applied:
            self.optimizer.step()
        self.zero_grad()
        return StepResult(norm, applied)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        weights = {n: p.detach().cpu() for n, p in self.model.named_parameters() if p.requires_grad}
        torch.save({"model": weights, "optimizer": self.optimizer.state_dict()}, path / "torch_engine.pt")

    def load(self, path: Path) -> None:
        file = path / "torch_engine.pt"
        if not file.is_file():
            raise CheckpointError(
                f"checkpoint '{path}' has no torch_engine.pt (written by another engine?); "
                f"fix: resume with the same --engine, or use a new --checkpoint-dir"
            )
        state = torch.load(file, map_location=self.device, weights_only=True)
        params = dict(self.model.named_parameters())
        missing = sorted(set(state["model"]) ^ {n for n, p in params.items() if p.requires_grad})
        if missing:
            raise CheckpointError(
                f"checkpoint '{path}' does not match the model's trainable weights (e.g. {missing[:3]}); "
                f"fix: resume with the same --lora-rank/--lora-targets, or use a new --checkpoint-dir"
            )
        with torch.no_grad():
            for name, value in state["model"].items():
                params[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])

    def gathered(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def master_weights(self) -> dict[str, torch.Tensor]:
        return {}  # the module's own fp32 weights are the masters

    def optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]:
        return {
            n: {k: v.detach().cpu().clone() for k, v in self.optimizer.state[p].items()}
            for n, p in self.model.named_parameters()
            if p.requires_grad and self.optimizer.state.get(p)
        }

    def load_optimizer_state(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        for name, param in _check_state_names(self.model, state).items():
            self.optimizer.state[param] = {k: v.to(param.device) for k, v in state[name].items()}

    def barrier(self) -> None:
        pass

    def all_reduce_sum(self, values: dict[str, float]) -> dict[str, float]:
        return values


class WholeModelCall:
    """Calls the model's forward and hides ``get_decoder``/``get_output_embeddings``, so
    ``models.forward.response_logprobs`` takes its unfused path (logits for the last R + 1 positions)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.config = model.config

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)


class DeepSpeedEngine:
    """A DeepSpeed ZeRO engine around the model and a client AdamW. Gradient accumulation is unmanaged: the
    trainer's micro-batch losses come weighted by their share of the mini-batch, and ``step`` is the boundary, so
    micro-batch counts may vary from step to step."""

    name = "deepspeed"

    def __init__(
        self,
        model: torch.nn.Module,
        lr: float,
        max_grad_norm: float,
        zero_stage: int,
        weight_decay: float = 0.0,
    ) -> None:
        import deepspeed  # lazy: slow import, and only this engine needs it

        from sdarflow.train.launch import ensure_process_group_env

        ensure_process_group_env()
        on_gpu = torch.cuda.is_available()
        if not torch.distributed.is_initialized():
            if not on_gpu:
                # No shared-memory all-reduce op on the CPU: training never uses it (it serves inference), and its
                # JIT build waits forever on a lock that a process killed mid-build leaves in the torch extensions
                # folder (a test run hung there). deepspeed.ops keeps this table editable for the launch.
                deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
            # gloo on CPU: DeepSpeed's CPU default (ccl) needs oneCCL, which is not installed.
            deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
        self.zero_stage = zero_stage
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "managed_gradient_accumulation": False,
            "zero_optimization": {"stage": zero_stage},
            "gradient_clipping": max_grad_norm if max_grad_norm > 0 else 0.0,
            # check_grad_overflow: without it bf16 ZeRO applies a NaN gradient instead of skipping the step.
            "bf16": {"enabled": on_gpu, "check_grad_overflow": True},
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=adamw(model, lr, weight_decay), config=config
        )
        self.model = model
        # ZeRO-3 gathers a module's weights in that module's forward hook. The fused head + log-prob path reads
        # lm_head.weight without calling lm_head, so under ZeRO-3 the model is called as a whole instead.
        self.forward_model = WholeModelCall(model) if zero_stage >= 3 else model
        self.grad_params = [] if zero_stage >= 3 else [p for p in model.parameters() if p.requires_grad]
        self.rank = torch.distributed.get_rank()
        self.world_size = torch.distributed.get_world_size()
        self.device = self.engine.device
        log.info(
            "deepspeed engine: ZeRO-%d, %s, rank %d of %d",
            zero_stage,
            "bf16" if on_gpu else "fp32",
            self.rank,
            self.world_size,
        )

    def backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages gradients over ranks; the trainer's weights already sum to 1 over the whole
        # mini-batch (all ranks together), so multiply back to get the sum.
        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)

    def step(self, lr: float) -> StepResult:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # ZeRO checks the gradient for inf/nan and, if found, skips the update and clears the gradient itself.
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        norm = float("nan") if norm is None else float(norm)
        return StepResult(norm, math.isfinite(norm))

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def save(self, path: Path) -> None:
        # Collective: every rank writes its optimizer partition into the same folder.
        self.engine.save_checkpoint(
            str(path), tag="engine", save_latest=False, exclude_frozen_parameters=True
        )

    def load(self, path: Path) -> None:
        if not (path / "engine").is_dir():
            raise CheckpointError(
                f"checkpoint '{path}' has no DeepSpeed state (written by another engine?); "
                f"fix: resume with the same --engine, or use a new --checkpoint-dir"
            )
        # Frozen base weights are not in the checkpoint (exclude_frozen_parameters), hence non-strict.
        loaded, _ = self.engine.load_checkpoint(
            str(path), tag="engine", load_module_strict=False, load_lr_scheduler_states=False
        )
        if loaded is None:
            raise CheckpointError(
                f"DeepSpeed could not load checkpoint '{path}'; fix: use a new --checkpoint-dir"
            )

    def gathered(self) -> contextlib.AbstractContextManager:
        """Full parameters visible on every rank (ZeRO-3 partitions them; a no-op for ZeRO-2)."""
        if self.zero_stage < 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None)

    def master_weights(self) -> dict[str, torch.Tensor]:
        """fp32 master copies of the trainable weights, by parameter name; on GPU the module holds bf16 copies,
        and publishing those would lose precision. Collective: every rank calls it."""
        from deepspeed.utils import safe_get_full_fp32_param

        out = {}
        for name, p in self.model.named_parameters():
            if p.requires_grad and (full := safe_get_full_fp32_param(p)) is not None:
                out[name] = full.detach().float().cpu()
        return out

    def optimizer_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """AdamW's moments of each trainable parameter, whole (gathered from the ranks' partitions), and the step
        count. Collective: every rank calls it."""
        from deepspeed.utils import safe_get_full_optimizer_state

        self._carries_state()
        states = [s for s in self.optimizer.optimizer.state.values() if "step" in s]  # the client AdamW's
        step = states[0]["step"].detach().cpu() if states else torch.tensor(0.0)
        return {
            n: {
                "step": step.clone(),
                **{k: safe_get_full_optimizer_state(p, k).float().cpu() for k in ADAM_MOMENTS},
            }
            for n, p in self.model.named_parameters()
            if p.requires_grad
        }

    def load_optimizer_state(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Each rank takes its partition of the moments (any world size wrote them), before the first step."""
        from deepspeed.utils import safe_set_full_optimizer_state

        self._carries_state()
        params = _check_state_names(self.model, state)
        # the client AdamW inside ZeRO's wrapper (its state is per flat partition)
        inner, step = self.optimizer.optimizer, next(iter(state.values()))["step"]
        # AdamW makes its state at its first step, and ZeRO links each parameter to its slice of the flat state
        # only then: make the state (as AdamW would) and link it now, so the moments can be set before training.
        for group in inner.param_groups:
            for flat in group["params"]:
                zeros = {k: torch.zeros_like(flat, memory_format=torch.preserve_format) for k in ADAM_MOMENTS}
                inner.state[flat] = {"step": step.clone().float(), **zeros}
        self.optimizer._hp_optimizer_states_linked = False
        self.optimizer._lazy_init_hp_params_optimizer_state()
        for name, param in params.items():
            for key in ADAM_MOMENTS:
                safe_set_full_optimizer_state(param, state[name][key].to(self.device), key)

    def _carries_state(self) -> None:
        if self.zero_stage >= 3:
            raise ConfigError(
                "train: --carry-optimizer moves AdamW's moments between rounds with ZeRO-1/2's partitions, not "
                "ZeRO-3's; fix: pass --zero-stage 2 (a LoRA's optimizer state is small), or no --carry-optimizer"
            )

    def barrier(self) -> None:
        torch.distributed.barrier()

    def all_reduce_sum(self, values: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return dict(zip(keys, t.tolist()))


# name -> builder(model, lr, max_grad_norm, zero_stage, weight_decay) -> TrainEngine
TRAIN_ENGINES: NameRegistry = NameRegistry("training engine")


@TRAIN_ENGINES.register("torch")
def _torch(
    model: torch.nn.Module, lr: float, max_grad_norm: float, zero_stage: int, weight_decay: float = 0.0
) -> TorchEngine:
    if torch.cuda.is_available():
        model.to("cuda")
    return TorchEngine(model, adamw(model, lr, weight_decay), max_grad_norm)


TRAIN_ENGINES.register("deepspeed")(DeepSpeedEngine)


def make_engine(
    name: str,
    model: torch.nn.Module,
    *,
    lr: float,
    max_grad_norm: float,
    zero_stage: int = 2,
    weight_decay: float = 0.0,
) -> TrainEngine:
    """Build the named engine around ``model`` (its ``requires_grad`` parameters are the ones trained, by AdamW
    with decoupled ``weight_decay``)."""
    return TRAIN_ENGINES.get(name)(model, lr, max_grad_norm, zero_stage, weight_decay)
