"""GRPO and RLSD advantages: hand-computed values and properties."""

import math

import pytest
import torch

from sdarflow.algo import (
    broadcast_advantages,
    episode_length_scale,
    grpo_advantages,
    penalized_scores,
    ppo_clip_loss,
    rlsd_advantages,
    rlsd_lambda,
    rlsd_weights,
)


def test_grpo_hand_values_with_unsorted_noncontiguous_groups():
    scores = torch.tensor([1.0, 1.0, 2.0, 0.0, 6.0, 4.0])
    groups = torch.tensor([3, 0, 3, 0, 3, 9])
    # group 3: s = 1, 2, 6; mean 3; unbiased var (4 + 1 + 9) / 2 = 7
    # group 0: s = 1, 0; mean 0.5; unbiased var (0.25 + 0.25) / 1 = 0.5
    # group 9: one score -> mean 0, std 1 (verl-agent), so it keeps 4 / (1 + eps)
    eps = 1e-6
    s3, s0 = math.sqrt(7) + eps, math.sqrt(0.5) + eps
    expected = [-2 / s3, 0.5 / s0, -1 / s3, -0.5 / s0, 3 / s3, 4 / (1 + eps)]
    out = grpo_advantages(scores, groups, eps=eps)
    assert out.tolist() == pytest.approx(expected, rel=1e-5)


def test_grpo_without_std_is_centered_score_and_a_single_keeps_its_score():
    scores = torch.tensor([1.0, 1.0, 2.0, 0.0, 6.0, 4.0])
    groups = torch.tensor([3, 0, 3, 0, 3, 9])
    out = grpo_advantages(scores, groups, norm_by_std=False)
    assert out.tolist() == pytest.approx([-2.0, 0.5, -1.0, -0.5, 3.0, 4.0])


def test_grpo_statistics_over_turn_rows_weigh_long_episodes():
    # One group: a success in 3 turns (score 1 on each row) and a failure in 10 turns (score 0).
    scores = torch.tensor([1.0] * 3 + [0.0] * 10)
    groups = ["task-a"] * 13
    trajs = ["win"] * 3 + ["lose"] * 10
    # rows: mean 3/13, unbiased std sqrt((3 (10/13)^2 + 10 (3/13)^2) / 12) = 0.43853
    mean = 3 / 13
    std = math.sqrt((3 * (1 - mean) ** 2 + 10 * mean**2) / 12)
    rows = grpo_advantages(scores, groups)
    assert rows[0].item() == pytest.approx((1 - mean) / std, rel=1e-5)
    assert rows[0].item() == pytest.approx(1.754, abs=1e-3)
    assert rows[-1].item() == pytest.approx(-0.526, abs=1e-3)
    # episodes: one score each (1 and 0): mean 0.5, std sqrt(0.5) -> +-0.7071
    episodes = grpo_advantages(scores, groups, traj_ids=trajs)
    assert episodes[0].item() == pytest.approx(0.5 / math.sqrt(0.5), rel=1e-5)
    assert episodes[-1].item() == pytest.approx(-0.5 / math.sqrt(0.5), rel=1e-5)


def test_grpo_episode_samples_are_scored_by_their_rows_mean_and_share_one_advantage():
    # Rows of one episode may differ (the invalid-action penalty is per turn): the episode is one sample scored by
    # its rows' mean, a: (1.0 + 0.9) / 2 = 0.95, b: (0.0 - 0.1) / 2 = -0.05; mean 0.45, std sqrt(0.5 / 1)
    scores = torch.tensor([1.0, 0.9, 0.0, -0.1])
    groups = ["g", "g", "g", "g"]
    trajs = ["a", "a", "b", "b"]
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    expected = [a, a, -a, -a]
    assert grpo_advantages(scores, groups, traj_ids=trajs).tolist() == pytest.approx(expected, rel=1e-5)


def test_grpo_episode_samples_that_tie_except_for_a_penalised_turn_stay_bounded():
    # Both episodes failed (return 0); one turn of b was penalised 0.1. The reference's cross_steps=False would
    # standardise b's penalised row with the tied first rows' std 0: -0.1 / 1e-6 = -1e5. As samples: a 0, b -0.05,
    # mean -0.025, std sqrt(2 * 0.025^2 / 1) = 0.035355 -> +-0.7071 on every row of each.
    out = grpo_advantages(torch.tensor([0.0, 0.0, 0.0, -0.1]), ["g"] * 4, traj_ids=["a", "a", "b", "b"])
    a = 0.025 / (math.sqrt(2 * 0.025**2) + 1e-6)
    assert out.tolist() == pytest.approx([a, a, -a, -a], rel=1e-4)
    assert out.abs().max() < 1


def test_grpo_episode_level_group_of_one_episode_gets_mean_zero_std_one():
    out = grpo_advantages(torch.tensor([0.5, 0.4]), ["g", "g"], traj_ids=["t", "t"])
    assert out.tolist() == pytest.approx([0.45 / (1 + 1e-6), 0.45 / (1 + 1e-6)], rel=1e-6)


def test_grpo_string_and_tensor_group_ids_agree():
    torch.manual_seed(5)
    scores = torch.rand(12)
    codes = torch.randint(0, 3, (12,))
    names = [f"group-{int(c)}" for c in codes]
    assert torch.equal(grpo_advantages(scores, codes), grpo_advantages(scores, names))


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_sums_to_zero_per_group(norm_by_std):
    torch.manual_seed(0)
    scores = torch.rand(64)
    groups = torch.arange(64) % 9  # every group has >= 2 rows
    adv = grpo_advantages(scores, groups, norm_by_std=norm_by_std)
    for g in groups.unique():
        assert adv[groups == g].sum().item() == pytest.approx(0.0, abs=1e-5)


def test_grpo_normalised_groups_have_unit_std():
    torch.manual_seed(1)
    scores = torch.rand(40)
    groups = torch.arange(40) // 8
    adv = grpo_advantages(scores, groups)
    for g in range(5):
        assert adv[groups == g].std().item() == pytest.approx(1.0, rel=1e-4)


def test_grpo_identical_scores_give_zero_not_nan():
    adv = grpo_advantages(torch.ones(4), torch.zeros(4, dtype=torch.int64))
    assert torch.equal(adv, torch.zeros(4))


def test_grpo_shape_errors():
    with pytest.raises(ValueError, match=r"\(N,\)"):
        grpo_advantages(torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(torch.ones(3), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="traj_ids"):
        grpo_advantages(torch.ones(3), ["g"] * 3, traj_ids=["t"])


def test_penalized_scores_hand_values():
    returns = torch.tensor([1.0, 1.0, 0.0, 0.0])
    ok = torch.tensor([True, False, True, False])
    assert penalized_scores(returns, ok, 0.1).tolist() == pytest.approx([1.0, 0.9, 0.0, -0.1])
    assert penalized_scores(returns, ok.float(), 0.01).tolist() == pytest.approx([1.0, 0.99, 0.0, -0.01])
    assert torch.equal(penalized_scores(returns, ok, 0.0), returns)
    with pytest.raises(ValueError, match="must match"):
        penalized_scores(returns, ok[:2], 0.1)


def test_rlsd_lambda_decays_linearly_to_zero():
    assert rlsd_lambda(0, 0.5, 100) == 0.5
    assert rlsd_lambda(1, 0.5, 100) == pytest.approx(0.495)  # the reference's first update is step 1
    assert rlsd_lambda(50, 0.5, 100) == pytest.approx(0.25)
    assert rlsd_lambda(100, 0.5, 100) == 0.0
    assert rlsd_lambda(250, 0.5, 100) == 0.0
    assert rlsd_lambda(30, lam0=0.2, warmdown_steps=60) == pytest.approx(0.1)
    assert rlsd_lambda(1000, lam0=0.3, warmdown_steps=0) == 0.3  # 0 steps: no decay


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
    out = rlsd_advantages(adv, torch.randn(3, 6), torch.randn(3, 6), mask, lam=0.0, clip_eps=0.2)
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
    out = rlsd_advantages(adv, student, torch.randn(2, 3), torch.ones(2, 3), 0.5, 0.2)
    assert not out.requires_grad


def test_episode_length_scale_hand_values():
    # group g: episode a = two turns of 3 and 5 tokens (N = 8), episode b = one turn of 4 (N = 4); mean N 6.
    # group h: episode c = one turn of 2 tokens; episode d = two empty turns (no tokens: scale 0, not in the mean).
    tokens = torch.tensor([3.0, 4.0, 5.0, 2.0, 0.0, 0.0])
    groups = ["g", "g", "g", "h", "h", "h"]
    trajs = ["a", "b", "a", "c", "d", "d"]
    out = episode_length_scale(tokens, groups, trajs)
    assert out.tolist() == pytest.approx([6 / 8, 6 / 4, 6 / 8, 1.0, 0.0, 0.0])
    # each episode's weight, scale x tokens summed over its turns, is its group's mean length
    assert float(out[0] * 3 + out[2] * 5) == pytest.approx(6.0) and float(out[1] * 4) == pytest.approx(6.0)


def test_episode_length_scale_keys_episodes_by_group_and_traj():
    # traj ids restart in every group: (g, 0) and (h, 0) are different episodes
    out = episode_length_scale(torch.tensor([2.0, 6.0, 1.0, 3.0]), ["g", "g", "h", "h"], [0, 1, 0, 1])
    assert out.tolist() == pytest.approx([4 / 2, 4 / 6, 2 / 1, 2 / 3])


def test_episode_length_scale_errors():
    with pytest.raises(ValueError, match="tokens must be"):
        episode_length_scale(torch.ones(2, 2), [0, 0], [0, 1])
    with pytest.raises(ValueError, match=">= 0"):
        episode_length_scale(torch.tensor([1.0, -1.0]), [0, 0], [0, 1])
    with pytest.raises(ValueError, match="traj_ids"):
        episode_length_scale(torch.tensor([1.0, 1.0]), [0, 0], [0])


def test_equal_episode_weight_makes_the_token_mean_gradient_balanced():
    # One group: a success (A = +1) in one turn of 2 tokens and a failure (A = -1) in two turns of 3 tokens each.
    # At ratio 1, token-mean PPO is -(1/T) sum_t A_t r_t, so d loss / d logp_t = -A_t / T with T = 8 tokens.
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, -1.0])
    scale = episode_length_scale(mask.sum(-1).float(), [0, 0, 0], ["s", "f", "f"])  # mean N 4: 4/2, 4/6, 4/6
    for a, net in ((adv, -(2 * 1 - 6 * 1) / 8), (adv * scale, 0.0)):
        logp = torch.zeros(3, 3, requires_grad=True)
        per_token = broadcast_advantages(a, mask)
        loss, _ = ppo_clip_loss(logp, logp.detach(), per_token, mask, 0.2, 0.28, "token-mean", None)
        loss.backward()
        grad = logp.grad
        # tokens: the failure's 6 tokens outweigh the success's 2, so the sampled tokens are pushed down on net
        # (a positive summed gradient of the loss); equal: each episode's tokens sum to -A_e * 4 / 8
        assert float(grad[mask].sum()) == pytest.approx(net, abs=1e-6)
    assert float(grad[0, :2].sum()) == pytest.approx(-4 / 8) and float(grad[1:].sum()) == pytest.approx(4 / 8)
