"""The study's analysis on hand-made cells: pooled values, relative figures, paired differences, gate verdicts."""

from __future__ import annotations

import pytest

from sdarflow.report import markdown
from sdarflow.study_report import analyze, study_report


def _split(successes: dict[str, int], n: int = 4) -> dict:
    return {"samples_per_task": n, "task_successes": successes, "pass_at_k": {"1": 0.0, "2": 0.0, "4": 0.0}}


def _cell(method: str, seed: int, test: dict[str, int], ood: dict[str, int], seconds: float) -> dict:
    rounds = [{"train_success": 0.5, "teacher_gap_mean": 0.1, "gate_mean": 0.5, "entropy": 1.0,
               "format_error_rate": 0.0}]  # fmt: skip
    ev = {"test": _split(test), "ood": _split(ood)}
    for split in ev.values():  # the report's own pass@1 (only the Runs table reads it)
        split["pass_at_k"]["1"] = sum(split["task_successes"].values()) / (4 * len(split["task_successes"]))
    return {"method": method, "seed": seed, "rounds": rounds, "seconds": {"train": seconds}, "eval": ev}


SETTINGS = {
    "methods": ["grpo", "sdar"],
    "seeds": [0, 1],
    "rounds": 1,
    "env": "e",
    "base_model": "b",
    "sizes": {},
    "stage_settings": {"train": {"lr": 0.002}},
}
CELLS = [
    # grpo: test tasks a, b solved 2/4 and 0/4 (seed 0), 4/4 and 0/4 (seed 1); ood x solved 1/4 then 0/4
    _cell("grpo", 0, {"a": 2, "b": 0}, {"x": 1}, 10.0),
    _cell("grpo", 1, {"a": 4, "b": 0}, {"x": 0}, 10.0),
    # sdar: test 3/4, 1/4 and 4/4, 2/4; ood 0/4 both seeds; 50% slower
    _cell("sdar", 0, {"a": 3, "b": 1}, {"x": 0}, 15.0),
    _cell("sdar", 1, {"a": 4, "b": 2}, {"x": 0}, 15.0),
]
BASE = {"eval": {"test": _split({"a": 1, "b": 0}), "ood": _split({"x": 0})}}


def test_pooled_relative_and_paired_values_by_hand():
    study = analyze(SETTINGS, BASE, CELLS)
    assert study["k"] == 4
    grpo, sdar = study["methods"]["grpo"], study["methods"]["sdar"]
    # pass@1 pooled over (seed, task): grpo (2 + 0 + 4 + 0) / 16 = 0.375; sdar (3 + 1 + 4 + 2) / 16 = 0.625
    assert grpo["test_pass@1"]["value"] == pytest.approx(0.375)
    assert sdar["test_pass@1"]["value"] == pytest.approx(0.625)
    assert grpo["test_pass@1"]["trials"] == 16
    # pass@4 with 4 samples: solved at least once -> grpo 2 of 4 (seed, task) pairs, sdar 4 of 4
    assert grpo["test_pass@k"]["value"] == pytest.approx(0.5)
    assert sdar["test_pass@k"]["value"] == pytest.approx(1.0)
    row = {t["method"]: t for t in study["table"]}["sdar"]
    assert row["relative_pass@1"] == pytest.approx(0.625 / 0.375)
    assert row["relative_pass@k"] == pytest.approx(2.0)
    assert row["relative_ood_pass@1"] == pytest.approx(0.0)  # grpo 1/8, sdar 0
    assert row["training_overhead"] == pytest.approx(1.5)
    # pass@k / pass@1: sdar 1 / 0.625 = 1.6, grpo 0.5 / 0.375 = 4/3 -> relative 1.2
    assert row["relative_pass@k_over_pass@1"] == pytest.approx(1.6 / (4 / 3))
    # paired pass@1 differences per (seed, task): +1/4, +1/4, 0, +2/4 -> mean 0.25
    d = study["paired"]["sdar"]["test_pass@1"]
    assert d["mean_diff"] == pytest.approx(0.25) and d["pairs"] == 4
    assert d["ci95"][0] <= 0.25 <= d["ci95"][1]
    # grpo against the base (a 1/4, b 0/4 for both seeds): +1/4, 0, +3/4, 0 -> 0.25
    assert study["paired"]["grpo_vs_base"]["test_pass@1"]["mean_diff"] == pytest.approx(0.25)
    # the gate cannot tell on two tasks: seed 1's pass@1 differences (a +0, b +2/4) have mean 0.25, se 0.25, and
    # the bound 0.25 - t_0.95(1) * 0.25 = 0.25 - 6.3138 * 0.25 = -1.3284; one ood task gives no bound at all
    assert study["gate"]["sdar"]["1"][0] == (
        "test pass@1 vs grpo: 0.75 - 0.50 = +0.25, lower bound -1.3284 (2 paired tasks) not above min_gain 0.00"
    )
    assert any("ood pass@1" in f and "cannot bound" in f for f in study["gate"]["sdar"]["0"])


def test_markdown_has_the_comparison_table():
    md = markdown(study_report(analyze(SETTINGS, BASE, CELLS), b""))
    assert "| method | relative pass@1 | relative pass@4 | relative OOD pass@1 | training overhead |" in md
    assert "| grpo | 1.00 | 1.00 | 1.00 | 1.00 |" in md
    assert "| sdar | 1.67 | 2.00 | 0.00 | 1.50 |" in md
    assert 'stage settings {"train": {"lr": 0.002}}' in md  # what every cell ran with


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "sdar"], "methods must include grpo"),
        (["--methods", "grpo", "sdra"], "unknown method 'sdra' in 'sdra'"),
        (
            ["--methods", "grpo", "grpo+scop"],
            "study: 'grpo+scop' names unknown or repeated option(s) ['scop']",
        ),
        (["--methods", "grpo", "grpo+scpo+scpo"], "repeated option(s) ['scpo', 'scpo']"),
        (["--seeds", "0", "0"], "seeds [0, 0] must be distinct"),
        (["--rounds", "0"], "rounds (0) must be >= 1"),
        (["--stage-settings", "{bad"], "--stage-settings is not JSON"),
        (["--stage-settings", '{"trian": {}}'], "unknown stage(s) ['trian']"),
    ],
)
def test_bad_study_settings_fail_in_one_line_and_write_nothing(argv, message, tmp_path, capsys):
    from sdarflow.cli import main

    out = tmp_path / "study"
    assert main(["study", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("error: ")
    assert not out.exists()
