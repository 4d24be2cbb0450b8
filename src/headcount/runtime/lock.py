"""Locks (``.headcount.lock``, held with flock, never written through a link or into a user's
file) and the folders a run creates (removed again, when it fails, only while they are empty)."""

from __future__ import annotations

import errno
import os
import socket
import stat
from datetime import datetime, timezone
from pathlib import Path

from headcount.runtime.atomic import SESSION
from headcount.runtime.errors import HeadcountError
from headcount.runtime.record import LOCK_NAME

_LOCK_TEXT = "headcount lock: "


def lock_file(directory: Path, what: str = "", name: str = LOCK_NAME, wait: bool = False, _tries: int = 10) -> int:
    """Open ``directory/.headcount.lock`` without following links and take an exclusive flock; returns the fd.
    ``wait``: block until the holder lets go, instead of refusing.

    A lock file that is a symbolic link, a directory, a file with other hard links, or a file that
    holds something other than headcount's lock text is refused (writing through it, or truncating
    it, would change another file).

    Raises:
        HeadcountError: the lock is held by another process, or the lock file is not headcount's.
    """
    path = Path(directory) / name
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    text = (f"{_LOCK_TEXT}session {SESSION} pid {os.getpid()} on {socket.gethostname()} since {now}"
            f"{' ' + what if what else ''}\n").encode()
    created = True
    try:
        fd = _create_with_text(path, text, flags)
        if fd is None:
            created = False  # someone's: headcount's (its text in it) or a user's file (refused below)
            fd = os.open(path, flags)
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
    head = os.pread(fd, 64, 0)
    if head and not head.startswith(_LOCK_TEXT.encode()):
        os.close(fd)
        raise HeadcountError(f"{path} is not headcount's lock file (it holds other text); move it away")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            holder = _holder(fd)
        finally:
            os.close(fd)
        raise HeadcountError(f"{directory} is in use by another headcount process ({holder})") from None
    try:
        on_disk = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        on_disk = None
    if on_disk is None or (on_disk.st_ino, on_disk.st_dev) != (st.st_ino, st.st_dev):
        # the file locked is no longer the one at the path: a refused run removed the folder's new lock
        # (and the folder it had created) between this open and this flock; a lock nobody else can see
        # is no lock, so take the one on disk (bounded: each round needs another process's removal)
        unlock_file(fd)
        if _tries <= 1:
            raise HeadcountError(f"{path} keeps being removed while it is locked; is another program cleaning {directory}?")
        return lock_file(directory, what, name, wait, _tries - 1)
    if not created and not os.pread(fd, 64, 0):
        # an empty file headcount did not create now (a lock appears with its text, see
        # _create_with_text): the user's, never written into or removed
        os.close(fd)
        raise HeadcountError(f"{path} is an empty file that headcount did not create, not headcount's lock file; "
                             "move it away")
    if not created:  # a killed run's lock: this run's text, written over it (never emptied on the way)
        os.pwrite(fd, text, 0)
        os.ftruncate(fd, len(text))
    return fd


def _create_with_text(path: Path, text: bytes, flags: int) -> int | None:
    """Create the file ``path`` holding ``text`` in one step; its open descriptor, None when ``path`` exists.

    On Linux the text is written into an unnamed file of the folder (``O_TMPFILE``) that is then
    linked at ``path``: the lock appears with its text or not at all, so a kill leaves no empty lock
    (an empty ``.headcount.lock`` is always someone else's). Elsewhere (no ``O_TMPFILE``) the file is
    created and written at once, and a kill in between can leave it empty.
    """
    if getattr(os, "O_TMPFILE", 0) and os.path.isdir("/proc/self/fd"):
        try:
            fd = os.open(path.parent, os.O_TMPFILE | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            fd = None  # this file system has no unnamed files
        if fd is not None:
            try:
                os.write(fd, text)
                folder = os.open(path.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
                try:  # a dir fd makes os.link use linkat(AT_SYMLINK_FOLLOW): the /proc link names the unnamed file
                    os.link(f"/proc/self/fd/{fd}", path.name, src_dir_fd=folder, dst_dir_fd=folder)
                finally:
                    os.close(folder)
            except FileExistsError:
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            return fd
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return None
    os.write(fd, text)
    return fd


def _holder(fd: int) -> str:
    """Who a held lock names (its text after the marker), or ``unknown``."""
    return os.pread(fd, 200, 0).decode(errors="replace").strip().removeprefix(_LOCK_TEXT.strip()).strip() or "unknown"


def lock_holder(directory: Path, name: str = LOCK_NAME) -> str | None:
    """Who holds ``directory/.headcount.lock`` now (its text), or None when no process does; takes
    no lock and changes nothing (opened read-only, without following a link)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        return None
    try:
        fd = os.open(Path(directory) / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held: by another process
            return _holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def lock_session(directory: Path, name: str = LOCK_NAME) -> str | None:
    """The session named in an existing headcount lock file (a killed run's), None otherwise."""
    try:
        text = (Path(directory) / name).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    parts = text.removeprefix(_LOCK_TEXT).split()
    return parts[1] if text.startswith(_LOCK_TEXT) and len(parts) > 1 and parts[0] == "session" else None


def first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` (itself included) that does not exist yet: what creating
    ``path`` makes, and what a run that fails early removes again. None when ``path`` exists."""
    path = Path(path)
    return next((d for d in [*reversed(path.parents), path] if not d.exists()), None)


def remove_created(path: Path, created: Path | None) -> None:
    """Remove the folders a failed run created, from ``path`` up to ``created``, each only while it
    is empty (``rmdir``): a folder that holds anything else (a file the user saved meanwhile) stays."""
    if created is None:
        return
    path, created = Path(path), Path(created)
    if path != created and created not in path.parents:
        return
    for d in [path, *path.parents]:
        try:
            d.rmdir()
        except OSError:
            return
        if d == created:
            return


def lock_or_undo(path: Path, command: str, created: Path | None, take):
    """Lock the folder ``path`` for ``headcount <command>`` and return ``(fd, take())``: ``take``
    reads and checks the folder's record under the lock. A refusal (any exception, Ctrl-C included)
    leaves the folder as it was: no lock file unless one was there, none of the folders this run
    made (``created``: [`first_missing`][headcount.runtime.lock.first_missing] before making them)."""
    had_lock = os.path.lexists(Path(path) / LOCK_NAME)
    try:
        fd = lock_file(path, f"headcount {command}")
    except BaseException:
        remove_created(path, created)
        raise
    try:
        return fd, take()
    except BaseException:
        if not had_lock:
            (Path(path) / LOCK_NAME).unlink(missing_ok=True)
        unlock_file(fd)
        remove_created(path, created)
        raise


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


__all__ = ["lock_file", "lock_or_undo", "lock_holder", "lock_session", "unlock_file", "first_missing", "remove_created"]
