"""The results store of a run directory.

Layout::

    RUN/
      study.yaml            the config file as given (verbatim)
      manifest.json         study type, config hash, headcount version, versions of the last run
      plan.json             every job of the current config: name(s), key, kind, params, inputs
      jobs/<key>/           one finished job: result.json, meta.json, DONE, and the files it wrote
      jobs/.headcount-tmp.<session>.<key>.*/  a job being written (ignored, removed on the next run)
      logs/<key>.error.txt  the traceback of a job that failed (removed when it later succeeds)
      history/<n>-<hash>/   config, manifest, plan and report of an earlier config (``--force``)
      report.html, results/*.csv, figures/*.png   the report (``headcount report RUN``)
      .headcount.lock       held (flock) by the process running the study
      .headcount-out.json   the record: which files are headcount's ([`headcount.runtime.record`][headcount.runtime.record]);
                            nothing else in the folder is ever replaced, moved or deleted

A job directory appears in one ``rename`` of a complete temporary directory whose ``DONE``
marker is written last, so ``jobs/<key>/`` is either absent or complete: a process killed at any
moment leaves at most a temporary directory, which is never read and is removed on resume (when
its session is one the record lists).
Only the driver process writes here.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from headcount.experiments.runner.jobfiles import (
    DONE,
    JOB_RECORD,
    META,
    RESERVED,
    RESULT,
    _fsync_dir,
    _fsync_tree,
    clear_stale,
    discard_tmp,
    list_job_files,
    pack_dir,
    refuse_users_files,
    unpack_files,
    users_files,
)
from headcount.experiments.runner.jobs import Job, JobResult, Plan, headcount_version
from headcount.runtime.atomic import SESSION, atomic_write_json, tmp_prefix, tmp_session
from headcount.runtime.errors import HeadcountError
from headcount.runtime.io import ACTIVE_OUTS, first_missing, lock_file, remove_created, unlock_file
from headcount.runtime.jsonfile import read_json as read_json_file
from headcount.runtime.written import remove_in_record, write_in_record
from headcount.runtime.launch import refuse_launcher
from headcount.runtime.record import LOCK_NAME, Record, first_foreign, refuse_foreign

try:  # POSIX only; elsewhere a run directory is simply not locked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

MANIFEST = "manifest.json"
CONFIG = "study.yaml"
PLAN = "plan.json"
FORMAT = 1
#: what a study and its report write at the top of a run directory (the record lists them)
OUTPUTS = (CONFIG, MANIFEST, PLAN, "jobs", "logs", "history", "report.html", "explore.html", "results", "figures")
#: the report's pages, and its folders of tables and figures (files the report writes, one by one)
REPORT_PAGES = ("report.html", "explore.html")
REPORT_DIRS = ("results", "figures")


def is_report_file(rel: str) -> bool:
    """Whether ``rel`` (a path relative to the run directory) is a file the report writes."""
    return rel in REPORT_PAGES or ("/" in rel and rel.split("/")[0] in REPORT_DIRS)


def read_json(path: Path, what: str = "", kind: type = dict):
    """A store file (a JSON ``kind``), or one line naming the missing or corrupt file (never a traceback);
    ``what="job"``: a job's file, whose fix is to delete the job directory (it is recomputed)."""
    fix = f"restore it, or delete {'the job directory' if what == 'job' else 'it'} to recompute"
    return read_json_file(path, f"the {what} file" if what else "", kind=kind, fix=fix)


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class RunStore:
    """A run directory: finished jobs by key, the plan, the config and the manifest.

    Args:
        root: the run directory (need not exist for reading an empty store).
        plan: the plan, for looking jobs up by name; read from ``plan.json`` when omitted.

    >>> import tempfile; store = RunStore(tempfile.mkdtemp())
    >>> store.is_done("toy-0123456789abcdef")
    False
    """

    def __init__(self, root: str | os.PathLike, plan: Plan | None = None):
        self.root = Path(root)
        self._plan_json: dict | None = plan.to_json() if plan is not None else None
        self._lock_fd: int | None = None
        self.record: Record | None = None  # the run directory's record, read when the lock is taken
        self._before: set[str] = set()
        self._read_state: tuple = ({}, [])
        self._had_lock, self._created = True, None

    # -- paths -----------------------------------------------------------------------------
    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def job_dir(self, key: str) -> Path:
        return self.jobs_dir / key

    # -- finished jobs ---------------------------------------------------------------------
    def is_done(self, key: str) -> bool:
        """Whether ``jobs/<key>/DONE`` exists (the only test of completion)."""
        return (self.job_dir(key) / DONE).is_file()

    def load(self, key: str, name: str | None = None) -> JobResult:
        """The finished job ``key`` as a [`JobResult`][headcount.experiments.runner.jobs.JobResult]."""
        d = self.job_dir(key)
        if not (d / DONE).is_file():
            raise HeadcountError(f"job {name or key!r} has not finished in {self.root}")
        meta = read_json(d / META, "job")
        result = read_json(d / RESULT, "job", object)
        return JobResult(
            key=key,
            kind=meta.get("kind", key.rsplit("-", 1)[0]),
            name=name or meta.get("name", key),
            params=meta.get("params", {}),
            result=result,
            dir=d,
            meta=meta,
        )

    def new_tmp_dir(self, key: str) -> Path:
        """A fresh temporary directory for job ``key`` (ignored until ``commit``)."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        d = self.jobs_dir / f"{tmp_prefix(key)}{uuid.uuid4().hex[:8]}"
        d.mkdir()
        return d

    def commit(self, job: Job, tmp: Path, result: Mapping[str, Any], meta: Mapping[str, Any]) -> JobResult:
        """Publish a temporary directory as ``jobs/<key>/``: write result, meta, DONE; rename.

        Args:
            job: the job that produced it.
            tmp: a directory from ``new_tmp_dir`` holding the files the job wrote.
            result: the job function's JSON-able return value.
            meta: timings and provenance (merged with the job's name/kind/params/inputs).

        Returns:
            The stored [`JobResult`][headcount.experiments.runner.jobs.JobResult].
        """
        for reserved in RESERVED:
            if (tmp / reserved).exists():
                raise HeadcountError(f"job {job.name!r} wrote {reserved!r}, a name the store reserves")
        full_meta = {
            "key": job.key,
            "name": job.name,
            "kind": job.kind,
            "fn": job.fn,
            "params": job.params,
            "inputs": {alias: d.key for alias, d in job.deps},
            "resources": job.resources.to_dict(),
            "headcount": headcount_version(),
            **dict(meta),
        }
        try:
            text = json.dumps(result, indent=2, ensure_ascii=False) + "\n"
        except (TypeError, ValueError) as e:
            raise HeadcountError(f"job {job.name!r} returned a result that is not JSON-able: {e}") from None
        final = self.job_dir(job.key)
        if (final / DONE).is_file():  # someone finished it meanwhile: keep theirs, drop ours
            self.discard(tmp)
            return self.load(job.key, job.name)
        theirs = users_files(tmp)  # a user's note saved into the job's checkpoints/ meanwhile: stays, unlisted
        (tmp / JOB_RECORD).unlink(missing_ok=True)  # the running job's own record, not one of its results
        (tmp / RESULT).write_text(text, encoding="utf-8")
        (tmp / META).write_text(json.dumps(full_meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / DONE).write_text(job.key + "\n", encoding="utf-8")
        _fsync_tree(tmp)
        if os.path.lexists(final):
            # a directory without DONE cannot come from this store (its DONE was removed): never
            # trusted; its files headcount wrote are removed, anything else refuses the job
            self.clear_stale([job.key])
        os.replace(tmp, final)
        _fsync_dir(self.jobs_dir)
        list_job_files(self.root, self.record, job.key, skip=theirs)
        self._remove_log(f"logs/{job.key}.error.txt")  # the traceback of an earlier failure: headcount's only
        return self.load(job.key, job.name)

    def clear_stale(self, keys) -> None:
        """Clean each ``jobs/<key>/`` without ``DONE`` of headcount's files (``jobfiles.clear_stale``)."""
        clear_stale(self.root, self.record, keys)

    def commit_files(self, job: Job, files: Mapping[str, bytes], result: Mapping, meta: Mapping) -> JobResult:
        """Like ``commit``, for files that came back as bytes (from a Ray task)."""
        tmp = self.new_tmp_dir(job.key)
        try:
            unpack_files(files, tmp)
            return self.commit(job, tmp, result, meta)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def record_failure(self, job: Job, text: str) -> Path:
        """Write the traceback of a failed job to ``logs/<key>.error.txt`` (see ``write_log``)."""
        return self.write_log(f"logs/{job.key}.error.txt",
                              f"job: {job.name}\nkey: {job.key}\nfn: {job.fn}\ntime: {utcnow()}\n\n{text}".encode())

    def write_log(self, rel: str, data: bytes) -> Path:
        """Write ``RUN/<rel>`` (a job's traceback or output under ``logs/``), listed in the record;
        a file of that name the record does not list is refused (``written.write_in_record``)."""
        return write_in_record(self.root, self.record, rel, data, what="the run directory")

    def _remove_log(self, rel: str) -> None:
        remove_in_record(self.root, self.record, rel)  # a file the record does not list stays

    def clean_tmp(self) -> int:
        """Remove the temporary directories left by killed runs; returns how many. Call under the lock.

        Only those whose session the run directory's record lists (``Record.clean_tmp``): a
        user's ``.something.tmp`` is never touched.
        """
        if self.record is None:
            return 0
        self.refuse_users_tmp()
        return sum(self.record.clean_tmp([sub], recursive=False) for sub in ("", "jobs", "logs", "results", "figures"))

    def refuse_users_tmp(self) -> None:
        """Refuse the run (one line naming it) when a killed run's job folder holds a user's file
        ([`refuse_users_files`][headcount.experiments.runner.jobfiles.refuse_users_files]); call under the lock, before writing anything."""
        if self.record is not None and self.jobs_dir.is_dir() and not self.jobs_dir.is_symlink():
            killed = set(self.record.sessions) - {SESSION}
            refuse_users_files(self.root, [p for p in self.jobs_dir.iterdir() if tmp_session(p.name) in killed
                                           and p.is_dir() and not p.is_symlink()])

    def discard(self, tmp: Path) -> None:
        """Remove the temporary folder of a job that failed or was interrupted, but a user's file in
        it ([`discard_tmp`][headcount.experiments.runner.jobfiles.discard_tmp]: it stays, and the next run refuses it naming it)."""
        if tmp.exists():
            discard_tmp(tmp)

    def finished_keys(self) -> set[str]:
        """Keys of every finished job in the directory (of this config or earlier ones)."""
        if not self.jobs_dir.is_dir():
            return set()
        return {p.name for p in self.jobs_dir.iterdir() if not p.name.startswith(".") and (p / DONE).is_file()}

    # -- plan: lookups by name (what report functions use) -----------------------------------
    @property
    def plan(self) -> dict:
        """The content of ``plan.json`` (the jobs of the config the run directory holds)."""
        if self._plan_json is None:
            path = self.root / PLAN
            if not path.is_file():
                raise HeadcountError(f"{self.root} has no {PLAN}; is it a headcount run directory?")
            plan = read_json(path)
            if not isinstance(plan.get("jobs"), list) or not all(
                    isinstance(e, dict) and isinstance(e.get("key"), str) and isinstance(e.get("name"), str)
                    and isinstance(e.get("kind"), str) for e in plan["jobs"]):
                raise HeadcountError(f"{path} is corrupt (no list of jobs with key, name and kind)")
            self._plan_json = plan
        return self._plan_json

    def _entries(self) -> list[dict]:
        return self.plan["jobs"]

    def _entry(self, name: str) -> dict:
        for e in self._entries():
            if name == e["key"] or name in e.get("names", [e["name"]]):
                return e
        names = [n for e in self._entries() for n in e.get("names", [e["name"]])]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise HeadcountError(f"no job named {name!r} in {self.root / PLAN}{hint}")

    def names(self, kind: str | None = None) -> list[str]:
        """Job names of the plan in order (all names, when several share a key), optionally of one kind."""
        return [n for e in self._entries() if kind in (None, e["kind"]) for n in e.get("names", [e["name"]])]

    def has(self, name: str) -> bool:
        """Whether the job with this name (or key) has finished."""
        return self.is_done(self._entry(name)["key"])

    def result(self, name: str) -> JobResult:
        """The finished job with this name (or key).

        Raises:
            HeadcountError: unknown name (with suggestions) or a job that has not finished.
        """
        e = self._entry(name)
        return self.load(e["key"], name if name != e["key"] else e["name"])

    def results(self, kind: str | None = None) -> list[JobResult]:
        """Every finished job of the plan (once per key, in plan order), optionally of one kind."""
        return [self.load(e["key"], e["name"]) for e in self._entries() if kind in (None, e["kind"]) and self.is_done(e["key"])]

    def missing(self) -> list[str]:
        """Names of the plan's jobs that have not finished."""
        return [e["name"] for e in self._entries() if not self.is_done(e["key"])]

    def timings(self):
        """A pandas DataFrame: one row per job of the plan (name, kind, key, status, seconds, ...)."""
        rows = []
        for e in self._entries():
            row = {"name": e["name"], "kind": e["kind"], "key": e["key"]}
            meta_path = self.job_dir(e["key"]) / META
            if self.is_done(e["key"]) and meta_path.is_file():
                meta = read_json(meta_path, "job")
                row.update(
                    status="done",
                    seconds=meta.get("seconds"),
                    started=meta.get("started"),
                    finished=meta.get("finished"),
                    executor=meta.get("executor"),
                    host=meta.get("host"),
                )
            else:
                row.update(status="missing", seconds=None, started=None, finished=None, executor=None, host=None)
            rows.append(row)
        return pd.DataFrame(rows, columns=["name", "kind", "key", "status", "seconds", "started", "finished", "executor", "host"])

    # -- config, manifest --------------------------------------------------------------------
    @property
    def manifest(self) -> dict:
        path = self.root / MANIFEST
        if not path.is_file():
            raise HeadcountError(f"{self.root} is not a headcount run directory (no {MANIFEST})")
        return read_json(path)

    @property
    def config_text(self) -> str:
        path = self.root / CONFIG
        return path.read_text(encoding="utf-8") if path.is_file() else ""

    def write_plan(self, plan: Plan) -> None:
        self._plan_json = plan.to_json()
        atomic_write_json(self.root / PLAN, self._plan_json)
        self.sealed(PLAN)

    def sealed(self, *names: str) -> None:
        """Record the stamps of the state files this run just wrote (``manifest.json``, ...), at
        once: an edit the user makes while the run goes on is theirs, never sealed as headcount's
        when the run ends (the next ``study`` or ``report`` refuses it)."""
        if self.record is not None:
            self.record.seal(names)
            self.record.write()

    # -- lock --------------------------------------------------------------------------------
    def lock(self) -> None:
        """Take ``RUN/.headcount.lock`` (flock) and the run directory's record.

        The lock file is opened without following links ([`headcount.runtime.io.lock_file`][headcount.runtime.io.lock_file]): one
        that is a symlink, a directory, a hard link or a user's file is refused, never written
        through. A folder without headcount's record that holds anything is refused, and so is a
        run directory where a name the study writes is not headcount's; a refused folder is left
        as it was (no lock file, no folder created).
        """
        if fcntl is None or self._lock_fd is not None:
            return
        refuse_launcher("headcount study")  # every rank would run the whole study in one directory
        created = first_missing(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise HeadcountError(f"cannot create {self.root}: {e.strerror}") from None
        had_lock = os.path.lexists(self.root / LOCK_NAME)
        fd = lock_file(self.root, "headcount study")
        try:
            rec = check_run_dir(self.root)
            if rec is None:
                rec = Record(self.root, "study")
        except BaseException:
            if not had_lock:
                (self.root / LOCK_NAME).unlink(missing_ok=True)
            unlock_file(fd)
            remove_created(self.root, created)
            raise
        self._lock_fd = fd
        self.record = rec
        self._had_lock, self._created = had_lock, created
        self._read_state = (dict(rec.files), list(rec.sessions))  # unchanged at unlock: nothing is written
        self._before = {p.name for p in self.root.iterdir()}
        if self.root not in ACTIVE_OUTS:
            ACTIVE_OUTS.append(self.root)

    def begin(self) -> None:
        """Claim the study's outputs and list this session in the record, before writing anything.

        A run killed after this leaves what it wrote headcount's (listed), and its temporary
        files removable by the next run; a run refused before it leaves the folder as it was.
        """
        rec = self.record
        rec.join_session()
        rec.claim(OUTPUTS)
        rec.claim((n for n in (MANIFEST, PLAN) if rec.owns(n)), rewrite=True)  # rewritten by every run
        rec.write()

    def unlock(self) -> None:
        if self._lock_fd is not None and (dict(self.record.files), self.record.sessions) != self._read_state:
            try:  # record what this run wrote at the top (jobs/, manifest.json, ...)
                rec = self.record
                wrote = [p.name for p in self.root.iterdir()
                         if p.name in OUTPUTS and (p.name in rec.files or p.name not in self._before)]
                rec.claim(wrote)
                # only what is still a claim: a file sealed when it was written (manifest.json, a
                # report page) and changed since is the user's, not stamped as headcount's now
                rec.seal([n for n in wrote if rec.files.get(n) is None])
                rec.write()
            except OSError:  # pragma: no cover - best effort: the next run records them
                pass
        if self._lock_fd is not None:
            untouched = (dict(self.record.files), self.record.sessions) == self._read_state
            if untouched and not self._had_lock:  # refused or had nothing to do: leave no new lock file
                (self.root / LOCK_NAME).unlink(missing_ok=True)
            unlock_file(self._lock_fd)
            self._lock_fd = None
            if untouched:
                remove_created(self.root, self._created)

    def __enter__(self) -> "RunStore":
        self.lock()
        return self

    def __exit__(self, *exc) -> None:
        self.unlock()


def check_run_dir(root: Path) -> Record | None:
    """The record of a run directory (None for a new or empty folder); refuses a folder that is not one.

    Raises:
        HeadcountError: a non-empty folder without headcount's record, the output of another
            command, or a name the study writes that the record does not list.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise HeadcountError(f"--out {root} is a file, not a directory")
    if not root.is_dir():
        return None
    rec = Record.read(root)
    if rec is None:
        first = first_foreign(root)
        if first is not None:
            raise HeadcountError(f"{root} is not empty and headcount has no record of it (it holds {first}); "
                                 "choose a new or empty directory for the run")
        return None
    if rec.command != "study":
        raise HeadcountError(f"{root} holds the output of `headcount {rec.command}`, not a study run; "
                             "choose another directory")
    # the run's own state files and folders: listed, unchanged since (a plan.json, manifest.json or
    # study.yaml the user edited is theirs), and no link (a linked jobs/ or results/ is refused)
    refuse_foreign(root, [p.name for p in sorted(root.iterdir()) if p.name in OUTPUTS and not rec.owns(p.name)])
    return rec


def job_meta(started: float, finished: float, executor: str, host: str | None = None) -> dict:
    """The timing part of ``meta.json``."""
    return {
        "started": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="milliseconds"),
        "finished": datetime.fromtimestamp(finished, timezone.utc).isoformat(timespec="milliseconds"),
        "seconds": round(finished - started, 3),
        "executor": executor,
        "host": host or socket.gethostname(),
    }


__all__ = ["RunStore", "check_run_dir", "is_report_file", "OUTPUTS", "pack_dir", "unpack_files", "job_meta", "utcnow", "DONE", "RESULT", "META", "RESERVED"]
