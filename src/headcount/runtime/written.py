"""What a direct writer (finetune, magnitude) writes while its ``--out`` guard is open: a library
function (the Trainer's checkpoints, a model's ``save_pretrained``) writes inside the folder, and
these functions list, claim, move and remove those files in the folder's record, so that a file is
headcount's only while the record lists it, at every depth.

The open guards are registered here for direct writers (``prepare_out``'s
[`OutDir`][headcount.runtime.io.OutDir], a study job's folder): anything with a ``path``, its
``record`` and ``_before`` (the top-level names there when it opened). These functions find the
guard whose folder holds a path and act on its record. (This module never imports ``io``: ``io``
imports it.)
"""

from __future__ import annotations

import os
from pathlib import Path
from headcount.runtime.atomic import _entries_under, atomic_write_bytes, atomic_write_json, json_bytes, remove_empty_dirs
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import parse_json
from headcount.runtime.record import linked_parent, refuse_foreign, stamp

#: the open guards of direct writers (finetune, magnitude): what [`record_written`][headcount.runtime.written.record_written] and
#: [`remove_written`][headcount.runtime.written.remove_written] update while a library function (the Trainer's checkpoints) writes inside them
_DIRECT: list = []


def _guard_of(path: Path):
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
        remove_empty_dirs(path)
    rec.write()
    return True


def _owned_now(guard, rel: str) -> bool:
    """Whether ``rel`` is headcount's now: listed and unchanged, and, for a name claimed but not yet
    written by this run (a top-level name absent when the run began), not a file that appeared since."""
    rec = guard.record
    if rec.files.get(rel, 0) is None and "/" not in rel and rel not in guard._before:
        return False  # claimed by this run, which has not written it: whoever put it there, not headcount
    return rec.owns(rel)


def write_in_record(folder: Path, rec, rel: str, data: bytes, *, owned=None, what: str = "--out") -> Path:
    """Write ``folder/<rel>`` atomically, listed in ``folder``'s record ``rec`` (None: a plain atomic
    write). A file there that is not headcount's now (``owned``, default ``rec.owns``: the user's, or
    changed since headcount wrote it) is refused with one line naming it (``what``: the folder, in
    words), never written over. The stamp is claimed before the write and sealed after it: a kill
    between the two leaves the file headcount's."""
    path = Path(folder) / rel
    if rec is not None:
        owned = owned or rec.owns
        if os.path.lexists(path) and not (owned(rel) and path.is_file() and not path.is_symlink()):
            refuse_foreign(folder, [rel], what=what)
        rec.claim([rel], rewrite=True)
        rec.write()
    atomic_write_bytes(path, data)
    if rec is not None:
        rec.seal([rel])
        rec.write()
    return path


def remove_in_record(folder: Path, rec, rel: str, *, owned=None, refuse: bool = False, what: str = "--out") -> None:
    """Remove ``folder/<rel>`` only while ``rec`` says, now, that it is headcount's (``owned``, default
    ``rec.owns``), and drop it from the record. Any other file stays: with ``refuse`` the run is
    refused with one line naming it (the run would write that name again). ``rec`` None: nothing."""
    if rec is None:
        return
    path = Path(folder) / rel
    if os.path.lexists(path):
        if (owned or rec.owns)(rel) and path.is_file() and not path.is_symlink():
            path.unlink()
        elif refuse:
            refuse_foreign(folder, [rel], what=what)
    if rel in rec.files:
        rec.forget(rel)
        rec.write()


def write_listed_json(path: Path, obj) -> None:
    """Write a JSON file a direct writer rewrites as it runs (``evaluations.json``), listed in its
    ``--out``'s record after each write ([`write_in_record`][headcount.runtime.written.write_in_record]).
    Outside a guard: a plain atomic write."""
    found = _guard_of(path)
    if found is None:
        atomic_write_bytes(path, json_bytes(obj))
        return
    guard, rel = found
    write_in_record(guard.path, guard.record, rel, json_bytes(obj), owned=lambda r: _owned_now(guard, r))


def remove_listed(path: Path, refuse: bool = True) -> None:
    """Remove one file of a direct writer's ``--out`` only while the record says, now, that it is
    headcount's ([`remove_in_record`][headcount.runtime.written.remove_in_record]; with ``refuse`` a
    user's file there refuses the run, otherwise it stays). Outside a guard the caller's own file goes."""
    found = _guard_of(path)
    if found is None:
        Path(path).unlink(missing_ok=True)
        return
    guard, rel = found
    remove_in_record(guard.path, guard.record, rel, owned=lambda r: _owned_now(guard, r), refuse=refuse)


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
    remove_empty_dirs(src)
    forget_under(src)
    return files


def claim_run(folder: Path, identity: dict, name: str, what: str = "run", write: bool = True,
              unreadable_is_fresh: bool = False) -> dict | None:
    """The resuming direct writers' claim on their folder: refuse it when its identity file ``name``
    (``run.json``, ``magnitude_run.json``) holds another run, naming the settings that differ;
    otherwise, with ``write`` and no identity there yet, write ``identity`` (the run is this folder's
    now; a finished or killed run of the same identity is resumed by the caller). An unreadable file
    is refused, or with ``unreadable_is_fresh`` (finetune's ``run.json``) read as none: a fresh
    start that writes over it. Returns the identity found there (None: none).

    Raises:
        HeadcountError: the file is unreadable, or holds another identity.
    """
    path = Path(folder) / name
    old = None
    if path.is_file():
        try:
            old = parse_json(path.read_text(encoding="utf-8"), str(path))
            if not isinstance(old, dict):
                raise ValueError(name)
        except (OSError, ValueError, HeadcountError):  # ValueError: not JSON, or not an object
            if not unreadable_is_fresh:
                raise HeadcountError(f"{path} is unreadable or corrupt; use another --out or delete it") from None
            old = None
    if old is not None and old != identity:
        diff = sorted(k for k in identity.keys() | old.keys() if old.get(k) != identity.get(k))
        raise HeadcountError(f"{folder} holds a different {what} (different {', '.join(diff)}); "
                             "use another --out or delete it")
    if write and old is None:
        atomic_write_json(path, identity)
    return old
