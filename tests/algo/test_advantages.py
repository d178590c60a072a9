"""GRPO and RLSD advantages: hand-computed values and properties."""

import math

import pytest
import torch

from sdarflow.algo import broadcast_advantages, grpo_advantages, rlsd_advantages, rlsd_weights


def test_grpo_hand_values_with_unsorted_noncontiguous_groups():
    rewards = torch.tensor([1.0, 1.0, 2.0, 0.0, 6.0, 4.0])
    groups = torch.tensor([3, 0, 3, 0, 3, 9])
    # group 3: r = 1, 2, 6; mean 3; unbiased var (4 + 1 + 9) / 2 = 7
    # group 0: r = 1, 0; mean 0.5; unbiased var (0.25 + 0.25) / 1 = 0.5
    # group 9: singleton -> 0
    eps = 1e-6
    s3, s0 = math.sqrt(7) + eps, math.sqrt(0.5) + eps
    expected = [-2 / s3, 0.5 / s0, -1 / s3, -0.5 / s0, 3 / s3, 0.0]
    out = grpo_advantages(rewards, groups, eps=eps)
    assert out.tolist() == pytest.approx(expected, rel=1e-5)


def test_grpo_without_std_is_centered_reward():
    rewards = torch.tensor([1.0, 1.0, 2.0, 0.0, 6.0, 4.0])
    groups = torch.tensor([3, 0, 3, 0, 3, 9])
    out = grpo_advantages(rewards, groups, norm_by_std=False)
    assert out.tolist() == pytest.approx([-2.0, 0.5, -1.0, -0.5, 3.0, 0.0])


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_sums_to_zero_per_group(norm_by_std):
    torch.manual_seed(0)
    rewards = torch.rand(64)
    groups = torch.randint(0, 9, (64,))
    adv = grpo_advantages(rewards, groups, norm_by_std=norm_by_std)
    for g in groups.unique():
        assert adv[groups == g].sum().item() == pytest.approx(0.0, abs=1e-5)


def test_grpo_normalised_groups_have_unit_std():
    torch.manual_seed(1)
    rewards = torch.rand(40)
    groups = torch.arange(40) // 8
    adv = grpo_advantages(rewards, groups)
    for g in range(5):
        assert adv[groups == g].std().item() == pytest.approx(1.0, rel=1e-4)


def test_grpo_identical_rewards_give_zero_not_nan():
    adv = grpo_advantages(torch.ones(4), torch.zeros(4, dtype=torch.int64))
    assert torch.equal(adv, torch.zeros(4))


def test_grpo_shape_errors():
    with pytest.raises(ValueError, match=r"\(N,\)"):
        grpo_advantages(torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError):
        grpo_advantages(torch.ones(3), torch.zeros(2, dtype=torch.int64))


def test_broadcast_advantages():
    out = broadcast_advantages(torch.tensor([2.0, -1.0]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert out.tolist() == [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]
    with pytest.raises(ValueError):
        broadcast_advantages(torch.ones(3), torch.ones(2, 3))


def test_rlsd_hand_values():
    adv = torch.tensor([[1.0, -1.0, 3.0, 0.0, 2.0]])
    student = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0]])
    teacher = torch.tensor([[-0.9, -0.9, 0.0, -4.0, -3.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    lam, eps = 0.5, 0.2
    expected = [
        1.0 * ((1 - lam) + lam * math.exp(0.1)),  # delta 0.1, inside the clip range
        -1.0 * ((1 - lam) + lam * math.exp(-0.1)),  # A < 0 flips the exponent
        3.0 * ((1 - lam) + lam * (1 + eps)),  # delta 1: exp(1) clipped to 1.2
        0.0,  # zero advantage stays zero
        0.0,  # masked
    ]
    out = rlsd_advantages(adv, student, teacher, mask, lam=lam, clip_eps=eps)
    assert out[0].tolist() == pytest.approx(expected, rel=1e-6)


def test_rlsd_lam_zero_is_identity_on_mask():
    torch.manual_seed(2)
    adv = torch.randn(3, 6)
    mask = torch.rand(3, 6) > 0.3
    out = rlsd_advantages(adv, torch.randn(3, 6), torch.randn(3, 6), mask, lam=0.0)
    assert torch.equal(out, torch.where(mask, adv, torch.zeros_like(adv)))


def test_rlsd_weights_stay_in_trust_range_and_padding_is_safe():
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    student = torch.tensor([[-50.0, -50.0, 0.0, float("-inf")]])
    teacher = torch.tensor([[0.0, 0.0, -50.0, float("-inf")]])
    w = rlsd_weights(adv, student, teacher, lam=0.5, clip_eps=0.2)
    assert w[0, :3].tolist() == pytest.approx([1.1, 0.9, 0.9])
    out = rlsd_advantages(adv, student, teacher, torch.tensor([[1, 1, 1, 0]]), lam=0.5, clip_eps=0.2)
    assert torch.isfinite(out).all()
    assert out[0, 3].item() == 0.0


def test_rlsd_carries_no_gradient():
    adv = torch.randn(2, 3, requires_grad=True)
    student = torch.randn(2, 3, requires_grad=True)
    out = rlsd_advantages(adv, student, torch.randn(2, 3), torch.ones(2, 3))
    assert not out.requires_grad
