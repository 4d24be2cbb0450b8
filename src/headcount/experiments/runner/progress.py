"""The progress display of a study: rich progress bars (jobs with ETA, and the steps a long job reports) on stderr."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from headcount.experiments.runner.jobs import Job


def _esc(text: str) -> str:
    return escape(str(text))


class Reporter:
    """Progress display for a run: one bar for jobs (with ETA), one per running job's own steps.

    Args:
        total: number of jobs to run.
        reused: number of jobs already finished (shown, not run).
        quiet: print nothing.
    """

    def __init__(self, total: int, reused: int = 0, quiet: bool = False, console=None):
        self.total = total
        self.reused = reused
        self.quiet = quiet
        self._console = console
        self._progress = None
        self._jobs_task = None
        self._steps: dict[str, Any] = {}
        self._active: set[str] = set()

    def __enter__(self) -> "Reporter":
        if self.quiet:
            return self
        console = self._console or Console(stderr=True)
        if self.total == 0:
            if self.reused:
                console.print(f"[dim]all {self.reused} job(s) already finished: nothing to run[/dim]")
            return self
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._progress.start()
        if self.reused:
            self._progress.console.print(f"[dim]{self.reused} job(s) already finished: reused[/dim]")
        self._jobs_task = self._progress.add_task("jobs", total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            for task in self._steps.values():
                self._progress.remove_task(task)
            self._steps.clear()
            self._progress.stop()

    def print(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text, highlight=False)

    def job_started(self, job: Job, verb: str = "start", where: str | None = None) -> None:
        """A job started (``where``: the node or device it runs on, shown after its name)."""
        self._active.add(job.key)
        on = f" on {_esc(where)}" if where else ""
        self.print(f"[cyan]{verb}[/cyan] {_esc(job.name)}{on} [dim]{job.key}[/dim]")

    def step(self, job: Job, completed: float, total: float | None = None, description: str | None = None) -> None:
        """A running job reported its own progress."""
        if self._progress is None or job.key not in self._active:  # late updates of finished jobs
            return
        task = self._steps.get(job.key)
        label = f"  {_esc(job.name)}" + (f": {_esc(description)}" if description else "")
        if task is None:
            task = self._progress.add_task(label, total=total)
            self._steps[job.key] = task
        kwargs = {"completed": completed, "description": label}
        if total is not None:
            kwargs["total"] = total
        self._progress.update(task, **kwargs)

    def job_finished(self, job: Job, seconds: float | None, error: str | None = None) -> None:
        self._active.discard(job.key)
        if self._progress is None:
            return
        task = self._steps.pop(job.key, None)
        if task is not None:
            self._progress.remove_task(task)
        if error is None:
            self.print(f"[green]done[/green]  {_esc(job.name)} [dim]({seconds:.1f} s)[/dim]")
        else:
            self.print(f"[red]FAILED[/red] {_esc(job.name)}: {_esc(error)}")
        self._progress.advance(self._jobs_task)

    def job_skipped(self, job: Job, because: str) -> None:
        self.print(f"[yellow]skip[/yellow]  {_esc(job.name)} (input {_esc(because)} failed)")
        if self._progress is not None:
            self._progress.advance(self._jobs_task)

    def callback(self, job: Job):
        """The ``progress`` argument a job function receives in this process."""

        def progress(completed: float, total: float | None = None, description: str | None = None) -> None:
            self.step(job, completed, total, description)

        return progress
