"""What a study's ``report_fn`` returns: sections of text, figures and tables.

Figures are matplotlib ``Figure`` objects, PNG files, or PNG bytes; tables are pandas
DataFrames (each becomes ``results/<name>.csv`` and an HTML table). Draw figures with
[`new_figure`][headcount.experiments.report.content.new_figure] (no pyplot state, Agg rendering) from saved results only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headcount.runtime.errors import HeadcountError

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise HeadcountError(f"report {what} name must match [A-Za-z0-9_.-]+ (got {name!r})")
    return name


@dataclass
class ReportFigure:
    """A figure of the report.

    Attributes:
        name: file-name stem (``figures/<name>.png``) and anchor; ``[A-Za-z0-9_.-]``.
        source: a matplotlib Figure, a path to a PNG file, or PNG bytes.
        caption: text under the figure.
    """

    name: str
    source: Any
    caption: str = ""

    def __post_init__(self):
        _check_name(self.name, "figure")


@dataclass
class ReportTable:
    """A table of the report.

    Attributes:
        name: ``results/<name>.csv``; ``[A-Za-z0-9_.-]``.
        data: a pandas DataFrame (tidy: one row per observation).
        caption: text above the table.
        csv: also write ``results/<name>.csv``.
        max_rows: rows shown in the HTML (the CSV has all of them).
        collapsed: shown folded (an HTML ``<details>`` with the caption as its summary): for
            raw tables below the ones a reader looks at first.
    """

    name: str
    data: Any
    caption: str = ""
    csv: bool = True
    max_rows: int = 60
    collapsed: bool = False

    def __post_init__(self):
        _check_name(self.name, "table")
        # lazy: pandas costs ~0.2 s to import, and headcount --help loads this module
        import pandas as pd

        if not isinstance(self.data, pd.DataFrame):
            raise HeadcountError(f"report table {self.name!r} must be a pandas DataFrame (got {type(self.data).__name__})")


def _figures(items) -> list[ReportFigure]:
    if items is None:
        return []
    if isinstance(items, Mapping):
        return [f if isinstance(f, ReportFigure) else ReportFigure(name, f) for name, f in items.items()]
    out = []
    for i, f in enumerate(items if isinstance(items, Sequence) else [items]):
        if isinstance(f, ReportFigure):
            out.append(f)
        elif isinstance(f, (str, Path)):
            out.append(ReportFigure(_check_name(Path(f).stem, "figure"), f))
        else:
            raise HeadcountError("give report figures a name: a dict {name: figure} or ReportFigure(name, figure)")
    return out


def _tables(items) -> list[ReportTable]:
    if items is None:
        return []
    if isinstance(items, Mapping):
        return [t if isinstance(t, ReportTable) else ReportTable(name, t) for name, t in items.items()]
    out = []
    for t in items:
        if not isinstance(t, ReportTable):
            raise HeadcountError("give report tables a name: a dict {name: DataFrame} or ReportTable(name, df)")
        out.append(t)
    return out


@dataclass
class Section:
    """One section of the report.

    Args:
        title: the heading.
        text: paragraphs separated by blank lines; ```code``` spans are kept.
        figures: ``{name: Figure | png path | png bytes}`` or a list of [`ReportFigure`][headcount.experiments.report.content.ReportFigure].
        tables: ``{name: DataFrame}`` or a list of [`ReportTable`][headcount.experiments.report.content.ReportTable].
        main: whether its tables are main tables (the ones ``headcount study`` prints in the
            terminal too, see [`ReportContent.main_tables`][headcount.experiments.report.content.ReportContent.main_tables]); None: a section of shown
            tables only (no figures, none collapsed) is one.
    """

    title: str
    text: str = ""
    figures: Any = None
    tables: Any = None
    main: bool | None = None

    def __post_init__(self):
        self.figures = _figures(self.figures)
        self.tables = _tables(self.tables)


@dataclass
class ReportContent:
    """Everything a study type's ``report_fn`` wants in the report.

    Attributes:
        title: the report's title (default: the config's ``name`` or the study type).
        summary: text under the title (the headline numbers).
        sections: the sections, in order.
        notice: one caution shown before everything else, in the report and in the terminal
            summary (the demo's "these numbers illustrate the pipeline only").
        glance: a compact table shown first, beside the headline figure: this run's main numbers
            beside the paper's (``results/<name>.csv`` too; printed first in the terminal).
        headline: the name of a figure of the sections, shown at the top beside ``glance``
            (and again in its section).
        caveats: what every reader must know before reading the numbers (the MLM head they rest
            on, ...), each said once, in one box at the top with the notice; the summary and the
            tables mark what they concern (``†``) instead of repeating them.

    >>> import pandas as pd
    >>> c = ReportContent("Toy", sections=[Section("Sums", tables={"sums": pd.DataFrame({"x": [1]})})])
    >>> [t.name for t in c.tables()]
    ['sums']
    """

    title: str = ""
    summary: str = ""
    sections: list[Section] = field(default_factory=list)
    notice: str = ""
    glance: ReportTable | None = None
    headline: str = ""
    caveats: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.sections = list(self.sections)
        self.caveats = [c for c in dict.fromkeys(self.caveats or []) if c]  # each once
        if self.glance is not None and not isinstance(self.glance, ReportTable):
            raise HeadcountError(f"the report's glance must be a ReportTable (got {type(self.glance).__name__})")
        seen: dict[str, str] = {f"table:{self.glance.name}": "glance"} if self.glance is not None else {}
        for s in self.sections:
            if not isinstance(s, Section):
                raise HeadcountError(f"report sections must be Section objects (got {type(s).__name__})")
            for kind, items in (("figure", s.figures), ("table", s.tables)):
                for item in items:
                    tag = f"{kind}:{item.name}"
                    if tag in seen:
                        raise HeadcountError(f"two report {kind}s are named {item.name!r}")
                    seen[tag] = s.title
        if self.headline and f"figure:{self.headline}" not in seen:
            raise HeadcountError(f"the report's headline {self.headline!r} is not a figure of its sections")

    def figures(self) -> list[ReportFigure]:
        """Every figure, in order."""
        return [f for s in self.sections for f in s.figures]

    def tables(self) -> list[ReportTable]:
        """Every table, in order (the glance first)."""
        return ([self.glance] if self.glance is not None else []) + [t for s in self.sections for t in s.tables]

    def main_tables(self) -> list[tuple[Section, ReportTable]]:
        """The main tables with their sections, in order: the shown (not collapsed) tables of the
        sections marked ``main=True``, and of unmarked sections that hold only shown tables (the
        studies' first sections: the paper's tables with this run's numbers).

        >>> import pandas as pd
        >>> df = pd.DataFrame({"x": [1]})
        >>> c = ReportContent(sections=[Section("Main", tables={"m": df}),
        ...                             Section("Raw", figures={"f": b"png"}, tables={"r": df})])
        >>> [t.name for _, t in c.main_tables()]
        ['m']
        """
        out = []
        for s in self.sections:
            auto = not s.figures and bool(s.tables) and not any(t.collapsed for t in s.tables)
            if s.main or (s.main is None and auto):
                out += [(s, t) for t in s.tables if not t.collapsed]
        return out


#: The glance table's columns: one row per number, this run's beside the paper's.
GLANCE_COLUMNS = ["quantity", "task", "this run", "paper"]


def glance_table(rows: list[dict], name: str, caption: str) -> ReportTable | None:
    """The report's glance table ([`ReportContent.glance`][headcount.experiments.report.content.ReportContent.glance]) from glance rows
    (dicts keyed by [`GLANCE_COLUMNS`][headcount.experiments.report.content.GLANCE_COLUMNS]); None without rows."""
    if not rows:
        return None
    import pandas as pd  # lazy, as in ReportTable

    return ReportTable(name, pd.DataFrame(rows, columns=GLANCE_COLUMNS), caption=caption)


def headline_of(sections: list[Section], names, art: str = "") -> str:
    """The first of ``names`` (with the artifact prefix ``art``) that is a figure of ``sections``, or
    ``""`` ([`ReportContent.headline`][headcount.experiments.report.content.ReportContent.headline])."""
    drawn = {f.name for s in sections for f in s.figures}
    return next((f"{art}{n}" for n in names if f"{art}{n}" in drawn), "")


def new_figure(nrows: int = 1, ncols: int = 1, size: tuple[float, float] = (6.4, 4.0), **subplot_kw):
    """A matplotlib Figure and its axes, without pyplot (no global state, renders with Agg).

    Returns:
        ``(fig, axes)``; ``axes`` is one Axes for 1x1, else an array as ``plt.subplots`` gives.

    >>> fig, ax = new_figure()
    >>> _ = ax.plot([0, 1], [1, 0]); type(fig).__name__
    'Figure'
    """
    # lazy: matplotlib costs ~0.2-0.3 s to import, and headcount --help loads this module
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=True, subplot_kw=subplot_kw or None)
    return fig, axes
