"""`headcount demo`: the offline study (configs/demo.yaml) from set-up to report."""

from __future__ import annotations

from pathlib import Path

import typer

from headcount import experiments
from headcount.cli.commands import app
from headcount.cli.commands.study import GPUS_PER_JOB_HELP, STUDY_DEVICE_HELP, check_gpus_per_job, jobs_line
from headcount.data.tasks import is_fetched
from headcount.runtime.errors import HeadcountError


@app.command()
def demo(
    full: bool = typer.Option(False, "--full", help="the larger profile (configs/demo-full.yaml)"),
    out: Path = typer.Option(Path("runs/demo"), "--out", "-o", help="run directory (running again resumes)"),
    executor: str = typer.Option("local", "--executor", "-e", help="local or ray"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    gpus_per_job: float = typer.Option(None, "--gpus-per-job", help=GPUS_PER_JOB_HELP),
    device: str = typer.Option(None, "--device", help=STUDY_DEVICE_HELP),
):
    """Run the demo study on the offline default model and data; print where the report is."""
    from headcount.experiments.report import print_summary  # lazy: the report imports scipy, --help need not

    check_gpus_per_job(gpus_per_job)
    if not is_fetched():
        raise HeadcountError("the offline data is not fetched: run `headcount data fetch` (or `make data`) first")
    config = experiments.CONFIGS / ("demo-full.yaml" if full else "demo.yaml")
    summary = experiments.run_study(config, out, executor=executor, quiet=quiet, gpus_per_job=gpus_per_job, device=device)
    typer.echo(jobs_line(summary))
    if summary.report is not None:
        print_summary(summary.run_dir)  # the report's main tables (RUN/results/summary.json)
    typer.echo(f"report: {summary.report}")
