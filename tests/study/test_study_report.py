"""The study's analysis on hand-made cells: pooled values, relative figures, paired differences, gate verdicts."""

from __future__ import annotations

import pytest

from sdarflow.report import markdown
from sdarflow.study_report import analyze, study_report


def _split(successes: dict[str, int], n: int = 4) -> dict:
    return {"samples_per_task": n, "task_successes": successes, "pass_at_k": {"1": 0.0, "2": 1.0, "4": 1.0}}


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
BASE = [
    {"seed": seed, "eval": {"test": _split({"a": 1, "b": 0}), "ood": _split({"x": 0})}} for seed in (0, 1)
]


def test_pooled_relative_and_paired_values_by_hand():
    study = analyze(SETTINGS, BASE, CELLS)
    assert study["k"] == 4
    grpo, sdar = study["methods"]["grpo"], study["methods"]["sdar"]
    # pass@1: each task's mean over the seeds, then the mean over tasks: grpo a (2/4 + 4/4) / 2 = 0.75, b 0 ->
    # 0.375; sdar a (3/4 + 4/4) / 2 = 0.875, b (1/4 + 2/4) / 2 = 0.375 -> 0.625
    assert grpo["test_pass@1"]["value"] == pytest.approx(0.375)
    assert sdar["test_pass@1"]["value"] == pytest.approx(0.625)
    assert (grpo["test_pass@1"]["trials"], grpo["test_pass@1"]["tasks"], grpo["test_pass@1"]["seeds"]) == (
        16,
        2,
        2,
    )
    # pass@4 with 4 samples: solved at least once -> grpo task a in both seeds, b in neither: 0.5; sdar 1.0
    assert grpo["test_pass@k"]["value"] == pytest.approx(0.5)
    assert sdar["test_pass@k"]["value"] == pytest.approx(1.0)
    row = {t["method"]: t for t in study["table"]}["sdar"]
    assert row["relative_pass@1"] == pytest.approx(0.625 / 0.375)
    assert row["relative_pass@k"] == pytest.approx(2.0)
    assert row["relative_ood_pass@1"] == pytest.approx(0.0)  # grpo 1/8, sdar 0
    assert row["training_overhead"] == pytest.approx(1.5)
    # pass@k / pass@1: sdar 1 / 0.625 = 1.6, grpo 0.5 / 0.375 = 4/3 -> relative 1.2
    assert row["relative_pass@k_over_pass@1"] == pytest.approx(1.6 / (4 / 3))
    # paired pass@1 per task, seed means: a 0.875 - 0.75 = +0.125, b 0.375 - 0 = +0.375 -> mean 0.25 over 2 tasks;
    # sd 0.176777, se 0.125, t_0.975(1) = 12.706205 -> 0.25 +- 1.588276 (two tasks say little)
    d = study["paired"]["sdar"]["test_pass@1"]
    assert d["mean_diff"] == pytest.approx(0.25) and d["tasks"] == 2
    assert d["ci95"] == [pytest.approx(0.25 - 1.588276, abs=1e-5), pytest.approx(0.25 + 1.588276, abs=1e-5)]
    # what it could have detected (95%, 80% power): (t_0.975(1) + t_0.8(1)) * se, t_0.8(1) = tan(0.3 pi) = 1.376382
    assert d["mde"] == pytest.approx((12.706205 + 1.376382) * 0.125, abs=1e-5)
    # grpo against the base (a 1/4, b 0/4, evaluated for each seed): a 0.75 - 0.25, b 0 - 0 -> 0.25
    assert study["paired"]["grpo_vs_base"]["test_pass@1"]["mean_diff"] == pytest.approx(0.25)
    # the gate does not judge two tasks (nor one ood task): fewer than the default policy's min_tasks
    assert study["gate"]["sdar"]["1"][0].startswith(
        "test: 2 paired tasks are fewer than the gate's min_tasks 32"
    )
    assert any(f.startswith("ood: 1 paired tasks are fewer") for f in study["gate"]["sdar"]["0"])


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
        (
            ["--methods", "grpo", "sdar+solution+synthetic"],
            "study: 'sdar+solution+synthetic': options solution and synthetic set rescore teacher_context "
            "differently; fix: keep one of them",
        ),
        (["--seeds", "0", "0"], "seeds [0, 0] must be distinct"),
        (["--rounds", "0"], "study: rounds = 0 must be >= 1"),
        (["--stage-settings", "{bad"], "--stage-settings is not JSON"),
        (["--stage-settings", '{"trian": {}}'], "study: stage_settings: unknown key(s) trian"),
    ],
)
def test_bad_study_settings_fail_in_one_line_and_write_nothing(argv, message, tmp_path, capsys):
    from sdarflow.cli import main

    out = tmp_path / "study"
    assert main(["study", "--output", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("error: ")
    assert not out.exists()


def test_valid_pass_at_1_by_round_starts_at_the_base_and_ends_at_the_final_adapter():
    """The held-out curve: point 0 the base model's valid pass@1 for the run's seed, then each round's adapter
    (the cell's valid_after_round), the final evaluation's last; a cell made before it was recorded has none."""

    def cell(seed: int, after: list[float] | None, final: int) -> dict:
        c = _cell("grpo", seed, {"a": 1}, {"x": 0}, 1.0)
        c["rounds"] = c["rounds"] * 3
        c["eval"]["valid"] = _split({"v": final}) | {"pass_at_k": {"1": final / 4}}
        return c | ({} if after is None else {"valid_after_round": after})

    base = [{"seed": s, "eval": {"test": _split({"a": 0}), "ood": _split({"x": 0}),
                                 "valid": _split({"v": 0}) | {"pass_at_k": {"1": 0.1 * (s + 1)}}}} for s in (0, 1)]  # fmt: skip
    settings = SETTINGS | {"methods": ["grpo"]}
    # seed 0: 0.1, 0.2, 0.3, final 2/4; seed 1: 0.2, 0.4, 0.4, final 4/4 -> mean 0.15, 0.3, 0.35, 0.75
    study = analyze(settings, base, [cell(0, [0.2, 0.3], 2), cell(1, [0.4, 0.4], 4)])
    c = study["methods"]["grpo"]["curves"]["valid_pass@1"]
    assert c["mean"] == pytest.approx([0.15, 0.3, 0.35, 0.75])
    assert c["min"] == pytest.approx([0.1, 0.2, 0.3, 0.5]) and c["max"] == pytest.approx([0.2, 0.4, 0.4, 1.0])
    old = analyze(settings, base, [cell(0, None, 2), cell(1, None, 4)])
    assert old["methods"]["grpo"]["curves"]["valid_pass@1"]["mean"] == [None] * 4


def test_the_base_models_rollouts_on_each_rounds_games_are_the_train_curves_reference():
    """Each round plays new games: the base cells' rollout success and return on them (``*_by_round``), mean and
    band over seeds, drawn beside the runs' train success and return; none from base cells made before."""
    from sdarflow.study_report import curves_png

    settings = SETTINGS | {"methods": ["grpo"], "rounds": 2}
    grpo = [c | {"rounds": c["rounds"] * 2} for c in CELLS if c["method"] == "grpo"]
    # success: seed 0 0.25 then 0.5, seed 1 0.125 then 0.25 -> mean 0.1875, 0.375; return: 0.5, 0.75 and 0.25, 0.5
    base = [
        b | {"train_success_by_round": s, "train_return_by_round": r}
        for b, s, r in zip(BASE, [[0.25, 0.5], [0.125, 0.25]], [[0.5, 0.75], [0.25, 0.5]], strict=True)
    ]
    curves = analyze(settings, base, grpo)["base_curves"]
    assert curves["train_success"]["mean"] == pytest.approx([0.1875, 0.375])
    assert curves["train_success"]["min"] == pytest.approx([0.125, 0.25])
    assert curves["train_success"]["max"] == pytest.approx([0.25, 0.5])
    assert curves["train_return"]["mean"] == pytest.approx([0.375, 0.625])
    old = analyze(settings, BASE, grpo)
    assert all(old["base_curves"][k]["mean"] == [] for k in ("train_success", "train_return"))
    assert curves_png(analyze(settings, base, grpo)).startswith(b"\x89PNG")


def test_curves_without_any_point_still_make_a_figure():
    from sdarflow.study_report import curves_png

    assert curves_png({"methods": {"grpo": {"curves": {}}}}).startswith(b"\x89PNG")
