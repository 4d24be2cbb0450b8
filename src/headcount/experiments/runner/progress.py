"""The progress display of a study on stderr: its plan and an estimate first, then rich progress bars
(jobs with ETA, and the steps a long job reports) on a terminal; off a terminal (a log, CI) plain
lines, a job's own steps at most every ``headcount.runtime.progress.PLAIN_EVERY_S`` seconds, and
``job k/N, ETA`` on each ``done`` line."""

from __future__ import annotations

import time
from collections.abc import Callable
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
from headcount.runtime.progress import PLAIN_EVERY_S, duration


def plan_line(kinds: list[str], reused: int = 0) -> str:
    """The jobs to run by kind: ``plan: 5 jobs to run (finetune 2, score 3); 1 reused``.

    >>> plan_line(["score", "finetune", "score"], reused=1)
    'plan: 3 jobs to run (score 2, finetune 1); 1 reused'
    """
    counts: dict[str, int] = {}
    for k in kinds:
        counts[k] = counts.get(k, 0) + 1
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    text = f"plan: {len(kinds)} job{'s' if len(kinds) != 1 else ''} to run" + (f" ({by_kind})" if kinds else "")
    return text + (f"; {reused} reused" if reused else "")


def estimate_seconds(pending: list[str], timed: list[tuple[str, float]]) -> float | None:
    """Seconds the ``pending`` job kinds should take: per kind, the mean of the ``timed`` jobs
    ``(kind, seconds)`` of that kind, else the mean of them all; None when nothing is timed.

    >>> estimate_seconds(["score", "score", "prune"], [("score", 10.0), ("finetune", 50.0)])
    50.0
    >>> estimate_seconds(["score"], []) is None
    True
    """
    if not timed:
        return None
    by_kind: dict[str, list[float]] = {}
    for k, s in timed:
        by_kind.setdefault(k, []).append(s)
    overall = sum(s for _, s in timed) / len(timed)
    return sum(sum(by_kind[k]) / len(by_kind[k]) if k in by_kind else overall for k in pending)


def estimate_line(pending: list[str], timed: list[tuple[str, float]], fresh: str | None = None) -> str:
    """``estimate: about 3m05s (an estimate: the mean time of each kind's 4 finished jobs of this run)``;
    before any job of the run finished, ``fresh`` when given (the line of
    [`plan_estimate`][headcount.experiments.runner.estimate.plan_estimate]): finished jobs' times win.

    >>> estimate_line(["score"], [])
    'estimate: none yet (no job of this run has finished; each done line then gives an ETA)'
    """
    left = estimate_seconds(pending, timed)
    if left is None:
        if fresh:
            return fresh
        return "estimate: none yet (no job of this run has finished; each done line then gives an ETA)"
    n = len(timed)
    return (f"estimate: about {duration(left)} (an estimate: the mean time per kind of the {n} finished "
            f"job{'s' if n != 1 else ''} of this run)")


def _esc(text: str) -> str:
    return escape(str(text))


class Reporter:
    """Progress display for a run: one bar for jobs (with ETA), one per running job's own steps.

    Args:
        total: number of jobs to run.
        reused: number of jobs already finished (shown, not run).
        quiet: print nothing.
    """

    def __init__(self, total: int, reused: int = 0, quiet: bool = False, console=None,
                 pending: list[Job] | None = None, timed: list[tuple[str, float]] | None = None,
                 clock=time.monotonic, fresh: Callable[[], str] | None = None):
        self.total = total
        self.reused = reused
        self.quiet = quiet
        self._console = console
        #: the kinds of the jobs still to run, and (kind, seconds) of the finished ones of this run
        self._pending = [j.kind for j in pending] if pending is not None else None
        self._timed = list(timed or [])
        #: the fresh-run estimate's line, computed only when printed (not quiet, nothing timed yet)
        self._fresh = fresh
        self._done = 0
        self._clock = clock
        self._plain = False  # not a terminal: steps as rate-limited lines
        self._last_step: dict[str, float] = {}
        self._progress = None
        self._jobs_task = None
        self._steps: dict[str, Any] = {}
        self._active: set[str] = set()

    def __enter__(self) -> "Reporter":
        if self.quiet:
            return self
        console = self._console or Console(stderr=True)
        self._plain = not console.is_terminal
        if self._pending is not None and self.total:
            console.print(plan_line(self._pending, self.reused), highlight=False, soft_wrap=True)
            fresh = self._fresh() if self._fresh is not None and not self._timed else None
            console.print(estimate_line(self._pending, self._timed, fresh), highlight=False, soft_wrap=True)
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
            # a log's lines are never folded at the console's width (a line is one event)
            self._progress.console.print(text, highlight=False, soft_wrap=self._plain)

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
        if self._plain:  # a log: one line at most every PLAIN_EVERY_S seconds per job
            now = self._clock()
            if now - self._last_step.setdefault(job.key, now) >= PLAIN_EVERY_S:
                self._last_step[job.key] = now
                of = f"/{total:g}" if total is not None else ""
                self.print(f"[dim]{label.strip()}: {completed:g}{of}[/dim]")
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
        self._done += 1
        if error is None:
            self._timed.append((job.kind, seconds))
            self.print(f"[green]done[/green]  {_esc(job.name)} [dim]({seconds:.1f} s; {self.eta_text(job)})[/dim]")
        else:
            self.print(f"[red]FAILED[/red] {_esc(job.name)}: {_esc(error)}")
        self._progress.advance(self._jobs_task)

    def eta_text(self, job: Job | None = None) -> str:
        """``job 3/10, ETA ~2m10s`` after a job ended: the estimate for the jobs left (per kind:
        [`estimate_seconds`][headcount.experiments.runner.progress.estimate_seconds])."""
        text = f"job {self._done}/{self.total}"
        if self._pending is None:
            return text
        if job is not None and job.kind in self._pending:
            self._pending.remove(job.kind)
        left = estimate_seconds(self._pending, self._timed)
        return text + (f", ETA ~{duration(left)}" if left is not None and self._pending else "")

    def job_skipped(self, job: Job, because: str) -> None:
        self._done += 1
        if self._pending is not None and job.kind in self._pending:
            self._pending.remove(job.kind)
        self.print(f"[yellow]skip[/yellow]  {_esc(job.name)} (input {_esc(because)} failed)")
        if self._progress is not None:
            self._progress.advance(self._jobs_task)

    def callback(self, job: Job):
        """The ``progress`` argument a job function receives in this process."""

        def progress(completed: float, total: float | None = None, description: str | None = None) -> None:
            self.step(job, completed, total, description)

        return progress
