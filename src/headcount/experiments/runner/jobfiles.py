"""Ownership of a run directory's job folders, file by file (docs/promises.md).

A finished ``jobs/<key>/`` is listed in the run directory's record file by file; a ``jobs/<key>/``
without ``DONE`` (its ``DONE`` removed: the store never leaves one) is cleaned of the files the
record lists, then of the folders left empty; a file headcount did not write stays where it is
and refuses the job, naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

from headcount.runtime.atomic import atomic_write_bytes, remove_empty_dirs
from headcount.runtime.errors import HeadcountError
from headcount.runtime.record import Record, refuse_foreign, stamp

DONE = "DONE"


def list_job_files(root: Path, rec: Record | None, key: str) -> None:
    """List every file of the finished ``root/jobs/<key>/`` in the record ``rec`` (None: nothing to list)."""
    if rec is None:
        return
    for top, _, files in os.walk(Path(root) / "jobs" / key):
        for f in files:
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


def write_listed(root: Path, rec: Record | None, rel: str, data: bytes) -> Path:
    """Write ``root/<rel>`` (a job's traceback or output under ``logs/``) atomically, listed in ``rec``.

    Raises:
        HeadcountError: a file of that name is there that ``rec`` does not list as headcount's
            (the user's, or one changed since): it is never replaced.
    """
    path = Path(root) / rel
    if rec is not None:
        refuse_foreign(root, rec.in_the_way([rel]), what="the run directory")
        rec.claim([rel], rewrite=True)  # a kill between the write and the seal leaves it headcount's
        rec.write()
    atomic_write_bytes(path, data)
    if rec is not None:
        rec.seal([rel])
        rec.write()
    return path


def remove_listed(root: Path, rec: Record | None, rel: str) -> None:
    """Remove ``root/<rel>`` when ``rec`` lists it as headcount's (unchanged since); any other file stays."""
    if rec is None or rel not in rec.files:
        return
    path = Path(root) / rel
    if rec.owns(rel) and path.is_file() and not path.is_symlink():
        path.unlink()
    rec.forget(rel)
    rec.write()
