"""The RL update on the tiny model: every method moves the LoRA weights; non-finite steps are skipped, then fail."""

from __future__ import annotations

import pytest
import torch

from sdarflow.algo import METHODS
from sdarflow.models import load_policy
from sdarflow.models.policy import new_lora
from sdarflow.train.trainer import RLHyper, TrainingDiverged, make_samples, rl_update


def rescored_rows(n_groups: int = 2, g: int = 2, nan: bool = False) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for grp in range(n_groups):
        for i in range(g):
            resp = torch.randint(5, 300, (3,), generator=gen).tolist()
            old = (-torch.rand(3, generator=gen) * 3).tolist()
            rows.append(
                {
                    "traj_id": f"g{grp}/e{i}",
                    "group_id": f"g{grp}",
                    "episode_return": float(i % 2),
                    "prompt_token_ids": torch.randint(5, 300, (10,), generator=gen).tolist(),
                    "response_token_ids": resp,
                    "old_logprobs": [float("nan")] * 3 if nan else old,
                    "teacher_logprobs": [x + 0.5 for x in old],
                }
            )
    return rows


def lora_model(tiny_model):
    policy = load_policy(str(tiny_model), trainable=True)
    torch.manual_seed(0)
    model = new_lora(policy.model, 4, 8, ["q_proj", "v_proj"])
    return model, policy.tokenizer.pad_token_id


def test_advantages_are_group_normalized():
    samples = make_samples(rescored_rows())
    by_group: dict[str, float] = {}
    for row, s in zip(rescored_rows(), samples):
        by_group[row["group_id"]] = by_group.get(row["group_id"], 0.0) + s.advantage
    assert all(abs(v) < 1e-5 for v in by_group.values())


@pytest.mark.parametrize("method", METHODS)
def test_every_method_moves_the_adapter(tiny_model, method):
    model, pad = lora_model(tiny_model)
    # lora_B starts at zero, so the A side shows movement after one step
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    history = rl_update(
        model, opt, make_samples(rescored_rows()), RLHyper(method=method, mini_batches=2, lam=0.5), pad
    )
    assert len(history) == 2 and not any(h["skipped"] for h in history)
    moved = sum(
        float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters() if p.requires_grad
    )
    assert moved > 0
    assert "loss/total" in history[0] and "actor/entropy" in history[0]


def test_non_finite_steps_are_skipped_then_fail(tiny_model):
    model, pad = lora_model(tiny_model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    samples = make_samples(rescored_rows(nan=True))
    with pytest.raises(TrainingDiverged, match="3 consecutive non-finite steps"):
        rl_update(
            model, opt, samples, RLHyper(method="grpo", mini_batches=1, epochs=5, max_nonfinite_steps=3), pad
        )
