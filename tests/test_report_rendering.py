"""The one report renderer: Markdown with every value escaped, a self-contained autoescaped HTML page, plots
referenced (Markdown) or inlined (HTML), and the same bytes for the same report."""

from __future__ import annotations

import base64

import pytest

from sdarflow.report import Report, Section, html, markdown, md_escape

PNG = b"\x89PNG\r\n\x1a\nfake"


def hostile() -> Report:
    return Report(
        title="run <b>x</b> | *bold*",
        subtitle="model /tmp/a_b",
        sections=[
            Section("Table", table=(["name", "value"], [["<script>", "1|2"], ["[link](http://x)", "# h"]])),
            Section("Plots", images=("p",)),
            Section("Lineage", items=[("uri", "s3://b/k`x`"), ("multi", "line\nbreak")]),
            Section("Empty", text="nothing <here>"),
        ],
        images={"p": ("a <plot>", PNG)},
    )


def test_markdown_escapes_every_value_and_keeps_tables_one_line_per_row():
    md = markdown(hostile())
    assert md.startswith("# run \\<b\\>x\\</b\\> \\| \\*bold\\*\n")
    assert "| \\<script\\> | 1\\|2 |" in md
    assert "| \\[link\\](http://x) | \\# h |" in md
    assert "- uri: s3://b/k\\`x\\`" in md and "- multi: line break" in md
    assert "model /tmp/a\\_b" in md and "nothing \\<here\\>" in md
    assert "## Plots" not in md  # a section of plots alone shows nothing without files for them
    assert md.endswith("nothing \\<here\\>\n")


def test_markdown_references_plots_by_file_name():
    md = markdown(hostile(), {"p": "plot 1.png"})
    assert "## Plots\n\n![a \\<plot\\>](<plot 1.png>)\n" in md


def test_html_is_escaped_and_self_contained():
    page = html(hostile())
    assert page.startswith("<!DOCTYPE html>")
    assert "<script>" not in page and "<b>" not in page
    assert "<td>&lt;script&gt;</td><td>1|2</td>" in page
    assert f'<img alt="a &lt;plot&gt;" src="data:image/png;base64,{base64.b64encode(PNG).decode()}">' in page
    assert "<li>uri: <code>s3://b/k`x`</code></li>" in page
    assert 'src="http' not in page and "href=" not in page


def test_rendering_is_deterministic():
    assert html(hostile()) == html(hostile()) and markdown(hostile()) == markdown(hostile())


def test_md_escape():
    assert md_escape("a_b*c|d\r\ne") == "a\\_b\\*c\\|d e"
    assert md_escape("&lt;") == "\\&lt;"  # an entity would render as '<'
    assert [md_escape(t) for t in ("- a", "+ b", "1. c", "12) d", "a-b")] == [
        "\\- a",
        "\\+ b",
        "1\\. c",
        "12\\) d",
        "a-b",
    ]  # a value that starts like a list item stays text
    assert md_escape(3) == "3"


def test_a_report_refuses_a_plot_it_does_not_have():
    with pytest.raises(ValueError, match="sections show images \\['q'\\]"):
        Report("r", sections=[Section("Plots", images=("q",))])


def test_sections_with_nothing_to_show_are_left_out():
    r = Report("r", sections=[Section("no header", table=([], [["x"]])), Section("Plots", images=())])
    assert markdown(r) == "# r\n"
    assert "<h2>" not in html(r)


def test_every_report_writes_a_figure_alike():
    from sdarflow.report import number, with_interval

    assert [number(x) for x in (0.1484375, 3, "grpo", None, float("nan"), float("inf"))] == [
        "0.148", "3", "grpo", "n/a", "n/a", "n/a"
    ]  # fmt: skip
    assert number(1.0, 2) == "1.00"
    assert with_interval(0.1484375, [0.046875, 0.265625]) == "0.148 [0.047, 0.266]"
    assert with_interval(0.5, None) == with_interval(0.5, []) == "0.500"


def test_a_zero_width_interval_says_why():
    from sdarflow.report import interval, signed_with_interval

    assert signed_with_interval(0.0125, (-0.0031, 0.0281)) == "+0.013 [-0.003, +0.028]"
    assert interval((0.0, 0.0), 12) == "(identical on every task)"  # never "[+0.000, +0.000]"
    assert interval((-0.054, -0.054), 1) == "(no interval: 1 task)"
