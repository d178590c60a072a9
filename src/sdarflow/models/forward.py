"""Teacher-forced log-probs of response tokens given their prompts: the one forward used by rescoring and training.

Sequences are left-padded so every response ends at the right edge; the LM head then runs only on the last
``R_max + 1`` positions (``logits_to_keep``) instead of the whole prompt, and log-probs are gathered per token in
float32 in chunks, so the batch x length x vocab float32 tensor is never materialized.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from sdarflow.algo.logprobs import entropy_from_logits, linear_entropy, linear_token_logprobs, token_logprobs


@dataclass
class ResponseBatch:
    input_ids: torch.Tensor  # (B, L) left-padded prompt + response
    attention_mask: torch.Tensor  # (B, L)
    position_ids: torch.Tensor  # (B, L)
    targets: torch.Tensor  # (B, R) response tokens right-aligned, pad elsewhere
    mask: torch.Tensor  # (B, R) 1.0 on response tokens

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum().item())


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> ResponseBatch:
    seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in seqs)
    r_max = max(1, max(len(r) for r in responses))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp_mask = torch.zeros((len(seqs), r_max), dtype=torch.float32)
    for i, (s, r) in enumerate(zip(seqs, responses, strict=True)):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        attn[i, width - len(s) :] = 1
        if r:
            resp_mask[i, r_max - len(r) :] = 1.0
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    targets = ids[:, width - r_max :]
    return ResponseBatch(ids, attn, pos, targets, resp_mask)


def to_device(batch, device: torch.device):
    """A ``ResponseBatch`` or ``PackedBatch`` with its tensors on ``device`` (they are built on the CPU)."""
    moved = {
        f.name: getattr(batch, f.name).to(device)
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return dataclasses.replace(batch, **moved)


def response_logprobs(
    model, batch: ResponseBatch, with_entropy: bool = False, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token float32 log-probs (B, R) of ``batch.targets`` (and entropies), masked positions set to 0. A plain
    linear LM head is fused with the log-prob, so the (B, R, V) logits never exist; else only the last R + 1
    positions' logits are computed."""
    r_max = batch.targets.shape[1]
    parts = _decoder_and_head(model)
    # fused with the log-prob, the head must be a plain bias-free matrix (not, e.g., a LoRA-wrapped head)
    if parts is not None and isinstance(parts[1], torch.nn.Linear) and parts[1].bias is None:
        decoder, head = parts
        hidden = decoder(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).last_hidden_state[:, -(r_max + 1) : -1, :]  # (B, R, H): position t predicts token t + 1
        logp = linear_token_logprobs(hidden, head.weight, batch.targets, chunk_size) * batch.mask
        ent = linear_entropy(hidden, head.weight, chunk_size) * batch.mask if with_entropy else None
        return logp, ent
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=r_max + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :]  # (B, R, V)
    logp = token_logprobs(logits, batch.targets, chunk_size=chunk_size) * batch.mask
    ent = entropy_from_logits(logits, chunk_size=chunk_size) * batch.mask if with_entropy else None
    return logp, ent


@torch.no_grad()
def prompt_states(
    model, prompts: list[list[int]], pad_id: int, max_tokens: int, device: torch.device
) -> torch.Tensor:
    """The last layer's hidden state at each prompt's last token (the state a turn acts from): (N, H) float32,
    from left-padded batches of at most ``max_tokens`` padded tokens. No gradient; the caller sets the mode."""
    out: list[torch.Tensor | None] = [None] * len(prompts)
    for idx in token_budget_batches([len(p) for p in prompts], max_tokens):
        batch = to_device(make_batch([prompts[i] for i in idx], [[] for _ in idx], pad_id), device)
        hidden = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=1,
            output_hidden_states=True,
            use_cache=False,
        ).hidden_states[-1][:, -1, :]
        for i, h in zip(idx, hidden.float().cpu(), strict=True):
            out[i] = h
    return torch.stack(out) if prompts else torch.zeros(0, 0)


# Configs that transform logits after the head (scaling, soft-capping): the fused path would be wrong for them.
_LOGIT_TRANSFORMS = ("logit_scale", "logits_scaling", "final_logit_softcapping", "output_multiplier_scale")


def _decoder_and_head(model):
    """(decoder, lm_head) of a causal LM (PEFT-wrapped or not) whose logits are exactly
    ``lm_head(decoder(...).last_hidden_state)``; None for one that transforms them or hides its parts."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if not hasattr(base, "get_decoder") or not hasattr(base, "get_output_embeddings") or config is None:
        return None
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    head = base.get_output_embeddings()
    return (base.get_decoder(), head) if head is not None else None


def token_budget_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group indices (sorted by length, so padding is small) into batches of at most ``max_tokens`` padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = max([lengths[j] for j in current] + [lengths[i]])
        if current and width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


# ------------------------------------------------------------------------------------------------------ packing
#
# Packed rows: several (prompt + response) sequences laid end to end in one row, each with its own position ids
# starting at 0 and no attention mask. transformers (checked on 5.19, Qwen2, sdpa and eager on CPU; tested in
# tests/teacher) detects the position-id resets and builds a block-diagonal causal mask, so a token never attends
# to another sequence; flash-attention builds turn the same position ids into variable-length kernels. The LM head
# runs only on the positions that predict a response token.


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (B, L) sequences laid end to end; the tail after the last one is padding
    position_ids: torch.Tensor  # (B, L) restart at 0 for every sequence (and for the padding tail)
    gather_index: torch.Tensor  # (N,) flat index into B * L of each position that predicts a response token
    targets: torch.Tensor  # (N,) the response tokens, sequence by sequence
    spans: list[tuple[int, int, int]]  # (sequence index, start in N, response length) per packed sequence

    @property
    def num_tokens(self) -> int:
        return int(self.targets.numel())


def pack_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: indices in bins of at most ``capacity`` tokens, longest first; a longer sequence
    gets a bin of its own (never split: it must see its whole prompt)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        slot = next((b for b, room in enumerate(free) if lengths[i] <= room), None)
        if slot is None:
            bins.append([i])
            free.append(max(0, capacity - lengths[i]))
        else:
            bins[slot].append(i)
            free[slot] -= lengths[i]
    return bins


def make_packed_batch(
    prompts: list[list[int]], responses: list[list[int]], bins: list[list[int]], pad_id: int
) -> PackedBatch:
    """One row per bin; ``bins`` index into ``prompts``/``responses``."""
    used = [sum(len(prompts[i]) + len(responses[i]) for i in b) for b in bins]
    width = max(used)
    ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(bins), width), dtype=torch.long)
    gather: list[int] = []
    targets: list[int] = []
    spans: list[tuple[int, int, int]] = []
    for row, b in enumerate(bins):
        off = 0
        for i in b:
            p, r = prompts[i], responses[i]
            n = len(p) + len(r)
            ids[row, off : off + n] = torch.tensor(p + r, dtype=torch.long)
            pos[row, off : off + n] = torch.arange(n)
            # position t predicts token t + 1: the response tokens are predicted from len(p)-1 .. n-2
            start = row * width + off + len(p) - 1
            spans.append((i, len(targets), len(r)))
            gather.extend(range(start, start + len(r)))
            targets.extend(r)
            off += n
        pos[row, off:] = torch.arange(width - off)  # the padding tail is a sequence of its own
    return PackedBatch(ids, pos, torch.tensor(gather, dtype=torch.long), torch.tensor(targets), spans)


def packed_response_logprobs(model, batch: PackedBatch, chunk_size: int = 1024) -> torch.Tensor:
    """Per-token float32 log-probs (N,) of ``batch.targets``; equal to ``response_logprobs`` on the same sequences.
    The LM head runs only on the N gathered hidden states; models that post-process their logits go through their
    own forward instead (full logits, then gathered)."""
    if batch.num_tokens == 0:
        return torch.zeros(0)
    parts = _decoder_and_head(model)
    if parts is None:
        logits = model(
            input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=None, use_cache=False
        ).logits  # (B, L, V)
        picked = logits.reshape(-1, logits.shape[-1]).index_select(0, batch.gather_index)  # (N, V)
        return token_logprobs(picked, batch.targets, chunk_size=chunk_size)
    decoder, head = parts
    hidden = decoder(
        input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=None, use_cache=False
    ).last_hidden_state  # (B, L, H)
    picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.gather_index)  # (N, H)
    return token_logprobs(head(picked), batch.targets, chunk_size=chunk_size)
