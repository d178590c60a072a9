"""``make bench`` rewrites the README's table from the result files: every benchmark's row, the machine, and
nothing outside the markers."""

from __future__ import annotations

import json

import pytest

from bench import readme
from sdarflow.provenance import machine

RESULTS = {
    "startup": {"help_seconds": 0.07, "component_start_seconds": {"generate": 2.4, "train": 2.8}},
    "rescoring": {
        "tokens_per_s": {"packed": 9000.0, "padded_in_order": 5000.0},
        "rows": 96,
        "mean_row_tokens": 310.4,
        "forward_flops": 2.5e12,
        "speedup": 1.8,
        "speedup_bound": 2.1,
        "fraction_of_peak": 0.55,
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
    return folder


def test_table_has_a_row_per_result_and_the_machine(results):
    lines = readme.table(results).splitlines()
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in lines if ln.startswith("| ") and "---" not in ln}
    assert set(rows) == {"benchmark", "startup", "rescoring", "pipeline_overhead"}
    assert "speedup 1.80x (padding bound 2.10x); fraction_of_peak 0.55" in rows["rescoring"]
    assert "0.07 s / 2.8 s" in rows["startup"] and "(train) 2.8 s" in rows["startup"]
    assert "overhead 10.0%" in rows["pipeline_overhead"] and "2.5 s per task" in rows["pipeline_overhead"]
    assert lines[-1].startswith("Machine: ") and f"{machine()['cpus']} cores" in lines[-1]


def test_an_older_result_file_is_named_not_a_crash(results):
    (results / "rollout.json").write_text(
        json.dumps({"benchmark": "rollout", "machine": machine(), "speedup": 1})
    )
    row = next(ln for ln in readme.table(results).splitlines() if ln.startswith("| rollout"))
    assert "an older result" in row and "python -m bench rollout" in row


def test_update_replaces_only_the_marked_table(results, tmp_path):
    page = tmp_path / "README.md"
    page.write_text(f"intro\n{readme.START}\nold table\n{readme.END}\noutro\n")
    readme.update(page, results)
    text = page.read_text()
    assert text.startswith(f"intro\n{readme.START}\n| benchmark |") and text.endswith(
        f"{readme.END}\noutro\n"
    )
    assert "old table" not in text
    readme.update(page, results)
    assert page.read_text() == text  # idempotent

    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="lacks the bench table markers"):
        readme.update(page, results)
