"""The warm start is deterministic: it runs its steps (same seed, same weights) or stops where its loss says
(--sft-stop-at-loss), and a time limit fails the build loudly instead of shortening it."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from sdarflow.train.sft import STOP_WINDOW, SFTPair, SFTTimeLimitExceeded, reached, sft


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


def test_stop_at_loss_compares_the_mean_of_the_last_window_of_steps():
    losses = [{"loss": 1.0}] * (STOP_WINDOW - 1)
    assert not reached(losses, 2.0)  # fewer steps than the window: never
    window = [{"loss": 0.5}] * (STOP_WINDOW // 2) + [{"loss": 0.3}] * (STOP_WINDOW // 2)
    assert reached(
        [{"loss": 9.0}, *window], 0.4
    )  # mean 0.4 of the last 20; the older 9.0 is out of the window
    assert not reached([{"loss": 9.0}, *window], 0.39)
    assert reached([{"loss/total": 0.25}] * STOP_WINDOW, 0.25, key="loss/total")


def test_an_early_stopped_sft_is_the_full_runs_prefix():
    full = sft(_model(), _pairs(), pad_id=0, steps=60, batch_size=4, seed=3)
    means = [sum(h["loss"] for h in full[i - STOP_WINDOW : i]) / STOP_WINDOW for i in range(STOP_WINDOW, 61)]
    target = means[len(means) // 2]  # reached somewhere in the middle of the run
    first = next(i for i, m in enumerate(means) if m <= target) + STOP_WINDOW
    stopped = sft(_model(), _pairs(), pad_id=0, steps=60, batch_size=4, seed=3, stop_at_loss=target)
    assert len(stopped) == first < 60
    assert [h["loss"] for h in stopped] == [h["loss"] for h in full[:first]]


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


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tasks", "0"], "tasks = 0 must be >= 1"),
        (["--sft-steps", "0"], "sft_steps = 0 must be >= 1"),
        (["--sft-stop-at-loss", "-1"], "sft_stop_at_loss = -1.0 must be >= 0"),
        (["--sft-stop-at-loss", "nan"], "sft_stop_at_loss = nan must be a finite number"),
    ],
)
def test_build_model_rejects_bad_sizes_in_one_line(tmp_path, capsys, flags, message):
    from sdarflow.cli import main

    out = tmp_path / "model"
    assert main(["build-model", "--output", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()


def test_build_model_never_replaces_a_folder_it_did_not_build(tmp_path, capsys):
    """--output holding anything but an earlier build (a user's notes, an imported model) was deleted whole."""
    from sdarflow.cli import main

    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    assert main(["build-model", "--output", str(out), "--tasks", "1", "--sft-steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds files build-model did not write (no sdarflow_build.json)" in err[0]
    assert [p.name for p in tmp_path.rglob("*")] == ["model", "notes.md"]


def test_a_solution_share_puts_each_games_own_solution_where_the_solution_teacher_does(game_cache):
    from sdarflow.envs import get_suite
    from sdarflow.rollout.prompt import prompt_text
    from sdarflow.train.warmstart import BaseModelSpec, _sft_data, expert_steps

    plain_spec, spec = BaseModelSpec(tasks=3), BaseModelSpec(tasks=3, solution_share=0.5)
    assert plain_spec.hash() == BaseModelSpec(tasks=3, solution_share=0.0).hash() != spec.hash()
    steps, _ = expert_steps("textworld-cooking", 3)
    suite = get_suite("textworld-cooking")
    header = "[Privileged Skill Information]\nSolution of this task, the expert's actions in order:\n"
    plain_tok, plain, _ = _sft_data(plain_spec)
    tok, pairs, _ = _sft_data(spec)
    taught = 0
    for step, before, now in zip(steps, plain, pairs, strict=True):
        text, was = prompt_text(tok, now.prompt), prompt_text(plain_tok, before.prompt)
        if text.startswith(header):  # the game's own walkthrough, numbered, then the student prompt
            taught += 1
            listed = "".join(f"{i}. {a}\n" for i, a in enumerate(suite.solution(step.task_id, "train"), 1))
            assert text.startswith(header + listed + "\n") and text.endswith(
                was[was.rfind("<|im_start|>system") :]
            )
        else:  # every other pair is the one the spec without solutions builds: its skill draws are unchanged
            assert text == was
        assert prompt_text(tok, now.response) == prompt_text(plain_tok, before.response)
    assert 0.25 * len(steps) < taught < 0.75 * len(steps)


def test_a_build_records_the_cpu_kernels_and_threads_its_bits_depend_on(tiny_model):
    """Two "AMD EPYC" VMs built the demo's model with other bytes from one spec; the kernels ATen picks (AVX2,
    AVX-512: they sum floats in other orders) and the thread count are the likely difference, so the build file
    records them."""
    from sdarflow.train.warmstart import BUILD_FILE

    info = json.loads((tiny_model / BUILD_FILE).read_text())
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["torch_threads"] == torch.get_num_threads()
