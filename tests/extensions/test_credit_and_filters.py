"""SCPO credit and the negative-value filter, by hand on two episodes of one group, through the core's registries."""

import pytest
import torch
from factories import two_episodes

from sdarflow.extensions.filters import negative_value_rows
from sdarflow.train.samples import make_samples, row_advantages, row_scores


def test_scpo_row_advantages_by_hand():
    # scores 1, 1, 0, 0: mean 0.5, unbiased std sqrt(1/3), so A = +-0.5 / (sqrt(1/3) + 1e-6)
    a = 0.5 / (3**-0.5 + 1e-6)
    rows = two_episodes()
    assert row_advantages(rows) == pytest.approx([a, a, -a, -a], rel=1e-6)
    # F's first turn is S's: S's credit; its second (the divergent one) keeps the failure's
    assert row_advantages(rows, credit="scpo") == pytest.approx([a, a, a, -a], rel=1e-6)
    rows[2]["response_token_ids"] = [6]  # the first turns differ now: no shared prefix
    assert row_advantages(rows, credit="scpo") == pytest.approx([a, a, -a, -a], rel=1e-6)


def test_negative_value_filter_drops_the_turns_after_a_divergence_that_failed():
    # states: turn 0 [1, 2] shared (value (1 + 0) / 2 - 0.5 = 0); turn 1 [1, 2, 7, 3] is also shared (the
    # same action led there), value 0: nothing dropped
    assert negative_value_rows(two_episodes(), row_scores(two_episodes(), 0.0)) == [False] * 4
    rows = two_episodes()
    rows[3]["prompt_token_ids"] = [1, 2, 7, 4]  # F saw another observation: its own state, value 0 - 0.5
    assert negative_value_rows(rows, row_scores(rows, 0.0)) == [False, False, False, True]
    for r in rows:
        r.update(old_logprobs=[-1.0], teacher_logprobs=[-1.0])
    kept = make_samples(rows, dropped=negative_value_rows(rows, row_scores(rows, 0.0)))
    assert [s.response for s in kept] == [[7], [8], [7]]


def test_negative_value_filter_with_head_values_compares_with_the_groups_first_turn():
    # rows S0, S1, F0, F1 (turns 0, 1, 0, 1): the start's value is the mean of the turn-0 rows (one state, 0.5);
    # S1 at 0.7 is above it, F1 at 0.45 below: only F1 is dropped, whatever the returns say
    values = torch.tensor([0.5, 0.7, 0.5, 0.45], dtype=torch.float64)
    assert negative_value_rows(two_episodes(), row_scores(two_episodes(), 0.0), values=values) == [
        False,
        False,
        False,
        True,
    ]
    assert (
        negative_value_rows(two_episodes(), row_scores(two_episodes(), 0.0), values=torch.full((4,), 0.3))
        == [False] * 4
    )
