"""The SFT warm start a pretrained model gets: the env's expert walkthrough as trajectory rows in the model's
prompt format (generate --policy expert), trained with train --mode sft; rescore refuses the rows."""

from __future__ import annotations

import math

import pytest

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.rollout.prompt import build_messages, encode_prompt, goal_of, loads
from sdarflow.schema import TRAJECTORY_SCHEMA


def _expert(tmp_path, model, env: str, fmt: str, tasks: int = 3) -> list[dict]:
    out = str(tmp_path / f"expert-{env}-{fmt}")
    argv = ["generate", "--policy", "expert", "--model", str(model), "--env", env, "--tasks", str(tasks)]
    assert main([*argv, "--prompt-format", fmt, "--output", out]) == 0
    return storage.read_table(out, kind="trajectories", schema=TRAJECTORY_SCHEMA).to_pylist(), out


@pytest.mark.parametrize("env", ["tool-use", "search-qa", "textworld-cooking"])
def test_walkthrough_rows_are_the_policys_prompts_with_the_experts_reply(tmp_path, tiny_model, env, capsys):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows, _ = _expert(tmp_path, tiny_model, env, "reference")
    capsys.readouterr()
    episodes = {r["traj_id"] for r in rows}
    assert len(episodes) == 3 and all(r["success"] and r["format_ok"] for r in rows)
    assert all(r["policy_version"] == "expert" and r["traj_id"].endswith("/expert") for r in rows)
    for r in rows:
        msgs = loads(r["prompt_messages"])
        assert r["prompt_token_ids"] == encode_prompt(
            tokenizer, msgs
        )  # what the policy would have been shown
        assert r["response_text"].startswith("<think></think>\n<action>") and r["response_text"].endswith(
            "</action>"
        )
        assert r["response_token_ids"][-1] == tokenizer.eos_token_id
        assert tokenizer.decode(r["response_token_ids"][:-1]) == r["response_text"]
        assert all(math.isnan(x) for x in r["rollout_logprobs"])  # no model sampled it
        assert len(r["rollout_logprobs"]) == len(r["response_token_ids"])
    first = next(r for r in rows if r["turn"] == 1)
    assert "already taken 1 step(s)" in loads(first["prompt_messages"])[0]["content"]
    if env == "textworld-cooking":  # TextWorld lists its admissible actions, as the reference's ALFWorld does
        assert all(
            "Your admissible actions of the current situation are: [" in r["prompt_messages"] for r in rows
        )


def test_the_command_format_and_the_sft_warm_start_then_rescore_refuses(tmp_path, tiny_model, capsys):
    rows, uri = _expert(tmp_path, tiny_model, "tool-use", "auto", tasks=2)
    assert all(
        not r["response_text"].startswith("<think>") for r in rows
    )  # auto: the tiny model's command format
    first = loads(rows[0]["prompt_messages"])
    assert first == build_messages(goal_of(first), [], "Ready.")  # tool-use's first observation
    adapter = str(tmp_path / "warm")
    argv = ["train", "--mode", "sft", "--model", str(tiny_model), "--input", uri, "--output", adapter]
    assert main([*argv, "--mini-batches", "2", "--engine", "torch"]) == 0
    assert storage.read_manifest(adapter)["kind"] == "adapter"
    capsys.readouterr()
    code = main(["rescore", "--input", uri, "--skills", str(tiny_model / "seed_skills"), "--model", str(tiny_model),
                 "--output", str(tmp_path / "rescored")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code != 0 and "expert walkthrough rows" in err and "train --mode sft" in err
    assert not (tmp_path / "rescored").exists()


def test_expert_with_an_adapter_is_refused(tmp_path, tiny_model, capsys):
    code = main(["generate", "--policy", "expert", "--model", str(tiny_model), "--adapter", str(tiny_model), "--output",
                 str(tmp_path / "o")])  # fmt: skip
    assert code != 0 and "drop --adapter" in capsys.readouterr().err


def test_a_model_without_seed_skills_gets_a_library_and_a_warm_start_without_seed_skills_a_library_and_a_warm_start(
    tmp_path, tiny_model
):
    from sdarflow.skills.library import SkillLibrary
    from sdarflow.start_point import default_preset, seed_skills_of, warm_start

    root = str(tmp_path / "store")
    uri = seed_skills_of("tool-use", 6, f"{root}/a")
    lib = SkillLibrary.load(storage.resolve(uri).path)
    assert storage.read_manifest(uri, "skills") and lib.task_specific()
    assert all(s.evidence.get("source") == "seed" for s in lib.task_specific())
    # search-qa's walkthroughs share no step across tasks; the SDAR reference's search skills are its seed library
    from sdarflow.skills.library import reference_library

    search = SkillLibrary.load(storage.resolve(seed_skills_of("search-qa", 6, f"{root}/b")).path)
    assert search.version == SkillLibrary.load(reference_library("search-qa")).version
    assert {s.name for s in search.skills_for("birthplace")} == {"direct_retrieval"}
    adapter = warm_start(tiny_model, "tool-use", 2, {"mini_batches": 1, "engine": "torch"}, root, "r1")
    assert storage.read_manifest(adapter, "adapter")["kind"] == "adapter"
    assert default_preset(tiny_model) == "demo"  # sdarflow built it: its format and sizes
