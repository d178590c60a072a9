"""The rescore stage through the CLI: a hand-written reference library is used, every strategy runs, packed and
padded batching agree, the reports are published with the dataset, shards partition the rows, the ucb
statistics carry across rounds through extract-skills, and the reference log-probs are the base model's."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sdarflow import storage
from sdarflow.cli import main
from sdarflow.schema import RESCORED_SCHEMA

# Keyword retrieval on the reference library per game (tests/teacher/conftest.py GAMES): every task type with a
# keyword in the prompt, in task_keywords order (cut: slice chop dice; cook: fry roast grill; cut+cook: slice fry,
# mapped to cooking), after the general skill.
KEYWORD_IDS = {
    "game-0": ["general", "cutting", "cooking"],  # "slice": cut and cut+cook
    "game-1": ["general", "cooking", "cooking"],  # "fry": cook and cut+cook, not deduplicated
    "game-2": ["general", "cutting"],  # "dice"
    "game-3": ["general", "cooking"],  # "roast"
}


def read(uri: str) -> list[dict]:
    return storage.read_table(uri, kind="rescored", schema=RESCORED_SCHEMA).to_pylist()


def test_reference_library_is_used_and_reports_are_published(dataset, rescore, reference_library, tmp_path):
    out = str(tmp_path / "out")
    code, result = rescore(dataset(), reference_library, out)
    assert code == 0, result
    rows = read(out)
    for r in rows:
        assert r["skill_ids"] == KEYWORD_IDS[r["task_id"]] and r["skill_hit"]
        assert len(r["teacher_logprobs"]) == len(r["old_logprobs"]) == len(r["response_token_ids"])
        assert r["ref_logprobs"] == r["old_logprobs"]  # no adapter: the policy is the reference
    assert any(abs(a - b) > 1e-4 for r in rows for a, b in zip(r["old_logprobs"], r["teacher_logprobs"]))
    m = result["metrics"]
    for key in ("rescore/gap_mean/cut", "rescore/gap_positive_share/cook", "rescore/skill_uses/general"):
        assert key in m
    assert m["rescore/retrieval_hit_rate"] == m["rescore/retrieval_match_rate"] == 1.0
    assert m["rescore/skill_uses/general"] == len(rows) and m["rescore/tokens_per_s"] > 0
    manifest = storage.read_manifest(out, "rescored")
    # under _attachments/: a Parquet reader of the folder (pyarrow, pandas) skips it and sees only the parts
    assert [a["path"] for a in manifest["attachments"]] == [
        "_attachments/report.html",
        "_attachments/report.md",
    ]
    assert pq.read_table(out).num_rows == len(rows)
    page = storage.read_member(out, "report.html").decode()
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page and "cutting" in page
    assert "| cut |" in storage.read_member(out, "report.md").decode()


def test_overwrite_keeps_the_reports_and_refuses_without_the_flag(
    dataset, rescore, reference_library, tmp_path
):
    traj, out = dataset(), str(tmp_path / "out")
    code, first = rescore(traj, reference_library, out)
    assert code == 0
    manifest = Path(out) / "_manifest.json"
    stamp = manifest.stat().st_mtime_ns
    # the same request again (a retried task): its recorded result, nothing redone or rewritten
    assert rescore(traj, reference_library, out) == (0, first) and manifest.stat().st_mtime_ns == stamp
    code, err = rescore(traj, reference_library, out, "--retrieval", "full")
    assert code == 2 and "already published by another rescore request" in err and "--overwrite" in err
    assert rescore(traj, reference_library, out, "--overwrite", "--retrieval", "full")[0] == 0
    assert storage.read_member(out, "report.html") and storage.read_member(out, "report.md")
    assert read(out)[0]["skill_ids"] == ["general", "cutting", "cooking"]


@pytest.mark.parametrize("strategy", ["keyword", "ucb", "random", "full"])
def test_every_strategy_runs(dataset, rescore, reference_library, tmp_path, strategy):
    out = str(tmp_path / strategy)
    code, result = rescore(dataset(), reference_library, out, "--retrieval", strategy, "--seed", "3")
    assert code == 0, result
    rows = read(out)
    assert all(r["skill_hit"] and r["skill_ids"][0] == "general" for r in rows)
    if strategy == "ucb":  # per task type, untried skills first: the first two rows of a type differ
        first = {}
        for r in rows:
            first.setdefault(r["task_type"], []).append(r["skill_ids"][1])
        assert all(len(set(ids[:2])) == 2 for ids in first.values())


def test_packed_and_padded_stage_outputs_agree(dataset, rescore, reference_library, tmp_path):
    traj = dataset()
    for mode in ("packed", "padded"):
        assert rescore(traj, reference_library, str(tmp_path / mode), "--batching", mode)[0] == 0
    packed, padded = read(str(tmp_path / "packed")), read(str(tmp_path / "padded"))
    diff = max(
        abs(a - b)
        for p, q in zip(packed, padded)
        for col in ("old_logprobs", "teacher_logprobs")
        for a, b in zip(p[col], q[col])
    )
    assert diff < 1e-5


def test_bf16_weights_give_float32_logprobs_near_the_float32_weights(
    dataset, rescore, reference_library, tmp_path
):
    """--precision bf16 (auto's choice on a GPU; auto is fp32 on this CPU) scores with bf16 weights; the log-probs
    stay float32 and within bf16's rounding of the float32 weights' ones."""
    traj = dataset()
    for precision in ("auto", "fp32", "bf16"):
        out = str(tmp_path / precision)
        assert rescore(traj, reference_library, out, "--precision", precision)[0] == 0
    auto, fp32, bf16 = (read(str(tmp_path / p)) for p in ("auto", "fp32", "bf16"))
    assert auto == fp32
    gaps = [
        abs(a - b)
        for p, q in zip(bf16, fp32)
        for col in ("old_logprobs", "teacher_logprobs", "ref_logprobs")
        for a, b in zip(p[col] or [], q[col] or [])
    ]
    assert gaps and 0 < max(gaps) < 0.25 and sum(gaps) / len(gaps) < 0.05


def test_shards_partition_the_groups(dataset, rescore, reference_library, tmp_path):
    traj = dataset()
    shards = []
    for s in (0, 1):
        out = str(tmp_path / f"shard{s}")
        assert rescore(traj, reference_library, out, "--shard", str(s), "--num-shards", "2")[0] == 0
        shards.append(read(out))
    groups = [{r["group_id"] for r in rows} for rows in shards]
    assert groups[0] and groups[1] and not groups[0] & groups[1]
    assert sum(len(rows) for rows in shards) == 15


def test_ucb_statistics_carry_across_rounds(dataset, rescore, reference_library, tmp_path, capsys):
    traj = dataset()
    scored = str(tmp_path / "rescored0")
    assert rescore(traj, reference_library, scored, "--retrieval", "ucb")[0] == 0
    lib1 = str(tmp_path / "skills1")
    argv = ["extract-skills", "--input", traj, "--previous", reference_library, "--output", lib1]
    assert main([*argv, "--rescored", scored]) == 0
    capsys.readouterr()
    stats = json.loads((Path(lib1) / "skill_stats.json").read_text())
    arms = stats["arms"]
    assert set(arms) == {"cut", "cook"} and stats["updates"] == 1
    pulls = sum(a["pulls"] for per_type in arms.values() for a in per_type.values())
    assert pulls == 15  # every row credited its one task-specific skill
    # the next round reads them from the library
    code, result = rescore(traj, lib1, str(tmp_path / "rescored1"), "--retrieval", "ucb")
    assert code == 0, result
    # rows scored with another library cannot update this one
    code = main(
        [
            "extract-skills",
            "--input",
            traj,
            "--previous",
            lib1,
            "--rescored",
            scored,
            "--output",
            str(tmp_path / "x"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "was scored with skill library" in err


def test_reference_logprobs_are_the_base_model_without_the_adapter(
    dataset, rescore, reference_library, tmp_path, tiny_model, published_adapter
):
    from sdarflow.models import load_policy
    from sdarflow.teacher.rescore import score

    out = str(tmp_path / "out")
    code, result = rescore(dataset(), reference_library, out, "--adapter", published_adapter)
    assert code == 0, result
    rows = read(out)
    base = load_policy(str(tiny_model))
    prompts, responses = [r["prompt_token_ids"] for r in rows], [r["response_token_ids"] for r in rows]
    expected = score(base.model, prompts, responses, base.tokenizer.pad_token_id, 16384)
    flat = [
        (a, b, o) for r, e in zip(rows, expected) for a, b, o in zip(r["ref_logprobs"], e, r["old_logprobs"])
    ]
    assert max(abs(a - b) for a, b, _ in flat) < 1e-5
    assert max(abs(a - o) for a, _, o in flat) > 1e-3  # the adapter changes the policy
    kl = sum(o - a for a, _, o in flat) / len(flat)
    assert abs(result["metrics"]["rescore/ref_kl_mean"] - kl) < 1e-6
    # each turn's progress: the sum of its tokens' old - reference log-probs
    for r in rows:
        assert r["progress"] == pytest.approx(sum(r["old_logprobs"]) - sum(r["ref_logprobs"]), abs=1e-4)
    assert any(abs(r["progress"]) > 1e-3 for r in rows)


def test_no_ref_logprobs_writes_nulls(dataset, rescore, reference_library, tmp_path, published_adapter):
    out = str(tmp_path / "out")
    code, result = rescore(
        dataset(), reference_library, out, "--adapter", published_adapter, "--no-ref-logprobs"
    )
    assert code == 0, result
    assert all(r["ref_logprobs"] is None and r["progress"] is None for r in read(out))
    assert "rescore/ref_kl_mean" not in result["metrics"]


def test_a_merged_adapter_gets_the_base_reloaded(tiny_model, published_adapter, tokenizer, student_rows):
    from sdarflow.models import load_policy
    from sdarflow.teacher.rescore import reference_model, score

    rows = student_rows[:3]
    prompts, responses = [r["prompt_token_ids"] for r in rows], [r["response_token_ids"] for r in rows]
    pad = tokenizer.pad_token_id
    base = score(load_policy(str(tiny_model)).model, prompts, responses, pad, 16384)
    merged = load_policy(str(tiny_model), published_adapter).model.merge_and_unload()
    with reference_model(merged, str(tiny_model), flash_attention=False) as ref:
        assert ref is not merged
        got = score(ref, prompts, responses, pad, 16384)
    assert max(abs(a - b) for g, e in zip(got, base) for a, b in zip(g, e)) < 1e-5


def test_prompt_budget_and_reference_flags(capsys):
    from sdarflow.errors import ConfigError
    from sdarflow.stages.rescore import RescoreConfig

    cfg = RescoreConfig()
    assert cfg.skill_place == "prefix" and cfg.max_prompt_tokens == 2048 and cfg.ref_logprobs
    with pytest.raises(ConfigError, match=r"max_prompt_tokens = 0 must be >= 1"):
        RescoreConfig(max_prompt_tokens=0)
    with pytest.raises(SystemExit):
        main(["rescore", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--ref-logprobs, --no-ref-logprobs" in text and "{prefix,system,user}" in text


@pytest.mark.parametrize("place", ["system", "user"])
def test_message_places_run(dataset, rescore, reference_library, tmp_path, place):
    out = str(tmp_path / place)
    code, result = rescore(dataset(), reference_library, out, "--skill-place", place)
    assert code == 0, result
    rows = read(out)
    assert any(abs(a - b) > 1e-4 for r in rows for a, b in zip(r["old_logprobs"], r["teacher_logprobs"]))


@pytest.fixture(scope="module")
def adapter_with_ema(tiny_model, tmp_path_factory) -> str:
    """A published LoRA whose student weights are random (B too) and whose ema/ is the same LoRA with B = 0,
    the base model's function: an EMA teacher that has not moved from a new LoRA."""
    import torch

    from sdarflow.extensions.ema import EMA_DIR
    from sdarflow.models.policy import load_policy, new_lora

    model = new_lora(load_policy(str(tiny_model)).model, rank=4, alpha=8, targets=["q_proj", "v_proj"])
    staged = tmp_path_factory.mktemp("ema-staged")
    model.save_pretrained(str(staged / EMA_DIR))  # B = 0
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    model.save_pretrained(str(staged))
    out = str(tmp_path_factory.mktemp("ema-adapter") / "published")
    storage.publish_dir(staged, out, kind="adapter")
    return out


def test_the_ema_teacher_scores_with_the_adapters_average(
    dataset, rescore, reference_library, tmp_path, adapter_with_ema, published_adapter, caplog
):
    traj = dataset()
    runs = {}
    for name, flags in {
        "ema": ["--adapter", adapter_with_ema, "--teacher", "ema"],
        "current": ["--adapter", adapter_with_ema],
        "base": [],  # no adapter: teacher = the base model with skills, what an unmoved average is
    }.items():
        code, result = rescore(traj, reference_library, str(tmp_path / name), *flags)
        assert code == 0, result
        runs[name] = read(str(tmp_path / name))

    def gap(a: str, b: str, column: str) -> float:
        return max(abs(x - y) for ra, rb in zip(runs[a], runs[b]) for x, y in zip(ra[column], rb[column]))

    assert gap("ema", "base", "teacher_logprobs") < 1e-5  # the teacher ran on the average's weights
    assert gap("ema", "current", "old_logprobs") < 1e-6  # the student pass is the student's
    assert gap("current", "base", "teacher_logprobs") > 1e-3  # and the adapter does change the policy
    # an adapter without an average yet (a pipeline's start adapter): train starts one at the current weights,
    # so this round's teacher is the current student, with a warning
    code, _ = rescore(traj, reference_library, str(tmp_path / "no-ema"), "--adapter", published_adapter)
    assert code == 0
    code, _ = rescore(
        traj, reference_library, str(tmp_path / "x"), "--adapter", published_adapter, "--teacher", "ema"
    )
    assert code == 0 and "has no ema/ yet; the teacher is the current student" in caplog.text
    same = [(a, b) for ra, rb in zip(read(str(tmp_path / "x")), read(str(tmp_path / "no-ema")))
            for a, b in zip(ra["teacher_logprobs"], rb["teacher_logprobs"])]  # fmt: skip
    assert max(abs(a - b) for a, b in same) < 1e-6


def test_the_report_shows_the_teachers_discrimination_with_task_intervals(
    student_rows, write_dataset, rescore, reference_library, tmp_path
):
    """Four games: every contrast is n/a (4 tasks) and no discrimination metric is written; the same turns as six
    tasks with expert labels (turn 0 matches) give both contrasts a difference with a task-level interval."""
    code, few = rescore(write_dataset("few", student_rows), reference_library, str(tmp_path / "a"))
    assert code == 0, few
    assert not any(k.startswith("rescore/discrimination/") for k in few["metrics"])
    page = storage.read_member(str(tmp_path / "a"), "report.md").decode()
    assert "Teacher discrimination" in page and "n/a (4 tasks)" in page and "n/a (0 tasks)" in page

    copies = [dict(r, task_id=f"{r['task_id']}-2", traj_id=f"{r['traj_id']}-2") for r in student_rows[:8]]
    labelled = [
        dict(r, expert_action="take knife", expert_match=r["turn"] == 0) for r in student_rows + copies
    ]
    code, out = rescore(write_dataset("six", labelled), reference_library, str(tmp_path / "b"))
    assert code == 0, out
    m = out["metrics"]
    for contrast in ("expert", "success"):
        for q in ("gate", "gap"):
            key = f"rescore/discrimination/{contrast}/{q}"
            assert m[f"{key}/lo"] <= m[key] <= m[f"{key}/hi"], key
    section = (
        storage.read_member(str(tmp_path / "b"), "report.md").decode().split("Teacher discrimination")[1]
    )
    assert "n/a" not in section.split("##")[0]
