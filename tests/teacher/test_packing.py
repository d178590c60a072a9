"""Packed rescoring equals padded rescoring (within 1e-5) on the tiny model with mixed lengths, and packing
really isolates the sequences it lays end to end."""

from __future__ import annotations

import pytest
import torch

from sdarflow.models import load_policy
from sdarflow.models.forward import make_packed_batch, pack_bins
from sdarflow.teacher.rescore import padding_share, score


def mixed(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    p_lens = [7, 190, 12, 301, 55, 1, 88, 140, 23, 260]
    r_lens = [3, 1, 5, 20, 9, 4, 0, 12, 1, 7]  # one row has no response tokens at all
    prompts = [torch.randint(5, 300, (n,), generator=g).tolist() for n in p_lens]
    responses = [torch.randint(5, 300, (n,), generator=g).tolist() for n in r_lens]
    return prompts, responses


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(x) for x in b]
    return max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))


@pytest.fixture(scope="module")
def policy(tiny_model):
    return load_policy(str(tiny_model))


@pytest.mark.parametrize("pack_length", [0, 128, 512])
def test_packed_equals_padded(policy, pack_length):
    prompts, responses = mixed()
    pad = policy.tokenizer.pad_token_id
    padded = score(policy.model, prompts, responses, pad, 2048, batching="padded")
    packed = score(policy.model, prompts, responses, pad, 2048, batching="packed", pack_length=pack_length)
    assert max_diff(padded, packed) < 1e-5
    assert packed[6] == [] and all(lp <= 0 for row in packed for lp in row)


def test_packed_equals_padded_with_eager_attention_and_a_lora_adapter(tiny_model):
    from transformers import AutoModelForCausalLM

    from sdarflow.models.policy import new_lora

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), attn_implementation="eager").eval()
    model = new_lora(model, rank=4, alpha=8)
    torch.manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero: perturb it so the adapter changes the outputs
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    prompts, responses = mixed(1)
    padded = score(model, prompts, responses, 0, 4096, batching="padded")
    packed = score(model, prompts, responses, 0, 4096, batching="packed", pack_length=400)
    assert max_diff(padded, packed) < 1e-5


def test_packing_isolates_sequences(policy):
    """The same sequences laid end to end with one running position range (no isolation) score differently."""
    prompts, responses = mixed(2)
    pad = policy.tokenizer.pad_token_id
    packed = score(policy.model, prompts, responses, pad, 4096, batching="packed", pack_length=4096)
    batch = make_packed_batch(prompts, responses, [list(range(len(prompts)))], pad)
    assert batch.input_ids.shape[0] == 1  # every sequence in one row
    joined = torch.arange(batch.input_ids.shape[1])[None]
    with torch.no_grad():
        logits = policy.model(input_ids=batch.input_ids, position_ids=joined).logits[0]
    leaky = torch.log_softmax(logits, -1)[batch.gather_index].gather(-1, batch.targets[:, None]).squeeze(-1)
    isolated = torch.tensor([x for i, start, n in sorted(batch.spans) for x in packed[i]])
    order = [k for i, start, n in sorted(batch.spans) for k in range(start, start + n)]
    assert (leaky[order] - isolated).abs().max() > 1e-2


def test_pack_bins_first_fit_decreasing():
    lengths = [50, 700, 300, 300, 120, 90, 10, 1200]
    bins = pack_bins(lengths, 1000)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert bins[0] == [7]  # longer than a bin: alone, never split
    for b in bins[1:]:
        assert sum(lengths[i] for i in b) <= 1000
    assert len(bins) == 3  # 1200 | 700 + 120 + 90 + 50 + 10 | 300 + 300


def test_packing_wastes_less_than_padding():
    lengths = [20, 400, 35, 380, 60, 300, 25, 410] * 4
    assert padding_share(lengths, 4096, "packed") < 0.5 * padding_share(lengths, 4096, "padded")
