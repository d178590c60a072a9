"""The method registry: every method trains, composes its terms as documented, and fails clearly."""

import math

import pytest
import torch

from sdarflow.algo import (
    METHOD_REGISTRY,
    METHODS,
    Registry,
    UnknownNameError,
    method_loss,
    opsd_loss,
    ppo_clip_loss,
    register_method,
    sdar_loss,
    token_logprobs,
)

B, T = 4, 6


def _batch(seed: int = 0, **overrides):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) > 0.25
    mask[:, 0] = True
    logprobs = (-torch.rand(B, T, generator=g) * 2).requires_grad_()
    batch = {
        "logprobs": logprobs,
        "old_logprobs": (logprobs + 0.05 * torch.randn(B, T, generator=g)).detach(),
        "teacher_logprobs": -torch.rand(B, T, generator=g) * 2,
        "advantages": torch.randn(B, 1, generator=g).expand(B, T) * mask,
        "mask": mask,
    }
    return batch | overrides


def test_methods_are_the_six_named():
    assert set(METHODS) == {"grpo", "opsd", "grpo_opsd", "rlsd", "skill_sd", "sdar"}
    assert METHOD_REGISTRY.names() == METHODS


@pytest.mark.parametrize("method", METHODS)
def test_every_method_gives_a_finite_scalar_with_gradient(method):
    batch = _batch()
    loss, metrics = method_loss(method, **batch)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    grad = batch["logprobs"].grad
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert grad[~batch["mask"]].eq(0).all()
    assert metrics["loss/total"] == pytest.approx(loss.item())
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    assert all("/" in k for k in metrics)


@pytest.mark.parametrize(
    ("method", "has_pg", "has_aux"),
    [
        ("grpo", True, False),
        ("opsd", False, True),
        ("grpo_opsd", True, True),
        ("rlsd", True, False),
        ("skill_sd", True, True),
        ("sdar", True, True),
    ],
)
def test_metric_terms_and_total(method, has_pg, has_aux):
    lam = 0.3
    _, m = method_loss(method, lam=lam, **_batch())
    assert ("loss/pg" in m) == has_pg
    assert ("loss/aux" in m) == has_aux
    weight = lam if has_pg else 1.0  # opsd alone has weight 1
    expected = m.get("loss/pg", 0.0) + weight * m.get("loss/aux", 0.0)
    assert m["loss/total"] == pytest.approx(expected, rel=1e-6)


def test_sdar_is_grpo_plus_lam_gated_distillation():
    batch, lam, beta = _batch(1), 0.01, 5.0
    total, _ = method_loss("sdar", lam=lam, beta=beta, **batch)
    pg, _ = ppo_clip_loss(batch["logprobs"], batch["old_logprobs"], batch["advantages"], batch["mask"])
    aux, _ = sdar_loss(batch["logprobs"], batch["teacher_logprobs"], batch["mask"], beta=beta)
    assert total.item() == pytest.approx((pg + lam * aux).item(), rel=1e-6)


def test_opsd_is_distillation_only():
    batch = _batch(2)
    total, m = method_loss("opsd", **batch)
    aux, _ = opsd_loss(batch["logprobs"], batch["teacher_logprobs"], batch["mask"])
    assert total.item() == pytest.approx(aux.item())
    assert "loss/pg" not in m
    other, _ = method_loss("opsd", **(batch | {"advantages": torch.zeros(B, T)}))
    assert other.item() == pytest.approx(total.item())


def test_skill_sd_and_grpo_opsd_share_a_loss_form():
    batch = _batch(3)
    a, _ = method_loss("skill_sd", lam=0.1, **batch)
    b, _ = method_loss("grpo_opsd", lam=0.1, **batch)
    assert a.item() == pytest.approx(b.item())


def test_reductions_to_grpo():
    batch = _batch(4)
    grpo, _ = method_loss("grpo", **batch)
    assert method_loss("rlsd", rlsd_lam=0.0, **batch)[0].item() == pytest.approx(grpo.item())
    assert method_loss("sdar", lam=0.0, **batch)[0].item() == pytest.approx(grpo.item())


def test_grpo_needs_no_teacher_but_distillers_do():
    batch = _batch(5, teacher_logprobs=None)
    loss, _ = method_loss("grpo", **batch)
    assert math.isfinite(loss.item())
    with pytest.raises(ValueError, match="teacher_logprobs"):
        method_loss("sdar", **batch)


def test_per_episode_advantages_are_rejected():
    with pytest.raises(ValueError, match="advantages"):
        method_loss("grpo", **_batch(6, advantages=torch.randn(B)))


def test_unknown_method_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        method_loss("sdra", **_batch())
    assert isinstance(err.value, ValueError)
    for name in METHODS:
        assert name in str(err.value)


def test_duplicate_registration_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_method("sdar")(lambda x: x)
    reg: Registry[int] = Registry("thing")
    reg.register("a")(1)
    assert reg.get("a") == 1 and "a" in reg
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(2)
    assert reg.get("a") == 1


@pytest.mark.parametrize("method", METHODS)
def test_one_step_moves_a_tiny_policy(method):
    torch.manual_seed(7)
    vocab, hidden = 11, 8
    policy = torch.nn.Linear(hidden, vocab)
    before = policy.weight.detach().clone()
    states = torch.randn(B, T, hidden)
    actions = torch.randint(0, vocab, (B, T))
    mask = torch.ones(B, T, dtype=torch.bool)
    with torch.no_grad():
        old = token_logprobs(policy(states), actions)
    teacher = old + torch.randn(B, T)  # a teacher that disagrees with the student token by token
    advantages = torch.randn(B, 1).expand(B, T).contiguous()
    logprobs = token_logprobs(policy(states), actions, chunk_size=5)
    loss, _ = method_loss(
        method,
        logprobs=logprobs,
        old_logprobs=old,
        teacher_logprobs=teacher,
        advantages=advantages,
        mask=mask,
        lam=0.1,
    )
    loss.backward()
    torch.optim.SGD(policy.parameters(), lr=0.5).step()
    assert not torch.allclose(policy.weight, before)
