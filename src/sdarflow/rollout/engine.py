"""Generation engines behind one interface: prompts (token ids) in; sampled tokens, their log-probs, text out.

``hf`` (transformers ``generate``, batched) runs anywhere; ``vllm`` (``rollout.vllm_engine``) is the throughput
engine, imported only when used. ``auto`` picks vllm on a GPU where vllm is installed, else hf. Every engine exposes its tokenizer, EOS id and context length (so prompts are
checked before any generation) and ``close()``. The hf engine's sampling uses the Gumbel-max trick with one
``torch.Generator`` per sample: argmax(logits / T + Gumbel noise) is an exact sample from softmax(logits / T), and
giving every sample its own seed makes a group's samples differ and any sample reproducible regardless of which
other prompts shared its batch.

Log-probs are of the raw policy (temperature 1, float32 ``log_softmax``), the same quantity the trainer computes,
so the engine/trainer gap measures numerical drift rather than a definitional difference.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from sdarflow.errors import ConfigError
from sdarflow.models.device import model_device

log = logging.getLogger(__name__)

ENGINES: tuple[str, ...] = ("auto", "hf", "vllm")


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finished: bool  # ended with EOS rather than hitting max_new_tokens


class Engine(Protocol):
    tokenizer: object
    eos_id: int
    max_context: int  # tokens of prompt + response the model accepts

    def close(self) -> None: ...

    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        min_new_tokens: int = 0,  # EOS is not sampled before this many tokens (fixed-length benchmarks)
    ) -> list[Sample]: ...


class _GumbelSampler:
    """Logits processor that turns greedy decoding into seeded sampling (temperature, top-p)."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float):
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature <= 0:
            return scores
        logits = scores.float() / self.temperature  # (B, V)
        if self.top_p < 1.0:
            logits = _top_p_mask(logits, self.top_p)
        # CPU generators: a sample's noise, so the sample, is the same on every device
        u = torch.stack([torch.rand(logits.shape[-1], generator=g) for g in self.generators]).to(
            logits.device
        )
        # u in (0, 1) strictly, so both logs are finite
        gumbel = -torch.log(-torch.log(u.clamp(1e-12, 1.0 - 1e-7)))
        return logits + gumbel


def _top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
    drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class HFEngine:
    """Batched ``transformers`` generation on the device the model is on."""

    def __init__(self, model, tokenizer, eos_id: int, batch_size: int = 64):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.pad_id = tokenizer.pad_token_id
        self.batch_size = batch_size
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 0)

    def close(self) -> None:
        """Nothing to release: the model is an ordinary in-process module."""

    @torch.inference_mode()
    def generate(self, prompts, seeds, *, max_new_tokens, temperature, top_p=1.0, min_new_tokens=0):
        out: list[Sample] = []
        for i in range(0, len(prompts), self.batch_size):
            out.extend(
                self._batch(
                    prompts[i : i + self.batch_size],
                    seeds[i : i + self.batch_size],
                    max_new_tokens,
                    temperature,
                    top_p,
                    min_new_tokens,
                )
            )
        return out

    def _batch(self, prompts, seeds, max_new_tokens, temperature, top_p, min_new_tokens) -> list[Sample]:
        from transformers import LogitsProcessorList

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):  # left padding: generation continues from the right edge
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        device = model_device(self.model)
        gen = self.model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([_GumbelSampler(seeds, temperature, top_p)]),
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        new = gen.sequences[:, width:]  # (B, T_new)
        logits = torch.stack(gen.logits, dim=1)  # (B, T_new, V) raw, before our processor
        logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        samples = []
        for row in range(len(prompts)):
            toks = new[row].tolist()
            finished = self.eos_id in toks
            n = toks.index(self.eos_id) + 1 if finished else len(toks)
            text = self.tokenizer.decode(toks[:n], skip_special_tokens=True)
            samples.append(Sample(toks[:n], logprobs[row, :n].tolist(), text, finished))
        return samples


DEFAULT_ACTION_TOKENS = 24  # for suites that do not say (short text-game commands)


def action_tokens(suite, requested: int) -> int:
    """Tokens per action: the requested number, else the suite's own need, else the default."""
    return requested or getattr(suite, "max_action_tokens", DEFAULT_ACTION_TOKENS)


def pick_engine(name: str, device: torch.device) -> str:
    """The engine ``name`` stands for: ``auto`` is vllm on a GPU when vllm is installed, else hf."""
    if name != "auto":
        return name
    return "vllm" if device.type == "cuda" and importlib.util.find_spec("vllm") else "hf"


def load_engine(
    name: str,
    model: str,
    adapter: str | None = None,
    *,
    batch_size: int = 64,
    vllm_options=None,
    device: str = "auto",
) -> Engine:
    """Open engine ``name`` (``pick_engine``) on the HF model folder ``model`` with an optional LoRA ``adapter``
    (local folder); the hf engine runs on ``device`` (``models.device``), vLLM places itself.

    Both engines refuse an adapter trained on another base model; ``vllm`` fails in one line with the install fix
    when the package is missing, and starts its engine processes only at the first ``generate``.
    """
    from sdarflow.models.device import resolve_device

    place = resolve_device(device)
    chosen = pick_engine(name, place)
    log.info("engine %s%s", chosen, f" (auto, device {place})" if name == "auto" else "")
    if chosen == "hf":
        from sdarflow.models import load_policy

        policy = load_policy(model, adapter, device=str(place))
        return HFEngine(policy.model, policy.tokenizer, policy.eos_id, batch_size)
    if chosen == "vllm":
        from sdarflow.rollout.vllm_engine import VLLMEngine, VLLMOptions

        return VLLMEngine(model, adapter, vllm_options or VLLMOptions(max_num_seqs=batch_size))
    raise ConfigError(f"unknown engine {name!r}; available: {', '.join(ENGINES)}; fix: pick one of those")
