"""Teacher-forced response log-probs: left-padded, LM head on the response only, equal to a plain per-sequence
forward pass."""

from __future__ import annotations

import torch

from sdarflow.models import load_policy
from sdarflow.models.forward import make_batch, response_logprobs, token_budget_batches


def test_batched_response_logprobs_equal_unpadded_reference(tiny_model):
    policy = load_policy(str(tiny_model))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 500, (n,), generator=g).tolist() for n in (7, 19, 12)]
    responses = [torch.randint(5, 500, (n,), generator=g).tolist() for n in (3, 1, 5)]
    batch = make_batch(prompts, responses, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, ent = response_logprobs(policy.model, batch, with_entropy=True)
        for row, (p, r) in enumerate(zip(prompts, responses)):
            ids = torch.tensor([p + r])
            full = torch.log_softmax(policy.model(input_ids=ids).logits[0].float(), -1)
            ref = full[len(p) - 1 : len(p) + len(r) - 1].gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
            got = logp[row, batch.targets.shape[1] - len(r) :]
            assert torch.allclose(got, ref, atol=1e-5)
    assert (logp[batch.mask == 0] == 0).all() and (ent[batch.mask == 0] == 0).all()
    assert batch.num_tokens == 9


def test_token_budget_batches_respect_the_budget():
    lengths = [5, 50, 7, 48, 6, 51]
    batches = token_budget_batches(lengths, max_tokens=110)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        assert max(lengths[i] for i in b) * len(b) <= 110 or len(b) == 1
