"""The Ray executor: each job a Ray task with its resources (CPUs, GPUs), on a cluster
(``--address``, else ``$RAY_ADDRESS``) or on a local Ray instance it starts. Before the first job
is submitted, the cluster is checked ([`headcount.experiments.runner.ray_cluster`][headcount.experiments.runner.ray_cluster]): every job
fits on some node, and every node runs this headcount and sees the study's input files. Tasks run
in a scratch directory on their node, with their output (stdout, stderr) in a file, and return
the result dict, their files and that output as bytes; the driver alone writes the store (the
output as ``logs/<key>.log``), so the results are the same as with ``local``. Inputs from earlier
jobs are read in place when the node sees the run directory and otherwise fetched from the Ray
object store. Progress, the start of every attempt and the node that ran it reach the driver
through a small actor placed on the driver's own node."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from headcount.experiments.runner.execution import Executor, Outcome, _one_line, _skip_if_blocked
from headcount.experiments.runner.jobs import Job
from headcount.experiments.runner.progress import Reporter
from headcount.experiments.runner.ray_cluster import (
    Node,
    alive_nodes,
    check_nodes,
    check_reachable,
    check_resources,
    connect,
    describe,
    resolve_address,
)
from headcount.experiments.runner.ray_task import _Collector, _label, _ray_job
from headcount.experiments.runner.store import RunStore, job_meta, pack_dir
from headcount.runtime.bounds import Bound
from headcount.runtime.device import ENV_DEVICE, pool_devices
from headcount.runtime.errors import HeadcountError

#: seconds a submitted job may wait for a place while none of the study's jobs runs (then it is reported)
PLACEMENT_TIMEOUT = 600.0
#: GPUs a model-running job asks Ray for when the cluster has GPUs (``RayExecutor(gpus_per_job=...)``)
DEFAULT_GPUS_PER_JOB = 1.0
#: what ``gpus_per_job`` may be: more than 0 (0.5: two such jobs share a GPU), no more than a machine has
#: (Ray would wait for ever)
GPUS_PER_JOB = Bound(0, 256, low_open=True)


def check_gpus_per_job(value, name: str = "gpus_per_job") -> float:
    """GPUs a job that runs a model asks the Ray executor for, in [`GPUS_PER_JOB`][headcount.experiments.runner.ray_executor.GPUS_PER_JOB]: the one rule
    for ``--gpus-per-job`` and ``RayExecutor(gpus_per_job=...)``.

    >>> check_gpus_per_job(0.5)
    0.5
    """
    return float(GPUS_PER_JOB.check(value, name))


def ray_gpus(job: Job, cluster: Mapping[str, float], *, gpus_per_job: float = DEFAULT_GPUS_PER_JOB,
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
        address: a running cluster (``host:port``, ``ray://host:port``, ``auto``); ``None``:
            ``$RAY_ADDRESS`` when set (Ray's convention), else a private local Ray instance with
            ``num_cpus`` CPUs, shut down afterwards.
        num_cpus: CPUs of a local instance (default: this machine's).
        num_gpus: GPUs of a local instance (default: what Ray detects).
        ship_inputs: ``"auto"`` (ship upstream files through the object store when connected to a
            cluster, so workers without the run directory can read them), ``"always"``, ``"never"``.
        max_retries: Ray retries of a task whose worker or node died (not of a job that raised).
        gpus_per_job: GPUs a job that runs a model (``Job.uses_model``) asks for when the cluster
            has GPUs ([`ray_gpus`][headcount.experiments.runner.ray_executor.ray_gpus]; default 1); fractional values share a GPU between jobs.
            Given, it is refused on a cluster without GPUs.
        placement_timeout: seconds a submitted job may wait for a place while none of the study's
            jobs runs; then it is reported as failed (never waited on for ever).

    >>> RayExecutor(address=None, num_cpus=2).name
    'ray'
    """

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None,
                 ship_inputs: str = "auto", max_retries: int = 1, gpus_per_job: float | None = None,
                 placement_timeout: float = PLACEMENT_TIMEOUT):
        if ship_inputs not in ("auto", "always", "never"):
            raise HeadcountError(f"ship_inputs must be auto, always or never (got {ship_inputs!r})")
        self.gpus_per_job = check_gpus_per_job(DEFAULT_GPUS_PER_JOB if gpus_per_job is None else gpus_per_job)
        self.gpus_per_job_given = gpus_per_job is not None
        if isinstance(placement_timeout, bool) or not isinstance(placement_timeout, (int, float)) \
                or not placement_timeout > 0:
            raise HeadcountError(f"placement_timeout must be a number of seconds > 0 (got {placement_timeout!r})")
        self.placement_timeout = float(placement_timeout)
        self.address = address or None
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.ship_inputs = ship_inputs
        self.max_retries = max_retries
        self._ray = None
        self._local = True  # a private local instance (it cannot grow; every node is this machine)
        self._prepared: dict[str, dict] = {}
        self.driver_node: str | None = None  # the node this process is attached to
        self.collector_node: str | None = None  # where the progress collector ran (the driver's node)

    @property
    def target(self) -> str | None:
        """The cluster this executor joins: ``address``, else ``$RAY_ADDRESS``; None: a local instance."""
        return resolve_address(self.address)

    def set_device(self, spec: str | None) -> None:
        """The study's device spec, checked for its form only: the GPUs are the cluster's, not this
        machine's (a cluster without GPUs refuses ``cuda`` when it is joined)."""
        pool_devices(spec, n_cuda=1 << 16)
        self.device = spec

    def check(self) -> None:
        """Fail early (before the run directory is touched): Ray missing, cluster unreachable."""
        try:
            import ray  # noqa: F401
        except ImportError:
            raise HeadcountError("the ray executor needs Ray: pip install 'headcount[ray]'") from None
        if self.target is not None:
            check_reachable(self.target)

    def _device_spec(self) -> str:
        return (self.device or os.environ.get(ENV_DEVICE) or "auto").lower()

    def _job_env(self, job: Job, gpus: float | None = None) -> dict:
        """A job's ``HEADCOUNT_DEVICE`` under Ray: ``auto`` (its GPUs) when it was given GPUs
        (``gpus``, default its ``resources``: see [`ray_gpus`][headcount.experiments.runner.ray_executor.ray_gpus]) and the study's device is not
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
        if self._local:  # a local instance cannot grow: fit or refuse now, never hang
            if gpus > have_gpu:
                raise HeadcountError(
                    f"job {job.name!r} needs {gpus:g} GPU(s); the local Ray instance has {have_gpu:g}"
                )
            cpus = min(cpus, have_cpu) if have_cpu else cpus
        return {"num_cpus": cpus, "num_gpus": gpus, "max_retries": self.max_retries}

    def _check_gpus(self, nodes: Sequence[Node]) -> None:
        """Refuse GPU settings the cluster cannot honour (jobs would silently run on the CPU, or wait for ever)."""
        most = max((n.gpus for n in nodes), default=0.0)
        where = "the local Ray instance" if self._local else "the Ray cluster"
        if self.gpus_per_job_given:
            if self._device_spec() == "cpu":
                raise HeadcountError(f"--gpus-per-job {self.gpus_per_job:g}: the study's device is cpu")
            if most <= 0:
                raise HeadcountError(f"--gpus-per-job {self.gpus_per_job:g}: {where} has no GPU ({describe(nodes)})")
            if self.gpus_per_job > most + 1e-9:
                raise HeadcountError(f"--gpus-per-job {self.gpus_per_job:g}: no node of {where} has that many "
                                     f"GPUs ({describe(nodes)})")
        if self._device_spec().startswith("cuda") and most <= 0:
            raise HeadcountError(f"the study's device is {self._device_spec()}, but {where} has no GPU "
                                 f"({describe(nodes)}); use --device auto or cpu")

    def prepare(self, jobs: Sequence[Job]) -> None:
        """Check the cluster before anything is written or submitted: the GPU settings, a node
        for every job, and (on a cluster) every node that can run jobs runs this headcount and
        sees the study's input files. Refusals are one [`HeadcountError`][headcount.runtime.errors.HeadcountError] line."""
        ray = self._ray
        todo = list(jobs)
        if ray is None or not todo:
            return
        nodes = alive_nodes(ray)
        self._check_gpus(nodes)
        cluster = ray.cluster_resources()
        options = {j.key: self._options(j, cluster) for j in todo}
        requests = {j.name: (options[j.key]["num_cpus"], options[j.key]["num_gpus"]) for j in todo}
        check_resources(requests, nodes)
        if not self._local:
            workers = [n for n in nodes if any(n.fits(c, g) for c, g in requests.values())]
            self.say(f"checking {len(workers)} node{'' if len(workers) == 1 else 's'} (headcount, Python, the job "
                     "functions, the study's inputs)...")
            check_nodes(ray, workers, [j.params for j in todo], [j.fn for j in todo], self._sys_path())
        self._prepared.update(options)

    @staticmethod
    def _sys_path() -> list[str]:
        return [os.path.abspath(p or os.getcwd()) for p in sys.path]

    @contextmanager
    def session(self, jobs: Sequence[Job] = ()):
        """Start or join Ray for the duration of the block (shutting down what this call started),
        and check the cluster for ``jobs`` (``prepare``) before the block runs."""
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self.check()
        import ray

        if self._ray is not None:  # nested: already connected
            self.prepare(jobs)
            yield self
            return
        started_here = not ray.is_initialized()
        if started_here:
            self.say(f"connecting to Ray at {self.target}..." if self.target is not None else
                     f"starting a local Ray instance ({self.num_cpus or os.cpu_count() or 1} CPUs)...")
            connect(ray, self.target, self.num_cpus, self.num_gpus)
            self._local = self.target is None
        else:  # the caller connected: a cluster unless it is one node on this machine
            self._local = len(alive_nodes(ray)) == 1 and self.target is None
        self._ray = ray
        try:
            self.prepare(jobs)
            yield self
        finally:
            self._ray = None
            self._prepared = {}
            if started_here:
                ray.shutdown()

    # -- run -------------------------------------------------------------------------------------
    def run(self, jobs: Sequence[Job], store: RunStore, reporter: Reporter, keep_going: bool = True) -> Outcome:
        if not any(not store.is_done(j.key) for j in jobs):
            return Outcome()
        with self.session():
            return _Loop(self, store, reporter, keep_going).run([j for j in jobs if not store.is_done(j.key)])


class _Loop:
    """One run of the Ray executor: submit the jobs whose inputs are done, follow progress, the
    nodes (one lost: say which jobs Ray runs again, and where), jobs that find no place, and
    commit each result as it comes back."""

    def __init__(self, exe: RayExecutor, store: RunStore, reporter: Reporter, keep_going: bool):
        self.exe, self.ray, self.store, self.reporter, self.keep_going = exe, exe._ray, store, reporter, keep_going
        self.out = Outcome()
        self.shipped: dict[str, Any] = {}
        self.where: dict[str, dict] = {}  # key -> the node of its latest attempt
        self.attempts: dict[str, list[dict]] = {}
        self.waiting: dict[str, float] = {}  # key -> since when it waits for a place
        self.last_start = time.monotonic()
        self.per_node: Counter = Counter()

    def spec(self, dep: Job, ship: bool) -> dict:
        r = self.store.load(dep.key, dep.name)
        files = None
        if ship:
            if dep.key not in self.shipped:
                self.shipped[dep.key] = self.ray.put(pack_dir(r.dir))
            files = [self.shipped[dep.key]]  # nested: fetched by the worker only when it needs it
        return {"key": r.key, "kind": r.kind, "name": r.name, "params": r.params, "result": r.result,
                "meta": r.meta, "dir": str(r.dir.resolve()), "files": files}

    def run(self, todo: list[Job]) -> Outcome:
        ray, exe, store, reporter, out = self.ray, self.exe, self.store, self.reporter, self.out
        if not todo:
            return out
        missing = [j for j in todo if j.key not in exe._prepared]
        if missing:
            exe.prepare(missing)
        options = {j.key: exe._prepared[j.key] for j in todo}
        ship = exe.ship_inputs == "always" or (exe.ship_inputs == "auto" and not exe._local)
        remote = ray.remote(_ray_job)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()  # the collector lives and dies with the driver's node
        sink = ray.remote(_Collector).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
        exe.driver_node, exe.collector_node = here, ray.get(sink.node.remote())
        sys_path = exe._sys_path()
        nodes = {n.node_id: n for n in alive_nodes(ray)}
        next_nodes_check = time.monotonic() + 2.0
        running: dict[Any, Job] = {}
        bad: set[str] = set()
        by_key = {j.key: j for j in todo}
        try:
            while todo or running:
                for job in list(todo):
                    if _skip_if_blocked(job, todo, bad, out, reporter, self.keep_going):
                        continue
                    if all(store.is_done(d.key) for _, d in job.deps):
                        todo.remove(job)
                        inputs = {alias: self.spec(d, ship) for alias, d in job.deps}
                        expected = {w: d for w, d in _fingerprint(job.params).items()} or None
                        ref = remote.options(**options[job.key]).remote(
                            job.fn, job.key, job.params, inputs, sys_path, sink,
                            exe._job_env(job, options[job.key]["num_gpus"]), expected)
                        running[ref] = job
                        self.waiting[job.key] = time.monotonic()
                if not running:
                    if todo:  # pragma: no cover - only when inputs are neither done nor pending
                        raise HeadcountError(f"jobs {[j.name for j in todo]} wait for inputs that never run")
                    break
                ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                self.follow(sink, by_key, nodes)
                if time.monotonic() >= next_nodes_check:
                    nodes = self.check_nodes(nodes, running)
                    next_nodes_check = time.monotonic() + 2.0
                for ref in ready:
                    self.finish(running.pop(ref), ref, bad)
                self.unplaceable(running, options, nodes, bad)
        except KeyboardInterrupt:
            out.interrupted = True
            for ref in running:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # pragma: no cover
                    pass
            raise
        if self.per_node:
            reporter.print("[dim]jobs per node: " + ", ".join(f"{label} {n}" for label, n in sorted(
                self.per_node.items())) + "[/dim]")
        return out

    def follow(self, sink, by_key: dict, nodes: dict) -> None:
        """Starts (with their nodes) and progress reported by the tasks."""
        try:
            events, state = self.ray.get(sink.poll.remote())
        except Exception:  # pragma: no cover - progress is best effort
            return
        for key, where in events:
            job = by_key.get(key)
            if job is None:
                continue
            self.waiting.pop(key, None)
            self.last_start = time.monotonic()
            before = self.attempts.setdefault(key, [])
            before.append(where)
            self.where[key] = where
            label = _label(where)
            if len(before) > 1:
                self.reporter.job_started(job, "retry", f"{label} (attempt {len(before)}; the last on "
                                          f"{_label(before[-2])})")
            else:
                self.reporter.job_started(job, "start", label)
        for key, (completed, total, desc) in state.items():
            if key in by_key:
                self.reporter.step(by_key[key], completed, total, desc)

    def check_nodes(self, nodes: dict, running: dict) -> dict:
        """Say when a node leaves (and which jobs ran there) or joins."""
        try:
            now = {n.node_id: n for n in alive_nodes(self.ray)}
        except Exception:  # pragma: no cover - the head is busy: next time
            return nodes
        for node_id in set(nodes) - set(now):
            node = nodes[node_id]
            there = [j for j in running.values() if (self.where.get(j.key) or {}).get("node_id") == node_id]
            for j in there:
                self.waiting[j.key] = time.monotonic()  # waits for a place again
                self.where.pop(j.key, None)
            jobs = ", ".join(j.name for j in there) or "no job of this study"
            self.reporter.print(f"[red]node lost[/red] {node.label}: {jobs} ran there; Ray runs such jobs again on "
                                f"another node (up to {self.exe.max_retries} time(s))")
        for node_id in set(now) - set(nodes):
            self.reporter.print(f"[dim]node joined: {now[node_id].label}[/dim]")
        return now

    def finish(self, job: Job, ref, bad: set) -> None:
        store, out, reporter = self.store, self.out, self.reporter
        self.waiting.pop(job.key, None)
        self.last_start = time.monotonic()
        try:
            res = self.ray.get(ref)
        except Exception as e:  # the worker or its node died, after its retries
            where = self.where.get(job.key) or (self.attempts.get(job.key) or [{}])[-1]
            on = f" on {_label(where)}" if where else ""
            res = {"ok": False, "message": f"its task died{on} after {self.exe.max_retries} retr"
                   f"{'y' if self.exe.max_retries == 1 else 'ies'}: {_one_line(e)}", "traceback": str(e), "where": where}
        where = res.get("where") or {}
        log = res.get("log") or b""
        if log:
            store.write_log(f"logs/{job.key}.log", log)  # listed; a user's file of that name is never replaced
        if res["ok"]:
            meta = job_meta(res["started"], res["finished"], self.exe.name, where.get("host"))
            meta.update(node_id=where.get("node_id"), node_address=where.get("node_address"))
            tries = self.attempts.get(job.key, [])
            if len(tries) > 1:
                meta["attempts"] = [_label(w) for w in tries]
            try:
                store.commit_files(job, res["files"], res["result"], meta)
            except HeadcountError as e:
                res = {"ok": False, "message": str(e), "traceback": str(e), "where": where}
        if res["ok"]:
            out.ran.append(job.name)
            self.per_node[_label(where)] += 1
            reporter.job_finished(job, res["finished"] - res["started"])
        else:
            bad.add(job.key)
            out.failed[job.name] = res["message"]
            output = f"output: logs/{job.key}.log\n" if log else ""
            store.record_failure(job, f"node: {_label(where) if where else '?'}\nhost: {where.get('host', '?')}\n"
                                 f"{output}\n{res['traceback']}")
            reporter.job_finished(job, None, res["message"])

    def unplaceable(self, running: dict, options: dict, nodes: dict, bad: set) -> None:
        """Report (and cancel) jobs that waited ``placement_timeout`` seconds for a place while
        none of the study's jobs ran: the cluster has no room for them (a node left, or other
        work holds what they ask for)."""
        limit = self.exe.placement_timeout
        now = time.monotonic()
        busy = any(j.key not in self.waiting for j in running.values())
        if busy or now - self.last_start < limit:
            return
        for ref, job in list(running.items()):
            since = self.waiting.get(job.key)
            if since is None or now - since < limit:
                continue
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # pragma: no cover
                pass
            del running[ref]
            self.waiting.pop(job.key, None)
            opts = options[job.key]
            message = (f"no node of the Ray cluster took it within {limit:g} s (it asks for {opts['num_cpus']:g} CPUs "
                       f"and {opts['num_gpus']:g} GPUs; {describe(list(nodes.values()))})")
            bad.add(job.key)
            self.out.failed[job.name] = message
            self.store.record_failure(job, message + "\n")
            self.reporter.job_finished(job, None, message)


def _fingerprint(params) -> dict:
    from headcount.data.fingerprint import params_fingerprint

    return params_fingerprint(params) or {}
