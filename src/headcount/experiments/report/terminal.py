"""The report's main tables as plain text, for the end of ``headcount study`` / ``demo`` / ``report``.

The numbers come from one place: the study type's ``report_fn``. [`summary_record`][headcount.experiments.report.terminal.summary_record] keeps
what the report shows first (the summary and the main tables, cells as the HTML shows them) and
``build_report`` writes it to ``RUN/results/summary.json``; [`print_summary`][headcount.experiments.report.terminal.print_summary] reads that file
and prints the tables with rich, at most 100 columns wide: a table too wide for that is split
into column groups that each repeat its label columns (task, metric, ...).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from headcount.experiments.report.format import display_frame, looks_numeric
from headcount.experiments.report.html import tidy
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import parse_json

#: ``RUN/results/<SUMMARY_FILE>``: the summary and the main tables as shown.
SUMMARY_FILE = "summary.json"

#: The widest line printed.
MAX_WIDTH = 100

#: Rows printed per table (the CSV has all of them).
MAX_ROWS = 30


def summary_record(content) -> dict:
    """The summary text and the main tables of a [`ReportContent`][headcount.experiments.report.ReportContent], cells as text.

    Returns:
        ``{"title", "summary", "tables": [{"name", "section", "caption", "columns", "rows"}]}``;
        ``rows`` are lists of strings (missing values blank), every row of each table.

    >>> import pandas as pd
    >>> from headcount.experiments.report import ReportContent, Section
    >>> c = ReportContent("T", "s", [Section("Main", tables={"m": pd.DataFrame({"task": ["a"], "x": [None]})})])
    >>> summary_record(c)["tables"][0]["rows"]
    [['a', '']]
    """
    tables = []
    glance = [("At a glance", content.glance)] if content.glance is not None else []
    for section, t in [*glance, *((s.title, t) for s, t in content.main_tables())]:
        df = display_frame(tidy(t.data))
        tables.append({"name": t.name, "section": section, "caption": t.caption,
                       "columns": [str(c) for c in df.columns], "rows": df.values.tolist()})
    return {"title": content.title, "notice": content.notice, "caveats": list(content.caveats),
            "summary": content.summary, "tables": tables}


def _first_sentence(text: str) -> str:
    """The caption's first sentence (the page has the rest; a ``;`` outside brackets ends it too),
    whole: the terminal wraps it, never cuts it.

    >>> _first_sentence("Magnitude pruning (weights, the paper's procedure: prune; retrain): dev metric; more.")
    "Magnitude pruning (weights, the paper's procedure: prune; retrain): dev metric."
    """
    text = " ".join(text.split())
    depth, end = 0, len(text)
    for i, ch in enumerate(text):
        depth += ch in "(["
        depth -= ch in ")]" and depth > 0
        if depth == 0 and ch in ".;?!" and (i + 1 == len(text) or text[i + 1] == " "):
            end = i + 1
            break
    head = text[:end]
    return head[:-1] + "." if head.endswith(";") else head


def _label_columns(columns: list[str], rows: list[list[str]]) -> int:
    """How many leading columns name a row (text, not numbers): repeated in every column group; 1 to 3."""
    k = 1
    while k < min(3, len(columns) - 1):
        cells = [r[k] for r in rows if r[k]]
        if not cells or any(looks_numeric(c) for c in cells):
            break
        k += 1
    return k


def _widths(columns: list[str], rows: list[list[str]], cap: int) -> list[int]:
    """Each column's width without wrapping a cell (headers may wrap at spaces), at most ``cap``."""
    out = []
    for j, name in enumerate(columns):
        cells = max((len(r[j]) for r in rows), default=0)
        word = max((len(w) for w in name.split()), default=1)
        out.append(min(cap, max(cells, word, 1)))
    return out


def column_groups(columns: list[str], rows: list[list[str]], width: int = MAX_WIDTH) -> list[list[int]]:
    """Split the columns into groups that each fit ``width`` characters, each starting with the label columns.

    >>> cols = ["task", "metric"] + [f"value {i}" for i in range(8)]
    >>> groups = column_groups(cols, [["a", "acc"] + ["0.31 ± 0.02 [0.20, 0.40]"] * 8], width=100)
    >>> [g[:2] for g in groups] == [[0, 1]] * len(groups), len(groups)
    (True, 3)
    """
    keys = list(range(_label_columns(columns, rows)))
    widths = _widths(columns, rows, cap=width // 2)
    cost = [w + 3 for w in widths]  # a column and its gap (padding 1 + 1, a separator); no outer edges
    groups, current = [], []
    room = width + 3 - sum(cost[k] for k in keys)
    used = 0
    for j in range(len(keys), len(columns)):
        if current and used + cost[j] > room:
            groups.append(keys + current)
            current, used = [], 0
        current.append(j)
        used += cost[j]
    if current or not groups:
        groups.append(keys + current)
    return groups


def _console(file=None, width: int | None = None):
    file = file or sys.stdout
    if width is None:
        width = MAX_WIDTH
        if getattr(file, "isatty", lambda: False)():
            width = min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns)
    return Console(file=file, width=width, highlight=False, soft_wrap=False, emoji=False)


def print_tables(record: dict, console=None, *, max_rows: int = MAX_ROWS) -> None:
    """Print the tables of a [`summary_record`][headcount.experiments.report.terminal.summary_record] (each caption's first sentence above it)."""
    console = console or _console()
    width = console.width
    section = None
    for t in record.get("tables", []):
        if t["section"] != section:
            section = t["section"]
            console.print(Text(section, style="bold underline"))
        columns, rows = t["columns"], t["rows"]
        shown = rows[:max_rows]
        caption = _first_sentence(t["caption"] or t["name"])  # wrapped at the console's width
        groups = column_groups(columns, shown, width)
        widths = _widths(columns, shown, cap=width // 2)
        labels = _label_columns(columns, shown)
        console.print(Text(caption, style="dim"))
        for g in groups:
            table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
            for j in g:
                table.add_column(Text(columns[j]), width=widths[j], overflow="fold",  # fixed: the group fits
                                 justify="left" if j < labels else "right")
            for r in shown:
                table.add_row(*[Text(r[j]) for j in g])
            console.print(table)
            console.print()
        if len(rows) > len(shown):
            console.print(Text(f"first {len(shown)} of {len(rows)} rows: results/{t['name']}.csv", style="dim"))


def print_summary(run_dir, console=None) -> bool:
    """Print the main tables of a run's report (from ``RUN/results/summary.json``) to the terminal.

    Args:
        run_dir: a run directory whose report has been drawn.
        console: a rich Console (default: stdout, at most 100 columns).

    Returns:
        Whether there was anything to print (False for a report without main tables, or one
        drawn before this file existed).
    """
    path = Path(run_dir) / "results" / SUMMARY_FILE
    try:
        record = parse_json(path.read_text(encoding="utf-8"), str(path))
    except (OSError, ValueError, HeadcountError):
        return False
    if not record.get("tables"):
        return False
    console = console or _console()
    console.print()
    if record.get("notice"):
        console.print(Text(record["notice"].replace("**", ""), style="bold"))
        console.print()
    for caveat in record.get("caveats") or []:  # each once, as in the report's box
        console.print(Text(caveat.replace("**", "")))
        console.print()
    print_tables(record, console)
    return True
