"""The training report: a self-contained HTML page with the curves as a base64 PNG, and Markdown tables."""

from __future__ import annotations

import base64
import re

from sdarflow import storage
from sdarflow.report import html, markdown
from sdarflow.train.report import MAX_TABLE_ROWS, teacher_contexts, training_report, write_reports


def history(n: int = 6) -> list[dict]:
    out = []
    for i in range(1, n + 1):
        sft = i % 3 == 0
        out.append(
            {
                "step": i,
                "kind": "sft" if sft else "rl",
                "loss/total": 1.0 / i,
                "loss/pg": None if sft else 0.1,
                "loss/aux": None if sft else 0.2,
                "sdar/gate_mean": None if sft else 0.3 + 0.01 * i,
                "sdar/teacher_gap_mean": None if sft else 0.5,
                "actor/entropy": 2.0,
                "actor/clipfrac": None if sft else 0.1,
                "grad_norm": float("nan") if i == 2 else 0.5,
                "lr": 1e-3,
            }
        )
    return out


def test_html_is_self_contained_with_a_png(tmp_path):
    write_reports(tmp_path, history(), {"loss/total": 0.4, "train/steps": 6.0}, "train: sdar")
    page = (tmp_path / "report.html").read_text()
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m and base64.b64decode(m.group(1)).startswith(b"\x89PNG")
    assert "http" not in page.replace("http-equiv", "")  # nothing fetched from elsewhere
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# train: sdar") and "| loss/total | 0.4 |" in md
    assert "| 3 | sft |" in md and "| 2 | rl |" in md


def test_rendering_is_deterministic_and_tables_stay_short():
    h = history(200)
    assert html(training_report(h, {}, "t")) == html(training_report(h, {}, "t"))
    rows = [
        line for line in markdown(training_report(h, {}, "t")).splitlines() if re.match(r"\| \d+ \|", line)
    ]
    assert len(rows) <= MAX_TABLE_ROWS + 1 and rows[-1].startswith("| 200 |")


def test_empty_history_still_renders():
    assert "no data" not in markdown(training_report([], {}, "t"))
    assert "<img" in html(training_report([], {}, "t"))


def test_a_flat_panel_gets_a_readable_range():
    """One step (or a constant metric) draws a flat line: its axis spans the value's size, not matplotlib's +-4%
    (a 0.96-1.04 axis reads as movement)."""
    from matplotlib.figure import Figure

    from sdarflow.train.report import _single_value_limits

    for values, limits in (([1.0], (0.0, 2.0)), ([-0.5, -0.5], (-1.0, 0.0)), ([0.0], (-1.0, 1.0))):
        ax = Figure().subplots()
        ax.plot(range(len(values)), values)
        _single_value_limits(ax, values)
        assert ax.get_ylim() == limits
    ax = Figure().subplots()
    ax.plot([1, 2], [1.0, 2.0])
    before = ax.get_ylim()
    _single_value_limits(ax, [1.0, 2.0])  # a line that moves keeps matplotlib's range
    assert ax.get_ylim() == before


def test_teacher_contexts_follow_the_data_and_the_start_adapter(tmp_path):
    def published(name: str, kind: str, **meta) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / "f.txt").write_text(name)
        uri = str(tmp_path / f"{name}-published")
        storage.publish_dir(tmp_path / name, uri, kind=kind, **meta)
        return uri

    skills = published("a", kind="rescored", teacher_context="skills")
    solution = published("b", kind="rescored", teacher_context="solution")
    assert teacher_contexts([skills, skills], "") == ["skills"]
    assert teacher_contexts([skills, solution], "") == ["skills", "solution"]
    assert teacher_contexts([published("t", kind="trajectories")], "") == []  # an SFT's data had no teacher
    # an adapter that continues from a control's stays a control's
    assert teacher_contexts([skills], published("d", kind="adapter", teacher_contexts=["synthetic"])) == [
        "skills",
        "synthetic",
    ]
    # what does not say is unknown, not nothing: rescored before manifests named the teacher, unpublished folders
    older, folder = published("c", kind="rescored"), str(tmp_path / "unpublished")
    assert teacher_contexts([older], published("e", kind="adapter")) == ["unknown"]
    assert teacher_contexts([folder], folder) == ["unknown"]
