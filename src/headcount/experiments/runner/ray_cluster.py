"""The Ray cluster as the Ray executor meets it: which address to use (``--address``, else
``$RAY_ADDRESS``, else a private local instance), connecting (with a one-line error that names
token authentication when that is what failed), the alive nodes and their resources, and the
checks made before the first job is submitted: every job fits on some node, and every node that
can run jobs runs this headcount and Python, imports the job functions and sees the study's input
files (models, tasks, files named by the jobs' parameters) with the same content as this machine.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import socket
import sys
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from headcount.runtime.errors import HeadcountError

#: Ray's own variable for the cluster a driver joins (``ray.init()`` reads it too)
ENV_ADDRESS = "RAY_ADDRESS"
#: seconds a node may take to answer the input check (its first worker imports headcount)
PROBE_TIMEOUT = 120.0
#: what Ray's client prints (once a second, for 20 s) when the cluster refuses its token
_AUTH_WORDS = ("Unauthenticated", "InvalidAuthToken", "authentication token")
TOKEN_HELP = ("export RAY_AUTH_MODE=token and give this machine the cluster's token (the head's "
              "~/.ray/auth_token copied to the same path, or RAY_AUTH_TOKEN_PATH, or RAY_AUTH_TOKEN; "
              "`ray get-auth-token` prints it on the head)")


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


def resolve_address(address: str | None) -> str | None:
    """The cluster to join: ``address``, else ``$RAY_ADDRESS`` (Ray's convention); None (or
    ``local``) for a private local instance.

    >>> os.environ.pop(ENV_ADDRESS, None) and None
    >>> resolve_address(None), resolve_address("auto"), resolve_address("local")
    (None, 'auto', None)
    """
    address = (address or os.environ.get(ENV_ADDRESS) or "").strip()
    return None if address in ("", "local") else address


@contextmanager
def _captured_stderr():
    """Hold what Ray's C++ client writes to file descriptor 2 while connecting (a failed token
    prints a line a second for 20 s); the text is in the yielded list afterwards."""
    box: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # pragma: no cover - no real stderr: nothing to hold
        yield box
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield box
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):  # pragma: no cover
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            box.append(tmp.read()[-20000:].decode("utf-8", "replace"))


def connect_error(address: str, exc: BaseException, captured: str = "") -> HeadcountError:
    """The one-line error of a failed connection; it names token authentication when the
    cluster refused this machine's token (or the lack of one).

    >>> str(connect_error("h:6379", ConnectionError("Failed to connect"), "Unauthenticated: ..."))[:73]
    'cannot connect to the Ray cluster at h:6379: it uses token authentication'
    """
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = f"{type(exc).__name__} {exc}\n{captured}"
    if any(w.lower() in text.lower() for w in _AUTH_WORDS):
        mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower()
        if mode != "token":
            why = f"RAY_AUTH_MODE is {mode or 'unset'} here"
        elif "no authentication token was found" in text:
            why = "RAY_AUTH_MODE=token here, but this machine has no token"
        else:
            why = "it refused this machine's token"
        return HeadcountError(f"cannot connect to the Ray cluster at {address}: it uses token authentication "
                              f"and {why}: {TOKEN_HELP}")
    return HeadcountError(f"cannot connect to the Ray cluster at {address}: {type(exc).__name__}: {first}")


def connect(ray, address: str | None, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Join the cluster at ``address``, or start a private local instance (``address`` None: never
    the cluster ``ray.init()`` would find on this machine, which ``num_cpus`` cannot be given to)."""
    common = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    if address is None:
        kwargs = dict(address="local", num_cpus=num_cpus or os.cpu_count() or 1, **common)
        if num_gpus is not None:
            kwargs["num_gpus"] = num_gpus
        try:  # not under _captured_stderr: the processes it starts would inherit the held descriptor
            ray.init(**kwargs)
        except Exception as e:
            raise HeadcountError(f"could not start a local Ray instance: {type(e).__name__}: "
                                 f"{(str(e).strip().splitlines() or [''])[0]}") from None
        return
    check_reachable(address)
    common.pop("include_dashboard")
    with _captured_stderr() as held:
        try:
            ray.init(address=address, **common)
            return
        except Exception as e:
            err = e
    raise connect_error(address, err, held[0] if held else "") from None


# -- nodes ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """An alive node of the cluster: its Ray node id, address (IP), host name and resources."""

    node_id: str
    address: str
    hostname: str = ""
    cpus: float = 0.0
    gpus: float = 0.0

    @property
    def label(self) -> str:
        """``192.0.2.7 (3f2a9c1e)``: the address and the start of the node id.

        >>> Node("3f2a9c1e77", "10.0.0.2").label
        '10.0.0.2 (3f2a9c1e)'
        """
        return f"{self.address} ({self.node_id[:8]})"

    def fits(self, cpus: float, gpus: float) -> bool:
        return self.cpus + 1e-9 >= cpus and self.gpus + 1e-9 >= gpus

    def to_dict(self) -> dict:
        return {"node_id": self.node_id, "node_address": self.address, "host": self.hostname}


def alive_nodes(ray) -> list[Node]:
    """The cluster's alive nodes (``ray.nodes()``)."""
    out = []
    for n in ray.nodes():
        if not n.get("Alive", n.get("alive")):
            continue
        res = n.get("Resources", {}) or {}
        out.append(Node(n["NodeID"], n.get("NodeManagerAddress", "?"), n.get("NodeManagerHostname", ""),
                        float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0))))
    return out


def describe(nodes: Sequence[Node]) -> str:
    """``nodes: 10.0.0.1 (3f2a9c1e) 8 CPUs 0 GPUs, ...``

    >>> describe([Node("ab", "10.0.0.1", cpus=8)])
    'nodes: 10.0.0.1 (ab) 8 CPUs 0 GPUs'
    """
    if not nodes:
        return "no alive node"
    return "nodes: " + ", ".join(f"{n.label} {n.cpus:g} CPUs {n.gpus:g} GPUs" for n in nodes)


def check_resources(requests: Mapping[str, tuple[float, float]], nodes: Sequence[Node]) -> None:
    """Refuse a job that no alive node can hold (Ray would keep it waiting for ever).

    ``requests``: ``{job name: (cpus, gpus)}``.

    >>> check_resources({"a": (4, 0)}, [Node("ab", "10.0.0.1", cpus=2)])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: job 'a' asks for 4 CPUs and 0 GPUs; no node of the Ray cluster has that ...
    """
    for name, (cpus, gpus) in requests.items():
        if not any(n.fits(cpus, gpus) for n in nodes):
            raise HeadcountError(f"job {name!r} asks for {cpus:g} CPUs and {gpus:g} GPUs; no node of the Ray "
                                 f"cluster has that ({describe(nodes)}), so it would wait for ever")


# -- what the jobs read, seen from every node --------------------------------------------------------
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def lookup(params, where: str):
    """The value at a fingerprint's place in the params (``tasks[0]``, ``patterns.cnn.maps``).

    >>> lookup({"tasks": ["a", "b"], "p": {"m": "x"}}, "tasks[1]"), lookup({"p": {"m": "x"}}, "p.m")
    ('b', 'x')
    """
    value = params
    for name, index in _PART.findall(where):
        value = value[int(index)] if index else value[name]
    return value


def input_items(params) -> dict[tuple[str, str], str]:
    """``{(params key, value): digest}`` of the local inputs the params name (models, tasks,
    files): what a node must see with the same content (see [`headcount.data.fingerprint`][headcount.data.fingerprint])."""
    from headcount.data.fingerprint import params_fingerprint

    out = {}
    for where, digest in (params_fingerprint(params) or {}).items():
        key = [n for n, _ in _PART.findall(where) if n][-1]
        out[(key, str(lookup(params, where)))] = digest
    return out


def item_digests(items: Sequence[tuple[str, str]]) -> list[str | None]:
    """The digests of ``items`` (``(params key, value)``) as this machine sees them (None: not there)."""
    from headcount.data.fingerprint import params_fingerprint

    return [(params_fingerprint({key: value}) or {}).get(key) for key, value in items]


def mismatch(params, expected: Mapping[str, str] | None) -> str | None:
    """What this machine does not see as the driver did (None when all is the same)."""
    if not expected:
        return None
    from headcount.data.fingerprint import params_fingerprint

    got = params_fingerprint(params) or {}
    for where, digest in expected.items():
        if got.get(where) != digest:
            how = "it is missing or unreadable here" if got.get(where) is None else "its content differs here"
            return f"{lookup(params, where)} ({where}): {how}"
    return None


def _probe(items: list, fns: list, sys_path: list, expected_version: str) -> dict:
    """Body of the check task run on every node."""
    for p in sys_path:
        if p not in sys.path and os.path.isdir(p):
            sys.path.append(p)
    from headcount.experiments.runner.jobs import headcount_version, resolve_function

    import_error = None
    for fn in fns:
        try:
            resolve_function(fn)
        except Exception as e:  # noqa: BLE001 - reported by the driver
            import_error = f"cannot import the job function {fn} ({type(e).__name__}: {e})"
            break
    return {"headcount": headcount_version(), "python": platform.python_version(),
            "import_error": import_error, "digests": item_digests(items) if import_error is None else []}


def check_nodes(ray, nodes: Sequence[Node], params_list: Sequence[dict], fns: Sequence[str],
                sys_path: Sequence[str], timeout: float = PROBE_TIMEOUT) -> None:
    """Run a check task on each of ``nodes`` and refuse (one line) when a node runs another
    headcount or Python, cannot import a job function, or does not see an input file of the
    jobs with this machine's content."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from headcount.experiments.runner.jobs import headcount_version

    wanted: dict[tuple[str, str], str] = {}
    for params in params_list:
        wanted.update(input_items(params))
    items = sorted(wanted)
    here = {"headcount": headcount_version(), "python": platform.python_version()}
    probe = ray.remote(_probe)
    refs = {probe.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        n.node_id, soft=False)).remote(items, sorted(set(fns)), list(sys_path), here["headcount"]): n for n in nodes}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    if late:
        raise HeadcountError(f"node {refs[late[0]].label} did not answer the check of the study's inputs "
                             f"within {timeout:g} s (is headcount installed there?)")
    for ref in ready:
        node = refs[ref]
        try:
            seen = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - headcount missing there, a dead worker
            first = (str(e).strip().splitlines() or [""])[-1]
            raise HeadcountError(f"node {node.label} cannot run the study's jobs ({first.strip()}); install "
                                 "headcount there, in the same version (pip install 'headcount[ray]')") from None
        for what in ("headcount", "python"):
            if seen[what] != here[what]:
                raise HeadcountError(f"node {node.label} runs {what} {seen[what]}, this machine {here[what]}: "
                                     "install the same versions on every node")
        if seen["import_error"]:
            raise HeadcountError(f"node {node.label} {seen['import_error']}")
        for (key, value), digest in zip(items, seen["digests"]):
            if digest != wanted[(key, value)]:
                how = "missing or unreadable there" if digest is None else "different there"
                raise HeadcountError(
                    f"node {node.label} does not see the study's input {value} ({how}); every node needs the "
                    "models, tasks and files the config names at the same path (a shared filesystem, or a "
                    "copy on each node); see docs/studies.md")


__all__ = ["ENV_ADDRESS", "Node", "alive_nodes", "check_nodes", "check_reachable", "check_resources", "connect",
           "connect_error", "describe", "mismatch", "resolve_address"]
