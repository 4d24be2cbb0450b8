"""What headcount owns in a folder: the record ``.headcount-out.json``.

The rule every writer follows (docs/promises.md): **a file or
folder is headcount's only if the record of the folder it sits in lists it**, and, for a file, only
while its content is what the record says (a SHA-256 for files up to ``HASH_LIMIT``, size and
mtime above). Nothing else is ever replaced or deleted, ``--force`` included: a name headcount
would write that is not headcount's is refused with one line.

Temporary files are named ``.headcount-tmp.<session>.<name>...``: ``<session>`` is a random token
of the process that made them (``SESSION``). A folder's record lists the sessions that wrote
into it *before* they write, so a later run can prove a temporary file is headcount's (its prefix
and a session of the record) and remove it; a user's ``.draft.tmp`` never matches.

Record format (JSON object)::

    {"headcount_record": 1, "command": "score", "identity": {...},
     "files": {"scores.json": {"kind": "file", "size": 812, "sha256": "..."},
               "model": {"kind": "dir"}, "results/jobs.csv": {...}, "metrics.json": null},
     "sessions": ["3f9a0c1e", ...]}

``files`` keys are paths relative to the folder (``/``-separated); ``null`` marks a name claimed by
a run that may be writing it (a killed run's claim stays; the run that finishes replaces it by the
file's stamp, or drops it when the file was not written).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from headcount.runtime.atomic import (
    SESSION,
    TMP_PREFIX,
    atomic_write_json,
    remove_empty_dirs,
    tmp_prefix,
    tmp_session,
)
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import parse_json

RECORD = ".headcount-out.json"
LOCK_NAME = ".headcount.lock"
#: files up to this size are recorded by SHA-256 (cheap); larger ones by size and mtime
HASH_LIMIT = 64 << 20
#: sessions kept in a record (enough for every killed run a folder plausibly sees)
MAX_SESSIONS = 64
FORMAT = 1

def stamp(path: Path) -> dict | None:
    """What the record keeps of ``path``: its kind, and for a file its size and SHA-256 (or mtime)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    import stat as _stat

    if _stat.S_ISDIR(st.st_mode):
        return {"kind": "dir"}
    if not _stat.S_ISREG(st.st_mode):
        return {"kind": "other"}  # a link or a device is never headcount's output
    if st.st_size > HASH_LIMIT:
        return {"kind": "file", "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"kind": "file", "size": st.st_size, "sha256": h.hexdigest()}


def bad_path(rel) -> str | None:
    """Why ``rel`` cannot name a file inside a record's folder, or None when it can.

    A listed path must be relative, ``/``-separated and normalised (no ``.``, ``..`` or empty
    part, no backslash, no NUL), and may not be the record or the lock file itself.
    """
    if not isinstance(rel, str) or not rel:
        return "an empty name"
    if rel.startswith("/") or re.match(r"^[A-Za-z]:", rel) or "\\" in rel:
        return "an absolute path"
    if "\0" in rel or any(part in ("", ".", "..") for part in rel.split("/")) or posixpath.normpath(rel) != rel:
        return "a path that is not normalised inside the folder"
    if rel in (RECORD, LOCK_NAME):
        return "the record or the lock file itself"
    return None


def linked_parent(folder: Path, rel: str) -> str | None:
    """The first folder on the way to ``folder/rel`` (``rel`` excluded) that is a symbolic link, or None."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        sub = "/".join(parts[:i])
        if os.path.islink(Path(folder) / sub):
            return sub
    return None


# -- one-file outputs: the record is inside the file --------------------------------------------------
#
# A one-file output (``export --format onnx``, ``explore``) has no folder of its own, so no record
# beside it: it carries its own. Its headcount marker holds ``SEAL_TAG`` + 64 zeros when the file is
# made; [`seal_bytes`][headcount.runtime.record.seal_bytes] replaces the zeros by the SHA-256 of the whole file as it was with the
# zeros (same length: an ONNX protobuf or a page stays valid). [`sealed_intact`][headcount.runtime.record.sealed_intact] undoes that and
# compares: a file the user edited afterwards (a note added to a page) is no longer headcount's.

SEAL_TAG = "headcount-sha256:"
SEAL_PLACEHOLDER = SEAL_TAG + "0" * 64


def seal_bytes(data: bytes) -> bytes:
    """``data`` with its one seal placeholder replaced by the digest of ``data`` (see above)."""
    mark = SEAL_PLACEHOLDER.encode()
    i = data.find(mark)
    if i < 0 or data.find(mark, i + 1) >= 0:
        raise ValueError("the output must hold exactly one seal placeholder")
    digest = hashlib.sha256(data).hexdigest().encode()
    return data[:i] + SEAL_TAG.encode() + digest + data[i + len(mark):]


def seal_file(path: Path, within: int = 1 << 20) -> None:
    """[`seal_bytes`][headcount.runtime.record.seal_bytes] of a file too large to hold twice in
    memory (a GGUF export): its one placeholder looked for in the first ``within`` bytes, the
    SHA-256 of the whole file (placeholder included) streamed, then written over the zeros in place."""
    mark = SEAL_PLACEHOLDER.encode()
    with open(path, "r+b") as fh:
        head = fh.read(within)
        i = head.find(mark)
        if i < 0 or head.find(mark, i + 1) >= 0:
            raise ValueError("the file must hold exactly one seal placeholder near its start")
        fh.seek(0)
        digest = hashlib.sha256()
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            digest.update(chunk)
        fh.seek(i + len(SEAL_TAG))
        fh.write(digest.hexdigest().encode())


def sealed_intact(path: Path) -> bool:
    """Whether the file at ``path`` is exactly what [`seal_bytes`][headcount.runtime.record.seal_bytes] made (unchanged since)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return False
    tag = SEAL_TAG.encode()
    i = data.find(tag)
    if i < 0 or data.find(tag, i + 1) >= 0:
        return False
    digest = data[i + len(tag):i + len(tag) + 64]
    if len(digest) != 64:
        return False
    blank = data[:i] + SEAL_PLACEHOLDER.encode() + data[i + len(tag) + 64:]
    return hashlib.sha256(blank).hexdigest().encode() == digest


def matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


class Record:
    """The record of one folder. ``read`` it, change it, ``write`` it (atomically)."""

    def __init__(self, folder: Path, command: str, identity=None, files: dict | None = None,
                 sessions: list[str] | None = None):
        self.folder = Path(folder)
        self.command = command
        self.identity = identity
        self.files: dict[str, dict | None] = dict(files or {})
        self.sessions: list[str] = list(sessions or [])

    # -- reading and writing ---------------------------------------------------------------------
    @classmethod
    def read(cls, folder: Path) -> "Record | None":
        """The folder's record; None when there is none (or the file there is not a record).

        Raises:
            HeadcountError: the record lists a path that is absolute, not normalised, outside the
                folder, or reached through a symbolic link: such a record is never trusted (nothing
                it lists is replaced, moved or deleted).
        """
        path = Path(folder) / RECORD
        if not path.is_file() or path.is_symlink():
            return None
        try:
            data = parse_json(path.read_text(encoding="utf-8"), str(path))
        except (OSError, ValueError, HeadcountError):  # HeadcountError: huge integers, deep nesting
            return None
        if (not isinstance(data, dict) or data.get("headcount_record") != FORMAT
                or not isinstance(data.get("command"), str) or not isinstance(data.get("files"), dict)
                or not isinstance(data.get("sessions", []), list)):
            return None
        for k in data["files"]:
            why = bad_path(k) or (f"reached through the symbolic link {linked_parent(folder, k)}"
                                  if linked_parent(folder, k) else None)
            if why:
                raise HeadcountError(
                    f"{path} lists {k!r}, {why}: headcount refuses a record that points outside its folder "
                    "(nothing was changed); restore the record or move the folder away")
        files = {str(k): (v if isinstance(v, dict) else None) for k, v in data["files"].items()}
        sessions = [s for s in data.get("sessions", []) if isinstance(s, str)]
        return cls(folder, data["command"], data.get("identity"), files, sessions)

    def write(self) -> None:
        atomic_write_json(self.folder / RECORD, {
            "headcount_record": FORMAT, "command": self.command, "identity": self.identity,
            "files": dict(sorted(self.files.items())), "sessions": self.sessions[-MAX_SESSIONS:],
        })

    # -- ownership -------------------------------------------------------------------------------
    def owns(self, rel: str) -> bool:
        """Whether ``rel`` is headcount's: listed, and (a file) unchanged since it was recorded."""
        if rel not in self.files or bad_path(rel) or linked_parent(self.folder, rel):
            return False
        if os.path.islink(self.folder / rel):
            return False  # headcount never writes a link: one at a listed name is someone else's
        want = self.files[rel]
        if want is None:  # claimed by a run that may have been killed while writing it
            return True
        now = stamp(self.folder / rel)
        if now is None:
            return True  # gone: nothing to protect
        if want.get("kind") == "dir":
            return now.get("kind") == "dir"
        if now.get("kind") != "file":
            return False
        if "sha256" in want and now.get("sha256"):
            return want["sha256"] == now["sha256"]
        return want.get("size") == now.get("size") and want.get("mtime_ns") == now.get("mtime_ns")

    def in_the_way(self, names: Iterable[str]) -> list[str]:
        """Of ``names`` (relative paths headcount is about to write), those that exist and are not its."""
        return [n for n in names if os.path.lexists(self.folder / n) and not self.owns(n)]

    def claim(self, names: Iterable[str], rewrite: bool = False) -> None:
        """List ``names`` as being written (call before writing them, then ``write``).

        ``rewrite``: the caller checked that the listed ones are headcount's and is about to replace
        them: their stamps become claims too, so a run killed between the write and ``seal``
        leaves them headcount's (not "changed by the user").
        """
        for n in names:
            if rewrite or self.files.get(n) is None:
                self.files[n] = None

    def seal(self, names: Iterable[str] | None = None) -> None:
        """Record the current stamp of ``names`` (default: every listed name); drop the missing."""
        for n in list(self.files if names is None else names):
            s = stamp(self.folder / n)
            if s is None:
                self.files.pop(n, None)
            else:
                self.files[n] = s

    def forget(self, rel: str) -> None:
        self.files.pop(rel, None)

    def join_session(self) -> None:
        """List this process's session (before it makes temporary files here)."""
        if SESSION not in self.sessions:
            self.sessions.append(SESSION)
        self.sessions = self.sessions[-MAX_SESSIONS:]

    def clean_tmp(self, under: Iterable[str] = ("",), recursive: bool = True) -> int:
        """Remove headcount temporary files and folders of this record's sessions (not this process's).

        Looks in the folder and in the subfolders ``under`` (relative paths; ``""`` the folder
        itself, never recursively), recursively when ``recursive``. Returns how many were removed.
        """
        ours = set(self.sessions) - {SESSION}
        found: list[tuple[Path, bool]] = []
        for sub in under:
            base = self.folder / sub if sub else self.folder
            if not base.is_dir() or base.is_symlink():
                continue
            stack = [base]
            while stack:
                d = stack.pop()
                try:
                    entries = list(os.scandir(d))
                except OSError:
                    continue
                for e in entries:
                    if tmp_session(e.name) in ours:
                        found.append((Path(e.path), e.is_dir(follow_symlinks=False)))
                    elif sub and recursive and e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
        # a user's file in one of them refuses the run before anything is removed
        theirs = [x for p, is_dir in found if is_dir for x in self._clean_tmp_dir(p, ours, dry=True)]
        if theirs:
            raise HeadcountError(
                f"{self.folder} holds {describe(theirs)} inside a temporary folder of a killed headcount run, "
                "which headcount did not write there; headcount never deletes a file it did not write: move it "
                "away and run again")
        for p, is_dir in found:
            if is_dir:
                self._clean_tmp_dir(p, ours)
            else:
                p.unlink(missing_ok=True)
        return len(found)

    def _clean_tmp_dir(self, d: Path, ours: set[str], dry: bool = False) -> list[str]:
        """Empty a killed session's temporary folder of what it wrote there, then remove the
        folders left empty. When the record lists files under it (claimed before a library wrote
        them, as for a Trainer checkpoint), only those go, and any other file is returned (the
        user's: it stays). A folder the record lists nothing under (written in one library call:
        its content was never known) goes whole."""
        rel = d.relative_to(self.folder).as_posix()
        listed = [k for k in self.files if k.startswith(rel + "/")]
        if not listed:
            if not dry:
                shutil.rmtree(d, ignore_errors=True)
            return []
        theirs, ours_here = [], []
        for top, dirs, files in os.walk(d):
            for f in [*files, *(x for x in dirs if os.path.islink(Path(top) / x))]:
                p = Path(top) / f
                key = p.relative_to(self.folder).as_posix()
                plain = p.is_file() and not p.is_symlink()
                # a claimed or listed file, or the session's own temporary file (an atomic write cut short)
                (ours_here if plain and ((key in self.files and self.owns(key)) or tmp_session(f) in ours)
                 else theirs).append(p)
        if dry:
            return [p.relative_to(self.folder).as_posix() for p in theirs]
        for p in ours_here:
            p.unlink()
        for k in listed:
            self.forget(k)
        remove_empty_dirs(d)
        return [p.relative_to(self.folder).as_posix() for p in theirs]


def first_foreign(folder: Path, ignore: Iterable[str] = ()) -> str | None:
    """The first entry of a folder without a record (what makes it someone else's), or None."""
    skip = {LOCK_NAME, *ignore}
    names = sorted(p.name for p in Path(folder).iterdir() if p.name not in skip)
    return names[0] if names else None


def describe(names: list[str], limit: int = 3) -> str:
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def refuse_foreign(folder, names: list[str], what: str = "--out") -> None:
    """One line for names headcount would write that are the user's (never replaced, ``--force`` included)."""
    if names:
        raise HeadcountError(
            f"{what} {folder} holds {describe(names)}, which headcount's record there does not list as its own "
            "(or which changed since headcount wrote it); headcount never replaces a file it did not write, "
            "--force included: move it away or choose another directory")


__all__ = ["RECORD", "LOCK_NAME", "TMP_PREFIX", "SESSION", "HASH_LIMIT", "Record", "stamp", "tmp_prefix",
           "tmp_session", "matches", "first_foreign", "refuse_foreign", "bad_path", "linked_parent",
           "SEAL_PLACEHOLDER", "seal_bytes", "seal_file", "sealed_intact"]
