"""``sdarflow plan``: a round's time per stage and its GPU-hours, before launching, from throughput constants.

A round of ``tasks x group_size`` episodes of ``turns`` turns makes ``R = tasks x group_size x turns`` turn rows
of ``prompt_tokens + response_tokens`` tokens. With ``N`` model parameters and ``G`` GPUs (or one CPU machine),
and each constant an *effective* rate on one device (FLOP/s as achieved, not peak; seconds per env call):

- generate: ``(2N x R x prompt_tokens / prefill_flops + 2N x R x response_tokens / decode_flops) / G`` of
  generation, plus ``R x env_turn_s + episodes x env_reset_s`` of env and prompt work on the CPU: added to it
  (``--envs local``), or overlapped (``process``: the larger of the two).
- rescore: ``2N x R x (prompt_tokens + response_tokens) x passes / forward_flops / G`` (``passes``: student and
  teacher, plus the reference once the round starts from an adapter).
- train: ``6N x R x (prompt_tokens + response_tokens) x epochs / train_flops / G`` (forward and backward).
- evaluate: generate's formula for ``eval_tasks x eval_samples`` episodes of ``eval_turns`` turns on each of the
  two held-out splits.
- every task (prepare, the six stages, promote): ``task_start_s`` (process or pod start and imports).

``GPU-hours = G x round seconds / 3600``. Each GPU holds the model's weights in ``precision`` (``N x 2`` bytes in
bf16, what every stage's ``--precision auto`` loads on a GPU, a training rank's frozen base included; ``N x 4`` in
fp32), besides its KV cache or activations. Constants come from ``sdarflow plan --calibrate MODEL`` (measured on this
machine with that model), from ``bench/results/gpu_check.json``, or from ``PUBLISHED`` (data-sheet peaks times
utilisation figures reported for vLLM and FSDP/DeepSpeed training; a rough start, not a measurement).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sdarflow.errors import ConfigError

SPLITS = 2  # evaluate plays the test and ood splits
WEIGHT_BYTES = {"bf16": 2, "fp32": 4}  # per parameter, by models.device precision


@dataclass(frozen=True)
class Constants:
    """Effective rates on one device (FLOP/s as achieved) and per-call CPU seconds; ``source`` says where from."""

    prefill_flops: float
    decode_flops: float
    forward_flops: float
    train_flops: float
    env_turn_s: float  # per turn row: the env step, prompt building and parsing
    env_reset_s: float  # per episode
    task_start_s: float  # per pipeline task
    source: str

    @classmethod
    def load(cls, path: str | Path) -> Constants:
        """From a ``--calibrate`` file, or ``gpu_check.json`` (its measured ``plan_constants``)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(
                f"plan: cannot read constants {path} ({err}); fix: sdarflow plan --calibrate"
            ) from err
        data = data.get("plan_constants", data)
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(names - {"source"} - set(data))
        if missing:
            raise ConfigError(
                f"plan: {path} lacks {', '.join(missing)}; fix: write it with sdarflow plan --calibrate"
            )
        return cls(**{k: data[k] for k in names - {"source"}}, source=data.get("source", str(path)))


# H100 SXM bf16 dense peak 989 TFLOP/s. Utilisation: prefill ~50% and batched decode ~15% in vLLM (decode is memory
# bound: ~15k tokens/s for a 7B model at batch 256 is ~21% of peak), training ~35% MFU (FSDP/DeepSpeed reports on
# 7B models); env turns of a text game ~2 ms, resets ~20 ms (this project's TextWorld); a pod's start ~60 s.
H100_PEAK = 989e12
PUBLISHED = Constants(
    prefill_flops=0.5 * H100_PEAK,
    decode_flops=0.15 * H100_PEAK,
    forward_flops=0.5 * H100_PEAK,
    train_flops=0.35 * H100_PEAK,
    env_turn_s=0.002,
    env_reset_s=0.02,
    task_start_s=60.0,
    source="published figures for H100 (see sdarflow.plan.PUBLISHED)",
)


@dataclass(frozen=True)
class Workload:
    model_params: float
    gpus: int
    tasks: int
    group_size: int
    turns: float
    prompt_tokens: float
    response_tokens: float
    eval_tasks: int
    eval_samples: int
    eval_turns: float
    epochs: int = 1
    rescore_passes: int = 3
    envs: str = "process"  # local: env work adds to generation; process: overlaps it
    precision: str = "bf16"  # the weights on each GPU

    def check(self) -> None:
        for name in ("model_params", "tasks", "group_size", "turns", "prompt_tokens", "response_tokens"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"plan: --{name.replace('_', '-')} must be > 0; fix: pass a positive number"
                )
        if self.precision not in WEIGHT_BYTES:
            raise ConfigError(
                f"plan: --precision {self.precision!r} is not one of {', '.join(WEIGHT_BYTES)}; fix: pick one"
            )
        if self.gpus < 0:
            raise ConfigError("plan: --gpus must be >= 0 (0: one CPU machine); fix: e.g. --gpus 8")


def _rollout_seconds(w: Workload, c: Constants, episodes: float, turns: float) -> float:
    rows = episodes * turns
    devices = max(w.gpus, 1)
    generation = 2 * w.model_params * rows * (
        w.prompt_tokens / c.prefill_flops + w.response_tokens / c.decode_flops
    ) / devices  # fmt: skip
    env = rows * c.env_turn_s + episodes * c.env_reset_s
    return max(generation, env) if w.envs == "process" else generation + env


def estimate(w: Workload, c: Constants) -> dict:
    """Seconds per stage of one round (each with its task start), the total, and GPU-hours."""
    w.check()
    devices = max(w.gpus, 1)
    rows = w.tasks * w.group_size * w.turns
    tokens = rows * (w.prompt_tokens + w.response_tokens)
    work = {
        "prepare": 0.0,
        "generate": _rollout_seconds(w, c, w.tasks * w.group_size, w.turns),
        "extract-skills": 0.0,
        "rescore": 2 * w.model_params * tokens * w.rescore_passes / c.forward_flops / devices,
        "train": 6 * w.model_params * tokens * w.epochs / c.train_flops / devices,
        "evaluate": SPLITS * _rollout_seconds(w, c, w.eval_tasks * w.eval_samples, w.eval_turns),
        "register": 0.0,
        "promote": 0.0,
    }
    stages = {name: seconds + c.task_start_s for name, seconds in work.items()}
    total = sum(stages.values())
    return {
        "stages_seconds": stages,
        "work_seconds": work,
        "round_seconds": total,
        "gpu_hours": w.gpus * total / 3600,
        "weights_gib_per_gpu": w.model_params * WEIGHT_BYTES[w.precision] / 2**30,
        "constants": dataclasses.asdict(c),
        "workload": dataclasses.asdict(w),
    }


def _time_env(suite, tokenizer) -> tuple[float, float, list[list[int]]]:
    """(seconds per reset, seconds per turn including its prompt, the prompts) over a few scripted turns of 8
    train tasks."""
    from sdarflow.rollout.prompt import build_messages, encode_prompt

    resets, seconds_reset, seconds_turn, prompts = 0, 0.0, 0.0, []
    for task in suite.tasks("train", 8):
        env = suite.make(task)
        t0 = time.perf_counter()
        reset = env.reset()
        seconds_reset += time.perf_counter() - t0
        resets += 1
        actions: list[str] = []
        observation = reset.observation
        for action in ("look", "inventory", "examine counter", "go north", "look"):
            t0 = time.perf_counter()
            prompt = encode_prompt(tokenizer, build_messages(reset.instruction, actions, observation))
            step = env.step(action)
            seconds_turn += time.perf_counter() - t0
            prompts.append(prompt)
            actions.append(action)
            observation = step.observation
            if step.done:
                break
        env.close()
    return seconds_reset / resets, seconds_turn / len(prompts), prompts


def _time_model(engine, prompts: list[list[int]], new: int = 16) -> dict[str, float]:
    """Seconds of a prefill, of ``new`` decode steps, of a teacher-forced forward and of a forward + backward on
    ``prompts`` (one batch), after a warm-up."""
    import torch

    from sdarflow.models.forward import make_batch, response_logprobs, to_device

    def generate(tokens: int) -> float:
        t0 = time.perf_counter()
        seeds = list(range(len(prompts)))
        engine.generate(prompts, seeds, max_new_tokens=tokens, min_new_tokens=tokens, temperature=1.0)
        return time.perf_counter() - t0

    generate(2)  # warm-up
    t_prefill, t_full = generate(1), generate(new)
    model = engine.model
    device = next(model.parameters()).device
    data = to_device(make_batch(prompts, [[engine.eos_id] * 8 for _ in prompts], engine.pad_id), device)

    def finished() -> float:  # a GPU runs kernels asynchronously: wait for them before reading the clock
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    with torch.inference_mode():
        response_logprobs(model, data)
        t0 = finished()
        response_logprobs(model, data)
        t_forward = finished() - t0
    model.train()
    t0 = finished()
    logp, _ = response_logprobs(model, data)
    logp.sum().backward()
    t_train = finished() - t0
    model.eval()
    return {
        "prefill": t_prefill,
        "decode": max(t_full - t_prefill, 1e-9),
        "forward": t_forward,
        "train": t_train,
    }


def _task_start_seconds() -> float:
    """What a model task imports before its work, in a fresh interpreter (the runner's own bookkeeping aside)."""
    t0 = time.perf_counter()
    code = "import kfp.dsl.executor_main, sdarflow.stages.train, peft, transformers.modeling_utils"
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def calibrate(model: str, env: str = "textworld-cooking", device: str = "auto", batch: int = 64) -> Constants:
    """Measure the constants on this machine with ``model`` (an HF folder): prefill and decode through the hf
    engine, a teacher-forced forward, one training step, and ``env``'s resets and turns. About a minute."""
    from sdarflow.envs import get_suite
    from sdarflow.rollout.engine import load_engine

    engine = load_engine("hf", model, batch_size=batch, device=device)
    params = sum(p.numel() for p in engine.model.parameters())
    env_reset_s, env_turn_s, prompts = _time_env(get_suite(env), engine.tokenizer)
    batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
    prompt_tokens = sum(len(p) for p in batch_prompts)
    new = 16
    t = _time_model(engine, batch_prompts, new)
    seq_tokens = prompt_tokens + 8 * batch
    return Constants(
        prefill_flops=2 * params * prompt_tokens / t["prefill"],
        decode_flops=2 * params * batch * (new - 1) / t["decode"],
        forward_flops=2 * params * seq_tokens / t["forward"],
        train_flops=6 * params * seq_tokens / t["train"],
        env_turn_s=env_turn_s,
        env_reset_s=env_reset_s,
        task_start_s=_task_start_seconds(),
        source=f"sdarflow plan --calibrate {model} on this machine ({params / 1e6:.2f}M parameters, batch {batch})",
    )


def render(plan: dict) -> str:
    """The plan as a small table."""
    lines = [f"{'stage':<16}{'seconds':>12}"]
    lines += [f"{name:<16}{seconds:>12.1f}" for name, seconds in plan["stages_seconds"].items()]
    lines.append(f"{'round':<16}{plan['round_seconds']:>12.1f}")
    lines.append(f"GPU-hours per round: {plan['gpu_hours']:.2f}  (constants: {plan['constants']['source']})")
    precision = plan["workload"]["precision"]
    lines.append(
        f"weights per GPU: {plan['weights_gib_per_gpu']:.1f} GiB ({precision}), plus KV cache or activations"
    )
    return "\n".join(lines)
