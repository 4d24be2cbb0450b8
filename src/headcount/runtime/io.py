"""Atomic writes (a result is either the old file or the complete new one, never half), and the
``--out`` guard every command uses ([`prepare_out`][headcount.runtime.io.prepare_out])."""

from __future__ import annotations

import errno
import glob
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from headcount.runtime.atomic import TMP_PREFIX, _entries_under, _usual_mode, atomic_write_bytes, tmp_prefix
from headcount.runtime.errors import HeadcountError
from headcount.runtime.launch import refuse_launcher
from headcount.runtime.lock import first_missing, lock_file, lock_or_undo, lock_session, remove_created, unlock_file
from headcount.runtime.record import (
    LOCK_NAME,
    RECORD,
    Record,
    first_foreign,
    matches,
    refuse_foreign,
    sealed_intact,
    stamp,
)
from headcount.runtime.written import _DIRECT

# -- output directories: one guard for every command's --out ---------------------------------------
#
# What headcount promises about an --out directory (docs/promises.md, "What headcount promises about your
# files"): it writes only inside it; a file is headcount's only if the folder's record
# (``.headcount-out.json``, see [`headcount.runtime.record`][headcount.runtime.record]) lists it, and nothing else is ever
# replaced or deleted, ``--force`` included; a folder without a record that holds anything is
# refused; the outputs of one command appear together (written into a staging directory inside
# --out and renamed into place only after all of them succeeded); ``.headcount.lock`` held with
# flock keeps two processes out of one directory; temporary files of a killed run are removed by
# the next run only when their session is one the record lists.


#: the --out directories this command has taken (cli.main clears it; the Ctrl-C message names the last)
ACTIVE_OUTS: list[Path] = []

def check_file_out(out, command: str, marker_of, identity=None, force: bool = False, echo=None,
                   example: str = "out.file") -> Path:
    """Refuse a one-file ``--out`` that is a directory, a link, a file headcount did not write
    (``marker_of(path)`` -> its headcount marker dict, None when it has none), or, unless
    ``force``, the output of another identity (``identity`` None: not checked); return it as a Path.
    """
    if out is None or str(out).strip() == "":
        raise HeadcountError("--out must name a file (got an empty string)")
    path = Path(out).expanduser()
    if path.is_dir():
        raise HeadcountError(f"--out {out} is a directory; `headcount {command}` writes one file "
                             f"(e.g. {Path(out) / example})")
    if path.exists() or path.is_symlink():
        if path.is_symlink() or not path.is_file():
            raise HeadcountError(f"--out {out} is not a plain file; refusing to replace it")
        mark = marker_of(path)
        if mark is None:
            raise HeadcountError(f"--out {out} exists and was not written by `headcount {command}`; "
                                 "refusing to overwrite it (choose another file)")
        if not sealed_intact(path):
            raise HeadcountError(f"--out {out} was written by `headcount {command}` but changed since (its bytes no "
                                 "longer match the digest sealed into it); headcount never replaces a file the user "
                                 "edited, --force included: move it away or choose another file")
        if identity is not None and mark.get("identity") != identity:
            if not force:
                raise HeadcountError(f"--out {out} holds a different `headcount {command}` output (another run or "
                                     "settings); use another --out, or --force to replace it")
            if echo is not None:
                echo(f"--force: replacing the earlier `headcount {command}` output in {out}")
    return path


@contextmanager
def one_file_out(path: Path, command: str, option: str = "--out"):
    """The guard of a one-file output (``export --format onnx``, ``explore``): create its folder,
    hold ``.headcount.lock.NAME`` beside it (see [`lock_file`][headcount.runtime.lock.lock_file]; removed after), and on failure
    remove the folders it created. The caller checks the file itself (a file headcount did not
    write is never replaced) before and again inside the block, and writes it atomically.

    The lock is the record of a one-file output: a run killed while writing leaves it, with its
    session, and the next run removes that session's temporary files (``.headcount-tmp.<session>.NAME.*``).
    """
    path = Path(path)
    created = first_missing(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HeadcountError(f"cannot create the folder of {option} {path}: {e.strerror}") from None
    name = f"{LOCK_NAME}.{path.name}"
    ok = False
    try:
        killed = lock_session(path.parent, name)
        try:
            fd = lock_file(path.parent, f"headcount {command}", name=name)
        except HeadcountError as e:
            if "in use" in str(e):
                raise HeadcountError(f"{path} is being written by another headcount process "
                                     f"({path.parent / name} is held)") from None
            raise
        try:
            if killed:  # a killed run's temporary files (its session is in the lock it left)
                for p in path.parent.glob(f"{TMP_PREFIX}{killed}.{glob.escape(path.name)}.*"):
                    p.unlink(missing_ok=True)
            ACTIVE_OUTS.append(path)
            yield path
            ok = True
        finally:
            try:  # removed while held: a process that opened it before waits on a file nobody will hold
                (path.parent / name).unlink()  # and is refused (LOCK_NB); one that comes later makes a new one
            except OSError:
                pass
            unlock_file(fd)
    finally:
        if not ok:
            remove_created(path.parent, created)


def _foreign_under(rec: Record, rel: str) -> list[str]:
    """The files under the folder ``rel`` of ``rec``'s folder (any depth) that are not headcount's:
    listed and unchanged, or, in a folder whose files were never listed (a record of a folder
    sealed whole), every file. Empty when ``rel`` is not a folder."""
    path = rec.folder / rel
    if not path.is_dir() or path.is_symlink():
        return []
    per_file = any(k.startswith(rel + "/") for k in rec.files)
    return [f"{rel}/{sub}" for sub in _entries_under(path)
            if (per_file or os.path.islink(path / sub)) and not rec.owns(f"{rel}/{sub}")]


def _differences(old, new) -> list[str]:
    if not isinstance(old, dict) or not isinstance(new, dict):
        return ["settings"]
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


class OutDir:
    """A command's ``--out`` directory, checked, locked and recorded (see [`prepare_out`][headcount.runtime.io.prepare_out]).

    Two ways to write: stage the outputs in ``staging`` and ``commit`` them (each staged
    entry replaces its namesake, which the record lists; listed files the new run did not write
    are removed), or write the declared ``outputs`` directly into the folder (``finetune``,
    ``magnitude``: they resume); ``close`` then records what they wrote. Use as a context
    manager; the lock is released and the staging directory removed on exit.
    """

    def __init__(self, path: Path, record: Record, outputs, fd: int, before: set[str], identity=None,
                 created: Path | None = None, claimed: bool = False, notice: str | None = None, echo=None,
                 direct: bool = False, record_bytes: bytes | None = None):
        self.path = path
        self.record = record
        self.command = record.command
        self.identity = identity  # recorded when the outputs are committed (the old files keep the old one)
        self.outputs = tuple(outputs)
        self._fd = fd
        self._before = before  # entries present when the run started
        self._staging: Path | None = None
        self._created = created  # the top directory this run created (removed again if it fails early)
        self._claimed = claimed  # the record was written by this run
        self._notice = notice  # the --force message, said when the new outputs are committed
        self._echo = echo
        self._committed = False
        self._direct = direct
        self._record_bytes = record_bytes  # the record as it was: restored when a staged run fails

    def _only_ours(self) -> bool:
        return all(p.name in (RECORD, LOCK_NAME) or p.name.startswith(tmp_prefix("")[:-1])
                   for p in self.path.iterdir())

    def _undo(self) -> None:
        """After a failure that wrote nothing: leave the directory as it was before the run."""
        try:
            if not self._only_ours():
                return
            if self._created is not None:  # remove what this run made, file by file, then the empty folders
                for p in self.path.iterdir():
                    if p.name in (RECORD, LOCK_NAME):
                        p.unlink(missing_ok=True)
                    elif p.name.startswith(tmp_prefix("")[:-1]) and p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p, ignore_errors=True)  # this process's own temporary folder
                    elif p.name.startswith(tmp_prefix("")[:-1]):
                        p.unlink(missing_ok=True)
                remove_created(self.path, self._created)
            elif self._claimed:
                (self.path / RECORD).unlink(missing_ok=True)
                (self.path / LOCK_NAME).unlink(missing_ok=True)
        except OSError:  # pragma: no cover - best effort
            pass

    def staging(self) -> Path:
        if self._staging is None:
            self._staging = Path(tempfile.mkdtemp(dir=self.path, prefix=tmp_prefix("staging"), suffix=".tmp"))
            _usual_mode(self._staging, directory=True)
        return self._staging

    def commit(self, source: Path | None = None) -> list[str]:
        """Move every entry of ``source`` (default: the staging directory) into ``--out``.

        Raises:
            HeadcountError: an entry would replace a file the record does not list as headcount's
                (one put there while the command ran, or changed since headcount wrote it).
        """
        source = Path(source) if source is not None else self.staging()
        names = sorted(p.name for p in source.iterdir())
        rec = self.record
        refuse_foreign(self.path, rec.in_the_way(names))
        stale = [n for n in rec.files if "/" not in n and n not in names and os.path.lexists(self.path / n)]
        refuse_foreign(self.path, [n for n in stale if not rec.owns(n)])
        # at every depth: a folder replaced or removed may hold only headcount's files
        refuse_foreign(self.path, [f for n in [*names, *stale] for f in _foreign_under(rec, n)])
        if self._notice and self._echo is not None:
            self._echo(self._notice)
        rec.claim(names, rewrite=True)  # a kill between the renames and the seal leaves them headcount's
        rec.write()
        self._committed = True  # from here on the record says what reached the folder (never restored)
        trash = Path(tempfile.mkdtemp(dir=self.path, prefix=tmp_prefix("old"), suffix=".tmp"))
        try:
            for name in names:
                target = self.path / name
                if target.is_dir() and not target.is_symlink():
                    os.replace(target, trash / name)  # a directory cannot replace a non-empty one
                os.replace(source / name, target)
            for name in stale:
                os.replace(self.path / name, trash / name)
                rec.forget(name)
            rec.files = {k: v for k, v in rec.files.items() if k in names or os.path.lexists(self.path / k)}
            rec.claim(names)
            rec.seal(names)
            for name in names:  # a folder's files are listed one by one
                if (self.path / name).is_dir() and not (self.path / name).is_symlink():
                    rec.files.update({f"{name}/{sub}": stamp(self.path / name / sub)
                                      for sub in _entries_under(self.path / name)})
            if self.identity is not None:
                rec.identity = self.identity
            rec.write()
        finally:
            shutil.rmtree(trash, ignore_errors=True)
        return names

    def seal(self) -> None:
        """Record the declared outputs the run wrote directly (those that were not there before it or are listed)."""
        rec = self.record
        new = [p.name for p in self.path.iterdir()
               if matches(p.name, self.outputs) and (p.name in rec.files or p.name not in self._before)]
        rec.claim(new)
        rec.seal([n for n in rec.files if matches(n, self.outputs)])  # also drops claims never written
        rec.write()

    def close(self, failed: bool = False) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        try:
            if self._direct and self._fd is not None and not self._only_ours():
                self.seal()  # direct writers (finetune, magnitude), finished or not; staged ones commit
        except OSError:  # pragma: no cover - best effort: the claims stay
            pass
        if failed:
            self._undo()
            if not self._direct and not self._committed and self._record_bytes is not None:
                try:  # nothing of this run reached the folder: its record is left as it was too
                    atomic_write_bytes(self.path / RECORD, self._record_bytes)
                except OSError:  # pragma: no cover - best effort: an extra session is harmless
                    pass
        if self in _DIRECT:
            _DIRECT.remove(self)
        unlock_file(self._fd)
        self._fd = None  # the path stays in ACTIVE_OUTS: the Ctrl-C message names it after the unwinding

    def __enter__(self) -> "OutDir":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)


def check_out_path(out, option: str = "--out") -> Path:
    """Refuse an empty ``--out`` and one that names an existing file; return it as a Path."""
    if out is None or str(out).strip() == "":
        raise HeadcountError(f"{option} must name a directory (got an empty string)")
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise HeadcountError(f"{option} {out} is an existing file, not a directory; choose a directory")
    return path


def _take(path: Path, out, command: str, identity, outputs, force: bool, direct: bool):
    """``prepare_out``'s check of the locked ``--out`` (see there): ``(record, the record file's bytes
    as found or None, whether headcount had no record there, the --force notice or None)``."""
    rec = Record.read(path)
    record_bytes = (path / RECORD).read_bytes() if rec is not None else None
    if rec is None:
        first = first_foreign(path)
        if first is not None:
            raise HeadcountError(f"--out {out} is not empty and headcount has no record of it (it holds {first}); "
                                 "choose a new or empty directory")
    elif rec.command != command:
        raise HeadcountError(f"--out {out} holds the output of `headcount {rec.command}`; "
                             f"choose another directory for `headcount {command}`")
    entries = sorted(p.name for p in path.iterdir() if p.name not in (RECORD, LOCK_NAME))
    notice = None
    if rec is not None:
        refuse_foreign(out, rec.in_the_way([e for e in entries if matches(e, outputs)]))
        ours = [e for e in entries if e in rec.files]
        if identity is not None and ours and rec.identity != identity:
            what = ", ".join(_differences(rec.identity, identity))
            if not force:
                raise HeadcountError(f"--out {out} holds a different `headcount {command}` run (different "
                                     f"{what}); use another --out, or --force to replace its files")
            notice = f"--force: replacing the earlier {command} run in {out} (different {what}): {', '.join(ours)}"
        # in the folders the record lists, sealed or only claimed (a killed direct writer's checkpoints/)
        rec.clean_tmp(["", *(n for n, s in rec.files.items() if (s.get("kind") == "dir" if s else "/" not in n)
                             and (path / n).is_dir() and not (path / n).is_symlink())])
    claimed = rec is None
    if rec is None:
        rec = Record(path, command)
    rec.join_session()  # before any temporary file of this process is made here
    if direct:
        rec.claim(o for o in outputs if not any(c in o for c in "*?["))
    rec.write()
    return rec, record_bytes, claimed, notice


def prepare_out(out, command: str, *, identity=None, outputs=(), force: bool = False, echo=None,
                distributed: bool = False, direct: bool = False) -> OutDir:
    """Check, create, lock and record a command's ``--out``; returns an [`OutDir`][headcount.runtime.io.OutDir].

    Args:
        out: the directory.
        command: the command's name (``"score"``); an earlier output of another command is refused.
        identity: what the run computes (JSON-able). An earlier output of the same command with
            another identity is refused unless ``force`` (then ``echo`` says what is replaced when
            the new outputs are committed); None: the caller checks (``finetune``/``magnitude`` resume).
        outputs: names (or glob patterns) of what the command writes into the folder. An existing
            entry that matches one and that the record does not list as headcount's is refused,
            with or without ``force``.
        force: replace an earlier output of the same command with other settings (its listed files only).
        echo: where the ``--force`` message goes.
        distributed: the command runs across the ranks of torchrun / accelerate launch (rank 0
            calls this); otherwise a launcher is refused here, before anything is touched.
        direct: the command writes ``outputs`` (literal names) straight into the folder and
            resumes (``finetune``, ``magnitude``): they are claimed in the record before it
            starts, so a run killed while writing them leaves them headcount's.

    Raises:
        HeadcountError: an empty path, an existing file, a non-empty directory without headcount's
            record, the output of another command, a file in the way that is not headcount's,
            another run without ``force``, a directory that cannot be created or written, or one in
            use by another process.
    """
    path = check_out_path(out)
    if not distributed:
        refuse_launcher(f"headcount {command}")
    created = first_missing(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise HeadcountError(f"--out {out}: a parent is an existing file") from None
    except OSError as e:
        raise HeadcountError(f"cannot create --out {out}: {e.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise HeadcountError(f"--out {out} is not writable")
    fd, (rec, record_bytes, claimed, notice) = lock_or_undo(
        path, command, created, lambda: _take(path, out, command, identity, outputs, force, direct))
    ACTIVE_OUTS.append(path)
    before = {p.name for p in path.iterdir()}
    guard = OutDir(path, rec, outputs, fd, before, identity=identity, created=created, claimed=claimed, notice=notice,
                   echo=echo, direct=direct, record_bytes=record_bytes)
    if direct:
        _DIRECT.append(guard)
    return guard


def io_error_message(e: OSError) -> str | None:
    """One line for an OSError that is the user's environment, not a bug (full disk, permissions)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device while writing {e.filename or 'results'} (earlier results are kept)"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"cannot write {e.filename or 'results'}: {e.strerror}"
    return None
