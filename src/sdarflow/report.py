"""One way to write a report, for every stage that writes one and the method study: a :class:`Report` (title,
subtitle, sections of text, a table, bullets and plots) rendered as escaped Markdown for a KFP ``Output[Markdown]``
or one self-contained HTML page (Jinja2 with autoescape, plots inline) for ``Output[HTML]``. Rendering is
deterministic: the same report gives the same bytes.
"""

from __future__ import annotations

import base64
import functools
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# (header, rows); every cell already formatted as text
Table = tuple[Sequence[str], Sequence[Sequence[str]]]


@dataclass(frozen=True)
class Section:
    title: str
    text: str = ""
    table: Table | None = None
    items: Sequence[tuple[str, str]] = ()  # "key: value" bullets
    images: Sequence[str] = ()  # keys of Report.images


@dataclass
class Report:
    title: str
    subtitle: str = ""
    sections: list[Section] = field(default_factory=list)
    images: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # key -> (alt text, PNG bytes)

    def __post_init__(self) -> None:
        # checked when the report is made, not when it is rendered after the stage's work
        missing = sorted({k for s in self.sections for k in s.images} - self.images.keys())
        if missing:
            raise ValueError(f"report {self.title!r}: sections show images {missing} that it does not have")

    def shown(self, image_files: Mapping[str, str] | None = None) -> list[Section]:
        """The sections with something to show: with ``image_files`` (Markdown) a plot counts only if it has a
        file; without (HTML) every plot counts."""
        return [
            s for s in self.sections
            if s.text or (s.table and s.table[0]) or s.items
            or any(image_files is None or key in image_files for key in s.images)
        ]  # fmt: skip


CSS = (
    "body{font-family:sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;margin:0 0 1.5em}"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}"
    "img{max-width:100%;display:block;margin:0 0 1em}"
)

_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{ r.title }}</title><style>{{ css }}</style></head><body>
<h1>{{ r.title }}</h1>
{% if r.subtitle %}<p>{{ r.subtitle }}</p>
{% endif %}
{% for s in sections %}
<h2>{{ s.title }}</h2>
{% if s.text %}<p>{{ s.text }}</p>
{% endif %}
{% if s.table and s.table[0] %}<table><thead><tr>{% for h in s.table[0] %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for row in s.table[1] %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
{% endif %}
{% if s.items %}<ul>{% for k, v in s.items %}<li>{{ k }}: <code>{{ v }}</code></li>{% endfor %}</ul>
{% endif %}
{% for key in s.images %}<img alt="{{ r.images[key][0] }}" src="data:image/png;base64,{{ r.images[key][1]|b64 }}">
{% endfor %}
{% endfor %}
</body></html>
"""

_MARKDOWN = """# {{ r.title|md }}
{% if r.subtitle %}

{{ r.subtitle|md }}
{% endif %}
{% for s in sections %}

## {{ s.title|md }}
{% if s.text %}

{{ s.text|md }}
{% endif %}
{% if s.table and s.table[0] %}

| {{ s.table[0]|map('md')|join(' | ') }} |
|{{ '---|' * (s.table[0]|length) }}
{% for row in s.table[1] %}
| {{ row|map('md')|join(' | ') }} |
{% endfor %}
{% endif %}
{% if s.items %}

{% for k, v in s.items %}
- {{ k|md }}: {{ v|md }}
{% endfor %}
{% endif %}
{% for key in s.images if key in files %}

![{{ r.images[key][0]|md }}](<{{ files[key] }}>)
{% endfor %}
{% endfor %}
"""

# CommonMark lets a backslash escape any ASCII punctuation; these are the ones that change rendering ('&' starts
# an entity), and a line that starts like a list item would become one.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~!&])")
_LIST_START = re.compile(r"^(\s*(?:\d{1,9})?)([-+.)])(?=\s|$)")


def number(x: Any, digits: int = 3) -> str:
    """A figure as every report's tables print it: ``digits`` decimals for a float, an integer or text as is, and
    ``n/a`` where there is none (None, NaN, infinity)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def with_interval(x: float | None, ci: Sequence[float] | None, digits: int = 3) -> str:
    """``0.148 [0.047, 0.266]``: a figure with its 95% interval (the figure alone where it has none)."""
    return number(x, digits) + (f" [{number(ci[0], digits)}, {number(ci[1], digits)}]" if ci else "")


def interval(ci: Sequence[float], tasks: int | None = None) -> str:
    """A difference's 95% interval over ``tasks``, ``[-0.012, +0.034]``; a zero-width one says why instead of
    printing a point as if it were an interval: one task has no spread, and several agree exactly only when every
    task's difference is the same (as when nothing differs at all)."""
    lo, hi = ci
    if tasks is not None and tasks < 2:
        return f"(no interval: {tasks} task)"
    return "(identical on every task)" if lo == hi else f"[{lo:+.3f}, {hi:+.3f}]"


def signed_with_interval(
    x: float, ci: Sequence[float], tasks: int | None = None, mde: float | None = None
) -> str:
    """``+0.012 [-0.003, +0.027]``: a difference with its :func:`interval`, and ``(MDE 0.041)`` after it where its
    minimum detectable effect is known (``sdarflow.evaluate.compare.minimum_detectable_effect``)."""
    shown = mde is not None and (tasks is None or tasks >= 2)  # one task prints no interval: no MDE either
    return f"{x:+.3f} {interval(ci, tasks)}" + (f" (MDE {mde:.3f})" if shown else "")


def md_escape(text: object) -> str:
    """``text`` as literal Markdown on one line (a table cell or a bullet cannot span lines)."""
    one_line = " ".join(str(text).splitlines())
    return _LIST_START.sub(r"\1\\\2", _MD_SPECIAL.sub(r"\\\1", one_line))


@functools.cache
def _template(kind: str):
    """The compiled template (Jinja2 is imported on first use: a stage that writes no report never pays for it)."""
    import jinja2

    env = jinja2.Environment(
        autoescape=kind == "html", trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
    )
    env.filters["md"] = md_escape
    env.filters["b64"] = lambda data: base64.b64encode(data).decode("ascii")
    return env.from_string(_HTML if kind == "html" else _MARKDOWN)


def html(report: Report) -> str:
    """One self-contained HTML page: every value escaped, the plots inline."""
    from markupsafe import Markup

    return _template("html").render(r=report, sections=report.shown(), css=Markup(CSS))


def markdown(report: Report, image_files: Mapping[str, str] | None = None) -> str:
    """Markdown: every value escaped. A Markdown artifact cannot embed images, so a plot is referenced only when
    ``image_files`` names the file it is stored under next to the Markdown; a section with nothing else to show
    is left out."""
    files = dict(image_files or {})
    text = _template("markdown").render(r=report, sections=report.shown(files), files=files)
    return text.rstrip("\n") + "\n"


def png(fig: Any, dpi: int = 100) -> bytes:
    """A matplotlib figure (object API: no pyplot state) as PNG bytes, without the version stamp that would make
    the same plot differ between matplotlib releases."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()
