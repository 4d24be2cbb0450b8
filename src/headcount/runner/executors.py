"""Executors: run the pending jobs of a plan and publish their results in the store.

- :class:`LocalExecutor` runs jobs one after another in this process, in plan (topological)
  order; each job writes straight into a temporary directory of the store. On a machine with
  several GPUs it keeps a device pool (:func:`headcount.device.pool_devices`): up to one job per
  GPU at once, each in its own process that sees only its GPU (``CUDA_VISIBLE_DEVICES``).
- :class:`RayExecutor` turns each job into a Ray task with its resources (CPUs, GPUs), starting
  a local Ray instance when no address is given. Tasks run in a scratch directory on their
  worker and return the result dict and their files as bytes; the driver alone writes the store,
  so the results are the same as with ``local`` and nothing depends on a shared filesystem.
  Inputs are read in place when the worker sees the run directory (same machine or a shared
  filesystem) and otherwise fetched from the Ray object store.

Both show rich progress bars (jobs, with ETA; and the steps a long job reports) on stderr.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import queue as queue_errors
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
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

from ..device import (
    ENV_DEVICE,
    ENV_PRECISION,
    PRECISIONS,
    check_gpus_per_job,
    cuda_count,
    pool_devices,
    resolve_device,
    resolve_precision,
)
from ..device import job_environment as device_env
from ..errors import HeadcountError
from .jobs import Job, JobResult, resolve_function
from .store import DONE, RESULT, RunStore, job_meta, pack_dir, unpack_files


def call_job(fn_path: str, params: dict, inputs: Mapping[str, JobResult], workdir: Path, progress) -> dict:
    """Import and call a job function; check that it returned a JSON-able dict.

    >>> import tempfile
    >>> call_job("headcount.runner.jobs:example_job", {"values": [1, 2]}, {}, Path(tempfile.mkdtemp()), None)
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


def _esc(text: str) -> str:
    return escape(str(text))


# ---------------------------------------------------------------------------------------------
# progress display
# ---------------------------------------------------------------------------------------------
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

    def job_started(self, job: Job, verb: str = "start") -> None:
        self._active.add(job.key)
        self.print(f"[cyan]{verb}[/cyan] {_esc(job.name)} [dim]{job.key}[/dim]")

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
    def session(self):
        """Context around one or more ``run`` calls (nothing by default)."""
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


# ---------------------------------------------------------------------------------------------
# local
# ---------------------------------------------------------------------------------------------
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


class DevicePool:
    """Free devices of a study run: a job takes one to start and gives it back when it ends.

    >>> pool = DevicePool(["cuda:0", "cuda:1"])
    >>> a, b, c = pool.acquire(), pool.acquire(), pool.acquire()
    >>> a, b, c
    ('cuda:0', 'cuda:1', None)
    >>> pool.release(a); pool.acquire()
    'cuda:0'
    """

    def __init__(self, devices: Sequence[str]):
        if not devices:
            raise HeadcountError("a device pool needs at least one device")
        self.devices = list(devices)
        self.free = list(devices)

    def __len__(self) -> int:
        return len(self.devices)

    def acquire(self) -> str | None:
        return self.free.pop(0) if self.free else None

    def release(self, device: str) -> None:
        self.free.append(device)
        self.free.sort(key=self.devices.index)  # lowest index first: deterministic placement


def _device_meta(device: str, precision: str | None = None) -> dict:
    """``device`` and ``precision`` of a job pinned to ``device`` (for its ``meta.json``);
    ``precision``: the study's spec (None: ``$HEADCOUNT_PRECISION``, else auto)."""
    try:
        return {"device": device, "precision": resolve_precision(precision, resolve_device(device))}
    except HeadcountError:  # a fake pool (tests)
        return {"device": device}


def _local_worker(fn_path: str, key: str, params: dict, inputs: dict, workdir: str, env: dict, queue,
                  device: str = "cpu") -> None:
    """Body of a pooled job's process: pin the device, run the job, report through ``queue``.

    The job's device metadata is worked out here, after the job: the driver never creates a
    CUDA context on the pool's GPUs."""
    os.environ.update(env)  # before anything initialises CUDA in this fresh process
    last = [0.0]

    def progress(completed: float, total: float | None = None, description: str | None = None) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5 or (total is not None and completed >= total):
            last[0] = now
            queue.put(("progress", key, completed, total, description))

    t0 = time.time()
    try:
        result = call_job(fn_path, params, inputs, Path(workdir), progress)
        t1 = time.time()
        queue.put(("done", key, result, t0, t1, {**_device_meta(env.get("HEADCOUNT_DEVICE", device)), "device": device}))
    except BaseException as e:  # noqa: BLE001 - reported to the driver, which decides
        queue.put(("error", key, _one_line(e), traceback.format_exc()))


class LocalExecutor(Executor):
    """Run jobs on this machine: one by one in this process, or one per GPU at once.

    With one device in the pool (the CPU, one GPU, or ``device: cuda:N``) jobs run in this
    process in topological order, with ``HEADCOUNT_DEVICE`` set to the device. With several
    (``auto`` or ``cuda`` on a machine with N GPUs) up to N jobs run at once, each in a fresh
    process that sees only its GPU; a job starts when its inputs are done and a GPU is free.

    Args:
        devices: the pool, e.g. ``["cuda:0", "cuda:1"]`` (tests pass ``["cpu", "cpu"]`` to run
            two processes on the CPU); default: :func:`headcount.device.pool_devices` of
            ``self.device``.

    >>> LocalExecutor().name
    'local'
    """

    name = "local"

    def __init__(self, devices: Sequence[str] | None = None):
        self.devices = list(devices) if devices is not None else None

    def pool(self) -> DevicePool:
        return DevicePool(self.devices if self.devices is not None else pool_devices(self.device))

    def run(self, jobs: Sequence[Job], store: RunStore, reporter: Reporter, keep_going: bool = True) -> Outcome:
        pool = self.pool()
        # several devices, or one GPU of several: jobs in their own processes, each seeing its GPU
        # only (in this process the Trainer would take cuda:0, or wrap the model in DataParallel)
        if len(pool) > 1 or (pool.devices[0].startswith("cuda:") and cuda_count() > 1):
            return self._run_pooled(jobs, store, reporter, keep_going, pool)
        return self._run_here(jobs, store, reporter, keep_going, pool.devices[0])

    def _run_here(self, jobs, store: RunStore, reporter: Reporter, keep_going: bool, device: str) -> Outcome:
        where = _device_meta(device, self.precision)
        if any(not store.is_done(j.key) for j in jobs):
            reporter.print(f"[dim]jobs run on {where['device']}, {where.get('precision', '?')}[/dim]")
        out = Outcome()
        bad: set[str] = set()
        for job in jobs:
            if store.is_done(job.key):
                continue
            blocker = _blocked_by(job, bad)
            if blocker is not None:
                bad.add(job.key)
                out.skipped.append(job.name)
                reporter.job_skipped(job, blocker)
                continue
            if out.failed and not keep_going:
                out.skipped.append(job.name)
                continue
            inputs = {alias: store.load(dep.key, dep.name) for alias, dep in job.deps}
            tmp = store.new_tmp_dir(job.key)
            reporter.job_started(job)
            t0 = time.time()
            try:
                with job_environment({ENV_DEVICE: device, **self.precision_env()}):
                    result = call_job(job.fn, job.params, inputs, tmp, reporter.callback(job))
                t1 = time.time()
                store.commit(job, tmp, result, {**job_meta(t0, t1, self.name), **_device_meta(device, self.precision)})
            except KeyboardInterrupt:
                out.interrupted = True
                raise
            except Exception as e:  # a failing job does not stop independent ones
                bad.add(job.key)
                out.failed[job.name] = _one_line(e)
                store.record_failure(job, traceback.format_exc())
                reporter.job_finished(job, None, _one_line(e))
                continue
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
            out.ran.append(job.name)
            reporter.job_finished(job, t1 - t0)
        return out


    def _run_pooled(self, jobs, store: RunStore, reporter: Reporter, keep_going: bool, pool: DevicePool) -> Outcome:
        ctx = multiprocessing.get_context("spawn")  # fresh processes: CUDA is not initialised there
        messages = ctx.Queue()
        out = Outcome()
        todo = [j for j in jobs if not store.is_done(j.key)]
        running: dict[str, tuple] = {}  # key -> (job, process, device, tmp)
        bad: set[str] = set()

        def finish(key: str, error: str | None, trace: str = "", result=None, t0=0.0, t1=0.0, where=None) -> None:
            job, proc, device, tmp = running.pop(key)
            proc.join(timeout=10)
            pool.release(device)
            try:
                if error is None:
                    try:
                        store.commit(job, tmp, result, {**job_meta(t0, t1, self.name), **(where or {"device": device})})
                    except HeadcountError as e:
                        error, trace = str(e), str(e)
                if error is None:
                    out.ran.append(job.name)
                    reporter.job_finished(job, t1 - t0)
                else:
                    bad.add(job.key)
                    out.failed[job.name] = error
                    store.record_failure(job, f"device: {device}\n\n{trace}")
                    reporter.job_finished(job, None, error)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)

        try:
            while todo or running:
                for job in list(todo):
                    if _skip_if_blocked(job, todo, bad, out, reporter, keep_going):
                        continue
                    if not all(store.is_done(d.key) for _, d in job.deps):
                        continue
                    device = pool.acquire()
                    if device is None:
                        break  # every device is busy
                    todo.remove(job)
                    inputs = {alias: store.load(dep.key, dep.name) for alias, dep in job.deps}
                    tmp = store.new_tmp_dir(job.key)
                    proc = ctx.Process(target=_local_worker, daemon=True,
                                       args=(job.fn, job.key, job.params, inputs, str(tmp),
                                             {**device_env(device), **self.precision_env()}, messages, device))
                    proc.start()
                    running[job.key] = (job, proc, device, tmp)
                    reporter.job_started(job, f"start on {device}:")
                if not running:
                    if todo:  # pragma: no cover - only when inputs are neither done nor pending
                        raise HeadcountError(f"jobs {[j.name for j in todo]} wait for inputs that never run")
                    break
                try:
                    msg = messages.get(timeout=0.5)
                except queue_errors.Empty:
                    for key, (job, proc, _, _) in list(running.items()):
                        if not proc.is_alive() and messages.empty():  # died without a word (killed, OOM)
                            finish(key, f"the job's process died (exit code {proc.exitcode})",
                                   f"exit code {proc.exitcode}")
                    continue
                kind, key = msg[0], msg[1]
                if key not in running:
                    continue
                if kind == "progress":
                    reporter.step(running[key][0], *msg[2:])
                elif kind == "done":
                    finish(key, None, result=msg[2], t0=msg[3], t1=msg[4], where=msg[5])
                else:
                    finish(key, msg[2], msg[3])
        except KeyboardInterrupt:
            out.interrupted = True
            for job, proc, _, tmp in running.values():
                proc.terminate()
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out


# ---------------------------------------------------------------------------------------------
# ray
# ---------------------------------------------------------------------------------------------
class _ProgressSink:
    """A tiny Ray actor that collects the latest progress of each running task."""

    def __init__(self):
        self.state: dict[str, tuple] = {}

    def update(self, key: str, completed: float, total: float | None, description: str | None) -> None:
        self.state[key] = (completed, total, description)

    def poll(self) -> dict[str, tuple]:
        state, self.state = self.state, {}
        return state


class _RemoteProgress:
    """The ``progress`` callback inside a Ray task: forwards at most two updates a second."""

    def __init__(self, sink, key: str):
        self.sink, self.key, self.last = sink, key, 0.0

    def __call__(self, completed: float, total: float | None = None, description: str | None = None) -> None:
        now = time.monotonic()
        if self.sink is None or (now - self.last < 0.5 and not (total is not None and completed >= total)):
            return
        self.last = now
        try:
            self.sink.update.remote(self.key, completed, total, description)
        except Exception:  # progress is best effort
            pass


def _ray_job(fn_path: str, key: str, params: dict, inputs_spec: dict, sys_path: list[str], sink,
             env: dict | None = None) -> dict:
    """Body of a Ray task: build inputs, run the job in a scratch dir, return result and files.

    ``env`` (``HEADCOUNT_DEVICE``) is set first: Ray has already limited ``CUDA_VISIBLE_DEVICES``
    to the GPUs it gave the task."""
    os.environ.update(env or {})
    for p in sys_path:
        if p not in sys.path and os.path.isdir(p):
            sys.path.append(p)
    host = socket.gethostname()
    scratch = Path(tempfile.mkdtemp(prefix=f"headcount-{key}-"))
    try:
        inputs = {}
        for alias, spec in inputs_spec.items():
            d = Path(spec["dir"])
            marker = d / DONE
            if not (marker.is_file() and marker.read_text().strip() == spec["key"]):
                if spec["files"] is None:
                    raise HeadcountError(f"input {alias!r} ({spec['key']}) is not reachable from {host}")
                import ray

                d = scratch / "inputs" / alias
                unpack_files(ray.get(spec["files"][0]), d)
                (d / RESULT).write_text(json.dumps(spec["result"], indent=2) + "\n")
            inputs[alias] = JobResult(
                key=spec["key"], kind=spec["kind"], name=spec["name"], params=spec["params"],
                result=spec["result"], dir=d, meta=spec["meta"],
            )
        workdir = scratch / "work"
        workdir.mkdir()
        t0 = time.time()
        result = call_job(fn_path, params, inputs, workdir, _RemoteProgress(sink, key))
        t1 = time.time()
        return {"ok": True, "result": result, "files": pack_dir(workdir, skip=frozenset()),
                "started": t0, "finished": t1, "host": host}
    except Exception as e:
        return {"ok": False, "message": _one_line(e), "traceback": traceback.format_exc(), "host": host}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _split_address(address: str) -> tuple[str, int]:
    """``host:port``, ``ray://host:port``, ``[v6]:port``, or a bare host -> (host, port)."""
    rest = address
    default = 6379
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        default = 10001 if scheme == "ray" else default
    rest = rest.rstrip("/")
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    else:
        host, port = rest, ""
    if not host:
        raise HeadcountError(f"bad Ray address {address!r} (use host:port or ray://host:port)")
    try:
        return host, int(port) if port else default
    except ValueError:
        raise HeadcountError(f"bad Ray address {address!r}: port {port!r} is not a number") from None


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast (one line) when nothing listens at a Ray address; ``auto`` is left to Ray.

    >>> check_reachable("127.0.0.1:1")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.errors.HeadcountError: cannot reach the Ray cluster at 127.0.0.1:1: ...
    """
    if address in ("auto", "local"):
        return
    host, port = _split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        raise HeadcountError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


#: GPUs a model-running job asks Ray for when the cluster has GPUs (``RayExecutor(gpus_per_job=...)``)
GPUS_PER_JOB = 1.0


def ray_gpus(job: Job, cluster: Mapping[str, float], *, gpus_per_job: float = GPUS_PER_JOB,
             device: str = "auto") -> float:
    """The GPUs a job asks Ray for: its ``resources.gpus`` when it names some; else, for a job
    that runs a model (``job.uses_model``) on a cluster with GPUs (``cluster["GPU"]``, from
    ``ray.cluster_resources()``) and a study device other than ``cpu``, ``gpus_per_job`` (at most
    the cluster's GPUs); else none (bookkeeping jobs: masks, statistics, reports).

    >>> from headcount.runner.jobs import Job
    >>> model, other = Job("m", "toy", "m:f", uses_model=True), Job("o", "toy", "m:f")
    >>> [ray_gpus(model, {"CPU": 8, "GPU": 2}), ray_gpus(other, {"CPU": 8, "GPU": 2}), ray_gpus(model, {"CPU": 8})]
    [1.0, 0.0, 0.0]
    >>> ray_gpus(model, {"GPU": 2}, gpus_per_job=0.5), ray_gpus(model, {"GPU": 2}, device="cpu")
    (0.5, 0.0)
    """
    if job.resources.gpus > 0:
        return float(job.resources.gpus)
    have = float(cluster.get("GPU", 0.0) or 0.0)
    if not job.uses_model or have <= 0 or str(device).lower() == "cpu":
        return 0.0
    return float(min(gpus_per_job, have))


class RayExecutor(Executor):
    """Run jobs as Ray tasks; the driver (this process) alone writes the store.

    Args:
        address: a running cluster (``host:port``, ``ray://host:port``, ``auto``); ``None`` starts
            a local Ray instance with ``num_cpus`` CPUs and shuts it down afterwards.
        num_cpus: CPUs of a local instance (default: this machine's).
        num_gpus: GPUs of a local instance (default: what Ray detects).
        ship_inputs: ``"auto"`` (ship upstream files through the object store when connected to a
            cluster, so workers without the run directory can read them), ``"always"``, ``"never"``.
        max_retries: Ray retries of a task whose worker died (not of a job that raised).
        gpus_per_job: GPUs a job that runs a model (``Job.uses_model``) asks for when the cluster
            has GPUs (:func:`ray_gpus`); fractional values share a GPU between jobs.

    >>> RayExecutor(address=None, num_cpus=2).name
    'ray'
    """

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None,
                 ship_inputs: str = "auto", max_retries: int = 1, gpus_per_job: float = GPUS_PER_JOB):
        if ship_inputs not in ("auto", "always", "never"):
            raise HeadcountError(f"ship_inputs must be auto, always or never (got {ship_inputs!r})")
        self.gpus_per_job = check_gpus_per_job(gpus_per_job)
        self.address = address or None
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.ship_inputs = ship_inputs
        self.max_retries = max_retries
        self._ray = None

    def check(self) -> None:
        """Fail early (before the run directory is touched): Ray missing, cluster unreachable."""
        try:
            import ray  # noqa: F401
        except ImportError:
            raise HeadcountError("the ray executor needs Ray: pip install 'headcount[ray]'") from None
        if self.address is not None:
            check_reachable(self.address)

    # -- connection ----------------------------------------------------------------------------
    def _connect(self, ray) -> bool:
        """Start or join Ray; returns whether this call initialised it (and must shut it down)."""
        if ray.is_initialized():
            return False
        if self.address is None:
            kwargs = dict(num_cpus=self.num_cpus or os.cpu_count() or 1, include_dashboard=False,
                          logging_level=logging.WARNING, log_to_driver=True)
            if self.num_gpus is not None:
                kwargs["num_gpus"] = self.num_gpus
            try:
                ray.init(**kwargs)
            except Exception as e:
                raise HeadcountError(f"could not start a local Ray instance: {_one_line(e)}") from None
            return True
        check_reachable(self.address)
        try:
            ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=True)
        except Exception as e:
            raise HeadcountError(f"cannot connect to the Ray cluster at {self.address}: {_one_line(e)}") from None
        return True

    def _device_spec(self) -> str:
        return (self.device or os.environ.get(ENV_DEVICE) or "auto").lower()

    def _job_env(self, job: Job, gpus: float | None = None) -> dict:
        """A job's ``HEADCOUNT_DEVICE`` under Ray: ``auto`` (its GPUs) when it was given GPUs
        (``gpus``, default its ``resources``: see :func:`ray_gpus`) and the study's device is not
        ``cpu``; else ``cpu``, so that no task uses a GPU Ray did not give it. With the study's
        ``precision:``, also ``HEADCOUNT_PRECISION``.

        >>> from headcount.runner.jobs import Job
        >>> RayExecutor()._job_env(Job("a", "toy", "m:f", resources={"gpus": 1}))
        {'HEADCOUNT_DEVICE': 'auto'}
        """
        gpus = job.resources.gpus if gpus is None else gpus
        gpu = gpus > 0 and self._device_spec() != "cpu"
        return {ENV_DEVICE: "auto" if gpu else "cpu", **self.precision_env()}

    def _options(self, job: Job, cluster: Mapping[str, float]) -> dict:
        cpus = job.resources.cpus
        gpus = ray_gpus(job, cluster, gpus_per_job=self.gpus_per_job, device=self._device_spec())
        have_cpu, have_gpu = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
        if self.address is None:  # a local instance cannot grow: fit or refuse now, never hang
            if gpus > have_gpu:
                raise HeadcountError(
                    f"job {job.name!r} needs {gpus:g} GPU(s); the local Ray instance has {have_gpu:g}"
                )
            cpus = min(cpus, have_cpu) if have_cpu else cpus
        return {"num_cpus": cpus, "num_gpus": gpus, "max_retries": self.max_retries}

    @contextmanager
    def session(self):
        """Start or join Ray for the duration of the block; shut down what this call started."""
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self.check()
        import ray

        if self._ray is not None:  # nested: already connected
            yield self
            return
        started_here = self._connect(ray)
        self._ray = ray
        try:
            yield self
        finally:
            self._ray = None
            if started_here:
                ray.shutdown()

    # -- run -------------------------------------------------------------------------------------
    def run(self, jobs: Sequence[Job], store: RunStore, reporter: Reporter, keep_going: bool = True) -> Outcome:
        if not any(not store.is_done(j.key) for j in jobs):
            return Outcome()
        with self.session():
            return self._run(self._ray, jobs, store, reporter, keep_going)

    def _run(self, ray, jobs, store: RunStore, reporter: Reporter, keep_going: bool) -> Outcome:
        out = Outcome()
        todo = [j for j in jobs if not store.is_done(j.key)]
        if not todo:
            return out
        cluster = ray.cluster_resources()
        options = {j.key: self._options(j, cluster) for j in todo}  # refuse impossible jobs up front
        ship = self.ship_inputs == "always" or (self.ship_inputs == "auto" and self.address is not None)
        remote = ray.remote(_ray_job)
        sink = ray.remote(num_cpus=0)(_ProgressSink).remote()
        sys_path = [os.path.abspath(p or os.getcwd()) for p in sys.path]
        shipped: dict[str, Any] = {}
        running: dict[Any, tuple[Job, float]] = {}
        bad: set[str] = set()
        by_key = {j.key: j for j in todo}

        def spec(alias: str, dep: Job) -> dict:
            r = store.load(dep.key, dep.name)
            files = None
            if ship:
                if dep.key not in shipped:
                    shipped[dep.key] = ray.put(pack_dir(r.dir))
                files = [shipped[dep.key]]  # nested: fetched by the worker only when it needs it
            return {"key": r.key, "kind": r.kind, "name": r.name, "params": r.params, "result": r.result,
                    "meta": r.meta, "dir": str(r.dir.resolve()), "files": files}

        try:
            while todo or running:
                for job in list(todo):
                    if _skip_if_blocked(job, todo, bad, out, reporter, keep_going):
                        continue
                    if all(store.is_done(d.key) for _, d in job.deps):
                        todo.remove(job)
                        inputs = {alias: spec(alias, d) for alias, d in job.deps}
                        ref = remote.options(**options[job.key]).remote(
                            job.fn, job.key, job.params, inputs, sys_path, sink,
                            self._job_env(job, options[job.key]["num_gpus"])
                        )
                        running[ref] = (job, time.time())
                        reporter.job_started(job, "queue")
                if not running:
                    if todo:  # pragma: no cover - only when inputs are neither done nor pending
                        raise HeadcountError(f"jobs {[j.name for j in todo]} wait for inputs that never run")
                    break
                ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                try:
                    for key, (completed, total, desc) in ray.get(sink.poll.remote()).items():
                        if key in by_key:
                            reporter.step(by_key[key], completed, total, desc)
                except Exception:  # pragma: no cover - progress is best effort
                    pass
                for ref in ready:
                    job, _ = running.pop(ref)
                    try:
                        res = ray.get(ref)
                    except Exception as e:  # the worker died (OOM, node lost) after its retries
                        res = {"ok": False, "message": _one_line(e), "traceback": str(e)}
                    if res["ok"]:
                        try:
                            store.commit_files(job, res["files"], res["result"],
                                               job_meta(res["started"], res["finished"], self.name, res["host"]))
                        except HeadcountError as e:
                            res = {"ok": False, "message": str(e), "traceback": str(e)}
                    if res["ok"]:
                        out.ran.append(job.name)
                        reporter.job_finished(job, res["finished"] - res["started"])
                    else:
                        bad.add(job.key)
                        out.failed[job.name] = res["message"]
                        store.record_failure(job, f"host: {res.get('host', '?')}\n\n{res['traceback']}")
                        reporter.job_finished(job, None, res["message"])
                    del ref, res
        except KeyboardInterrupt:
            out.interrupted = True
            for ref in running:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # pragma: no cover
                    pass
            raise
        return out


def make_executor(name: str | Executor = "local", address: str | None = None, **kwargs) -> Executor:
    """An executor by name (``local`` or ``ray``), or the given instance.

    >>> make_executor("local").name
    'local'
    """
    if isinstance(name, Executor):
        if kwargs:  # an executor made by the caller: its settings went to its constructor
            raise HeadcountError(f"{', '.join(sorted(kwargs))}: an executor instance was given; pass "
                                 "its settings to its constructor (RayExecutor(gpus_per_job=...))")
        return name
    if name == "local":
        if address:
            raise HeadcountError("--address is for the ray executor (add --executor ray)")
        if kwargs.get("gpus_per_job") is not None:
            raise HeadcountError("--gpus-per-job is for the ray executor (add --executor ray; the local executor "
                                 "runs one job per GPU)")
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(address=address, **kwargs)
    raise HeadcountError(f"unknown executor {name!r} (use local or ray)")


__all__ = ["Executor", "LocalExecutor", "RayExecutor", "Reporter", "Outcome", "call_job", "make_executor",
           "check_reachable", "ray_gpus", "GPUS_PER_JOB"]
