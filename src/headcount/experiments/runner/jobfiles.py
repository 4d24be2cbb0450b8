"""Ownership of a run directory's job folders, file by file (docs/promises.md).

A finished ``jobs/<key>/`` is listed in the run directory's record file by file; a ``jobs/<key>/``
without ``DONE`` (its ``DONE`` removed: the store never leaves one) is cleaned of the files the
record lists, then of the folders left empty; a file headcount did not write stays where it is
and refuses the job, naming it.

While a job runs, its temporary folder has a record of its own, ``.headcount-job.json``
([`JobRecord`][headcount.experiments.runner.jobfiles.JobRecord], open as a direct writer's guard by [`job_guard`][headcount.experiments.runner.jobfiles.job_guard]): the library code
that lists what it writes (the Trainer's ``checkpoints/``, a saved ``model/``) lists it there, and
removes only what it listed. A file in one of those folders that the job record does not list is
a user's ([`users_files`][headcount.experiments.runner.jobfiles.users_files]): it is never listed in the run's record when the job is
published, never removed with a failed job, and a killed job's folder that holds one is refused,
naming it, before anything is removed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from headcount.runtime.atomic import atomic_write_json, remove_empty_dirs, tmp_session
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import parse_json
from headcount.runtime.record import Record, describe, refuse_foreign, stamp
from headcount.runtime.written import _DIRECT  # the open guards of direct writers (finetune's Trainer looks there)

DONE = "DONE"
RESULT = "result.json"
META = "meta.json"
#: the names the store writes into every job's folder (a job may not write them)
RESERVED = frozenset({DONE, RESULT, META})


def list_job_files(root: Path, rec: Record | None, key: str, skip=()) -> None:
    """List every file of the finished ``root/jobs/<key>/`` in the record ``rec`` (None: nothing to
    list), but those of ``skip`` (paths relative to the job's folder: the user's)."""
    if rec is None:
        return
    d = Path(root) / "jobs" / key
    skip = set(skip)
    for top, _, files in os.walk(d):
        for f in files:
            if (Path(top) / f).relative_to(d).as_posix() not in skip:
                rel = (Path(top) / f).relative_to(root).as_posix()
                rec.files[rel] = stamp(Path(root) / rel)
    rec.write()


def clear_stale(root: Path, rec: Record | None, keys) -> None:
    """Clean each ``root/jobs/<key>/`` that exists without ``DONE`` file by file (see the module docstring).

    Raises:
        HeadcountError: a stale job directory that holds a file that is not headcount's, or is a link.
    """
    root = Path(root)
    changed = False
    for key in keys:
        d = root / "jobs" / key
        if not os.path.lexists(d) or (d / DONE).is_file():
            continue
        if d.is_symlink() or not d.is_dir():
            raise HeadcountError(f"{d} is not a job directory headcount wrote (a link or a file); move it away")
        prefix = f"jobs/{key}/"
        for rel in [k for k in (rec.files if rec is not None else {}) if k.startswith(prefix)]:
            p = root / rel
            if rec.owns(rel) and p.is_file() and not p.is_symlink():
                p.unlink()
            rec.forget(rel)  # removed, gone, or the user's now
            changed = True
        if not remove_empty_dirs(d):  # a user's file (or link) is left in the job's folder
            left = sorted((Path(t) / f).relative_to(root).as_posix()
                          for t, ds, fs in os.walk(d) for f in [*fs, *(x for x in ds if os.path.islink(Path(t) / x))])
            if changed:
                rec.write()
            refuse_foreign(root, left or [d.relative_to(root).as_posix()], what="the run directory")
    if changed:
        rec.write()


# -- a running job's own record ---------------------------------------------------------------------
JOB_RECORD = ".headcount-job.json"


class JobRecord(Record):
    """The record of a job's temporary folder while the job runs (written to ``JOB_RECORD`` there).

    Besides the files listed, it keeps the folders headcount lists in full (``listed_dirs``): a
    folder below the job's own is one when, the first time a file under it is listed, it holds no
    file that is not (a Trainer checkpoint and its ``checkpoints/``, a saved ``model/``; not a
    folder such as ``retrain/`` where the job wrote its own files first). A file in such a folder
    that is not listed is the user's.
    """

    def __init__(self, folder: Path, files: dict | None = None, listed_dirs=()):
        super().__init__(folder, "study job", files=files)
        self.listed_dirs: set[str] = set(listed_dirs)
        self._seen: set[str] = set(self.listed_dirs)

    def write(self) -> None:
        for rel in list(self.files):
            parts = rel.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in self._seen:
                    self._seen.add(d)
                    if not self._unlisted_in(d):
                        self.listed_dirs.add(d)
        atomic_write_json(self.folder / JOB_RECORD, {"headcount_job_record": 1,
                                                     "files": dict(sorted(self.files.items())),
                                                     "listed_dirs": sorted(self.listed_dirs)})

    def _unlisted_in(self, d: str) -> bool:
        try:
            entries = list(os.scandir(self.folder / d))
        except OSError:  # not there yet (claimed before written): nothing else in it
            return False
        return any(not e.is_dir(follow_symlinks=False) and f"{d}/{e.name}" not in self.files for e in entries)

    @classmethod
    def read_job(cls, folder: Path) -> "JobRecord | None":
        """The job record of ``folder``; None when the job listed nothing there.

        Raises:
            HeadcountError: a job record that is not one (never trusted: what it would say is unknown).
        """
        path = Path(folder) / JOB_RECORD
        if not os.path.lexists(path):
            return None
        try:
            if path.is_symlink():
                raise ValueError("a link")
            data = parse_json(path.read_text(encoding="utf-8"), str(path))
            files, dirs = data["files"], data["listed_dirs"]
            if data.get("headcount_job_record") != 1 or not isinstance(files, dict) or not isinstance(dirs, list):
                raise ValueError("not a job record")
        except (OSError, ValueError, TypeError, KeyError, HeadcountError) as e:
            raise HeadcountError(f"{path} is not a job record headcount can read ({e}); move the folder "
                                 f"{Path(folder).name} away and run again") from None
        return cls(folder, {str(k): (v if isinstance(v, dict) else None) for k, v in files.items()},
                   [str(d) for d in dirs])


class _JobGuard:
    """What [`headcount.runtime.written`][headcount.runtime.written] finds a direct writer's folder by: ``path``, ``record`` and
    the top-level names there before it began (a job's folder starts empty)."""

    def __init__(self, folder: Path):
        self.path = Path(folder)
        self.record = JobRecord(self.path)
        self._before: set[str] = set()


@contextmanager
def job_guard(workdir: Path) -> Iterator[JobRecord]:
    """Open a job's temporary folder as a direct writer's guard while the job function runs: what
    library code lists as it writes there goes into the folder's [`JobRecord`][headcount.experiments.runner.jobfiles.JobRecord]."""
    guard = _JobGuard(Path(workdir))
    _DIRECT.append(guard)
    try:
        yield guard.record
    finally:
        _DIRECT.remove(guard)


def users_files(folder: Path) -> list[str]:
    """The files (and links) in a job's temporary ``folder`` that are the user's: in a folder its
    job record lists in full, and not listed themselves (relative paths, sorted)."""
    rec = JobRecord.read_job(folder)
    if rec is None or not rec.listed_dirs:
        return []
    folder = Path(folder)
    theirs = []
    for top, dirs, files in os.walk(folder):
        for name in [*files, *(x for x in dirs if os.path.islink(Path(top) / x))]:
            rel = (Path(top) / name).relative_to(folder).as_posix()
            parents = rel.split("/")[:-1]
            if not any("/".join(parents[:i]) in rec.listed_dirs for i in range(1, len(parents) + 1)):
                continue  # the job's own files, in a folder it wrote itself
            if not ((rel in rec.files and rec.owns(rel)) or tmp_session(name) is not None):
                theirs.append(rel)
    return sorted(theirs)


def discard_tmp(folder: Path) -> list[str]:
    """Remove a job's temporary folder (a failed or interrupted job's) but a user's files in it,
    which stay with their folders and the job record that tells them apart (the next run refuses
    the folder, naming them: [`refuse_users_files`][headcount.experiments.runner.jobfiles.refuse_users_files]). Returns the user's files."""
    folder = Path(folder)
    try:
        theirs = users_files(folder)
    except HeadcountError:  # an unreadable job record: the folder stays for the next run to refuse
        return [JOB_RECORD]
    if not theirs:
        shutil.rmtree(folder, ignore_errors=True)
        return []
    keep = {*theirs, JOB_RECORD}
    for top, dirs, files in os.walk(folder):
        for name in [*files, *(x for x in dirs if os.path.islink(Path(top) / x))]:
            if (Path(top) / name).relative_to(folder).as_posix() not in keep:
                (Path(top) / name).unlink()
    remove_empty_dirs(folder)
    return theirs


def refuse_users_files(root: Path, folders) -> None:
    """Refuse, before anything is removed, when the temporary ``folders`` under ``root`` of earlier
    runs' unfinished jobs hold a user's file (one line naming it, relative to ``root``)."""
    theirs = [f"{Path(d).relative_to(root).as_posix()}/{rel}" for d in folders for rel in users_files(d)]
    if theirs:
        raise HeadcountError(
            f"{root} holds {describe(theirs)} inside the temporary folder of an unfinished job of an earlier "
            "run (killed, or the job failed), which headcount did not write there; headcount never deletes a file "
            "it did not write: move it away and run again")


# -- a job's files as bytes (shipped over Ray) and flushed before publishing ------------------------
def _fsync_tree(root: Path) -> None:
    """Flush every file of ``root`` and the directory entries, so a rename publishes complete data."""
    entries = sorted(root.rglob("*"))
    for path in entries:
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for d in [root, *(p for p in entries if p.is_dir())]:
        _fsync_dir(d)


def pack_dir(root: Path, skip: frozenset[str] = RESERVED) -> dict[str, bytes]:
    """Read every file under ``root`` into ``{relative posix path: bytes}`` (for shipping over Ray)."""
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            rel = path.relative_to(root).as_posix()
            if rel not in skip:
                files[rel] = path.read_bytes()
    return files


def unpack_files(files: Mapping[str, bytes], root: Path) -> None:
    """Write ``{relative path: bytes}`` under ``root``, refusing paths that escape it."""
    root = Path(root)
    base = root.resolve()
    for rel, data in files.items():
        target = (root / rel).resolve()
        if base != target and base not in target.parents:
            raise HeadcountError(f"refusing to write {rel!r} outside the job directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)



def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
