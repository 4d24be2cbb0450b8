"""The local executor: jobs one after another in this process, in plan (topological) order, each
writing straight into a temporary directory of the store. On a machine with several GPUs it keeps a
device pool ([`headcount.runtime.device.pool_devices`][headcount.runtime.device.pool_devices]): up to one job per GPU at once, each in its own
process that sees only its GPU (``CUDA_VISIBLE_DEVICES``)."""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_errors
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from headcount.experiments.runner.execution import (
    Executor,
    Outcome,
    _blocked_by,
    _device_meta,
    _one_line,
    _skip_if_blocked,
    call_job,
    job_environment,
)
from headcount.experiments.runner.jobfiles import job_guard
from headcount.experiments.runner.jobs import Job
from headcount.experiments.runner.progress import Reporter
from headcount.experiments.runner.store import RunStore, job_meta
from headcount.runtime.device import (
    ENV_DEVICE,
    cuda_count,
    pool_devices,
)
from headcount.runtime.device import job_environment as device_env
from headcount.runtime.errors import HeadcountError


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
        with job_guard(Path(workdir)):  # what the job's libraries list as they write (checkpoints)
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
            two processes on the CPU); default: [`headcount.runtime.device.pool_devices`][headcount.runtime.device.pool_devices] of
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
                with job_environment({ENV_DEVICE: device, **self.precision_env()}), job_guard(tmp):
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
                store.discard(tmp)  # a failed job's folder (a user's file in it stays)
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
                store.discard(tmp)

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
                proc.join(timeout=5)  # before its folder goes (a user's file in it stays)
                store.discard(tmp)
            raise
        return out


# ---------------------------------------------------------------------------------------------
# ray
# ---------------------------------------------------------------------------------------------
