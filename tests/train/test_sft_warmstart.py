"""The warm start is deterministic: it always runs its steps (same seed, same weights), and a time limit fails the
build loudly instead of shortening it."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from sdarflow.train.sft import SFTPair, SFTTimeLimitExceeded, sft


def _model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


def _pairs() -> list[SFTPair]:
    g = torch.Generator().manual_seed(1)
    return [
        SFTPair(
            torch.randint(1, 64, (8,), generator=g).tolist(), torch.randint(1, 64, (3,), generator=g).tolist()
        )
        for _ in range(12)
    ]


def test_same_seed_same_weights_and_every_step_runs():
    runs = []
    for _ in range(2):
        model = _model()
        history = sft(model, _pairs(), pad_id=0, steps=6, batch_size=4, seed=3, time_limit_s=600.0)
        assert [h["step"] for h in history] == [1, 2, 3, 4, 5, 6]
        runs.append({k: v.clone() for k, v in model.state_dict().items()})
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_time_limit_fails_instead_of_stopping_early():
    with pytest.raises(SFTTimeLimitExceeded, match=r"1 of 5 steps took .* over the time limit.*fix: raise"):
        sft(_model(), _pairs(), pad_id=0, steps=5, batch_size=4, time_limit_s=1e-9)


def test_a_build_past_its_time_limit_leaves_no_model(tmp_path, game_cache):
    from sdarflow.sizes import SIZES
    from sdarflow.train.warmstart import build_base_model

    out = tmp_path / "tiny"
    with pytest.raises(SFTTimeLimitExceeded):
        build_base_model(out, SIZES["smoke"]["model"], time_limit_s=1e-9)
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("flags", [["--tasks", "0"], ["--sft-steps", "0"]])
def test_build_model_rejects_empty_sizes_in_one_line(tmp_path, capsys, flags):
    from sdarflow.cli import main

    out = tmp_path / "model"
    assert main(["build-model", "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be >= 1; fix:" in err[0]
    assert not out.exists()
