"""Atomic writes (a result is either the old file or the complete new one, never half) and the
names of headcount's temporary files.

Every temporary file or folder headcount makes is named ``.headcount-tmp.<session>.<name>...``,
``<session>`` a random token of the process ([`SESSION`][headcount.runtime.atomic.SESSION]): a folder's record
([`headcount.runtime.record`][headcount.runtime.record]) lists the sessions that wrote into it, so a later run can prove that a
leftover temporary file is headcount's before removing it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from headcount.runtime.errors import HeadcountError

TMP_PREFIX = ".headcount-tmp."
#: this process's token, in the name of every temporary file or folder it makes
SESSION = secrets.token_hex(4)
_TMP = re.compile(r"^" + re.escape(TMP_PREFIX) + r"([0-9a-f]{8})\.")


def tmp_prefix(name: str) -> str:
    """The prefix of this process's temporary files for ``name`` (``.headcount-tmp.<session>.<name>.``)."""
    return f"{TMP_PREFIX}{SESSION}.{name}."


def tmp_session(name: str) -> str | None:
    """The session token of a headcount temporary name, None for any other name."""
    m = _TMP.match(name)
    return m.group(1) if m else None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _usual_mode(path, directory: bool = False) -> None:
    """mkstemp/mkdtemp make 0600/0700 files; give results the modes ``open`` would (umask)."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=tmp_prefix(path.name), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _usual_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def json_bytes(obj) -> bytes:
    """How headcount writes a JSON file: indented, keys in their order, a final newline."""
    return (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8")


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_bytes(path, json_bytes(obj))


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; it replaces ``path`` only if the block succeeds.

    Works for files written by libraries that take a file name (``savefig``, ``save_file``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{tmp_prefix(path.name)}{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        _usual_mode(tmp)  # safetensors writes 0600; results get the umask's mode like other files
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _entries_under(root: Path) -> list[str]:
    """Every file, link or other non-folder under ``root`` (any depth) and every linked folder, as relative paths."""
    found = []
    for top, dirs, files in os.walk(root):
        found += [(Path(top) / f).relative_to(root).as_posix() for f in files]
        found += [(Path(top) / d).relative_to(root).as_posix() for d in dirs if os.path.islink(Path(top) / d)]
    return sorted(found)


@contextmanager
def atomic_dir(path: str | os.PathLike, owned=None):
    """Yield a temporary directory that replaces ``path`` (a directory) when the block succeeds.

    An existing ``path`` is replaced only when, at every depth, each file it holds has a namesake
    in the new directory (an earlier version of the same output) and, when ``owned`` is given
    (relative path -> whether that file is headcount's, by its folder's record), is headcount's;
    otherwise [`HeadcountError`][headcount.runtime.errors.HeadcountError] naming them, and nothing is deleted.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=tmp_prefix(path.name), suffix=".tmp"))
    _usual_mode(tmp, directory=True)
    try:
        yield tmp
        for p in tmp.rglob("*"):
            if p.is_file() and not p.is_symlink():
                _usual_mode(p)
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise HeadcountError(f"{path} is an existing file or link, not a directory headcount wrote; move it away")
        if path.exists():
            # replace an earlier version of the same directory only: never delete a file the new
            # one does not replace (a folder of the user's named like an output is refused)
            extra = [rel for rel in _entries_under(path)
                     if not (tmp / rel).is_file() or os.path.islink(path / rel) or (owned is not None and not owned(rel))]
            if extra:
                raise HeadcountError(f"{path} holds {', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}, "
                                     "which the new version would not replace or headcount's record does not list "
                                     "as its own; headcount never deletes a file it did not write: move it away")
            old = path.with_name(f"{tmp_prefix(path.name)}old.{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def remove_empty_dirs(folder) -> bool:
    """Remove ``folder`` and the folders under it that hold nothing, deepest first; a folder that
    holds anything (a user's file) stays with its parents. Whether ``folder`` itself is gone."""
    folder = Path(folder)
    for top, dirs, _ in os.walk(folder, topdown=False):
        for d in dirs:
            try:
                os.rmdir(Path(top) / d)
            except OSError:
                pass  # not empty (or a link): it stays
    try:
        os.rmdir(folder)
    except OSError:
        return False
    return True

