"""Step-level credit, against hand-computed values: SCPO's sibling credit on a hand-made group, the progress term
from given log-probs, per-turn progress, the per-state value the negative-value filter reads, and the value head's ridge fit."""

from __future__ import annotations

import math

import pytest
import torch

from sdarflow.algo import turn_progress
from sdarflow.extensions.credit import scpo_advantages
from sdarflow.extensions.filters import relative_to_start, state_values
from sdarflow.extensions.ppl_delta import perplexity_delta
from sdarflow.extensions.progress import progress_advantages
from sdarflow.extensions.value_head import fit_value_head, head_values


def _episodes(spec):
    """Rows (group, traj, turn, key, success, advantage) from {(group, traj): (success, [(key, adv), ...])}."""
    rows = []
    for (group, traj), (won, turns) in spec.items():
        for t, (key, adv) in enumerate(turns):
            rows.append((group, traj, t, key, won, adv))
    return rows


def _scpo(rows):
    g, tr, t, k, s, a = zip(*rows, strict=True)
    return scpo_advantages(torch.tensor(a, dtype=torch.float64), list(g), list(tr), list(t), list(k), list(s))


def test_scpo_gives_the_shared_turns_the_closest_successful_siblings_credit():
    rows = _episodes(
        {
            ("g", "S1"): (True, [("a", 0.9), ("b", 1.1), ("c", 1.0)]),
            ("g", "S2"): (True, [("a", 0.7), ("q", 0.8)]),
            # shares a, b with S1 (2 turns) and a with S2 (1): S1's credit on turns 0-1, its own from turn 2
            ("g", "F1"): (False, [("a", -0.5), ("b", -0.5), ("x", -0.5), ("y", -0.5)]),
            # shares a, q with S2: S2's credit on turns 0-1
            ("g", "F2"): (False, [("a", -0.6), ("q", -0.6), ("r", -0.6)]),
            # diverges at turn 0: keeps its own advantages
            ("g", "F3"): (False, [("z", -0.4), ("b", -0.4)]),
            # a tie (1 turn with S1 and with S2): the first sibling in row order, S1
            ("g", "F4"): (False, [("a", -0.3), ("w", -0.3)]),
            # the same turns as S1, but in another group, which has no successful episode: unchanged
            ("h", "F5"): (False, [("a", -0.2), ("b", -0.2), ("c", -0.2)]),
        }
    )
    expected = [0.9, 1.1, 1.0, 0.7, 0.8] + [0.9, 1.1, -0.5, -0.5] + [0.7, 0.8, -0.6] + [-0.4, -0.4]
    expected += [0.9, -0.3] + [-0.2, -0.2, -0.2]
    assert _scpo(rows).tolist() == pytest.approx(expected)
    # row order does not matter, only which sibling comes first among the successes
    order = [5, 0, 13, 1, 9, 2, 15, 3, 10, 4, 6, 14, 7, 11, 8, 12, 16, 17, 18]
    shuffled = _scpo([rows[i] for i in order])
    assert shuffled.tolist() == pytest.approx([expected[i] for i in order])


def test_scpo_matches_turns_by_position_from_the_first():
    # the failure repeats S's second turn as its first: no shared prefix, so no credit
    rows = _episodes({("g", "S"): (True, [("a", 1.0), ("b", 1.0)]), ("g", "F"): (False, [("b", -1.0)])})
    assert _scpo(rows).tolist() == [1.0, 1.0, -1.0]


def test_scpo_checks_lengths_and_carries_no_gradient():
    adv = torch.tensor([1.0, -1.0], requires_grad=True)
    out = scpo_advantages(adv, ["g", "g"], ["s", "f"], [0, 0], ["a", "a"], [True, False])
    assert out.tolist() == [1.0, 1.0] and not out.requires_grad
    with pytest.raises(ValueError, match="turn_keys must be"):
        scpo_advantages(adv, ["g", "g"], ["s", "f"], [0, 0], ["a"], [True, False])
    with pytest.raises(ValueError, match="turn 0 of episode s appears twice"):
        scpo_advantages(adv, ["g", "g"], ["s", "s"], [0, 0], ["a", "a"], [True, True])


def test_progress_advantage_by_hand():
    adv = torch.tensor([[1.0, 1.0, 0.0], [-0.5, -0.5, -0.5]])
    logp = torch.tensor([[-1.0, -2.0, -math.inf], [-0.1, -3.0, -0.2]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -math.inf], [-0.1, -2.0, -0.7]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = progress_advantages(adv, logp, ref, mask, coef=0.1)
    # 1 + 0.1 * 0.5, 1 + 0.1 * (-1), masked 0 (no NaN from -inf - -inf); -0.5 + 0.1 * (0, -1, 0.5)
    torch.testing.assert_close(out, torch.tensor([[1.05, 0.9, 0.0], [-0.5, -0.6, -0.45]]))
    assert not out.requires_grad
    torch.testing.assert_close(progress_advantages(adv, logp, ref, mask, coef=0.0), adv * mask)


def test_turn_progress_is_the_turns_log_likelihood_ratio():
    logp = torch.tensor([[-1.0, -2.0, -math.inf], [-0.1, -3.0, -0.2]])
    ref = torch.tensor([[-1.5, -1.0, -math.inf], [-0.1, -2.0, -0.7]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert turn_progress(logp, ref, mask).tolist() == pytest.approx([0.5 - 1.0, 0.0 - 1.0 + 0.5])


def test_state_values_count_each_episode_once():
    # group g: S1 wins in 4 turns (states A, B, B2, B3), S2 wins in 1 (A), F1 and F2 fail in 2 (A then C); S_e is
    # each episode's mean row score: 1, 1, 0, -0.1 (F2's second turn was penalized 0.2: S_F2 = (0 - 0.2) / 2)
    rows = [  # (episode, state, score)
        ("S1", "A", 1.0), ("S1", "B", 1.0), ("S1", "B2", 1.0), ("S1", "B3", 1.0), ("S2", "A", 1.0),
        ("F1", "A", 0.0), ("F1", "C", 0.0), ("F2", "A", 0.0), ("F2", "C", -0.2),
    ]  # fmt: skip
    episodes, keys, scores = zip(*rows, strict=True)
    v = state_values(torch.tensor(scores), ["g"] * 9, list(episodes), list(keys))
    # each episode once: (1 + 1 + 0 - 0.1) / 4 = 0.475; a mean over rows (S1's 4 rows 4 times) would be 4.8 / 9
    a, b, c = 0.0, 1 - 0.475, -0.05 - 0.475  # A: every episode; B, B2, B3: S1's; C: F1 and F2
    assert v.tolist() == pytest.approx([a, b, b, b, a, a, c, a, c], abs=1e-6)
    # the start state is shared by every episode: value 0 whatever the episodes' lengths
    assert v[0] == pytest.approx(0.0, abs=1e-9)
    # another group is independent: one state, value 0
    h = state_values(torch.tensor([0.3, -0.1]), ["h", "h"], ["x", "y"], ["A", "A"])
    assert h.tolist() == pytest.approx([0.0, 0.0], abs=1e-7)


def test_perplexity_delta_is_the_drop_in_mean_nll():
    before, after = torch.tensor([2.0, 1.0, 0.5]), torch.tensor([1.5, 1.2, 0.5])
    torch.testing.assert_close(perplexity_delta(before, after), torch.tensor([0.5, -0.2, 0.0]))


def test_value_head_ridge_fit_by_hand():
    # x = [1], [2]; y = 1, 3; l2 = 0.5. X = [[1, 1], [2, 1]]: X^T X / 2 + 0.5 I = [[3, 1.5], [1.5, 1.5]],
    # X^T y / 2 = [3.5, 2] -> w = [1, 1/3] (det 2.25). Anchored at w0 = [2, 0]: rhs [4.5, 2] -> [5/3, -1/3].
    x, y = torch.tensor([[1.0], [2.0]]), torch.tensor([1.0, 3.0])
    w = fit_value_head(x, y, l2=0.5)
    assert w.tolist() == pytest.approx([1.0, 1 / 3])
    anchored = fit_value_head(x, y, torch.tensor([2.0, 0.0]), l2=0.5)
    assert anchored.tolist() == pytest.approx([5 / 3, -1 / 3])
    assert head_values(x, w).tolist() == pytest.approx([4 / 3, 7 / 3])
    # a strong anchor keeps the previous head
    assert fit_value_head(x, y, torch.tensor([2.0, 0.0]), l2=1e6).tolist() == pytest.approx(
        [2.0, 0.0], abs=1e-5
    )


def test_value_head_is_the_objectives_minimum():
    torch.manual_seed(0)
    x, y, w0 = torch.randn(7, 3), torch.randn(7), torch.randn(4)
    w = fit_value_head(x, y, w0, l2=0.1).requires_grad_(True)
    design = torch.cat([x.double(), torch.ones(7, 1, dtype=torch.float64)], dim=1)
    objective = ((design @ w - y.double()) ** 2).mean() + 0.1 * ((w - w0.double()) ** 2).sum()
    (grad,) = torch.autograd.grad(objective, w)
    assert grad.abs().max() < 1e-10


def test_value_head_rejects_bad_shapes_and_l2():
    x, y = torch.zeros(2, 3), torch.zeros(2)
    with pytest.raises(ValueError, match="prior must be"):
        fit_value_head(x, y, torch.zeros(3))
    with pytest.raises(ValueError, match="l2 must be > 0"):
        fit_value_head(x, y, l2=0.0)


def test_relative_to_start_subtracts_the_groups_first_turn_mean():
    # group a starts at turn 0 with values 0.5 and 0.9 (mean 0.7); group b's rows start at turn 1 (0.4)
    v = torch.tensor([0.5, 0.2, 0.9, 0.4, 0.1], dtype=torch.float64)
    rel = relative_to_start(v, ["a", "a", "a", "b", "b"], [0, 1, 0, 1, 2])
    assert rel.tolist() == pytest.approx([-0.2, -0.5, 0.2, 0.0, -0.3])
