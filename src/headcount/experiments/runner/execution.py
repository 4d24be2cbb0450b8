"""What every executor shares: calling a job function, the [`Executor`][headcount.experiments.runner.execution.Executor] interface, the outcome of a
run, skipping jobs whose inputs failed, and the environment a job runs in (device, precision)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from headcount.experiments.runner.jobs import Job, JobResult, resolve_function
from headcount.experiments.runner.progress import Reporter
from headcount.experiments.runner.store import RunStore
from headcount.runtime.device import (
    ENV_PRECISION,
    PRECISIONS,
    pool_devices,
    resolve_device,
    resolve_precision,
)
from headcount.runtime.errors import HeadcountError


def call_job(fn_path: str, params: dict, inputs: Mapping[str, JobResult], workdir: Path, progress) -> dict:
    """Import and call a job function; check that it returned a JSON-able dict.

    >>> import tempfile
    >>> call_job("headcount.experiments.runner.jobs:example_job", {"values": [1, 2]}, {}, Path(tempfile.mkdtemp()), None)
    {'sum': 3}
    """
    fn = resolve_function(fn_path)
    result = fn(params, dict(inputs), Path(workdir), progress)
    if result is None:
        result = {}
    if not isinstance(result, Mapping):
        raise HeadcountError(f"job function {fn_path} returned {type(result).__name__}, not a dict")
    result = dict(result)
    try:
        json.dumps(result)
    except (TypeError, ValueError) as e:
        raise HeadcountError(f"job function {fn_path} returned a result that is not JSON-able: {e}") from None
    return result


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    return msg if isinstance(exc, HeadcountError) else f"{type(exc).__name__}: {msg}".rstrip(": ")


@dataclass
class Outcome:
    """What an executor did: names of jobs run, failed (with a one-line reason) and skipped."""

    ran: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False


class Executor:
    """Base class: ``run`` executes ``jobs`` (pending, in topological order) into ``store``.

    ``check()`` validates the executor before anything is written; ``session()`` holds what
    ``run`` needs (a Ray connection) around it, so a failed connection writes nothing.
    ``device`` is the study's device spec (``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``; None:
    ``$HEADCOUNT_DEVICE``, else ``auto``): each job runs with ``HEADCOUNT_DEVICE`` set from it.
    """

    name = "executor"
    device: str | None = None
    precision: str | None = None
    #: where ``say`` writes (``run_study`` sets it): a rich Console, None (stderr), or False (quiet)
    console = False

    def say(self, text: str) -> None:
        """One dim status line while the executor sets up, before the progress display starts
        (connecting to a Ray cluster and checking its nodes take a minute): what it waits for."""
        if self.console is False:
            return
        from rich.console import Console
        from rich.markup import escape

        (self.console or Console(stderr=True)).print(escape(text), style="dim", highlight=False, soft_wrap=True)

    def set_device(self, spec: str | None) -> None:
        """Use the device spec ``spec`` for the jobs (checked now: an unavailable device is refused)."""
        pool_devices(spec)
        self.device = spec

    def set_precision(self, spec: str | None) -> None:
        """Run the jobs in precision ``spec`` (``auto`` | ``fp32`` | ``bf16``; None: ``$HEADCOUNT_PRECISION``,
        else auto): each job then runs with ``HEADCOUNT_PRECISION`` set to it.

        >>> e = Executor(); e.set_precision("BF16"); e.precision_env()
        {'HEADCOUNT_PRECISION': 'bf16'}
        """
        if spec is not None:
            spec = str(spec).strip().lower()
            if spec not in PRECISIONS:
                raise HeadcountError(f"unknown precision {spec!r}; choose one of {', '.join(PRECISIONS)}")
        self.precision = spec

    def precision_env(self) -> dict[str, str]:
        """``{"HEADCOUNT_PRECISION": spec}`` when a precision was set, else ``{}`` (the environment's own)."""
        if self.precision is None:
            return {}
        return {ENV_PRECISION: self.precision}

    def check(self) -> None:
        """Fail early on an unusable executor (nothing to check by default)."""

    @contextmanager
    def session(self, jobs: Sequence[Job] = ()):
        """Context around one or more ``run`` calls (nothing by default); ``jobs``, those to run,
        are checked against what the executor has (the Ray cluster's nodes) before the block runs."""
        yield self

    def run(self, jobs: Sequence[Job], store: RunStore, reporter: Reporter, keep_going: bool = True) -> Outcome:
        raise NotImplementedError


def _blocked_by(job: Job, bad: set[str]) -> str | None:
    for alias, dep in job.deps:
        if dep.key in bad:
            return dep.name
    return None


def _skip_if_blocked(job: Job, todo: list, bad: set[str], out, reporter, keep_going: bool) -> bool:
    """Skip ``job`` (take it off ``todo``, mark it bad) when a dependency failed or, without
    ``keep_going``, when any job failed; True when skipped. Shared by the local and Ray loops."""
    blocker = _blocked_by(job, bad)
    if blocker is None and (keep_going or not out.failed):
        return False
    todo.remove(job)
    bad.add(job.key)
    out.skipped.append(job.name)
    if blocker is not None:
        reporter.job_skipped(job, blocker)
    return True


@contextmanager
def job_environment(env: Mapping[str, str]):
    """Set environment variables for one in-process job; restore them afterwards."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _device_meta(device: str, precision: str | None = None) -> dict:
    """``device`` and ``precision`` of a job pinned to ``device`` (for its ``meta.json``);
    ``precision``: the study's spec (None: ``$HEADCOUNT_PRECISION``, else auto)."""
    try:
        return {"device": device, "precision": resolve_precision(precision, resolve_device(device))}
    except HeadcountError:  # a fake pool (tests)
        return {"device": device}
