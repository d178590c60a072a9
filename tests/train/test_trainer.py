"""The RL update on the tiny model: every method moves the LoRA weights; non-finite steps are skipped, then fail;
micro-batching never changes the gradient; SFT steps interleave at the ratio."""

from __future__ import annotations

import pytest
import torch

from sdarflow.algo import METHODS
from sdarflow.models import load_policy
from sdarflow.models.policy import new_lora
from sdarflow.train.engine import TorchEngine
from sdarflow.train.sft import sft_pairs_from_rows
from sdarflow.train.trainer import (
    REQUIRED_METRICS,
    RLHyper,
    TrainingDiverged,
    accumulate,
    make_samples,
    micro_step,
    rl_update,
)


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
    # every method's line carries every required metric, with a value (the teacher-gap diagnostics included)
    assert all(history[0][k] is not None for k in REQUIRED_METRICS)


def test_non_finite_steps_are_skipped_then_fail(tiny_model):
    model, pad = lora_model(tiny_model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    samples = make_samples(rescored_rows(nan=True))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    with pytest.raises(TrainingDiverged, match="3 consecutive non-finite steps"):
        rl_update(
            model, opt, samples, RLHyper(method="grpo", mini_batches=1, epochs=5, max_nonfinite_steps=3), pad
        )
    # skipped means skipped: no weight change and no optimizer state (AdamW would move even on a zero gradient)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if p.requires_grad)
    assert not opt.state


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_splitting_a_mini_batch_never_changes_its_gradient(tiny_model, agg):
    model, pad = lora_model(tiny_model)
    # lora_B is zero at init, so lora_A would get no gradient; make both sides live
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    hp = RLHyper(method="sdar", lam=0.5, agg=agg)
    rows = rescored_rows(n_groups=3, g=2)
    for i, r in enumerate(rows):  # uneven lengths, so token and sequence weights differ
        r["response_token_ids"] = r["response_token_ids"][: 1 + i % 3]
        r["old_logprobs"] = r["old_logprobs"][: 1 + i % 3]
        r["teacher_logprobs"] = r["teacher_logprobs"][: 1 + i % 3]
    samples = make_samples(rows)
    engine = TorchEngine(model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad]), 1.0)
    grads = []
    for budget in (10_000, 1):  # one micro-batch, then one per sample

        def loss_fn(micro):
            return micro_step(model, micro, hp, pad)

        metrics, _ = accumulate(engine, samples, loss_fn, agg, budget)
        grads.append((_grads(model), metrics["loss/total"]))
        engine.zero_grad()
    (g_one, loss_one), (g_split, loss_split) = grads
    assert abs(loss_one - loss_split) < 1e-5
    assert max(float((g_one[n] - g_split[n]).abs().max()) for n in g_one) < 1e-6
    assert max(float(g.abs().max()) for g in g_one.values()) > 0


def test_sft_steps_interleave_and_every_line_has_the_required_metrics(tiny_model):
    model, pad = lora_model(tiny_model)
    rows = rescored_rows()
    for r in rows:
        r["success"] = r["episode_return"] > 0
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    hp = RLHyper(method="sdar", mini_batches=2, epochs=2, sft_ratio=0.5)
    history = rl_update(model, opt, make_samples(rows), hp, pad, sft_pairs=sft_pairs_from_rows(rows))
    assert [h["kind"] for h in history] == ["rl", "rl", "sft", "rl", "rl", "sft"]
    for h in history:
        assert set(REQUIRED_METRICS) | {"step", "grad_norm", "lr", "tokens_per_s"} <= h.keys()
    sft = history[2]
    assert sft["loss/sft"] == sft["loss/total"] > 0 and sft["sdar/gate_mean"] is None
    assert history[0]["sdar/gate_mean"] is not None and history[0]["loss/aux"] is not None
