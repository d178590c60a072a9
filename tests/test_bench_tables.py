"""The result tables of the pages (README.md, docs/*.md) are rendered from the result files: every benchmark's row,
what made them, nothing outside the markers; and the committed pages agree with the committed results."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from bench import tables
from sdarflow.provenance import machine


def _task(imports: float, model: float) -> dict:
    cold = {"interpreter_s": 0.05, "imports_s": imports, "config_cold_s": 0.01, "model_cold_s": model}
    return {**cold, "fixed_cost_s": 0.06 + imports + model}


def _dist(rows: int, speedup: float, bound: float) -> dict:
    return {
        "rows": rows,
        "row_tokens": {"mean": 310.4},
        "tokens_per_s": {"packed": 9000.0, "padded_in_order": 5000.0},
        "speedup": speedup,
        "speedup_bound": bound,
        "fraction_of_bound": speedup / bound,
        "fraction_of_peak": 0.55,
    }


def _grid_cell(kind: str, batch: int, prompt_tokens: float, hf: tuple, vllm: tuple) -> dict:
    """A generation grid cell at 32 new tokens; ``hf``, ``vllm``: (tokens/s, prefill share, fraction of peak)."""
    engines = {
        name: dict(zip(("tokens_per_s", "prefill_share", "fraction_of_peak"), figures, strict=True))
        for name, figures in (("hf", hf), ("vllm", vllm))
    }
    return {"kind": kind, "new_tokens": 32, "batch": batch, "prompt_tokens_mean": prompt_tokens, **engines,
            "vllm_over_hf": vllm[0] / hf[0]}  # fmt: skip


RESULTS = {
    "startup": {
        "help_seconds": 0.07,
        "tasks": {"generate": _task(2.0, 2.5), "register": _task(1.9, 0.0), "train": _task(2.1, 2.7)},
        "fixed_cost_median_s": 4.61,
        "production": {"fixed_cost_share": 0.025},
    },
    "rescoring": {
        "model": "smollm2-135m-instruct",
        "distributions": {"demo": _dist(96, 1.2, 1.4), "agent": _dist(24, 1.8, 2.0)},
    },
    "generation": {
        "model": "smollm2-135m-instruct",
        "new_tokens": 32,
        "by_batch": {
            "1": {"tokens_per_s": {"engine": 10.0, "plain": 11.0}, "fraction_of_peak": 0.2},
            "8": {"tokens_per_s": {"engine": 17.0, "plain": 17.0}, "fraction_of_peak": 0.3},
        },
        "engine_over_plain": 0.91,
        "group_size": 8,
        "grid": {
            "first turn, 32 new, batch 8": _grid_cell(
                "first turn", 8, 430.0, (20.0, 0.5, 0.2), (50.0, 0.25, 0.5)
            ),
            "long, 32 new, batch 64": _grid_cell("long", 64, 1800.0, (6.0, 0.75, 0.3), (24.0, 0.5, 0.9)),
        },
        "vllm": {
            "vllm": "0.32.0",
            "torch": "2.13.0+cpu",
            "compiled": True,
            "prefix_caching": True,
            "start_seconds": 210.0,
        },
        "hf_drift": 1.02,
    },
    "pipeline_overhead": {
        "kfp_local_seconds": 220.0,
        "direct_seconds": 200.0,
        "overhead_per_task_seconds": 2.5,
        "overhead_fraction": 0.1,
    },
}


@pytest.fixture
def results(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    for name, values in RESULTS.items():
        (folder / f"{name}.json").write_text(json.dumps({"benchmark": name, "machine": machine(), **values}))
    (folder / "train_step.json").write_text(json.dumps({"benchmark": "train_step", "machine": machine()}))
    return folder


def test_table_has_a_row_per_result_and_what_made_it(results):
    lines = tables.bench_table(results).splitlines()
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in lines if ln.startswith("| ") and "---" not in ln}
    assert set(rows) == {"benchmark", "startup", "rescoring", "generation", "pipeline_overhead", "train_step"}
    assert "agent: 1.80x of a 2.00x bound (0.90), fraction_of_peak 0.55" in rows["rescoring"]
    assert "demo (96 turns, mean 310 tokens): packed 9000 vs padded 5000 tokens/s" in rows["rescoring"]
    assert "0.07 s / 4.6 s" in rows["startup"] and "slowest train 4.9 s" in rows["startup"]
    assert "2.5% of a production round" in rows["startup"]
    assert "1: 10 vs 11, 8: 17 vs 17" in rows["generation"] and "(worst batch) 0.91" in rows["generation"]
    assert "vLLM-CPU over the hf engine at the rollout's shapes: 2.5x to 4.0x" in rows["generation"]
    assert "overhead 10.0%" in rows["pipeline_overhead"] and "2.5 s per task" in rows["pipeline_overhead"]
    assert lines[-1] == "Made by: `train_step`: no provenance (made by an older sdarflow); rerun it."


def test_the_engine_table_shows_hf_and_vllm_by_shape_and_how_vllm_ran(results):
    lines = tables.generation_engines_table(results).splitlines()
    assert (
        lines[2] == "| first turn, 32 new, 8 rows | 430 | 20.0 | 50.0 | 2.50x | 50.0%, 25.0% | 0.20, 0.50 |"
    )
    assert lines[3] == "| long, 32 new, 64 rows | 1800 | 6.0 | 24.0 | 4.00x | 75.0%, 50.0% | 0.30, 0.90 |"
    assert "vLLM 0.32.0 (torch 2.13.0+cpu, compiled, prefix caching on) started in 210 s" in lines[5]
    assert "took 1.02x its first time" in lines[5]
    skipped = json.loads((results / "generation.json").read_text())
    for cell in skipped["grid"].values():
        del cell["vllm"], cell["vllm_over_hf"]
    skipped["vllm"] = {"skipped": "no vLLM venv here; fix: make .venv-vllm/.installed"}
    (results / "generation.json").write_text(json.dumps(skipped))
    lines = tables.generation_engines_table(results).splitlines()
    assert lines[2] == "| first turn, 32 new, 8 rows | 430 | 20.0 | - | - | 50.0%, - | 0.20, - |"
    assert lines[5].startswith("vLLM not measured: no vLLM venv here; fix: make .venv-vllm/.installed;")
    row = next(ln for ln in tables.bench_table(results).splitlines() if ln.startswith("| generation"))
    assert "vLLM-CPU" not in row


def test_an_older_result_file_is_named_not_a_crash(results):
    (results / "rollout.json").write_text(
        json.dumps({"benchmark": "rollout", "machine": machine(), "speedup": 1})
    )
    row = next(ln for ln in tables.bench_table(results).splitlines() if ln.startswith("| rollout"))
    assert "an older result" in row and "python -m bench rollout" in row


def test_update_replaces_only_the_marked_tables(results, tmp_path):
    page = tmp_path / "README.md"
    start, end = tables._markers("bench")
    page.write_text(f"intro\n{start}\nold table\n{end}\noutro\n")
    tables.update(page, results)
    text = page.read_text()
    assert text.startswith(f"intro\n{start}\n| benchmark |") and text.endswith(f"{end}\noutro\n")
    assert "old table" not in text
    tables.update(page, results)
    assert page.read_text() == text  # idempotent
    assert tables.stale(page, results) == []
    page.write_text(text.replace("overhead 10.0%", "overhead 1.0%"))  # edited by hand
    assert tables.stale(page, results) == ["bench"]

    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no generated-table markers"):
        tables.update(page, results)


def test_provenance_is_shown_per_distinct_origin(results):
    from sdarflow.provenance import provenance

    made = provenance(argv=["python", "-m", "bench", "startup"])
    (results / "startup.json").write_text(
        json.dumps({"benchmark": "startup", "machine": made.pop("machine"), "provenance": made,
                    **RESULTS["startup"]})
    )  # fmt: skip
    last = tables.bench_table(results).splitlines()
    assert any(ln.startswith(f"Made by: sdarflow {made['sdarflow']} at ") for ln in last)


def test_tables_stand_on_any_page_and_a_page_without_markers_is_left_alone(results, tmp_path):
    readme, doc, plain = (tmp_path / name for name in ("README.md", "doc.md", "plain.md"))
    start, end = tables._markers("bench")
    readme.write_text("intro\n")
    doc.write_text(f"{start}\nold table\n{end}\n")
    plain.write_text("no markers\n")
    pages = [readme, doc, plain]
    assert tables.stale(pages, results) == ["bench"]
    tables.update(pages, results)
    assert readme.read_text() == "intro\n" and plain.read_text() == "no markers\n"
    assert "| benchmark |" in doc.read_text()
    assert tables.stale(pages, results) == []
    assert tables.stale([readme, plain], results) == [
        f"{stem} (no table shows it)" for stem in sorted(p.stem for p in results.glob("*.json"))
    ]


def test_the_committed_readme_tables_agree_with_the_committed_results():
    assert tables.stale() == [], "run `python -m bench.tables` and commit the README and docs/"


def _fig(value: float) -> dict:
    return {"value": value, "ci95": [value - 0.05, value + 0.05]}


def _diff(mean: float) -> dict:
    return {"mean_diff": mean, "ci95": [mean - 0.04, mean + 0.04], "tasks": 32}


def test_the_rl_setting_is_selected_on_valid_and_shown_with_its_test_figures(tmp_path):
    from bench.grpo_tuning import select
    from sdarflow.provenance import provenance

    base = {f"{s}_pass@1": _fig(0.1) for s in ("valid", "test", "ood")}
    candidates = {
        "a": {"stage_settings": {}, "valid_pass@1": _fig(0.30), "test_pass@1": _fig(0.10), "ood_pass@1": _fig(0.02),
              "grpo_vs_base": {"test_pass@1": _diff(0.0)}, "base": base, "per_seed_test_pass@1": {"0": 0.1}},
        "b": {"stage_settings": {"train": {"lr": 0.005}}, "valid_pass@1": _fig(0.20), "test_pass@1": _fig(0.40),
              "ood_pass@1": _fig(0.02), "grpo_vs_base": {"test_pass@1": _diff(0.3)}, "base": base,
              "per_seed_test_pass@1": {"0": 0.4}},
    }  # fmt: skip
    assert select(candidates) == "a"  # valid decides, though b looks better on test
    made = provenance(argv=["python", "-m", "bench.grpo_tuning"])
    result = {"benchmark": "grpo_tuning", "machine": made.pop("machine"), "provenance": made,
              "selected_on": "valid", "selected": "a", "seeds": [0], "rounds": 3, "candidates": candidates,
              "grpo_vs_base": candidates["a"]["grpo_vs_base"]}  # fmt: skip
    (tmp_path / "grpo_tuning.json").write_text(json.dumps(result))
    table = tables.grpo_tuning_table(tmp_path)
    assert "| **a** (selected on valid) `{}` | 0.300 [0.250, 0.350] | 0.100 [0.050, 0.150] |" in table
    assert '| b `{"train": {"lr": 0.005}}` | 0.200 [0.150, 0.250] | 0.400 [0.350, 0.450] |' in table
    assert "Command: `python -m bench.grpo_tuning`" in table and "Made by: sdarflow" in table


def test_the_demo_table_shows_each_round_against_the_base(tmp_path):
    def figures(test: float) -> dict:
        return {"test": {"pass@1": test, "pass@1_ci95": [test - 0.1, test + 0.1], "tasks_x_samples": "32 x 4"},
                "ood": {"pass@1": 0.0, "pass@1_ci95": [0.0, 0.05], "tasks_x_samples": "32 x 4"}}  # fmt: skip

    evaluation = figures(0.2)
    evaluation["test"]["vs_base"] = {"diff": 0.1, "lower": -0.01, "tasks": 32}
    rounds = [{"round": 0, "eval": evaluation, "skills": {"right": 7, "wrong": 2, "recipe_blind": 1}}]
    result = {"benchmark": "demo", "machine": machine(), "base": figures(0.1), "per_round": rounds}
    (tmp_path / "demo.json").write_text(json.dumps(result))
    table = tables.demo_table(tmp_path)
    assert "| base model | 0.100 [0.000, 0.200] | 0.000 [0.000, 0.050] | 32 x 4 | | |" in table
    assert (
        "| round 0 | 0.200 [0.100, 0.300] | 0.000 [0.000, 0.050] | 32 x 4 | +0.100, -0.010 | 7 / 2 / 1 |"
        in table
    )


def _split(successes: dict[str, int]) -> dict:
    rate = sum(successes.values()) / (4 * len(successes))
    return {"samples_per_task": 4, "task_successes": successes, "pass_at_k": {"1": rate, "4": rate}}


def test_a_committed_study_gets_its_table_and_one_without_a_table_is_named(tmp_path):
    from sdarflow.provenance import provenance
    from sdarflow.study_report import analyze

    def cell(method: str, seed: int, test: dict[str, int]) -> dict:
        ev = {"valid": _split(test), "test": _split(test), "ood": _split({"x": 0, "y": 1})}
        return {"method": method, "seed": seed, "rounds": [{"train_success": 0.5}], "seconds": {"train": 1.0},
                "eval": ev}  # fmt: skip

    tasks = [f"t{i}" for i in range(8)]
    cells = [cell(m, seed, {t: (i + seed + (m == "sdar")) % 5 for i, t in enumerate(tasks)})
             for m in ("grpo", "sdar") for seed in (0, 1)]  # fmt: skip
    base = [cell("base", seed, dict.fromkeys(tasks, 1)) for seed in (0, 1)]
    settings = {"methods": ["grpo", "sdar"], "seeds": [0, 1], "rounds": 3,
                "provenance": provenance(argv=["sdarflow", "study", "--methods", "grpo", "sdar"])}  # fmt: skip
    study = analyze(settings, base, cells)
    made = dict(study["settings"]["provenance"])
    result = {"benchmark": "study_x", "machine": made.pop("machine"), "provenance": made, **study}
    (tmp_path / "study_x.json").write_text(json.dumps(result))
    table = tables.study_table("study_x", tmp_path)
    rows = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert rows[0].startswith("| method | valid pass@1 | test pass@1 | ood pass@1 | test pass@4 |")
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| base model", "| grpo", "| sdar"]
    assert (
        "GRPO - base model (paired): valid " in table
        and "Command: `sdarflow study --methods grpo sdar`" in table
    )
    # each difference says what it could have detected, and the footnote says what that is
    test_vs_base = study["paired"]["grpo_vs_base"]["test_pass@1"]
    assert f"(MDE {test_vs_base['mde']:.3f})" in table and "MDE: the minimum detectable effect" in table
    page = tmp_path / "README.md"
    start, end = tables._markers("bench")
    page.write_text(f"{start}\n{end}\n")
    tables.update(page, tmp_path)
    assert tables.stale(page, tmp_path) == ["study_x (no table shows it)"]
    start, end = tables._markers("study_x")
    page.write_text(page.read_text() + f"{start}\n{end}\n")
    tables.update(page, tmp_path)
    assert tables.stale(page, tmp_path) == []


def test_a_study_reanalysed_from_its_cells_gets_the_figures_of_this_code(tmp_path, monkeypatch):
    """A study that finished before the analysis recorded a figure (here the MDE) is recomputed from its cells,
    keeping the study's provenance and recording the analysing code's."""
    import bench.study_result as study_result
    from sdarflow.provenance import provenance
    from sdarflow.study_report import analyze

    tasks = [f"t{i}" for i in range(6)]
    cells = {f"{m}-seed{seed}": {"method": m, "seed": seed, "rounds": [{"train_success": 0.5}],
                                 "seconds": {"train": 1.0},
                                 "eval": {"test": _split({t: (i * (m == "grpo") + seed) % 5 for i, t in enumerate(tasks)}),
                                          "ood": _split({"x": seed, "y": 1})}}
             for m in ("base", "grpo") for seed in (0, 1)}  # fmt: skip
    made = provenance(argv=["sdarflow", "study"]) | {"commit": "0" * 40}
    settings = {"methods": ["grpo"], "seeds": [0, 1], "rounds": 1, "provenance": made}
    study = analyze(
        settings, [cells["base-seed0"], cells["base-seed1"]], [cells["grpo-seed0"], cells["grpo-seed1"]]
    )
    for figures in study["paired"].values():  # as an older analysis wrote it
        for d in figures.values():
            d.pop("mde")
    folder = tmp_path / "study"
    for name, cell in cells.items():
        (folder / "cells" / name).mkdir(parents=True)
        (folder / "cells" / name / "cell.json").write_text(json.dumps(cell))
    (folder / "study.json").write_text(json.dumps(study))
    monkeypatch.setattr(study_result, "RESULTS", tmp_path)
    assert study_result.main([str(folder), "x", "--reanalyse"]) == 0
    result = json.loads((tmp_path / "study_x.json").read_text())
    assert result["paired"]["grpo_vs_base"]["test_pass@1"]["mde"] is not None
    assert (tmp_path / "study_x.png").read_bytes().startswith(b"\x89PNG")  # the report's learning curves
    assert result["provenance"]["commit"] == "0" * 40 and result["analysed_by"]["commit"] != "0" * 40
    assert "Figures recomputed from its cells with sdarflow at " in tables.study_table("study_x", tmp_path)
    (folder / "cells" / "grpo-seed1" / "cell.json").unlink()
    with pytest.raises(
        SystemExit, match="grpo-seed1/cell.json is missing; fix: pass the study's --output folder"
    ):
        study_result.main([str(folder), "x", "--reanalyse"])


def test_a_learning_check_gets_its_curve_table_with_the_updates_diagnostics(tmp_path):
    def records(curve: list[float], share: float | None) -> list[dict]:
        trained = [{"round": i, "train_success": x, "zero_adv_group_share": 0.25, "aux_grad_share": share,
                    "gate_discrimination_expert": 0.05} for i, x in enumerate(curve[:-1])]  # fmt: skip
        return [*trained, {"round": len(curve) - 1, "train_success": curve[-1]}]

    result = {
        "benchmark": "learning_check_grpo_fixed", "machine": machine(), "method": "grpo", "fixed_tasks": True,
        "settings": {"rounds": 2, "tasks": 16, "group_size": 8, "lr": 0.002, "train_steps": 8, "lora_rank": 8,
                     "train": {"epochs": 4}},
        "train_success_by_round": {"0": [0.25, 0.5, 0.75], "1": [0.25, 0.25, 0.5]},
        "mean_by_round": [0.25, 0.375, 0.625],
        "rounds_by_seed": {"0": records([0.25, 0.5, 0.75], 0.01), "1": records([0.25, 0.25, 0.5], 0.03)},
        "base_mean": 0.25, "final_mean": 0.625, "passed": True,
        "provenance": {"commit": "abc", "uncommitted": "", "sdarflow": "0.1.0", "base_model": None,
                       "command": "python -m bench.learning_check --train '{\"epochs\": 4}'"},
    }  # fmt: skip
    (tmp_path / "learning_check_grpo_fixed.json").write_text(json.dumps(result))
    table = tables.render(
        "<!-- generated: learning_check_grpo_fixed (python -m bench.tables) -->\n"
        "<!-- end generated: learning_check_grpo_fixed -->",
        tmp_path,
    )
    assert "| seed 0 | 0.250 | 0.500 | 0.750 | +0.500 |" in table
    assert "| mean | 0.250 | 0.375 | 0.625 | +0.375 |" in table
    assert "the gradient share |grad aux| / |grad pg| 0.02 0.02" in table
    assert "grpo, 16 train tasks x 8 samples a round (the same every round), lr 0.002" in table
    assert "LoRA rank 8 (`python -m bench.learning_check --train '{\"epochs\": 4}'`)." in table
    assert "Overfit bar (final >= min(2 x base, base + 0.3)): met (0.250 -> 0.625)" in table
    assert "in none at the end" not in table  # a result from before the per-task counts
    for seed in ("0", "1"):
        result["rounds_by_seed"][seed][-1]["solved_by_task"] = {"t1": 0, "t2": 8}
    result["forgotten_tasks"] = {"0": ["t1"], "1": []}
    (tmp_path / "learning_check_grpo_fixed.json").write_text(json.dumps(result))
    table = tables.render(
        "<!-- generated: learning_check_grpo_fixed (python -m bench.tables) -->\n"
        "<!-- end generated: learning_check_grpo_fixed -->",
        tmp_path,
    )
    expected = "Tasks (of 2) solved in at least half their episodes after some round and in none at the end"
    assert f"{expected}: seed 0: 1; seed 1: 0." in table


def test_a_learning_check_stopped_short_keeps_its_rounds_and_says_so(tmp_path, monkeypatch):
    """A run stopped when a machine's time ran out left nothing (the result was written at the end): now each
    round writes it, marked incomplete, and the table reads a stopped seed's bar at its last round."""
    import argparse

    import bench.common
    import bench.learning_check as lc
    from sdarflow.provenance import provenance

    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)
    monkeypatch.setattr(lc, "RESULTS", tmp_path)
    args = argparse.Namespace(method="grpo", fixed_tasks=True, rounds=4, tasks=2, group_size=2, lr=2e-3,
                              train_steps=8, lora_rank=8, train="{}", seeds=[0, 1, 2])  # fmt: skip

    def rec(r: int, x: float) -> dict:
        return {"round": r, "train_success": x, "zero_adv_group_share": 0.5, "aux_grad_share": None,
                "gate_discrimination_expert": 0.01 * r, "solved_by_task": {"a": 1, "b": 0}}  # fmt: skip

    # seed 0 done (4 rounds and the final rollouts), seed 1 stopped after its second round's rollouts
    runs = {0: [rec(i, 0.125 * i) for i in range(5)], 1: [rec(0, 0.25), rec(1, 0.5)]}
    lc.save_result(args, "learning_check_x", runs, False, 1.0, "", provenance(None))
    result = json.loads((tmp_path / "learning_check_x.json").read_text())
    assert result["complete"] is False and result["mean_by_round"] == [0.125, 0.3125]
    assert (tmp_path / "learning_check_x.png").stat().st_size > 0
    table = tables.render(
        "<!-- generated: learning_check_x (python -m bench.tables) -->\n<!-- end generated: learning_check_x -->",
        tmp_path,
    )
    assert "| seed 0 | 0.000 | 0.125 | 0.250 | 0.375 | 0.500 | +0.500 |" in table
    assert "| seed 1 | 0.250 | 0.500 |  |  |  | +0.250 |" in table
    assert "| mean | 0.125 | 0.312 |  |  |  | +0.188 |" in table
    # the diagnostics of round 0 only: the one update whose outcome both seeds show
    assert (
        "zero advantage 0.5; the gradient share |grad aux| / |grad pg| -; the gate's expert-match discrimination 0. "
        in table
    )
    # judged only after every round asked for, not where a stopped run got to; seed 2 never started
    assert result["passed"] is None
    assert "Overfit bar (final >= min(2 x base, base + 0.3)): not judged (the run stopped short)" in table
    stopped = (
        "updates rolled out, seed 0: 4 of 4; seed 1: 1 of 4; seed 2: 0 of 4; a stopped seed's last column"
    )
    assert "**Stopped short** (the result is written after every round): " + stopped in table


def test_a_learning_check_counts_each_tasks_solved_episodes_and_names_the_forgotten(tmp_path):
    from factories import rescored_table

    from bench.learning_check import forgotten, solved_by_task
    from sdarflow import storage
    from sdarflow.schema import TRAJECTORY_SCHEMA

    # 3 tasks x 4 episodes of 2 turns, the odd episodes solved (marked on one row only: any row counts)
    rows = rescored_table(n_groups=3, group_size=4).select(TRAJECTORY_SCHEMA.names).to_pylist()
    for row in rows:
        row["success"] = row["success"] and row["turn"] == 1
    uri = str(tmp_path / "gen")
    table = pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA)
    storage.write_table(table, uri, kind="trajectories", schema=TRAJECTORY_SCHEMA, config_hash="t", inputs=[])
    assert solved_by_task(uri) == {"task-0": 2, "task-1": 2, "task-2": 2}
    records = [
        {"solved_by_task": {"a": 1, "b": 4, "c": 3}},  # b at half its 8 episodes: learned
        {"solved_by_task": {"a": 5, "b": 0, "c": 0}},
        {"solved_by_task": {"a": 0, "b": 0, "c": 1}},
    ]
    assert forgotten(records, group_size=8) == ["a", "b"]
