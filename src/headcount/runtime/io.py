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
from headcount.runtime.lock import first_missing, lock_file, lock_session, remove_created, unlock_file
from headcount.runtime.record import (
    LOCK_NAME,
    RECORD,
    Record,
    first_foreign,
    linked_parent,
    matches,
    refuse_foreign,
    sealed_intact,
    stamp,
)

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


#: the open guards of direct writers (finetune, magnitude): what [`record_written`][headcount.runtime.io.record_written] and
#: [`remove_written`][headcount.runtime.io.remove_written] update while a library function (the Trainer's checkpoints) writes inside them
_DIRECT: list["OutDir"] = []


def _guard_of(path: Path) -> "tuple[OutDir, str] | None":
    """The open direct guard whose folder holds ``path``, and ``path`` relative to it."""
    path = Path(os.path.abspath(path))
    for guard in reversed(_DIRECT):
        base = Path(os.path.abspath(guard.path))
        if base in path.parents:
            return guard, path.relative_to(base).as_posix()
    return None


def record_written(path: Path) -> None:
    """List every file under ``path`` (a folder a library wrote inside a direct writer's ``--out``,
    e.g. a Trainer checkpoint) in that ``--out``'s record: ownership is per file, at every depth.
    Outside such a guard (library use, a study job's private folder): nothing to record."""
    found = _guard_of(path)
    if found is None:
        return
    guard, rel = found
    rec = guard.record
    for top, _, files in os.walk(path):
        for f in files:
            sub = (Path(top) / f).relative_to(Path(path)).as_posix()
            rec.files[f"{rel}/{sub}"] = stamp(Path(path) / sub)
    rec.write()


def owned_check(path: Path):
    """For ``atomic_dir``: a test of the files under ``path`` (relative
    paths) by the record of the direct writer's ``--out`` that holds it; None outside such a guard.
    A file the record lists is headcount's while unchanged. One it does not list is headcount's
    only while the record lists ``path`` itself and nothing under it (a folder claimed or sealed
    before its files were listed: a killed run's); once its files are listed, any other is the
    user's. (``atomic_dir`` refuses a file without a namesake in the new version in any case.)"""
    found = _guard_of(path)
    if found is None:
        return None
    guard, rel = found
    rec = guard.record

    def owned(sub: str) -> bool:
        key = f"{rel}/{sub}"
        if key in rec.files:
            return rec.owns(key)
        return rel in rec.files and not any(k.startswith(rel + "/") for k in rec.files)  # listed before files were

    return owned


def remove_written(path: Path) -> bool:
    """Remove a folder inside a direct writer's ``--out`` file by file: the files its record lists
    (unchanged since) go, then the folders left empty; any other file stays where it is (and keeps
    its folders). Returns False when no guard holds ``path`` (the caller's folder is its own)."""
    found = _guard_of(path)
    if found is None:
        return False
    guard, rel = found
    rec = guard.record
    for k in [k for k in rec.files if k.startswith(rel + "/")]:
        p = guard.path / k
        if rec.owns(k) and p.is_file() and not p.is_symlink():
            p.unlink()
        rec.forget(k)
    if os.path.isdir(path) and not os.path.islink(path):
        for top, dirs, _ in os.walk(path, topdown=False):
            for d in dirs:
                try:
                    os.rmdir(Path(top) / d)
                except OSError:
                    pass
        try:
            os.rmdir(path)
        except OSError:
            pass
    rec.write()
    return True


def remove_written_file(path: Path) -> None:
    """Remove one file a direct writer wrote into its ``--out`` (an earlier run's
    ``weight_mask.safetensors`` that is not this result) only while the record says it is
    headcount's; outside such a guard the caller's own file goes.

    Raises:
        HeadcountError: a file is there that the record does not list as headcount's (the user's,
            or changed since): it stays, and the result would sit beside it, so the run is refused.
    """
    path = Path(path)
    found = _guard_of(path)
    if found is None:
        path.unlink(missing_ok=True)
        return
    guard, rel = found
    if not os.path.lexists(path):
        guard.record.forget(rel)
        return
    appeared = "/" not in rel and rel not in guard._before  # absent when this run began: not an earlier run's
    if appeared or not guard.record.owns(rel) or not path.is_file() or path.is_symlink():
        refuse_foreign(guard.path, [rel])
    path.unlink()
    guard.record.forget(rel)
    guard.record.write()


def _owned_now(guard: "OutDir", rel: str) -> bool:
    """Whether ``rel`` is headcount's now: listed and unchanged, and, for a name claimed but not yet
    written by this run (a top-level name absent when the run began), not a file that appeared since."""
    rec = guard.record
    if rec.files.get(rel, 0) is None and "/" not in rel and rel not in guard._before:
        return False  # claimed by this run, which has not written it: whoever put it there, not headcount
    return rec.owns(rel)


def write_listed_json(path: Path, obj) -> None:
    """Write a JSON file a direct writer rewrites as it runs (``evaluations.json``) and list its
    stamp in the record after each write: a file found there that is not headcount's (the user's,
    or changed since headcount wrote it) is refused, never written over. Outside a guard: a plain
    atomic write."""
    from headcount.runtime.atomic import atomic_write_json

    path = Path(path)
    found = _guard_of(path)
    if found is None:
        atomic_write_json(path, obj)
        return
    guard, rel = found
    rec = guard.record
    if os.path.lexists(path) and not (_owned_now(guard, rel) and path.is_file() and not path.is_symlink()):
        refuse_foreign(guard.path, [rel])
    rec.claim([rel], rewrite=True)  # a kill between the write and the stamp leaves it headcount's
    rec.write()
    atomic_write_json(path, obj)
    rec.seal([rel])
    rec.write()


def remove_listed(path: Path, refuse: bool = True) -> None:
    """Remove one file of a direct writer's ``--out`` only while the record says, now, that it is
    headcount's. A file that is not (the user's, saved since the run began or changed since
    headcount wrote it) stays: with ``refuse`` the run is refused with one line naming it (the
    run would write that name again), otherwise it is only dropped from the record. Outside a
    guard the caller's own file goes."""
    path = Path(path)
    found = _guard_of(path)
    if found is None:
        path.unlink(missing_ok=True)
        return
    guard, rel = found
    rec = guard.record
    if os.path.lexists(path):
        if _owned_now(guard, rel) and path.is_file() and not path.is_symlink():
            path.unlink()
        elif refuse:
            refuse_foreign(guard.path, [rel])
    rec.forget(rel)
    rec.write()


def claim_under(folder: Path, names) -> None:
    """Claim ``names`` (relative to ``folder``, a temporary folder a library is about to write
    into inside a direct writer's ``--out``) in the record, so that a later run removes exactly
    these if this one is killed while writing ([`Record.clean_tmp`][headcount.runtime.record.Record.clean_tmp]). Outside a guard: nothing."""
    found = _guard_of(folder)
    if found is None:
        return
    guard, rel = found
    guard.record.claim(f"{rel}/{n}" for n in names)
    guard.record.write()


def forget_under(folder: Path) -> None:
    """Drop the record's entries under ``folder`` (a temporary folder of this process that is gone)."""
    found = _guard_of(folder)
    if found is None:
        return
    guard, rel = found
    for k in [k for k in guard.record.files if k.startswith(rel + "/")]:
        guard.record.forget(k)
    guard.record.write()


def move_listed(src: Path, dst: Path, last: tuple[str, ...] = ()) -> list[str]:
    """Move the files of ``src`` (a temporary folder this process wrote) into the folder ``dst``,
    file by file, ``last`` ones last (a Trainer checkpoint: ``trainer_state.json``, which makes
    it complete). Inside a direct writer's ``--out`` every file is first listed in the record
    under its final name, so a kill during the moves leaves only listed files in ``dst``; a file
    in the way that the record does not list as headcount's (a user's note saved into a cut-short
    checkpoint) is refused with one line, before anything moves. ``src`` is removed when empty
    (its claims dropped). Returns the files moved (relative paths)."""
    src, dst = Path(src), Path(dst)
    files = sorted(_entries_under(src), key=lambda f: (f in last, f))
    found = _guard_of(dst)
    if found is not None:
        guard, rel = found
        rec = guard.record
        theirs = []
        for f in files:
            key = f"{rel}/{f}"
            link = linked_parent(guard.path, key)
            if link or (os.path.lexists(dst / f) and not (rec.owns(key) and (dst / f).is_file()
                                                          and not (dst / f).is_symlink())):
                theirs.append(link or key)
        refuse_foreign(guard.path, sorted(set(theirs)))
        for f in files:
            rec.files[f"{rel}/{f}"] = stamp(src / f)  # the same bytes (and mtime) once moved
        rec.write()
    elif dst.is_symlink():
        raise HeadcountError(f"{dst} is a link, not a folder headcount wrote; move it away")
    for f in files:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        os.replace(src / f, dst / f)
    for top, dirs, _ in os.walk(src, topdown=False):
        for d in dirs:
            try:
                os.rmdir(Path(top) / d)
            except OSError:
                pass
    try:
        os.rmdir(src)
    except OSError:
        pass
    forget_under(src)
    return files


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


def read_marker(directory: Path) -> dict | None:
    """The record of ``directory`` as a dict (command, identity, files), None when there is none."""
    rec = Record.read(directory)
    return None if rec is None else {"command": rec.command, "identity": rec.identity, "files": sorted(rec.files)}


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
    had_lock = os.path.lexists(path / LOCK_NAME)
    fd = lock_file(path, f"headcount {command}")
    try:
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
    except BaseException:
        if not had_lock:  # a refused directory is left exactly as it was
            (path / LOCK_NAME).unlink(missing_ok=True)
        unlock_file(fd)
        remove_created(path, created)
        raise
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
