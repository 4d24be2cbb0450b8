"""Reports drawn from saved results: ``report.html`` (self-contained), ``results/*.csv``, ``figures/*.png``.

A study type's ``report_fn(store, config)`` returns a [`ReportContent`][headcount.experiments.report.content.ReportContent]; it reads results
through the store (``store.result(name)``, ``store.results(kind)``), never models, so a report
is redrawn in seconds with ``headcount report RUN_DIR``.
"""

from headcount.experiments.report.build import build_report, default_report
from headcount.experiments.report.content import (
    ReportContent,
    ReportFigure,
    ReportTable,
    Section,
    glance_table,
    headline_of,
    new_figure,
)
from headcount.experiments.report.html import figure_png, tidy
from headcount.experiments.report.terminal import print_summary

__all__ = [
    "ReportContent",
    "ReportFigure",
    "ReportTable",
    "Section",
    "build_report",
    "default_report",
    "figure_png",
    "glance_table",
    "headline_of",
    "new_figure",
    "print_summary",
    "tidy",
]
