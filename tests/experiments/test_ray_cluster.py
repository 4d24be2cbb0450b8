"""The Ray executor as a user of a real cluster meets it: RAY_ADDRESS, token authentication in the
connection error, the checks before anything is written (a node for every job, GPU settings,
every node sees the study's inputs), which node ran what, lost nodes and jobs that find no place,
jobs' output in their log files. The cluster tests use a two-node cluster on this machine
(``ray.cluster_utils.Cluster``, on this machine's own address) whose second node cannot see one folder: its processes load a
``sitecustomize`` that makes ``os.stat``, ``os.open`` and ``open`` fail with ENOENT under that
folder (a simulation of a machine without the study folder: the same host, the same paths
elsewhere)."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import toy_study  # noqa: F401  (registers the toy study type)
from cli_helpers import run_cli

from headcount.experiments import run_study as api_run_study
from headcount.experiments.runner import Job, RayExecutor, StudyConfig, register_study
from headcount.experiments.runner.ray_cluster import Node, check_resources, connect_error, resolve_address
from headcount.experiments.runner.ray_executor import _Loop
from headcount.experiments.runner.ray_task import _ray_job
from headcount.experiments.runner.study import run_study
from headcount.runtime.errors import HeadcountError

TOY = "study: toy_study:toy\nvalues: [1, 2, 3]\nsteps: 3\n"


# --- a study whose jobs read a file the config names ------------------------------------------------
class ReaderConfig(StudyConfig):
    data: str
    cpus: float = 1.0


def read_data(params, inputs, workdir, progress) -> dict:
    print("a load report the terminal must not show")  # goes to logs/<key>.log
    return {"text": Path(params["data"]).read_text(), "i": params["i"]}


def _expand(config: ReaderConfig) -> list[Job]:
    return [Job(f"read-{i}", "reader", "test_ray_cluster:read_data", {"data": config.data, "i": i},
                resources={"cpus": config.cpus}) for i in range(2)]


register_study("reader", ReaderConfig, _expand, description="reads a file named by the config")


def terminal():
    from rich.console import Console

    buf = io.StringIO()
    return buf, Console(file=buf, force_terminal=True, color_system=None, width=200)


# --- without a cluster ------------------------------------------------------------------------------
def test_ray_address_is_honoured_like_ray_does(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert RayExecutor().target is None  # a private local instance
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert RayExecutor().target == "10.0.0.1:6379" and RayExecutor(address="auto").target == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert resolve_address(None) is None


@pytest.mark.parametrize("mode, captured, why", [
    (None, "gcs_client.cc:210: Failed to get cluster ID from GCS server: Unauthenticated: RPC error: "
           "InvalidAuthToken: Authentication token is missing or incorrect", "RAY_AUTH_MODE is unset here"),
    ("token", "Unauthenticated: RPC error: InvalidAuthToken", "it refused this machine's token"),
    ("token", "", "this machine has no token"),
])
def test_connection_errors_name_token_authentication(monkeypatch, mode, captured, why):
    """Ray 2.60's driver without the cluster's token retries for 20 s and raises a ConnectionError
    that never says why; the retries it printed (held back) name the cause."""
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    exc = (ConnectionError("Failed to connect to Ray cluster at h:6379") if captured else
           RuntimeError("Token authentication is enabled but no authentication token was found"))
    text = str(connect_error("h:6379", exc, captured))
    assert "\n" not in text and "token authentication" in text and why in text and "RAY_AUTH_MODE=token" in text
    other = str(connect_error("h:6379", ConnectionError("Failed to connect to Ray cluster at h:6379"), "timeout"))
    assert "authentication" not in other and other.startswith("cannot connect to the Ray cluster at h:6379")


def test_impossible_requests_are_refused_with_the_nodes():
    cpu_only = [Node("a" * 56, "10.0.0.1", cpus=4), Node("b" * 56, "10.0.0.2", cpus=2)]
    check_resources({"x": (4, 0)}, cpu_only)
    with pytest.raises(HeadcountError, match=r"job 'y' asks for 8 CPUs and 0 GPUs; no node .*10.0.0.2 \(bbbbbbbb\) 2 CPUs"):
        check_resources({"y": (8, 0)}, cpu_only)
    with pytest.raises(HeadcountError, match="asks for 1 CPUs and 1 GPUs"):
        check_resources({"z": (1, 1)}, cpu_only)
    exe = RayExecutor(gpus_per_job=1)
    exe._local = False
    with pytest.raises(HeadcountError, match=r"--gpus-per-job 1: the Ray cluster has no GPU \(nodes: 10.0.0.1"):
        exe._check_gpus(cpu_only)
    two = RayExecutor(gpus_per_job=2)
    two._local = False
    with pytest.raises(HeadcountError, match="no node of the Ray cluster has that many GPUs"):
        two._check_gpus([Node("c" * 56, "10.0.0.3", cpus=4, gpus=1)])
    cuda = RayExecutor()
    cuda.set_device("cuda")  # this machine has no GPU: the cluster's count, checked when joined
    with pytest.raises(HeadcountError, match="the study's device is cuda, but the local Ray instance has no GPU"):
        cuda._check_gpus(cpu_only)
    RayExecutor()._check_gpus(cpu_only)  # nothing asked: model jobs run on the CPU
    with pytest.raises(HeadcountError, match="placement_timeout"):
        RayExecutor(placement_timeout=0)


class _FakeRay:
    """The ray module as the driver's session meets it: two alive nodes, nothing started."""

    def __init__(self):
        self.nodes = _Fake([Node("a" * 56, "10.0.0.1", cpus=2), Node("b" * 56, "10.0.0.2", cpus=2)]).nodes

    def is_initialized(self):
        return False

    def cluster_resources(self):
        return {"CPU": 4.0}

    def shutdown(self):
        pass


@pytest.mark.parametrize("quiet", [False, True])
def test_the_driver_says_it_connects_and_checks_the_nodes_before_it_waits(quiet, tmp_path, monkeypatch, capsys):
    """Issue 43: the driver printed nothing for 71 s while it connected and checked the nodes. Each
    wait is announced first: what stderr held when the connection and the node check began."""
    import headcount.experiments.runner.ray_executor as rx

    monkeypatch.setitem(sys.modules, "ray", _FakeRay())
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    seen = []
    monkeypatch.setattr(rx, "check_reachable", lambda address: None)
    monkeypatch.setattr(rx, "connect", lambda ray, address, *a: seen.append(("connect", capsys.readouterr().err)))

    def check_nodes(ray, nodes, *args):
        seen.append((f"check {len(nodes)}", capsys.readouterr().err))
        raise HeadcountError(f"node {nodes[1].label} does not see the study's input x (missing or unreadable there)")

    monkeypatch.setattr(rx, "check_nodes", check_nodes)
    config = tmp_path / "toy.yaml"
    config.write_text(TOY)
    code, _, err = run_cli(capsys, "study", config, "--out", tmp_path / "run", "--executor", "ray",
                           "--address", "10.0.0.9:6379", *(["-q"] if quiet else []))
    assert code == 2 and err.strip() == "error: node 10.0.0.2 (bbbbbbbb) does not see the study's input x (missing or " \
        "unreadable there)", err
    if quiet:
        assert seen == [("connect", ""), ("check 2", "")]
    else:
        assert seen == [("connect", "connecting to Ray at 10.0.0.9:6379...\n"),
                        ("check 2", "checking 2 nodes (headcount, Python, the job functions, the study's inputs)...\n")]
    assert not (tmp_path / "run").exists()


def noisy(params, inputs, workdir, progress) -> dict:
    print("Some weights of the model were not initialized")
    os.write(2, b"100%|##########| 3/3\r\n")
    return {"ok": 1}


def test_a_job_keeps_its_output_and_names_an_input_its_node_does_not_see(tmp_path, capfd):
    sys_path = [str(Path(__file__).parent)]
    res = _ray_job("test_ray_cluster:noisy", "k", {}, {}, sys_path, None)
    assert res["ok"] and b"were not initialized" in res["log"] and b"3/3" in res["log"]
    assert "initialized" not in capfd.readouterr().out  # not on the terminal
    data = tmp_path / "in.txt"
    data.write_text("x")
    from headcount.data.fingerprint import params_fingerprint

    expected = params_fingerprint({"data": str(data), "i": 0})
    data.write_text("other content")  # the node sees another file at the same path
    res = _ray_job("test_ray_cluster:read_data", "k", {"data": str(data), "i": 0}, {}, sys_path, None,
                   expected=expected)
    assert not res["ok"] and f"does not see the input {data} (data): its content differs here" in res["message"]
    data.unlink()
    res = _ray_job("test_ray_cluster:read_data", "k", {"data": str(data), "i": 0}, {}, sys_path, None,
                   expected=expected)
    assert "missing or unreadable here" in res["message"]


def reads_its_input(params, inputs, workdir, progress) -> dict:
    """A job whose input job wrote no files (its result only), as the transfer study's masks are."""
    up = inputs["up"]
    return {"n": up.result["n"] + 1, "saved": json.loads((up.dir / "result.json").read_text())["n"],
            "files": sorted(p.name for p in up.dir.iterdir())}


def _finished_without_files(run: Path) -> tuple[Path, dict]:
    """A finished job's folder with its result and nothing else, and its input spec as the driver ships it."""
    from headcount.experiments.runner.store import DONE, RESULT

    up = run / "jobs" / "up-1"
    up.mkdir(parents=True)
    (up / RESULT).write_text('{"n": 1}\n')
    (up / DONE).write_text("up-1\n")
    return up, {"key": "up-1", "kind": "toy", "name": "up", "params": {"n": 1}, "result": {"n": 1}, "meta": {},
                "dir": str(up), "files": ["its files"]}


def test_an_input_that_left_only_its_result_reaches_a_node_without_the_run_directory(tmp_path, monkeypatch):
    """Issue 43: a job whose input job left only result.json failed with FileNotFoundError on a node
    that cannot see the run directory (4 of 37 transfer jobs on a 3-node cluster): the shipped
    files were {} and the inputs folder was made only for a file. Here the driver packs the input,
    the run directory is then gone (the node does not have it), and the task body runs in another
    scratch root with the shipped bytes from a stand-in for Ray's object store."""
    import shutil
    import tempfile
    import types

    from headcount.experiments.runner.store import pack_dir

    up, spec = _finished_without_files(tmp_path / "driver" / "run")
    shipped = {"its files": pack_dir(up)}
    assert shipped["its files"] == {}  # nothing but the result: nothing to ship
    shutil.rmtree(tmp_path / "driver")
    node = tmp_path / "node-scratch"
    node.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(node))
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(get=shipped.__getitem__, is_initialized=lambda: False))
    res = _ray_job("test_ray_cluster:reads_its_input", "down-1", {}, {"up": spec}, [str(Path(__file__).parent)], None)
    assert res["ok"], res.get("message")
    assert res["result"] == {"n": 2, "saved": 1, "files": ["result.json"]}
    assert list(node.iterdir()) == []  # the task's scratch folder (under the node's root) is gone


class _Fake:
    """Enough of ray, the store and the reporter for the executor's loop."""

    def __init__(self, nodes):
        self._nodes, self.cancelled, self.lines, self.failures = nodes, [], [], []

    def nodes(self):
        return [{"NodeID": n.node_id, "Alive": True, "NodeManagerAddress": n.address,
                 "Resources": {"CPU": n.cpus}} for n in self._nodes]

    def cancel(self, ref, force=False):
        self.cancelled.append(ref)

    def print(self, text):
        self.lines.append(text)

    def job_finished(self, job, seconds, error=None):
        self.lines.append(f"FAILED {job.name}: {error}")

    def record_failure(self, job, text):
        self.failures.append(text)


def test_lost_nodes_and_jobs_without_a_place_are_reported():
    a, b = Node("a" * 56, "10.0.0.1", cpus=2), Node("b" * 56, "10.0.0.2", cpus=2)
    fake = _Fake([a])
    exe = RayExecutor(placement_timeout=5)
    exe._ray = fake
    loop = _Loop(exe, fake, fake, True)
    job, other = Job("make-1", "toy", "toy_study:make", {"x": 1}), Job("make-2", "toy", "toy_study:make", {"x": 2})
    loop.where[job.key] = {"node_id": b.node_id, "node_address": b.address}
    nodes = loop.check_nodes({a.node_id: a, b.node_id: b}, {"ref1": job, "ref2": other})
    assert set(nodes) == {a.node_id}
    assert any("node lost" in line and "10.0.0.2 (bbbbbbbb): make-1 ran there" in line for line in fake.lines)
    assert job.key in loop.waiting  # waits for a place again
    # nothing of the study runs, and make-1 has waited longer than the timeout: reported, cancelled
    loop.waiting[job.key] = loop.last_start = time.monotonic() - 10
    running = {"ref1": job}
    loop.unplaceable(running, {job.key: {"num_cpus": 4, "num_gpus": 0}}, nodes, set())
    assert not running and fake.cancelled == ["ref1"] and "make-1" in loop.out.failed
    assert "no node of the Ray cluster took it within 5 s (it asks for 4 CPUs" in loop.out.failed["make-1"]


# --- on a two-node cluster on this machine -------------------------------------------------------------
HIDE = '''
import builtins, os
_prefix = os.environ.get("HC_HIDE")
if _prefix:
    def _hide(fn):
        def wrapped(path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(_prefix):
                raise FileNotFoundError(2, "No such file or directory (hidden from this node)", os.fspath(path))
            return fn(path, *args, **kwargs)
        return wrapped
    os.stat, os.lstat, os.open, builtins.open = _hide(os.stat), _hide(os.lstat), _hide(os.open), _hide(builtins.open)
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head (1 CPU) and a worker node (1 CPU) that cannot see ``hidden/``, both on this machine."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    tmp = tmp_path_factory.mktemp("cluster")
    site, hidden = tmp / "site", tmp / "hidden"
    site.mkdir()
    hidden.mkdir()
    (site / "sitecustomize.py").write_text(HIDE)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    path = os.pathsep.join([str(site), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    worker = c.add_node(num_cpus=1, env_vars={"PYTHONPATH": path, "HC_HIDE": str(hidden)})
    c.wait_for_nodes()
    try:
        yield c, hidden, worker
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


@pytest.mark.slow
def test_a_node_that_cannot_see_an_input_is_named_before_anything_is_written(cluster, tmp_path, capsys):
    c, hidden, worker = cluster
    (hidden / "data.txt").write_text("seen by the head only")
    config = tmp_path / "reader.yaml"
    config.write_text(f"study: test_ray_cluster:reader\ndata: {hidden / 'data.txt'}\n")
    run = tmp_path / "run"
    code, out, err = run_cli(capsys, "study", config, "--out", run, "--executor", "ray", "--address", c.address, "-q")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"node {worker.node_ip_address} ({worker.node_id[:8]}) does not see the study's input {hidden / 'data.txt'}" in err
    assert not run.exists()  # refused before the run directory was made


@pytest.mark.slow
def test_the_worker_node_gets_an_input_that_left_no_files_through_the_object_store(cluster, tmp_path):
    """The same on a real Ray node that cannot see the run directory (``hidden/``): the input's
    (empty) files come from the object store, its result from the spec."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from headcount.experiments.runner.store import pack_dir

    c, hidden, worker = cluster
    up, spec = _finished_without_files(hidden / tmp_path.name / "run")
    ray.init(address=c.address, logging_level="ERROR")
    try:
        spec["files"] = [ray.put(pack_dir(up))]  # nested, as the executor ships it: fetched on the node
        task = ray.remote(_ray_job).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            worker.node_id, soft=False))
        res = ray.get(task.remote("test_ray_cluster:reads_its_input", "down-1", {}, {"up": spec},
                                  RayExecutor._sys_path(), None))  # the driver's sys.path, as the executor sends it
    finally:
        ray.shutdown()
    assert res["where"]["node_id"] == worker.node_id
    assert res["ok"], res.get("message")
    assert res["result"] == {"n": 2, "saved": 1, "files": ["result.json"]}


@pytest.mark.slow
def test_a_study_runs_on_the_cluster_of_ray_address_and_records_the_nodes(cluster, tmp_path, monkeypatch, capsys):
    c, hidden, worker = cluster
    monkeypatch.setenv("RAY_ADDRESS", c.address)
    config = tmp_path / "toy.yaml"
    config.write_text(TOY)
    # impossible requests first: refused with one line, nothing written
    data = tmp_path / "data.txt"
    data.write_text("everyone sees this")
    greedy = tmp_path / "greedy.yaml"
    greedy.write_text(f"study: test_ray_cluster:reader\ndata: {data}\ncpus: 4\n")
    for argv, message in (([config, "--gpus-per-job", "1"], "--gpus-per-job 1: the Ray cluster has no GPU (nodes: "),
                          ([greedy], "job 'read-0' asks for 4 CPUs and 0 GPUs; no node of the Ray cluster has that")):
        code, _, err = run_cli(capsys, "study", *argv, "--out", tmp_path / "refused", "--executor", "ray", "-q")
        assert code == 2 and err.strip().startswith(f"error: {message}"), err
        assert not (tmp_path / "refused").exists()

    local = run_study(config, tmp_path / "local", quiet=True)
    exe = RayExecutor()
    buf, console = terminal()
    summary = api_run_study(config, tmp_path / "run", executor=exe, console=console)  # with the report
    assert len(summary.ran) == len(local.ran) == 5
    for p in (tmp_path / "local" / "jobs").rglob("*"):  # same files, same bytes as the local run
        if p.is_file() and p.name != "meta.json":
            assert (tmp_path / "run" / p.relative_to(tmp_path / "local")).read_bytes() == p.read_bytes()
    import ray

    ray.init(address=c.address, logging_level="ERROR")
    try:
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()
    metas = [json.loads(p.read_text()) for p in (tmp_path / "run" / "jobs").glob("*/meta.json")]
    assert {m["node_id"] for m in metas} <= alive and {m["node_address"] for m in metas} == {worker.node_ip_address}
    assert exe.collector_node == exe.driver_node and exe.driver_node in alive  # progress stays on the driver's node
    text = buf.getvalue()
    assert f"jobs per node: {worker.node_ip_address} (" in text and ": drawing" in text
    # said before each wait: joining the cluster, then checking its two nodes, then the jobs
    assert text.index(f"connecting to Ray at {c.address}...") < text.index("checking 2 nodes (") \
        < text.index("jobs per node")
    assert f" on {worker.node_ip_address} (" in text
    jobs = pd.read_csv(tmp_path / "run" / "results" / "jobs.csv")
    assert set(jobs["node_id"]) <= alive


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
