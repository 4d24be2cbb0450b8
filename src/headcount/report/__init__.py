"""Reports drawn from saved results: ``report.html`` (self-contained), ``results/*.csv``, ``figures/*.png``.

A study type's ``report_fn(store, config)`` returns a :class:`ReportContent`; it reads results
through the store (``store.result(name)``, ``store.results(kind)``), never models, so a report
is redrawn in seconds with ``headcount report RUN_DIR``.
"""

from .build import build_report, default_report
from .content import ReportContent, ReportFigure, ReportTable, Section, new_figure
from .html import figure_png, tidy
from .terminal import print_summary

__all__ = [
    "ReportContent",
    "ReportFigure",
    "ReportTable",
    "Section",
    "build_report",
    "default_report",
    "figure_png",
    "new_figure",
    "print_summary",
    "tidy",
]
