"""The body of a study job under Ray, on its node: check that the node sees the job's input files,
run the job in a scratch directory with its output (stdout, stderr) in a file, report the start
(with the node) and the progress to the driver's collector, and return the result, the files and
the output as bytes (the driver writes them into the run directory)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

from headcount.experiments.runner.execution import _one_line, call_job
from headcount.experiments.runner.jobs import JobResult
from headcount.experiments.runner.ray_cluster import mismatch
from headcount.experiments.runner.store import DONE, RESULT, pack_dir, unpack_files
from headcount.runtime.errors import HeadcountError

#: the most of a job's output (stdout and stderr) kept in ``logs/<key>.log``: its end
LOG_LIMIT = 4 << 20


class _Collector:
    """A tiny Ray actor on the driver's node: the latest progress of each running task, and the
    start of every attempt (with its node)."""

    def __init__(self):
        self.state: dict[str, tuple] = {}
        self.events: list[tuple] = []

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def update(self, key: str, completed: float, total: float | None, description: str | None) -> None:
        self.state[key] = (completed, total, description)

    def started(self, key: str, where: dict) -> None:
        self.events.append((key, where))

    def poll(self) -> tuple[list, dict]:
        events, state = self.events, self.state
        self.events, self.state = [], {}
        return events, state


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


def _here() -> dict:
    """This node as a job's ``meta.json`` records it: Ray node id, address, host name."""
    where = {"node_id": None, "node_address": None, "host": socket.gethostname()}
    try:
        import ray

        if ray.is_initialized():
            where["node_id"] = ray.get_runtime_context().get_node_id()
            where["node_address"] = ray.util.get_node_ip_address()
    except Exception:  # pragma: no cover - outside Ray (a direct call in a test)
        pass
    return where


@contextmanager
def _output_to(path: Path):
    """Send this process's stdout and stderr (file descriptors 1 and 2: print, logging, tqdm, the
    libraries' load reports) to ``path`` for the duration of a job."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # pragma: no cover
            pass
    saved = (os.dup(1), os.dup(2))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    streams = sys.stdout, sys.stderr  # and the Python streams, should they not be descriptors 1 and 2
    text = open(path, "a", buffering=1, encoding="utf-8", errors="replace")
    sys.stdout = sys.stderr = text
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams
        text.close()
        for stream in streams:
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # pragma: no cover
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _read_log(path: Path) -> bytes:
    if not path.is_file():
        return b""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size > LOG_LIMIT:
            f.seek(size - LOG_LIMIT)
            return f"[... the first {size - LOG_LIMIT} bytes cut]\n".encode() + f.read()
        return f.read()


def _ray_job(fn_path: str, key: str, params: dict, inputs_spec: dict, sys_path: list[str], sink,
             env: dict | None = None, expected: dict | None = None) -> dict:
    """Body of a Ray task: check the inputs, run the job in a scratch dir, return result, files and output.

    ``env`` (``HEADCOUNT_DEVICE``) is set first: Ray has already limited ``CUDA_VISIBLE_DEVICES``
    to the GPUs it gave the task. ``expected``: the digests of the inputs the params name, as the
    driver saw them; a node that sees other content (or none) fails the job with a line that says
    which file, instead of the job's own ``not found`` deep inside."""
    os.environ.update(env or {})
    for p in sys_path:
        if p not in sys.path and os.path.isdir(p):
            sys.path.append(p)
    where = _here()
    if sink is not None:
        try:
            sink.started.remote(key, where)
        except Exception:  # pragma: no cover - progress is best effort
            pass
    label = f"{where['node_address'] or where['host']}" + (f" ({where['node_id'][:8]})" if where["node_id"] else "")
    scratch = Path(tempfile.mkdtemp(prefix=f"headcount-{key}-"))
    log = scratch / "output.log"
    try:
        missing = mismatch(params, expected)
        if missing is not None:
            raise HeadcountError(f"node {label} does not see the input {missing}; every node needs the study's "
                                 "input files at the same path (docs/studies.md)")
        inputs = {}
        for alias, spec in inputs_spec.items():
            d = Path(spec["dir"])
            marker = d / DONE
            if not (marker.is_file() and marker.read_text().strip() == spec["key"]):
                if spec["files"] is None:
                    raise HeadcountError(f"input {alias!r} ({spec['key']}) is not reachable from {label}")
                import ray

                d = scratch / "inputs" / alias
                d.mkdir(parents=True, exist_ok=True)  # also for a job that left only its result (nothing shipped)
                unpack_files(ray.get(spec["files"][0]), d)
                (d / RESULT).write_text(json.dumps(spec["result"], indent=2) + "\n")
            inputs[alias] = JobResult(
                key=spec["key"], kind=spec["kind"], name=spec["name"], params=spec["params"],
                result=spec["result"], dir=d, meta=spec["meta"],
            )
        workdir = scratch / "work"
        workdir.mkdir()
        t0 = time.time()
        with _output_to(log):
            result = call_job(fn_path, params, inputs, workdir, _RemoteProgress(sink, key))
        t1 = time.time()
        return {"ok": True, "result": result, "files": pack_dir(workdir, skip=frozenset()),
                "started": t0, "finished": t1, "where": where, "log": _read_log(log)}
    except Exception as e:
        return {"ok": False, "message": _one_line(e), "traceback": traceback.format_exc(), "where": where,
                "log": _read_log(log)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _label(where: Mapping) -> str:
    """``10.0.0.2 (3f2a9c1e)`` for a job's node (its host name outside Ray)."""
    if not where:
        return "?"
    node_id = where.get("node_id")
    return f"{where.get('node_address') or where.get('host')}" + (f" ({node_id[:8]})" if node_id else "")
