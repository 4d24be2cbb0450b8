"""The Ray executor: each job a Ray task with its resources (CPUs, GPUs), starting a local Ray
instance when no address is given. Tasks run in a scratch directory on their worker and return the
result dict and their files as bytes; the driver alone writes the store, so the results are the
same as with ``local`` and nothing depends on a shared filesystem. Inputs are read in place when
the worker sees the run directory (same machine or a shared filesystem) and otherwise fetched
from the Ray object store."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headcount.experiments.runner.execution import Executor, Outcome, _one_line, _skip_if_blocked, call_job
from headcount.experiments.runner.jobs import Job, JobResult
from headcount.experiments.runner.progress import Reporter
from headcount.experiments.runner.store import DONE, RESULT, RunStore, job_meta, pack_dir, unpack_files
from headcount.runtime.device import (
    ENV_DEVICE,
    check_gpus_per_job,
)
from headcount.runtime.errors import HeadcountError


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
    headcount.runtime.errors.HeadcountError: cannot reach the Ray cluster at 127.0.0.1:1: ...
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

    >>> from headcount.experiments.runner.jobs import Job
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

        >>> from headcount.experiments.runner.jobs import Job
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
