"""The ``hf`` generation engine: batched ``transformers`` generation, on any device.

Sampling uses the Gumbel-max trick with one ``torch.Generator`` per sample: argmax(logits / T + Gumbel noise) is an
exact sample from softmax(logits / T), and giving every sample its own seed makes a group's samples differ and any
sample reproducible regardless of which other prompts shared its batch.

A rollout's prompts repeat: a group's G samples start from one prompt, and samples that have taken the same actions
so far share the next one too. Each distinct prompt of a batch is run once and its KV cache copied to the rows that
repeat it (``share_prompts``); the samples are the same, their log-probs equal to float rounding. It pays where the
prompt is much of the work: about half of a first turn of 400 prompt tokens and 32 new ones on SmolLM2 (2x for a
group of 8), little where replies are long (1.13x over episodes of ~100-token replies; docs/capacity.md).

On a CPU the KV cache has a fixed width, allocated once for the prompt and the new tokens: transformers' growing
cache concatenates each layer's whole cache with every new token, a copy that took 40% of a call of 32 rows x 32
new tokens on SmolLM2 (43 s against 25 s with the fixed cache, the same samples; docs/capacity.md).
"""

from __future__ import annotations

import torch

from sdarflow.models.device import model_device
from sdarflow.models.forward import make_batch, to_device
from sdarflow.rollout.episode import Sample


class _GumbelSampler:
    """Logits processor that turns greedy decoding into seeded sampling (temperature, top-p)."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float):
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.temperature, self.top_p = temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature <= 0:
            return scores
        logits = scores.float() / self.temperature  # (B, V)
        if self.top_p < 1.0:
            logits = _top_p_mask(logits, self.top_p)
        # CPU generators: a sample's noise, so the sample, is the same on every device
        noise = [torch.rand(logits.shape[-1], generator=g) for g in self.generators]
        u = torch.stack(noise).to(logits.device)
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

    name = "hf"

    def __init__(self, model, tokenizer, eos_id: int, batch_size: int = 64, share_prompts: bool = True):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.pad_id = tokenizer.pad_token_id
        self.batch_size = batch_size
        self.share_prompts = share_prompts
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 0)

    def close(self) -> None:
        """Nothing to release: the model is an ordinary in-process module."""

    @torch.inference_mode()
    def generate(
        self, prompts, seeds, *, max_new_tokens, temperature, top_p=1.0, min_new_tokens=0, logprobs=True
    ):
        """``logprobs=False``: the samples' ``logprobs`` are empty, and no (batch, tokens, vocab) logits are kept
        (for a caller that reads only the text, such as the format probe, beside a training step's memory)."""
        out: list[Sample] = []
        settings, n = (max_new_tokens, temperature, top_p, min_new_tokens, logprobs), self.batch_size
        for i in range(0, len(prompts), n):
            out += self._batch(prompts[i : i + n], seeds[i : i + n], *settings)
        return out

    def _batch(
        self, prompts, seeds, max_new_tokens, temperature, top_p, min_new_tokens, logprobs
    ) -> list[Sample]:
        from transformers import LogitsProcessorList

        # left-padded, so generation continues every row from the right edge
        batch = to_device(make_batch(prompts, [[] for _ in prompts], self.pad_id), model_device(self.model))
        width = batch.input_ids.shape[1]
        cache = self._prefill(prompts, batch, max_new_tokens)
        gen = self.model.generate(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            past_key_values=cache,
            max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([_GumbelSampler(seeds, temperature, top_p)]),
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            output_logits=logprobs,
            return_dict_in_generate=True,
        )
        new = gen.sequences[:, width:]  # (B, T_new)
        if logprobs:
            logits = torch.stack(gen.logits, dim=1)  # (B, T_new, V) raw, before our processor
            token_lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        samples = []
        for row in range(len(prompts)):
            toks = new[row].tolist()
            finished = self.eos_id in toks
            n = toks.index(self.eos_id) + 1 if finished else len(toks)
            text = self.tokenizer.decode(toks[:n], skip_special_tokens=True)
            samples.append(Sample(toks[:n], token_lp[row, :n].tolist() if logprobs else [], text, finished))
        return samples

    def _prefill(self, prompts, batch, max_new_tokens):
        """The KV cache of every row's prompt but its last token (None: ``generate`` prefills itself), which
        ``generate`` continues from with the last token, as it would after its own prefill. Each distinct prompt is
        run once (``share_prompts``) and its cache copied to the rows that repeat it. On a CPU the cache has a fixed
        width, the prompt plus ``max_new_tokens``: a growing cache copies itself whole at every new token."""
        from transformers import DynamicCache, StaticCache
        from transformers.cache_utils import DynamicLayer

        width = batch.input_ids.shape[1]
        # a model whose generation config names a cache keeps generate's own prefill (generate refuses both)
        if width < 2 or self.model.generation_config.cache_implementation is not None:
            return None
        first: dict[tuple[int, ...], int] = {}
        source = [
            first.setdefault(tuple(p), row) if self.share_prompts else row for row, p in enumerate(prompts)
        ]
        # the cache generate would make itself (its config gives sliding-window layers their own kind)
        cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
        # a sliding window's fixed-width layer stores other positions than its growing one: full attention only
        fixed = batch.input_ids.device.type == "cpu" and all(
            type(layer) is DynamicLayer for layer in cache.layers
        )
        unique = sorted(set(source))
        if len(unique) == len(prompts) and not fixed:
            return None
        ids, mask = batch.input_ids[unique, :-1], batch.attention_mask[unique, :-1]
        # the positions generate gives left-padded rows: count real tokens only (padding's value is never attended)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            logits_to_keep=1,
        )
        slot = {row: i for i, row in enumerate(unique)}
        rows = torch.tensor([slot[r] for r in source], device=ids.device)
        if not fixed:
            cache.batch_select_indices(rows)
            return cache
        # generate feeds the prompt's last token and every new one but the last
        static = StaticCache(config=self.model.config, max_cache_len=width - 1 + max_new_tokens)
        for i, layer in enumerate(cache.layers):
            static.update(layer.keys[rows], layer.values[rows], i)
            layer.keys = layer.values = None  # one layer held twice at a time, not the whole cache
        return static


def open_hf(model: str, adapter: str | None, *, batch_size: int, device: str, **_: object) -> HFEngine:
    """The hf engine on ``device`` with the policy at ``model`` (and its optional LoRA ``adapter``)."""
    from sdarflow.models import load_policy

    policy = load_policy(model, adapter, device=device)
    return HFEngine(policy.model, policy.tokenizer, policy.eos_id, batch_size)
