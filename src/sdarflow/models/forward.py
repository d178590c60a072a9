"""Teacher-forced log-probs of response tokens given their prompts: the one forward used by rescoring and training.

Sequences are left-padded so every response ends at the right edge; the LM head then runs only on the last
``R_max + 1`` positions (``logits_to_keep``) instead of the whole prompt, and log-probs are gathered per token in
float32 in chunks, so the batch x length x vocab float32 tensor is never materialized.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sdarflow.algo.logprobs import entropy_from_logits, token_logprobs


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


def response_logprobs(
    model, batch: ResponseBatch, with_entropy: bool = False, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token float32 log-probs (B, R) of ``batch.targets`` (and entropies), masked positions set to 0."""
    r_max = batch.targets.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        logits_to_keep=r_max + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :]  # (B, R, V): position t predicts token t + 1
    logp = token_logprobs(logits, batch.targets, chunk_size=chunk_size) * batch.mask
    ent = entropy_from_logits(logits, chunk_size=chunk_size) * batch.mask if with_entropy else None
    return logp, ent


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
