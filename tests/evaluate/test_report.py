"""The evaluation report (rendered by sdarflow.report): Markdown/HTML tables, escaping, deltas vs a baseline, and
PNG plots."""

from __future__ import annotations

import base64
import re

import pytest

from sdarflow.evaluate.metrics import build_report
from sdarflow.evaluate.report import PLOT_KEYS, evaluation_report, plots
from sdarflow.report import html, markdown

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def episodes(t1_successes: int = 4, cut_type: str = "cut") -> list[dict]:
    """test: t1 (cook, c=t1_successes), t2 (cook, c=1), t3 (cut, c=0); ood: o1 (cook, c=2), o2 (cut, c=0); n=4."""
    plan = [
        ("test", "t1", "cook", t1_successes),
        ("test", "t2", "cook", 1),
        ("test", "t3", cut_type, 0),
        ("ood", "o1", "cook", 2),
        ("ood", "o2", cut_type, 0),
    ]
    return [
        {"task_id": task, "task_type": task_type, "split": split, "success": i < c, "turns": 5,
         "format_errors": 1 if i == 0 else 0, "actions": 5}
        for split, task, task_type, c in plan
        for i in range(4)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def report() -> dict:
    return build_report(episodes(), adapter="cand-v3", base_model="tiny-qwen", config_hash="abc123")


@pytest.fixture(scope="module")
def baseline() -> dict:
    # t1 solves 2 of 4 instead of 4: test pass@1 = (1/2 + 1/4 + 0) / 3 = 0.25, cook pass@1 = 0.375
    return build_report(episodes(t1_successes=2), adapter="prod-v2", base_model="tiny-qwen")


@pytest.fixture(scope="module")
def candidate_plots(report: dict, baseline: dict) -> dict[str, bytes]:
    return plots(report, baseline)


def test_markdown_tables(report: dict) -> None:
    md = markdown(evaluation_report(report, None, {}))
    assert md.startswith("# Evaluation: cand-v3")
    assert "| 1 | 0.417 | 0.000 – 1.000 |" in md  # test pass@1 = 5/12
    assert "| 4 | 0.500 |" in md  # ood pass@4
    assert "| cook | 2 | 0.625 |" in md
    assert "| test | 3 | 4 | 0.417 | 0.050 | 5.000 |" in md  # success, format errors 3/60, mean turns
    assert "config\\_hash: abc123" in md
    assert "![" not in md and "Δ" not in md


def test_markdown_images_and_deltas(report: dict, baseline: dict) -> None:
    md = markdown(
        evaluation_report(report, baseline, plots(report, baseline)), {"pass_at_k": "pass_at_k.png"}
    )
    assert "![pass@k by split](<pass_at_k.png>)" in md
    assert "baseline: prod-v2" in md
    assert "| 1 | 0.417 | 0.000 – 1.000 | 3 × 4 | 0.250 | +0.167 |" in md
    assert "| cook | 2 | 0.625 | 0.375 | +0.250 |" in md
    assert "| 1 | 0.250 | 0.000 – 0.591 | 2 × 4 | 0.250 | +0.000 |" in md  # ood unchanged; Wilson 2/8


def test_html_self_contained(report: dict, baseline: dict, candidate_plots: dict[str, bytes]) -> None:
    page = html(evaluation_report(report, baseline, candidate_plots))
    assert page.startswith("<!DOCTYPE html>")
    for value in (
        "0.417",
        "0.000 – 1.000",
        "0.625",
        "0.050",
        "5.000",
        "abc123",
        "+0.167",
        "+0.250",
        "prod-v2",
    ):
        assert value in page
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == len(PLOT_KEYS)
    assert all(base64.b64decode(img).startswith(PNG_MAGIC) for img in images)
    assert not re.search(r'(src|href)="(?!data:)', page)  # nothing fetched from outside


def test_html_draws_plots_and_escapes_task_types() -> None:
    evil = "<script>alert('x')</script> $\\frac$"
    hostile = build_report(episodes(cut_type=evil), adapter="a<b>", base_model="m", inputs={"x": "</li>"})
    page = html(evaluation_report(hostile, None, plots(hostile)))
    assert "<script>" not in page and "<b>" not in page and '</li>"' not in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    assert "data:image/png;base64," in page
    md = markdown(evaluation_report(hostile, None, {}))
    assert "<script>" not in md and "\\<script\\>" in md


def test_rendering_is_deterministic(report: dict, baseline: dict) -> None:
    assert html(evaluation_report(report, baseline, plots(report, baseline))) == html(
        evaluation_report(report, baseline, plots(report, baseline))
    )
    assert plots(report) == plots(report)


def test_plots_are_png(report: dict, candidate_plots: dict[str, bytes]) -> None:
    assert set(candidate_plots) == set(PLOT_KEYS)
    assert all(png.startswith(PNG_MAGIC) for png in candidate_plots.values())
    alone = plots(report)
    assert all(png.startswith(PNG_MAGIC) for png in alone.values())
    assert alone["pass_at_k"] != candidate_plots["pass_at_k"]  # the baseline curve was drawn


def test_plots_with_one_split_and_one_sample() -> None:
    single = build_report(
        [{"task_id": "a", "task_type": "t", "split": "test", "success": True, "turns": 1, "format_errors": 0,
          "actions": 1}],
        adapter="x", base_model="m",
    )  # fmt: skip
    assert all(png.startswith(PNG_MAGIC) for png in plots(single).values())
