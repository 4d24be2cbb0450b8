"""`headcount study` and `headcount report`."""

from __future__ import annotations

from pathlib import Path

import typer

from headcount import experiments
from headcount.cli.commands import app
from headcount.runtime.errors import HeadcountError

GPUS_PER_JOB_HELP = ("with --executor ray: GPUs each job that runs a model asks Ray for (0.5: two jobs share a "
                     "GPU; default: the executor's, one). The local executor runs one job per GPU and refuses it")


def check_gpus_per_job(value: float | None) -> None:
    """``--gpus-per-job``: [`headcount.experiments.runner.ray_executor.check_gpus_per_job`][headcount.experiments.runner.ray_executor.check_gpus_per_job]'s rule, checked
    before the study loads (the local executor refuses it when it is made:
    [`headcount.experiments.runner.executors.make_executor`][headcount.experiments.runner.executors.make_executor])."""
    if value is not None:
        from headcount.experiments.runner.ray_executor import check_gpus_per_job as check  # lazy: --help stays light

        check(value, "--gpus-per-job")


def jobs_line(summary) -> str:
    """What a study command did and how long it took: ``jobs: 40 (40 ran, 0 reused) in 3 min 0 s``."""
    minutes, seconds = divmod(round(summary.seconds), 60)
    took = f"{minutes} min {seconds} s" if minutes else f"{summary.seconds:.1f} s"
    return f"jobs: {summary.jobs} ({len(summary.ran)} ran, {summary.reused} reused) in {took}"


PLACEMENT_HELP = ("with --executor ray: seconds a job may wait for a node with room for it while none of the "
                  "study's jobs runs; then it is reported as failed (default 600)")
STUDY_DEVICE_HELP = ("auto (every GPU: one job per GPU at once) | cpu | cuda | cuda:N (default: the config's "
                     "device:, else $HEADCOUNT_DEVICE, else auto)")


@app.command()
def study(
    config: Path = typer.Argument(..., help="study config (YAML), e.g. configs/demo.yaml"),
    out: Path = typer.Option(..., "--out", "-o", help="run directory (created; running again resumes)"),
    resume: bool = typer.Option(False, "--resume", help="continue an interrupted run (the default anyway)"),
    executor: str = typer.Option("local", "--executor", "-e", help="local (in this process) or ray"),
    address: str = typer.Option(None, "--address", help="Ray cluster (host:port, ray://host:port, auto); "
                                "default: $RAY_ADDRESS, else start a local Ray instance"),
    force: bool = typer.Option(False, "--force", help="take over a run directory made by another config "
                               "(deletes nothing; the old config and report move to history/)"),
    no_report: bool = typer.Option(False, "--no-report", help="do not draw the report at the end"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress display"),
    device: str = typer.Option(None, "--device", help=STUDY_DEVICE_HELP),
    gpus_per_job: float = typer.Option(None, "--gpus-per-job", help=GPUS_PER_JOB_HELP),
    placement_timeout: float = typer.Option(None, "--placement-timeout", help=PLACEMENT_HELP),
):
    """Run a study (resumable): every job of the config, then the report."""
    check_gpus_per_job(gpus_per_job)
    chosen = executor
    if placement_timeout is not None:
        if executor != "ray":
            raise HeadcountError("--placement-timeout is for the ray executor (add --executor ray)")
        from headcount.experiments.runner.ray_executor import RayExecutor  # lazy: --help stays light

        chosen = RayExecutor(address=address, gpus_per_job=gpus_per_job, placement_timeout=placement_timeout)
        address, gpus_per_job = None, None  # given to the executor
    from headcount.experiments.report import print_summary  # lazy: the report imports scipy, --help need not

    summary = experiments.run_study(config, out, executor=chosen, address=address, force=force,
                                    report=not no_report, quiet=quiet, device=device, gpus_per_job=gpus_per_job)
    typer.echo(f"run directory: {summary.run_dir}")
    typer.echo(jobs_line(summary))
    if summary.report is not None:
        print_summary(summary.run_dir)  # the report's main tables (RUN/results/summary.json)
        typer.echo(f"report: {summary.report}")


@app.command()
def report(run_dir: Path = typer.Argument(..., help="a run directory made by `headcount study`")):
    """Redraw report.html, results/*.csv and figures/ of a run from its saved results."""
    from headcount.experiments.report import build_report, print_summary  # lazy: scipy, which --help need not load

    if not (run_dir / "manifest.json").is_file():
        path = build_report(run_dir)  # not a run directory: its one error line, nothing created
    else:
        # lazy: the runner imports pandas and rich (~0.5 s), which --help need not load
        from headcount.experiments.runner.store import RunStore

        with RunStore(run_dir) as store:  # the run's lock: a study running there is refused, not raced
            store.clean_tmp()  # a killed report's (or study's) temporary files, by the record's sessions
            path = build_report(run_dir, store=store)
    print_summary(run_dir)
    typer.echo(f"report: {path}")
