"""Render a [`ReportContent`][headcount.experiments.report.content.ReportContent] into one self-contained ``report.html`` (+ CSVs and PNGs).

Figures are embedded as base64 PNG, tables as HTML (and written to ``results/<name>.csv``),
followed by the config as given, the jobs with their timings, and the versions of the software
that computed the results and drew the report.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import re
import sys
from pathlib import Path
from typing import Any

from headcount.analysis.figtext import literal_texts
from headcount.experiments.report.content import ReportContent, ReportFigure, ReportTable
from headcount.experiments.report.format import display_frame, looks_numeric
from headcount.runtime.errors import HeadcountError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
.meta{color:#666;font-size:.9em} figure{margin:1.2em 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#555;font-size:.9em} table.data{border-collapse:collapse;font-size:.85em;margin:.6em 0}
table.data th,table.data td{border:1px solid #ddd;padding:.25em .5em;vertical-align:top}
table.data th{background:#f6f6f6;font-weight:600}
table.data th,table.data td{text-align:left} table.data td:not(.num){overflow-wrap:anywhere;min-width:5.5em}
table.data td:first-child:not(.num){min-width:9em} table.data .num{text-align:right} table.data tbody tr:nth-child(even){background:#fbfbfb}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:.85em} code{background:#f3f3f3;padding:0 .2em}
.notice{border-left:4px solid #c60;background:#fff6ee;padding:.2em .8em;margin:.6em 0} nav ul{columns:3;font-size:.92em;margin:.6em 0;padding-left:1.2em} .summary p{margin:.35em 0} .caption{color:#555;font-size:.9em;margin:.2em 0} .note{color:#666;font-size:.85em}
div.table{max-width:100%;overflow-x:auto} details.table summary{cursor:pointer;color:#555;font-size:.9em}
.caveats{border-left:4px solid #c60;background:#fff6ee;padding:.1em .8em;margin:.6em 0;font-size:.92em}
.caveats p{margin:.3em 0} .caveats .notice{border:0;background:none;padding:0;margin:0} .glance{display:flex;gap:1.2em;align-items:flex-start;margin:.8em 0}
.glance figure{flex:0 1 auto;max-width:44%;margin:0} .glance figure img{max-height:420px;object-fit:contain;object-position:left top}
.glance .side{flex:1 1 56%;min-width:0} .glance table.data{margin-top:0;font-size:.8em}
.glance table.data td{padding:.15em .4em} .glance table.data td:first-child:not(.num){min-width:14em}
.glance .caption{font-size:.82em}
@media (max-width:900px){.glance{flex-direction:column}.glance figure{flex-basis:auto}}
"""


def figure_png(source: Any, dpi: int = 110) -> bytes:
    """PNG bytes of a matplotlib Figure, a PNG file, or PNG bytes.

    >>> from headcount.experiments.report.content import new_figure
    >>> fig, ax = new_figure(); _ = ax.plot([1, 2])
    >>> figure_png(fig)[:4]
    b'\\x89PNG'
    """
    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    elif isinstance(source, (str, Path)):
        try:
            data = Path(source).read_bytes()
        except OSError as e:
            raise HeadcountError(f"cannot read figure {source}: {e.strerror or e}") from None
    elif hasattr(source, "savefig"):
        buf = io.BytesIO()
        if getattr(source, "canvas", None) is None or type(source.canvas).__name__ == "FigureCanvasBase":
            # lazy: matplotlib costs ~0.2-0.3 s to import, and headcount --help loads this module
            from matplotlib.backends.backend_agg import FigureCanvasAgg

            FigureCanvasAgg(source)
        literal_texts(source)  # user text (a task named "a$^{$b") is drawn as written, not as mathtext
        source.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
        if "matplotlib.pyplot" in sys.modules:  # free pyplot-managed figures
            sys.modules["matplotlib.pyplot"].close(source)
        data = buf.getvalue()
    else:
        raise HeadcountError(f"a report figure must be a matplotlib Figure, a PNG path or PNG bytes "
                             f"(got {type(source).__name__})")
    if not data.startswith(PNG_MAGIC):
        raise HeadcountError("a report figure file must be a PNG")
    return data


def tidy(df):
    """The DataFrame as written to CSV: a meaningful index becomes columns, columns flattened."""
    # lazy: pandas costs ~0.2 s to import, and headcount --help loads this module
    import pandas as pd

    out = df.copy()
    if isinstance(out.columns, pd.MultiIndex):
        out.columns = ["_".join(str(c) for c in col if str(c) != "") for col in out.columns]
    if not isinstance(out.index, pd.RangeIndex) or out.index.name is not None:
        out = out.reset_index()
    return out


def _text_html(text: str) -> str:
    """Paragraphs (blank-line separated) with the markup report texts use: single backquotes for
    code, double asterisks for bold.

    >>> _text_html("**Only** `x`.")
    '<p><strong>Only</strong> <code>x</code>.</p>'
    """
    parts = []
    for para in re.split(r"\n\s*\n", text.strip()):
        if not para.strip():
            continue
        esc = html.escape(para)
        esc = re.sub(r"`([^`]+)`", r"<code>\1</code>", esc)
        esc = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", esc)
        parts.append(f"<p>{esc}</p>")
    return "\n".join(parts)


_NBSP = "\u00a0"


def _unbroken(text: str) -> str:
    """A numeric cell with its parts kept whole when the table wraps: ``0.31 ± 0.02``, ``[0.20, 0.40]``,
    ``(n=1 of 2)`` each stay on one line.

    >>> _unbroken("0.31 ± 0.02 [0.20, 0.40] (n=1 of 2)").replace(_NBSP, "_")
    '0.31_±_0.02 [0.20,_0.40] (n=1_of_2)'
    """
    text = text.replace(" ± ", f"{_NBSP}±{_NBSP}")
    text = re.sub(r"\[([^\]\s]+), ([^\]\s]+)\]", rf"[\1,{_NBSP}\2]", text)
    return re.sub(r"\(n=(\d+) of (\d+)\)", rf"(n=\1{_NBSP}of{_NBSP}\2)", text)


def _cells_html(df) -> str:
    """An HTML table of text cells: numbers right-aligned and kept whole, labels left-aligned and
    allowed to break (long names wrap instead of widening the page)."""
    cols = [str(c) for c in df.columns]
    rows = df.values.tolist()
    numeric = [any(r[j] for r in rows) and all(looks_numeric(r[j]) for r in rows if r[j]) for j in range(len(cols))]
    head = "".join(f'<th class="num">{html.escape(c)}</th>' if numeric[j] else f"<th>{html.escape(c)}</th>"
                   for j, c in enumerate(cols))
    body = []
    for r in rows:
        tds = "".join(f'<td class="num">{html.escape(_unbroken(v))}</td>' if looks_numeric(v)
                      else f"<td>{html.escape(v)}</td>" for v in r)
        body.append(f"<tr>{tds}</tr>")
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _table_html(table: ReportTable) -> str:
    df = tidy(table.data)
    shown = df.head(table.max_rows)
    body = _cells_html(display_frame(shown))  # cells as text: None/NaN blank, as in the terminal
    note = ""
    if len(df) > len(shown):
        note = f'<p class="note">first {len(shown)} of {len(df)} rows; all in results/{table.name}.csv</p>'
    csv = f"results/{html.escape(table.name)}.csv"
    link = f'<p class="note"><a href="{csv}">{csv}</a></p>' if table.csv else ""
    if table.collapsed:
        summary = html.escape(table.caption or table.name)
        return (f'<details class="table" id="table-{html.escape(table.name)}"><summary>{summary}</summary>'
                f'<div class="table">{body}</div>{note}{link}</details>')
    cap = f'<p class="caption">{html.escape(table.caption)}</p>' if table.caption else ""
    return f'<div class="table" id="table-{html.escape(table.name)}">{cap}{body}{note}{link}</div>'


def _figure_html(fig: ReportFigure, png: bytes) -> str:
    b64 = base64.b64encode(png).decode("ascii")
    cap = f"<figcaption>{html.escape(fig.caption)}</figcaption>" if fig.caption else ""
    return (f'<figure id="figure-{html.escape(fig.name)}"><img alt="{html.escape(fig.name)}" '
            f'src="data:image/png;base64,{b64}">{cap}</figure>')


def _caveats_html(content: ReportContent) -> str:
    """The notice and the caveats, each once, in one box at the top."""
    if not content.notice and not content.caveats:
        return ""
    paras = [f'<div class="notice">{_text_html(content.notice)}</div>'] if content.notice else []
    paras += [_text_html(c) for c in content.caveats]
    return f'<div class="caveats" id="caveats">{"".join(paras)}</div>'


def _glance_html(content: ReportContent, pngs: dict[str, bytes]) -> str:
    """The headline figure and the glance table side by side (one screen at 1280 x 800)."""
    fig = next((f for f in content.figures() if f.name == content.headline), None) if content.headline else None
    if fig is None and content.glance is None:
        return ""
    parts = ['<div class="glance" id="glance">']
    if fig is not None:
        b64 = base64.b64encode(pngs[fig.name]).decode("ascii")
        cap = f"<figcaption>{html.escape(fig.caption)}</figcaption>" if fig.caption else ""
        parts.append(f'<figure class="headline"><img alt="{html.escape(fig.name)}" '
                     f'src="data:image/png;base64,{b64}">{cap}</figure>')
    if content.glance is not None:
        bare = dataclasses.replace(content.glance, caption="")  # the caption under the table: the numbers first
        cap = f'<p class="caption">{html.escape(content.glance.caption)}</p>' if content.glance.caption else ""
        parts.append(f'<div class="side">{_table_html(bare)}{cap}</div>')
    parts.append("</div>")
    return "".join(parts)


def render_html(content: ReportContent, pngs: dict[str, bytes], *, subtitle: str, config_text: str,
                jobs_table, versions_table) -> str:
    """The report page as a string (figures already rendered to PNG, by name)."""
    title = html.escape(content.title or "headcount study")
    toc = "".join(f'<li><a href="#s{i}">{html.escape(s.title)}</a></li>' for i, s in enumerate(content.sections))
    if content.summary and (content.glance is not None or content.headline):
        toc = '<li><a href="#summary">In words</a></li>' + toc
    toc += '<li><a href="#config">Configuration</a></li><li><a href="#jobs">Jobs and timings</a></li>'
    toc += '<li><a href="#versions">Versions</a></li>'
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{title}</title><style>{CSS}</style></head><body>",
        f"<h1>{title}</h1>",
        f'<p class="meta">{html.escape(subtitle)}</p>',
        _caveats_html(content),
        _glance_html(content, pngs),
        (f'<section id="summary"><h2>In words</h2><div class="summary">{_text_html(content.summary)}</div></section>'
         if content.summary and (content.glance is not None or content.headline) else
         f'<div class="summary">{_text_html(content.summary)}</div>' if content.summary else ""),
        f"<nav><ul>{toc}</ul></nav>",
    ]
    for i, s in enumerate(content.sections):
        out.append(f'<section id="s{i}"><h2>{html.escape(s.title)}</h2>')
        if s.text:
            out.append(_text_html(s.text))
        for f in s.figures:
            out.append(_figure_html(f, pngs[f.name]))
        for t in s.tables:
            out.append(_table_html(t))
        out.append("</section>")
    out.append('<section id="config"><h2>Configuration</h2><p class="note">study.yaml, as given</p>')
    out.append(f"<pre>{html.escape(config_text)}</pre></section>")
    out.append('<section id="jobs"><h2>Jobs and timings</h2>')
    out.append(_table_html(jobs_table))
    out.append("</section>")
    out.append('<section id="versions"><h2>Versions</h2>')
    out.append(_table_html(versions_table))
    out.append("</section></body></html>\n")
    return "\n".join(x for x in out if x)
