"""agg_loss and masked_mean: hand-computed values, empty masks, gradients, batch splitting."""

import math

import pytest
import torch

from sdarflow.algo import AGG_MODES, UnknownNameError, agg_loss, masked_mean

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])

# Worked by hand from LOSS/MASK: tokens kept are 1, 2 (row 0) and 4 (row 1); T = 3, B = 2.
EXPECTED = {
    "token-mean": (1 + 2 + 4) / 3,
    "seq-mean-token-sum": ((1 + 2) + 4) / 2,
    "seq-mean-token-mean": ((1 + 2) / 2 + 4 / 1) / 2,
    "seq-mean-token-sum-norm": (1 + 2 + 4) / 3,  # verl: a sum over sequences over T, not a mean
}


def test_modes_are_the_four_documented():
    assert set(AGG_MODES) == set(EXPECTED)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_hand_values(mode):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(EXPECTED[mode], rel=1e-6)


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_bool_and_float_masks_agree(mode):
    a = agg_loss(LOSS, MASK.bool(), mode)
    b = agg_loss(LOSS, MASK.float(), mode)
    assert a.item() == pytest.approx(b.item())


@pytest.mark.parametrize("mode", AGG_MODES)
def test_empty_mask_gives_zero_not_nan(mode):
    loss = torch.randn(3, 4, requires_grad=True)
    out = agg_loss(loss, torch.zeros(3, 4), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(3, 4))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_inf_padding_is_ignored_and_masked_tokens_get_no_gradient(mode):
    loss = torch.tensor([[1.0, float("inf")], [2.0, float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 0], [1, 0]])
    out = agg_loss(loss, mask, mode)
    assert math.isfinite(out.item())
    out.backward()
    assert loss.grad[:, 1].eq(0).all()
    assert loss.grad[:, 0].gt(0).all()


@pytest.mark.parametrize("mode", AGG_MODES)
def test_gradcheck(mode):
    torch.manual_seed(0)
    loss = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(3, 5) > 0.4
    assert torch.autograd.gradcheck(lambda x: agg_loss(x, mask, mode), (loss,))


def test_token_mean_splits_by_token_count():
    torch.manual_seed(1)
    loss = torch.randn(8, 6)
    mask = torch.rand(8, 6) > 0.3
    full = agg_loss(loss, mask, "token-mean")
    n1, n2 = mask[:4].sum(), mask[4:].sum()
    l1 = agg_loss(loss[:4], mask[:4], "token-mean")
    l2 = agg_loss(loss[4:], mask[4:], "token-mean")
    assert full.item() == pytest.approx(((n1 * l1 + n2 * l2) / (n1 + n2)).item(), rel=1e-6)


def test_seq_mean_modes_split_by_sequence_count():
    torch.manual_seed(2)
    loss = torch.randn(6, 5)
    mask = torch.rand(6, 5) > 0.3
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        halves = (agg_loss(loss[:3], mask[:3], mode) + agg_loss(loss[3:], mask[3:], mode)) / 2
        assert agg_loss(loss, mask, mode).item() == pytest.approx(halves.item(), rel=1e-6)
    # seq-mean-token-sum-norm sums over sequences: halves of one width add up.
    halves = agg_loss(loss[:3], mask[:3], "seq-mean-token-sum-norm") + agg_loss(
        loss[3:], mask[3:], "seq-mean-token-sum-norm"
    )
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(halves.item(), rel=1e-6)


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(UnknownNameError) as err:
        agg_loss(LOSS, MASK, "token-sum")
    assert isinstance(err.value, ValueError)
    for mode in AGG_MODES:
        assert mode in str(err.value)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="one shape"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")


def test_masked_mean_hand_value():
    assert masked_mean(LOSS, MASK).item() == pytest.approx(7 / 3)
    assert masked_mean(LOSS, torch.zeros_like(MASK)).item() == 0.0
