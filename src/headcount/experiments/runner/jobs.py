"""Jobs, their keys, and the plan (a topologically sorted DAG of jobs).

A study expands into [`Job`][headcount.experiments.runner.jobs.Job] objects. A job names the function that computes it (a dotted
path ``"module:function"``, so that any process, local or on a Ray worker, can import it), the
JSON-able parameters it needs, and the jobs whose outputs it reads. Its **key** is a hash of

    kind + canonical JSON of params + (input name, upstream key) pairs + headcount version
        + content fingerprints of the local models, tasks and files the params name

so a setting changes exactly the keys of the jobs that read it (through their params) and of
every job downstream of those (through the upstream keys), and so does an edited data file or a
checkpoint rewritten at the same path ([`headcount.data.fingerprint`][headcount.data.fingerprint]); jobs upstream or on other
branches keep their keys and their finished results are reused.

A job function has the signature::

    def my_job(params: dict, inputs: dict[str, JobResult], workdir: Path, progress) -> dict

It writes any files into ``workdir``, returns a JSON-able dict (stored as ``result.json``), may
call ``progress(done, total=None, description=None)`` to report its own steps, and must be
deterministic given ``params`` (seed everything from them).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol

from headcount.data.fingerprint import params_fingerprint
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import read_json

_KIND_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_FN_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ALIAS_RE = re.compile(r"^[^\s/\\][^/\\]*$")


@lru_cache(maxsize=1)
def headcount_version() -> str:
    """The installed headcount version (part of every job key).

    >>> headcount_version().count(".") >= 1
    True
    """
    try:
        return version("headcount")
    except Exception:  # pragma: no cover - running from a source tree without metadata
        return "0+unknown"


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: equal data gives equal text.

    Raises:
        HeadcountError: when ``obj`` holds something JSON cannot represent (sets, objects, NaN).

    >>> canonical_json({"b": [1, 2.5], "a": "x"})
    '{"a":"x","b":[1,2.5]}'
    """
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise HeadcountError(f"not JSON-able: {e}") from None


def stable_hash(obj: Any, length: int = 16) -> str:
    """Hex SHA-256 of [`canonical_json`][headcount.experiments.runner.jobs.canonical_json] of ``obj``, cut to ``length`` characters.

    >>> stable_hash({"a": 1}) == stable_hash({"a": 1}) and len(stable_hash({"a": 1})) == 16
    True
    """
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()[:length]


@dataclass(frozen=True)
class Resources:
    """What one job needs from the machine that runs it (used by the Ray executor).

    Attributes:
        cpus: CPU cores (may be fractional).
        gpus: GPUs (may be fractional, e.g. 0.5 to share one GPU between two jobs).
    """

    cpus: float = 1.0
    gpus: float = 0.0

    def __post_init__(self):
        for name in ("cpus", "gpus"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise HeadcountError(f"job resources: {name} must be a number >= 0 (got {v!r})")

    @classmethod
    def coerce(cls, value: "Resources | Mapping[str, float] | None") -> "Resources":
        """Accept a [`Resources`][headcount.experiments.runner.jobs.Resources], a ``{"cpus": .., "gpus": ..}`` dict, or ``None``."""
        if value is None:
            return cls()
        if isinstance(value, Resources):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"cpus", "gpus"}
            if unknown:
                raise HeadcountError(f"job resources: unknown key(s) {sorted(unknown)} (use cpus, gpus)")
            return cls(**{k: float(v) for k, v in value.items()})
        raise HeadcountError(f"job resources must be a dict with cpus/gpus (got {value!r})")

    def to_dict(self) -> dict:
        return {"cpus": self.cpus, "gpus": self.gpus}


class ProgressFn(Protocol):
    """What a job function receives to report its own steps."""

    def __call__(self, completed: float, total: float | None = None, description: str | None = None) -> None: ...


def no_progress(completed: float, total: float | None = None, description: str | None = None) -> None:
    """A progress callback that does nothing (for calling job functions directly, e.g. in tests)."""


@dataclass(frozen=True)
class JobResult:
    """A finished job as its downstream jobs and report functions see it.

    Attributes:
        key: the job key (its directory name under ``RUN/jobs/``).
        kind: the job kind.
        name: the job's name in the plan (one of them, when several names share a key).
        params: the parameters it ran with.
        result: the dict the job function returned (``result.json``).
        dir: the directory holding the job's files (read-only by convention).
        meta: timings and provenance (``meta.json``): started, finished, seconds, executor, host.
    """

    key: str
    kind: str
    name: str
    params: dict
    result: dict
    dir: Path
    meta: dict = field(default_factory=dict)

    def path(self, relative: str) -> Path:
        """Path of a file the job wrote; [`HeadcountError`][headcount.runtime.errors.HeadcountError] when it is missing.

        >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / "x.txt").write_text("1")
        >>> JobResult("k", "toy", "toy", {}, {}, d).path("x.txt").read_text()
        '1'
        """
        p = self.dir / relative
        if not p.exists():
            raise HeadcountError(f"job {self.name!r} ({self.key}) has no file {relative!r}")
        return p

    def load_json(self, relative: str) -> Any:
        """Parse a JSON file the job wrote (a corrupt or edited one: one line naming it)."""
        return read_json(self.path(relative), f"job {self.name!r}'s file")

    def __getitem__(self, item: str) -> Any:
        return self.result[item]


class Job:
    """One unit of work in a study: a function, its parameters, and the jobs it reads.

    Args:
        name: unique, human-readable name in the study (``"finetune/sst2/seed1"``); not part of the key.
        kind: what the job computes (``"finetune"``, ``"score"``...); part of the key and of its
            directory name. ``[A-Za-z0-9_.-]``.
        fn: dotted path ``"package.module:function"`` of the job function.
        params: JSON-able dict of everything the function needs (and nothing else: each extra
            setting widens what a change re-runs).
        deps: upstream jobs, as a list (the function sees them under their names) or a dict
            ``{input_name: job}``.
        resources: ``{"cpus": 1, "gpus": 0}`` (or [`Resources`][headcount.experiments.runner.jobs.Resources]), for the Ray executor.
        uses_model: the job runs a model (forward/backward passes: fine-tuning, scoring,
            pruning, evaluation), so it wants a GPU where there is one: the Ray executor gives
            such a job ``gpus_per_job`` GPUs when the cluster has GPUs and ``resources`` asks for
            none. Like ``resources``, not part of the key.

    Raises:
        HeadcountError: bad name/kind/fn, non-JSON-able params, duplicate input names.

    >>> a = Job("a", "toy", "math:fsum", {"x": 1})
    >>> b = Job("b", "toy", "math:fsum", {"x": 2}, deps={"left": a})
    >>> a.key != b.key and b.inputs["left"] is a
    True
    """

    __slots__ = ("name", "kind", "fn", "_params_json", "deps", "resources", "uses_model", "key")

    def __init__(
        self,
        name: str,
        kind: str,
        fn: str,
        params: Mapping[str, Any] | None = None,
        deps: Sequence["Job"] | Mapping[str, "Job"] | None = None,
        resources: Resources | Mapping[str, float] | None = None,
        uses_model: bool = False,
    ):
        if not isinstance(name, str) or not name.strip():
            raise HeadcountError(f"job name must be a non-empty string (got {name!r})")
        if not isinstance(kind, str) or not _KIND_RE.match(kind):
            raise HeadcountError(f"job {name!r}: kind must match [A-Za-z0-9_.-]+ (got {kind!r})")
        if not isinstance(fn, str) or not _FN_RE.match(fn):
            raise HeadcountError(f"job {name!r}: fn must be a dotted path 'module:function' (got {fn!r})")
        params = dict(params or {})
        try:
            params_json = canonical_json(params)
        except HeadcountError as e:
            raise HeadcountError(f"job {name!r}: params {str(e)}") from None
        if isinstance(deps, Mapping):
            pairs = tuple(deps.items())
        else:
            pairs = tuple((d.name, d) for d in (deps or ()))
        seen = set()
        for alias, dep in pairs:
            if not isinstance(dep, Job):
                raise HeadcountError(f"job {name!r}: dependency {alias!r} is not a Job (got {type(dep).__name__})")
            if not isinstance(alias, str) or not _ALIAS_RE.match(alias):
                raise HeadcountError(f"job {name!r}: bad input name {alias!r}")
            if alias in seen:
                raise HeadcountError(f"job {name!r}: two inputs are named {alias!r}; pass deps as a dict")
            seen.add(alias)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "_params_json", params_json)
        object.__setattr__(self, "deps", pairs)
        object.__setattr__(self, "resources", Resources.coerce(resources))
        object.__setattr__(self, "uses_model", bool(uses_model))
        identity = {
            "kind": kind,
            "params": json.loads(params_json),
            "inputs": sorted([alias, dep.key] for alias, dep in pairs),
            "headcount": headcount_version(),
        }
        data = params_fingerprint(identity["params"])
        if data is not None:  # the contents of the models, tasks and files the params name
            identity["data"] = data
        digest = stable_hash(identity)
        object.__setattr__(self, "key", f"{kind}-{digest}")

    def __setattr__(self, name, value):
        raise AttributeError("Job is immutable")

    @property
    def params(self) -> dict:
        """A fresh copy of the parameters (mutating it does not change the job)."""
        return json.loads(self._params_json)

    @property
    def inputs(self) -> dict[str, "Job"]:
        """Upstream jobs by the input name the job function sees them under."""
        return dict(self.deps)

    def __eq__(self, other) -> bool:
        return isinstance(other, Job) and other.key == self.key and other.name == self.name

    def __hash__(self) -> int:
        return hash((self.key, self.name))

    def __repr__(self) -> str:
        return f"Job({self.name!r}, key={self.key!r})"


def resolve_function(path: str) -> Callable:
    """Import ``"module:function"`` (``function`` may be ``Class.method``).

    Raises:
        HeadcountError: the module or attribute cannot be imported, or is not callable.

    >>> resolve_function("math:sqrt")(9.0)
    3.0
    """
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise HeadcountError(f"cannot import job function {path!r}: {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HeadcountError(f"cannot import job function {path!r}: no attribute {part!r}") from None
    if not callable(obj):
        raise HeadcountError(f"job function {path!r} is not callable")
    return obj


def example_job(params: dict, inputs: dict, workdir: Path, progress=no_progress) -> dict:
    """The shape of a job function: sums ``params["values"]`` and the ``sum`` of every input.

    Real job functions live with their study type; this one documents the signature.

    >>> example_job({"values": [1, 2]}, {}, Path("."))
    {'sum': 3}
    """
    values = list(params.get("values", []))
    total = sum(values) + sum(r.result["sum"] for r in inputs.values())
    if progress is not None:
        progress(1, 1)
    return {"sum": total}


class Plan:
    """The jobs of a study, deduplicated by key and sorted so that inputs come first.

    Jobs reached only through ``deps`` are included. Two jobs with the same key are one
    computation (run once, visible under both names); two different keys may not share a name.

    Args:
        jobs: the jobs a study's ``expand_fn`` returned.

    >>> a = Job("a", "toy", "math:fsum", {"x": 1})
    >>> [j.name for j in Plan([Job("b", "toy", "math:fsum", deps=[a])]).jobs]
    ['a', 'b']
    """

    def __init__(self, jobs: Sequence[Job]):
        order: list[Job] = []
        by_key: dict[str, Job] = {}
        names: dict[str, str] = {}
        kinds_fn: dict[str, str] = {}

        def visit(job: Job) -> None:
            if not isinstance(job, Job):
                raise HeadcountError(f"a study must expand into Job objects (got {type(job).__name__})")
            if job.name in names and names[job.name] != job.key:
                raise HeadcountError(f"two different jobs are named {job.name!r}; job names must be unique")
            if job.kind in kinds_fn and kinds_fn[job.kind] != job.fn:
                raise HeadcountError(
                    f"kind {job.kind!r} is used with two functions ({kinds_fn[job.kind]}, {job.fn}); "
                    "a kind must name one computation"
                )
            kinds_fn[job.kind] = job.fn
            names[job.name] = job.key
            if job.key in by_key:
                return
            for _, dep in job.deps:
                visit(dep)
            by_key[job.key] = job
            order.append(job)

        for job in jobs:
            visit(job)
        self.jobs: list[Job] = order
        self.names: dict[str, str] = names

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self):
        return iter(self.jobs)

    def job(self, name: str) -> Job:
        """The job with this name."""
        key = self.key(name)
        return next(j for j in self.jobs if j.key == key)

    def key(self, name: str) -> str:
        """The key of the job with this name; [`HeadcountError`][headcount.runtime.errors.HeadcountError] with suggestions when unknown."""
        try:
            return self.names[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self.names), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise HeadcountError(f"no job named {name!r} in this study{hint}") from None

    def to_json(self) -> dict:
        """What ``RUN/plan.json`` holds: every job with its key, inputs and all its names."""
        aliases: dict[str, list[str]] = {}
        for n, k in self.names.items():
            aliases.setdefault(k, []).append(n)
        return {
            "headcount": headcount_version(),
            "jobs": [
                {
                    "key": j.key,
                    "name": j.name,
                    "names": aliases[j.key],
                    "kind": j.kind,
                    "fn": j.fn,
                    "params": j.params,
                    "inputs": {alias: d.key for alias, d in j.deps},
                    "resources": j.resources.to_dict(),
                    "uses_model": j.uses_model,
                }
                for j in self.jobs
            ],
        }
