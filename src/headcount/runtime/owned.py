"""A folder headcount owns file by file without a command's ``--out`` guard: the offline data
folder of ``headcount data fetch`` (docs/promises.md)."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from headcount.runtime.errors import HeadcountError
from headcount.runtime.lock import first_missing, lock_or_undo, unlock_file
from headcount.runtime.record import Record, refuse_foreign, stamp


@contextmanager
def owned_folder(root: Path, command: str, names: dict[str, Callable[[Path], bool]], subdirs=(),
                 what: str = "the folder"):
    """Create and lock ``root``, check and record the files of ``names`` in its record, yield it.

    ``names``: every file (relative path) the block may write -> a test of a file found there that
    the record does not list: True adopts it (the very bytes headcount writes there), False makes
    it the user's. A name the record lists that changed since, or a user's one, is refused before
    anything is written, and so is a link or file in place of one of ``subdirs``; the folder's
    other files are never touched. The names are claimed before the block and sealed after it
    (a kill leaves them headcount's); a refused folder is left as it was (no lock, no folder).

    Raises:
        HeadcountError: as above; ``root`` is a file, cannot be created, or is in use.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise HeadcountError(f"{what} {root} is an existing file, not a directory")
    created = first_missing(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HeadcountError(f"cannot create {what} {root}: {e.strerror or e}") from None
    fd, rec = lock_or_undo(root, command, created, lambda: _take(root, command, names, subdirs, what))
    try:
        rec.join_session()  # before this process makes temporary files here
        rec.claim(names, rewrite=True)  # checked: each is absent, headcount's, or adopted
        rec.write()
        yield rec
    finally:
        try:
            rec.seal(list(names))  # what is there now (a name never written is dropped)
            rec.write()
        finally:
            unlock_file(fd)


def _take(root: Path, command: str, names, subdirs, what: str) -> Record:
    rec = Record.read(root)
    if rec is not None and rec.command != command:
        raise HeadcountError(f"{root} holds the output of `headcount {rec.command}`; choose another folder")
    if rec is None:
        rec = Record(root, command)
    for sub in subdirs:
        p = root / sub
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            raise HeadcountError(f"{p} is not a folder headcount made (a link or a file); move it away")
    theirs = []
    for rel, adopt in names.items():
        p = root / rel
        if not os.path.lexists(p) or (rel in rec.files and rec.owns(rel)):
            continue
        if rel not in rec.files and p.is_file() and not p.is_symlink() and adopt(p):
            rec.files[rel] = stamp(p)  # the very bytes headcount writes there: adopted
            continue
        theirs.append(rel)
    refuse_foreign(root, theirs, what=what)
    rec.clean_tmp(["", *subdirs], recursive=False)
    return rec
