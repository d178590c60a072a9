"""The perplexity-delta turn reward: each turn against the next turn's context, by hand with a scorer whose
log-probs are known, and through rescore --ppl-delta on real search-qa rollouts of the tiny model."""

from __future__ import annotations

import math

import pytest

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.errors import ModelError
from sdarflow.extensions.ppl_delta import ppl_delta_rewards
from sdarflow.schema import RESCORED_SCHEMA


def test_each_turn_is_scored_against_the_context_after_it():
    # a scorer whose per-token log-prob is -1 / len(prompt): mean NLL = 1 / len(prompt), whatever the target
    def scorer(prompts, responses):
        return [[-1.0 / len(p)] * len(r) for p, r in zip(prompts, responses, strict=True)]

    rows = [  # episode a: 3 turns with prompts of 2, 4, 5 tokens (out of order); episode b: one turn
        {"traj_id": "a", "turn": 1, "task_id": "t", "prompt_token_ids": [1] * 4},
        {"traj_id": "a", "turn": 0, "task_id": "t", "prompt_token_ids": [1] * 2},
        {"traj_id": "b", "turn": 0, "task_id": "u", "prompt_token_ids": [1] * 3},
        {"traj_id": "a", "turn": 2, "task_id": "t", "prompt_token_ids": [1] * 5},
    ]
    refs = {"t": [7, 8], "u": [9]}
    out = ppl_delta_rewards(rows, refs, scorer)
    # turn 1: 1/4 - 1/5; turn 0: 1/2 - 1/4; last turns (a's 2, b's only) have no context after them
    assert out[0] == pytest.approx(1 / 4 - 1 / 5) and out[1] == pytest.approx(1 / 2 - 1 / 4)
    assert out[2] is None and out[3] is None


def test_a_non_finite_nll_is_one_line_not_a_nan_reward():
    def diverged(prompts, responses):  # a policy whose log-probs overflowed on the longer context
        return [[-math.inf if len(p) > 2 else -1.0] * len(r) for p, r in zip(prompts, responses, strict=True)]

    rows = [{"traj_id": "a", "turn": t, "task_id": "t", "prompt_token_ids": [1] * (2 + t)} for t in range(3)]
    with pytest.raises(ModelError, match=r"not finite for 2 of 2 turns.*fix:"):
        ppl_delta_rewards(rows, {"t": [7]}, diverged)


def test_rescore_scores_search_qa_turns_by_the_gold_answers_nll(
    tiny_model, tmp_path, capsys, reference_library
):
    from sdarflow.envs import get_suite
    from sdarflow.models import load_policy
    from sdarflow.teacher.rescore import score

    def rollouts(env: str, out: str) -> str:
        gen = ["generate", "--model", str(tiny_model), "--output", out, "--env", env, "--tasks", "2"]
        assert main([*gen, "--group-size", "2", "--max-turns", "3", "--max-new-tokens", "8"]) == 0
        return out

    def rescore(traj: str, out: str) -> int:
        argv = ["rescore", "--input", traj, "--skills", reference_library, "--model", str(tiny_model)]
        return main([*argv, "--retrieval", "full", "--output", out, "--ppl-delta"])

    out = str(tmp_path / "rescored")
    assert rescore(rollouts("search-qa", str(tmp_path / "traj")), out) == 0
    capsys.readouterr()
    rows = storage.read_table(out, kind="rescored", schema=RESCORED_SCHEMA).to_pylist()
    policy, suite = load_policy(str(tiny_model)), get_suite("search-qa")
    by_turn = {(r["traj_id"], r["turn"]): r for r in rows}
    checked = 0
    for r in rows:
        after = by_turn.get((r["traj_id"], r["turn"] + 1))
        if after is None:
            assert r["ppl_delta"] is None
            continue
        gold = suite.reference_continuation(r["task_id"])
        target = policy.tokenizer(gold, add_special_tokens=False)["input_ids"] + [policy.eos_id]
        lp = score(
            policy.model, [r["prompt_token_ids"], after["prompt_token_ids"]], [target, target], 0, 16384
        )
        expected = -sum(lp[0]) / len(target) + sum(lp[1]) / len(target)
        assert r["ppl_delta"] == pytest.approx(expected, abs=1e-4)
        checked += 1
    assert checked > 0
    # an env without a reference continuation: one line, nothing written
    tools = rollouts("tool-use", str(tmp_path / "tools"))
    capsys.readouterr()
    assert rescore(tools, str(tmp_path / "x")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gives no reference continuation" in err[0] and "fix:" in err[0]
    assert not storage.exists(str(tmp_path / "x"))


def test_train_adds_the_turn_reward_to_the_grpo_score():
    from sdarflow.train.samples import row_advantages

    turn = {"group_id": "g", "format_ok": True, "episode_return": 0.0, "success": False, "turn": 0}
    rows = [{**turn, "traj_id": "a", "ppl_delta": 0.4}, {**turn, "traj_id": "b", "ppl_delta": None}]
    assert row_advantages(rows) == [0.0, 0.0]  # outcome only: both failed alike
    # scores 0.4 and 0 (null counts 0): mean 0.2, std 0.2 * sqrt(2)
    a = 0.2 / (0.2 * 2**0.5 + 1e-6)
    assert row_advantages(rows, reward_coef=1.0) == pytest.approx([a, -a], rel=1e-6)
