"""Dual-clip PPO, SDAR, Skill-SD and KL penalties: hand-computed values, gradients, metrics."""

import math

import pytest
import torch

from sdarflow.algo import (
    AGG_MODES,
    UnknownNameError,
    kl_penalty,
    ppo_clip_loss,
    sdar_gate,
    sdar_loss,
    skill_sd_loss,
)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# --- PPO clip --------------------------------------------------------------------------------------------------


def test_ppo_hand_values_and_metrics():
    logprobs = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    old = torch.tensor([[0.0, -0.5, 0.5, 3.0]])
    adv = torch.tensor([[2.0, 1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    r = [1.0, math.exp(0.5), math.exp(-0.5)]
    per_token = [
        max(-2.0 * r[0], -2.0 * r[0]),  # ratio 1: inside the trust region
        max(-1.0 * r[1], -1.0 * 1.2),  # A > 0, ratio 1.65 > 1.2: clipped term wins
        max(1.0 * r[2], 1.0 * 0.8),  # A < 0, ratio 0.61 < 0.8: clipped term wins
    ]
    loss, metrics = ppo_clip_loss(logprobs, old, adv, mask, 0.2, 0.2, "token-mean", 3.0)
    assert loss.item() == pytest.approx(sum(per_token) / 3, rel=1e-6)
    assert metrics["actor/clipfrac"] == pytest.approx(2 / 3)
    assert metrics["actor/ppo_kl"] == pytest.approx((0.0 - 0.5 + 0.5) / 3, abs=1e-7)
    k3 = [x - 1 - math.log(x) for x in r]  # r - 1 - log r: 0 at r = 1, > 0 elsewhere
    assert metrics["actor/approx_kl"] == pytest.approx(sum(k3) / 3, rel=1e-6)
    assert metrics["actor/ratio_mean"] == pytest.approx(sum(r) / 3, rel=1e-6)
    assert metrics["actor/clipfrac_lower"] == 0.0  # 0.8 < 3: the dual clip is not active
    assert all(isinstance(v, float) for v in metrics.values())


def test_ppo_dual_clip_caps_negative_advantages():
    logprobs = torch.tensor([[0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-2.0, -0.5, -2.0, -25.0]])  # ratios e^2 = 7.39, e^0.5, e^2, e^25
    adv = torch.tensor([[-1.0, -2.0, 1.0, -0.5]])
    mask = torch.ones(1, 4)
    per_token = [
        min(max(1.0 * math.exp(2), 1.0 * 1.2), 1.0 * 3),  # A < 0, ratio 7.39 > 3: capped at -A * c = 3
        min(max(2.0 * math.exp(0.5), 2.0 * 1.2), 2.0 * 3),  # ratio 1.65 < 3: plain PPO, 3.30
        max(-math.exp(2), -1.2),  # A > 0: no dual clip, -1.2
        0.5 * 3,  # log-ratio 25 (not clamped): -A * ratio is huge, capped at 1.5
    ]
    loss, m = ppo_clip_loss(logprobs, old, adv, mask, 0.2, 0.2, "token-mean", 3.0)
    assert loss.item() == pytest.approx(sum(per_token) / 4, rel=1e-6)
    assert m["actor/clipfrac_lower"] == pytest.approx(2 / 4)
    assert m["actor/ratio_mean"] == pytest.approx(
        (2 * math.exp(2) + math.exp(0.5) + math.exp(25)) / 4, rel=1e-5
    )
    loss.backward()
    # capped tokens carry no gradient; the plain one has -A * ratio / 4
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, 2.0 * math.exp(0.5) / 4, 0.0, 0.0], rel=1e-6)


def test_ppo_without_dual_clip_is_plain_ppo():
    logprobs, old = torch.zeros(1, 1), torch.tensor([[-2.0]])
    loss, m = ppo_clip_loss(
        logprobs, old, torch.tensor([[-1.0]]), torch.ones(1, 1), 0.2, 0.2, "token-mean", None
    )
    assert loss.item() == pytest.approx(math.exp(2), rel=1e-6)
    assert m["actor/clipfrac_lower"] == 0.0
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_loss(logprobs, old, torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.2, "token-mean", 1.0)


def test_ppo_asymmetric_clip_high():
    logprobs = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-0.2]])  # ratio exp(0.2) = 1.221: inside 1.28, outside 1.2
    adv = torch.tensor([[1.0]])
    loss, m = ppo_clip_loss(
        logprobs, old, adv, torch.ones(1, 1), clip_low=0.2, clip_high=0.28, agg="token-mean", clip_ratio_c=3.0
    )
    assert loss.item() == pytest.approx(-math.exp(0.2))
    assert m["actor/clipfrac"] == 0.0
    loss, m = ppo_clip_loss(
        logprobs, old, adv, torch.ones(1, 1), clip_low=0.2, clip_high=0.2, agg="token-mean", clip_ratio_c=3.0
    )
    assert loss.item() == pytest.approx(-1.2)
    assert m["actor/clipfrac"] == 1.0


def test_ppo_gradient_is_zero_on_clipped_and_masked_tokens():
    logprobs = torch.zeros(1, 4, requires_grad=True)
    old = torch.tensor([[0.0, -0.5, 0.1, 0.0]])
    adv = torch.tensor([[2.0, 1.0, -1.0, 3.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, _ = ppo_clip_loss(logprobs, old, adv, mask, 0.2, 0.2, "token-mean", 3.0)
    loss.backward()
    # d/dlogp (-A * exp(logp - old)) = -A * ratio, over 3 tokens; token 1 is clipped, token 3 masked
    expected = [-2.0 * 1.0 / 3, 0.0, 1.0 * math.exp(-0.1) / 3, 0.0]
    assert logprobs.grad[0].tolist() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_ppo_gradcheck_away_from_clip_boundary(agg):
    torch.manual_seed(0)
    logprobs = (-torch.rand(3, 5, dtype=torch.float64)).requires_grad_()
    old = (logprobs + 0.1 * (torch.rand(3, 5, dtype=torch.float64) - 0.5)).detach()  # |log ratio| < 0.05
    adv = torch.randn(3, 5, dtype=torch.float64)
    mask = torch.rand(3, 5) > 0.3

    def f(lp):
        return ppo_clip_loss(lp, old, adv, mask, 0.2, 0.2, agg, 3.0)[0]

    assert torch.autograd.gradcheck(f, (logprobs,))


# --- SDAR ----------------------------------------------------------------------------------------------------

STUDENT = [[-1.0, -2.0, -0.5, -3.0]]
TEACHER = [[-0.5, -2.5, -0.5, 0.0]]
MASK = [[1, 1, 1, 0]]


def test_sdar_hand_values_and_metrics():
    student, teacher, mask = torch.tensor(STUDENT), torch.tensor(TEACHER), torch.tensor(MASK)
    deltas = [0.5, -0.5, 0.0]
    gates = [_sigmoid(5.0 * d) for d in deltas]  # 0.924, 0.076, 0.5
    loss, m = sdar_loss(student, teacher, mask, 5.0)
    assert loss.item() == pytest.approx(sum(g * d for g, d in zip(gates, deltas)) / 3, rel=1e-6)
    assert m["sdar/gate_mean"] == pytest.approx(sum(gates) / 3, rel=1e-6)
    assert m["sdar/gate_active_ratio"] == pytest.approx(1 / 3)  # 0.5 is not "active"
    assert m["sdar/teacher_gap_mean"] == pytest.approx(0.0, abs=1e-7)
    assert m["sdar/loss"] == pytest.approx(loss.item())
    assert all(isinstance(v, float) for v in m.values())


def _agg_weights(mask: torch.Tensor, agg: str) -> torch.Tensor:
    """The per-token weight each aggregation mode gives a (B, T) loss, derived independently of agg_loss."""
    b, t = mask.shape
    m = mask.double()
    if agg == "token-mean":
        return m / m.sum()
    if agg == "seq-mean-token-sum":
        return m / b
    if agg == "seq-mean-token-mean":
        return m / (b * m.sum(-1, keepdim=True))
    return m / t  # seq-mean-token-sum-norm: a sum over sequences divided by the width


@pytest.mark.parametrize("agg", AGG_MODES)
def test_sdar_gradient_is_minus_gate_times_agg_weight(agg):
    torch.manual_seed(3)
    student = (-torch.rand(4, 6, dtype=torch.float64) * 3).requires_grad_()
    teacher = (-torch.rand(4, 6, dtype=torch.float64) * 3).requires_grad_()
    mask = torch.rand(4, 6) > 0.3
    mask[:, 0] = True  # no empty rows, so every weight is well defined
    loss, _ = sdar_loss(student, teacher, mask, 5.0, agg=agg)
    loss.backward()
    gate = torch.sigmoid(5.0 * (teacher - student)).detach()
    assert torch.allclose(student.grad, -gate * _agg_weights(mask, agg), atol=1e-12)
    assert student.grad[~mask].eq(0).all()
    assert teacher.grad is None or teacher.grad.eq(0).all()


def test_sdar_beta_zero_gates_everything_at_half():
    torch.manual_seed(4)
    student, teacher = torch.randn(3, 5), torch.randn(3, 5)
    assert torch.equal(sdar_gate(student, teacher, 0.0), torch.full((3, 5), 0.5))
    loss, m = sdar_loss(student, teacher, torch.ones(3, 5), 0.0)
    assert m["sdar/gate_mean"] == 0.5
    assert m["sdar/gate_active_ratio"] == 0.0
    assert loss.item() == pytest.approx(0.5 * (teacher - student).mean().item(), rel=1e-5)


def test_sdar_large_beta_is_a_hard_gate():
    gate = sdar_gate(torch.tensor([-1.0, -1.0]), torch.tensor([0.0, -2.0]), 100.0)
    assert gate.tolist() == pytest.approx([1.0, 0.0], abs=1e-12)


# --- Skill-SD ---------------------------------------------------------------------------------------------------


def test_skill_sd_hand_values():
    s = torch.tensor([[-1.0, -2.0, -0.5, -1.0]])
    q = torch.tensor([[-2.0, -1.0, -0.5, -30.0]])
    old = torch.tensor([[-1.5, -2.0, -0.5, -13.0]])
    mask = torch.tensor([[1, 1, 1, 1]])

    def term(s_, q_, o_):
        ell = s_ - q_
        k3 = math.exp(min(-ell, 20.0)) - 1 + ell
        return math.exp(min(s_ - o_, 10.0)) * k3

    # token 0: l = 1, k3 = e^-1, rho = e^0.5; token 1: l = -1, k3 = e - 2, rho = 1; token 2: all equal, 0;
    # token 3: l = 29, k3 = e^-29 + 28, rho = e^min(12, 10) (the on-policy ratio is clamped at e^10)
    expected = [term(-1, -2, -1.5), term(-2, -1, -2), 0.0, term(-1, -30, -13)]
    assert expected[0] == pytest.approx(math.exp(0.5) * math.exp(-1))
    assert expected[3] == pytest.approx(math.exp(10) * (28 + math.exp(-29)))
    loss, m = skill_sd_loss(s, q, old, mask)
    assert loss.item() == pytest.approx(sum(expected) / 4, rel=1e-6)
    assert m["skill_sd/loss"] == pytest.approx(loss.item())
    assert m["skill_sd/rho_mean"] == pytest.approx((math.exp(0.5) + 1 + 1 + math.exp(10)) / 4, rel=1e-6)


def test_skill_sd_pulls_student_toward_teacher_from_both_sides():
    q = torch.tensor([[-2.0, -2.0]])
    s = torch.tensor([[-1.0, -3.0]], requires_grad=True)  # above and below the teacher
    loss, _ = skill_sd_loss(s, q, s.detach(), torch.ones(1, 2))
    loss.backward()
    # d/ds [rho * k3] = rho * (k3 + 1 - e^-l), rho = 1 at s = old; token mean over 2 tokens
    g0 = (math.exp(-1) - 1 + 1) + 1 - math.exp(-1)  # l = 1: 1.0 > 0, so descent lowers s toward q
    g1 = (math.exp(1) - 1 - 1) + 1 - math.exp(1)  # l = -1: -1.0 < 0, so descent raises s toward q
    assert s.grad[0].tolist() == pytest.approx([g0 / 2, g1 / 2], rel=1e-6)
    assert s.grad[0, 0] > 0 > s.grad[0, 1]


@pytest.mark.parametrize("agg", AGG_MODES)
def test_skill_sd_gradcheck(agg):
    torch.manual_seed(8)
    s = (-torch.rand(3, 4, dtype=torch.float64) * 2).requires_grad_()
    q = -torch.rand(3, 4, dtype=torch.float64) * 2
    old = (s + 0.2 * torch.randn(3, 4, dtype=torch.float64)).detach()
    mask = torch.rand(3, 4) > 0.3
    mask[:, 0] = True
    assert torch.autograd.gradcheck(lambda x: skill_sd_loss(x, q, old, mask, agg)[0], (s,))


def test_distillation_empty_mask_is_zero():
    student = torch.randn(2, 3, requires_grad=True)
    for loss, m in (
        sdar_loss(student, torch.randn(2, 3), torch.zeros(2, 3), 5.0),
        skill_sd_loss(student, torch.randn(2, 3), torch.randn(2, 3), torch.zeros(2, 3)),
    ):
        assert loss.item() == 0.0
        assert all(math.isfinite(v) for v in m.values())


# --- KL penalty -------------------------------------------------------------------------------------------------


def test_kl_penalty_hand_values():
    lp, ref = torch.tensor([0.0, -1.0]), torch.tensor([-0.5, 0.0])  # diff = lp - ref = [0.5, -1.0]
    assert kl_penalty(lp, ref, "kl").tolist() == pytest.approx([0.5, -1.0])
    assert kl_penalty(lp, ref, "abs").tolist() == pytest.approx([0.5, 1.0])
    assert kl_penalty(lp, ref, "mse").tolist() == pytest.approx([0.125, 0.5])
    # k3 with x = ref - lp = [-0.5, 1.0]: exp(x) - x - 1
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    assert kl_penalty(lp, ref, "low_var_kl").tolist() == pytest.approx(k3, rel=1e-6)


def test_kl_penalty_aliases_and_clamp():
    lp, ref = torch.randn(5), torch.randn(5)
    for alias, name in (("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")):
        assert torch.equal(kl_penalty(lp, ref, alias), kl_penalty(lp, ref, name))
    out = kl_penalty(torch.tensor([0.0, -50.0]), torch.tensor([-50.0, 0.0]), "low_var_kl")
    assert out.tolist() == [10.0, 10.0]
    assert (kl_penalty(lp, ref, "low_var_kl") >= 0).all()


def test_kl_penalty_unknown_kind_lists_kinds():
    with pytest.raises(UnknownNameError, match="low_var_kl"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")
