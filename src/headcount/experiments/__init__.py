"""Experiments: studies as jobs, their runs, reports and the explorer.

Holds the job runner (``runner``: configs, the job graph, the run store, executors), the study
types (``studies``: transfer, lottery, demo), the report (``report``), the head explorer
(``explorer``) and the shipped study configs (``configs/``, [`CONFIGS`][headcount.experiments.CONFIGS]). Inside, the layers
run studies > report > explorer > runner (``pyproject.toml``).

May import: every package below it (``headcount.train``, ``headcount.analysis``,
``headcount.importance``, ``headcount.data``, ``headcount.core``, ``headcount.runtime``);
only ``headcount.cli`` imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headcount.experiments.runner import RunSummary

#: the shipped study configs (``configs/`` in a checkout is a link to this folder)
CONFIGS = Path(__file__).resolve().parent / "configs"


def run_study(config, out, *, report: bool = True, **options) -> "RunSummary":
    """Run (or resume) a study and draw its report: ``headcount.experiments.runner.run_study`` with
    ``headcount.experiments.report.build_report`` (the runner does not import the report).

    Args:
        config: a YAML path, a validated config model, or a loaded config.
        out: the run directory.
        report: draw ``report.html``, ``results/`` and ``figures/`` once every job has finished.
        **options: the other arguments of ``headcount.experiments.runner.run_study`` (executor, address,
            force, keep_going, quiet, console, device, precision, gpus_per_job).

    Returns:
        The run's summary (RunSummary): the run directory, the jobs planned, reused, run, failed
        and skipped, and ``report``, the path of ``report.html`` (None when ``report=False``).
    """
    # lazy: the runner and the report import pandas, rich and the executors (~0.4 s), which the
    # score/prune/info commands never use
    from headcount.experiments import runner
    from headcount.experiments.report import build_report

    return runner.run_study(config, out, report=build_report if report else None, **options)
