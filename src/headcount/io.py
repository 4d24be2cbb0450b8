"""Atomic writes (a result is either the old file or the complete new one, never half), and the
``--out`` guard every command uses (:func:`prepare_out`)."""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from .errors import HeadcountError
from .launch import refuse_launcher


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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; it replaces ``path`` only if the block succeeds.

    Works for files written by libraries that take a file name (``savefig``, ``save_file``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        _usual_mode(tmp)  # safetensors writes 0600; results get the umask's mode like other files
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextmanager
def atomic_dir(path: str | os.PathLike, replace_any: bool = False):
    """Yield a temporary directory that replaces ``path`` (a directory) when the block succeeds.

    An existing ``path`` is replaced only when the new directory holds every name it holds (an
    earlier version of the same output); otherwise :class:`HeadcountError`, and nothing is deleted.
    ``replace_any=True``: ``path`` is wholly generated (a report's ``figures/``), replace it anyway.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    _usual_mode(tmp, directory=True)
    try:
        yield tmp
        for p in tmp.rglob("*"):
            if p.is_file() and not p.is_symlink():
                _usual_mode(p)
        if path.exists() and not path.is_dir():
            raise HeadcountError(f"{path} is an existing file, not a directory")
        if path.exists():
            # replace an earlier version of the same directory only: never delete a file the new
            # one does not replace (a folder of the user's named like an output is refused)
            extra = sorted({p.name for p in path.iterdir()} - {p.name for p in tmp.iterdir()})
            if extra and not replace_any:
                raise HeadcountError(f"{path} holds {', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}, "
                                     "which the new version would not replace; refusing to delete it")
            old = path.with_name(f".{path.name}.old.{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# -- output directories: one guard for every command's --out ---------------------------------------
#
# What headcount promises about an --out directory (README, "What headcount promises about your
# files"): it writes only inside it; it never deletes, hides or overwrites a file it did not write;
# an earlier output of the same command is recognised by ``.headcount-out.json`` (the command, its
# identity and the files it wrote); the outputs of one command appear together (they are written
# into a staging directory inside --out and renamed into place only after all of them succeeded);
# a ``.lock`` held with flock keeps two processes out of one directory; temporary files of a killed
# run (``.*.tmp*``, staging directories) are removed by the next run that holds the lock.


OUT_MARKER = ".headcount-out.json"
LOCK_NAME = ".lock"
STAGING_PREFIX = ".headcount-staging."

#: the --out directories this command has taken (cli.main clears it; the Ctrl-C message names the last)
ACTIVE_OUTS: list[Path] = []


#: the names of files that are not results yet, exactly as headcount's writers make them:
#: ``.NAME.XXXXXXXX.tmp`` (mkstemp/mkdtemp), ``.NAME.PID.tmp.SUFFIX`` (atomic_path),
#: ``.NAME.old.PID`` (atomic_dir), ``.headcount-staging.XXXXXXXX[.old].tmp``
_TEMP_NAMES = re.compile(r"^\..+\.([a-z0-9_]{8}|\d+)\.tmp(\.[A-Za-z0-9]+)?$|^\..+\.old\.\d+$"
                         r"|^" + re.escape(STAGING_PREFIX) + r"[a-z0-9_]{8}(\.old)?\.tmp$")


def _is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of headcount's temporary names (see ``_TEMP_NAMES``)."""
    return bool(_TEMP_NAMES.match(name))


def lock_file(directory: Path, what: str = "") -> int:
    """Open ``directory/.lock`` without following links and take an exclusive flock; returns the fd.

    A ``.lock`` that is a symbolic link, a directory, or a file with other hard links is refused
    (writing through it would change another file).

    Raises:
        HeadcountError: the lock is held by another process, or ``.lock`` is not a plain file.
    """
    path = Path(directory) / LOCK_NAME
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP or path.is_symlink():
            raise HeadcountError(f"{path} is a symbolic link; refusing to follow it (remove it)") from None
        if e.errno == errno.EISDIR or path.is_dir():
            raise HeadcountError(f"{path} is a directory, not a lock file (remove it)") from None
        raise HeadcountError(f"cannot create {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise HeadcountError(f"{path} is not a plain lock file (it has other links); remove it")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = os.read(fd, 200).decode(errors="replace").strip()
        finally:
            os.close(fd)
        raise HeadcountError(f"{directory} is in use by another headcount process ({holder or 'unknown'})") from None
    os.ftruncate(fd, 0)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {now}{' ' + what if what else ''}\n".encode())
    return fd


def unlock_file(fd: int | None) -> None:
    if fd is None:
        return
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)
    except (ImportError, OSError):  # pragma: no cover
        pass
    finally:
        os.close(fd)


def read_marker(directory: Path) -> dict | None:
    """The ``.headcount-out.json`` of ``directory`` (None when absent or unreadable)."""
    try:
        data = json.loads((Path(directory) / OUT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("command"), str) else None


def _differences(old, new) -> list[str]:
    if not isinstance(old, dict) or not isinstance(new, dict):
        return ["settings"]
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


class OutDir:
    """A command's ``--out`` directory, checked, locked and cleaned (see :func:`prepare_out`).

    Write the command's outputs into :meth:`staging` and call :meth:`commit`: each staged entry
    replaces its namesake in ``--out`` (earlier files of this command that the new run did not
    write are removed), then the marker records the new identity. Use as a context manager; the
    lock is released and the staging directory removed on exit.
    """

    def __init__(self, path: Path, command: str, identity, fd: int, previous: dict | None,
                 created: Path | None = None, claimed: bool = False):
        self.path = path
        self.command = command
        self.identity = identity
        self._fd = fd
        self._previous = previous
        self._staging: Path | None = None
        self._created = created  # the top directory this run created (removed again if it fails early)
        self._claimed = claimed  # the marker was written by this run

    def _only_ours(self) -> bool:
        return all(p.name in (OUT_MARKER, LOCK_NAME) or _is_temp_name(p.name) for p in self.path.iterdir())

    def _undo(self) -> None:
        """After a failure that wrote nothing: leave the directory as it was before the run."""
        try:
            if not self._only_ours():
                return
            if self._created is not None:
                shutil.rmtree(self.path, ignore_errors=True)
                for d in self.path.parents:  # the empty parents it created, up to self._created
                    if d == self._created.parent:
                        break
                    d.rmdir()
            elif self._claimed:
                (self.path / OUT_MARKER).unlink(missing_ok=True)
        except OSError:  # pragma: no cover - best effort
            pass

    def staging(self) -> Path:
        if self._staging is None:
            self._staging = Path(tempfile.mkdtemp(dir=self.path, prefix=STAGING_PREFIX, suffix=".tmp"))
            _usual_mode(self._staging, directory=True)
        return self._staging

    def commit(self, source: Path | None = None) -> list[str]:
        """Move every entry of ``source`` (default: the staging directory) into ``--out``."""
        source = Path(source) if source is not None else self.staging()
        names = sorted(p.name for p in source.iterdir())
        trash = Path(tempfile.mkdtemp(dir=self.path, prefix=STAGING_PREFIX, suffix=".old.tmp"))
        try:
            for name in names:
                target = self.path / name
                if target.is_dir() and not target.is_symlink():
                    os.replace(target, trash / name)  # a directory cannot replace a non-empty one
                os.replace(source / name, target)
            for name in (self._previous or {}).get("files", []):
                if name not in names and "/" not in name and not name.startswith(".") and (self.path / name).exists():
                    os.replace(self.path / name, trash / name)
            write_marker(self.path, self.command, self.identity, names)
        finally:
            shutil.rmtree(trash, ignore_errors=True)
        self._previous = read_marker(self.path)
        return names

    def close(self, failed: bool = False) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        if failed:
            self._undo()
        unlock_file(self._fd)
        self._fd = None  # the path stays in ACTIVE_OUTS: the Ctrl-C message names it after the unwinding

    def __enter__(self) -> "OutDir":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)


def write_marker(directory: Path, command: str, identity=None, files=None) -> None:
    atomic_write_json(Path(directory) / OUT_MARKER,
                      {"command": command, "identity": identity, "files": list(files or [])})


def check_out_path(out, option: str = "--out") -> Path:
    """Refuse an empty ``--out`` and one that names an existing file; return it as a Path."""
    if out is None or str(out).strip() == "":
        raise HeadcountError(f"{option} must name a directory (got an empty string)")
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise HeadcountError(f"{option} {out} is an existing file, not a directory; choose a directory")
    return path


def prepare_out(out, command: str, *, identity=None, own=(), force: bool = False, echo=None,
                distributed: bool = False) -> OutDir:
    """Check, create, lock and clean a command's ``--out``; returns an :class:`OutDir`.

    Args:
        out: the directory.
        command: the command's name (``"score"``); an earlier output of another command is refused.
        identity: what the run computes (JSON-able). An earlier output of the same command with
            another identity is refused unless ``force`` (then ``echo`` says what is replaced);
            None: the caller checks (``finetune``/``magnitude`` resume).
        own: names (or glob patterns) of what the command writes: an earlier output without a
            marker (written before markers existed) is recognised by them.
        force: replace an earlier output of the same command with other settings.
        echo: where the ``--force`` message goes.
        distributed: the command runs across the ranks of torchrun / accelerate launch (rank 0
            calls this); otherwise a launcher is refused here, before anything is touched.

    Raises:
        HeadcountError: an empty path, an existing file, a non-empty directory that is not an
            earlier output of ``command``, another run without ``force``, a directory that cannot
            be created or written, or one in use by another process.
    """
    path = check_out_path(out)
    if not distributed:
        refuse_launcher(f"headcount {command}")
    created = None
    for d in [path, *path.parents]:
        if d.exists():
            break
        created = d
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise HeadcountError(f"--out {out}: a parent is an existing file") from None
    except OSError as e:
        raise HeadcountError(f"cannot create --out {out}: {e.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise HeadcountError(f"--out {out} is not writable")
    had_lock = os.path.lexists(path / LOCK_NAME)
    fd = lock_file(path, f"headcount {command}")
    try:
        marker = read_marker(path)
        entries = sorted(p.name for p in path.iterdir()
                         if p.name not in (OUT_MARKER, LOCK_NAME) and not _is_temp_name(p.name))
        if marker is not None and marker["command"] != command:
            raise HeadcountError(f"--out {out} holds the output of `headcount {marker['command']}`; "
                                 f"choose another directory for `headcount {command}`")
        if marker is None and entries and not all(any(fnmatch.fnmatchcase(e, pat) for pat in own) for e in entries):
            shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
            raise HeadcountError(f"--out {out} is not empty and was not written by `headcount {command}` "
                                 f"(it holds {shown}); choose a new or empty directory")
        if identity is not None and entries:
            old = marker.get("identity") if marker is not None else "unknown"
            if old is not None and old != identity:
                what = ", ".join(_differences(old, identity))
                if not force:
                    raise HeadcountError(f"--out {out} holds a different `headcount {command}` run (different "
                                         f"{what}); use another --out, or --force to replace its files")
                if echo is not None:
                    echo(f"--force: replacing the earlier {command} run in {out} (different {what}): "
                         f"{', '.join(entries)}")
        for p in path.iterdir():  # temp files of a killed run (we hold the lock: nobody is writing)
            if _is_temp_name(p.name):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
        claimed = marker is None
        if claimed:  # claim it; files found here (an output older than markers) stay unidentified
            write_marker(path, command, None if not entries or identity is None else "unknown", entries)
            marker = read_marker(path)
    except BaseException:
        if not had_lock:  # a refused directory is left exactly as it was
            (path / LOCK_NAME).unlink(missing_ok=True)
        unlock_file(fd)
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    ACTIVE_OUTS.append(path)
    return OutDir(path, command, identity, fd, marker, created=created, claimed=claimed)


def io_error_message(e: OSError) -> str | None:
    """One line for an OSError that is the user's environment, not a bug (full disk, permissions)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device while writing {e.filename or 'results'} (earlier results are kept)"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {e.filename or 'results'}: {e.strerror}"
    return None
