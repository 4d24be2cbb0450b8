"""Writing an explorer page: one file, with the promises of an ``--out`` directory (docs/promises.md).

The page is written atomically (the old file or the complete new one, never half), under a
lock beside it (``.headcount.lock.<name>``, held with flock, removed after; a run killed while
writing leaves it, and the next run removes that run's temporary files). An existing file is
replaced only when it is an explorer page (its marker line, :func:`headcount.explorer.page.marker`),
and, unless ``force``, one of the same identity (the same run or model and settings).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..atomic import atomic_write_text
from ..errors import HeadcountError
from ..io import one_file_out
from .page import marker


def identity_of(settings: dict) -> str:
    """A short digest of what a page shows (its settings, paths resolved)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_out(out, identity: str | None, force: bool, echo=None) -> Path:
    """Refuse an ``--out`` that is a directory, a link, a file headcount did not write, or (without
    ``force``) the page of another run or settings; return it as a Path."""
    path = Path(out).expanduser()
    if str(out).strip() == "":
        raise HeadcountError("--out must name a file (got an empty string)")
    if path.is_dir():
        raise HeadcountError(f"--out {out} is a directory; the explorer is one file (e.g. {Path(out) / 'explore.html'})")
    if path.exists() or path.is_symlink():
        if path.is_symlink() or not path.is_file():
            raise HeadcountError(f"--out {out} is not a plain file; refusing to replace it")
        with open(path, "rb") as f:
            mark = marker(f.read(512))
        if mark is None:
            raise HeadcountError(f"--out {out} exists and was not written by `headcount explore`; "
                                 "refusing to overwrite it (choose another file)")
        if identity is not None and mark.get("identity") != identity:
            if not force:
                raise HeadcountError(f"--out {out} holds the explorer of another run or settings; "
                                     "use another --out, or --force to replace it")
            if echo is not None:
                echo(f"--force: replacing the earlier explorer page in {out}")
    return path


def write_page(out, text: str, identity: str | None = None, force: bool = False, echo=None) -> Path:
    """Write the page ``text`` to ``out`` (see the module docstring); returns the path."""
    path = check_out(out, identity, force, echo)
    with one_file_out(path, "explore"):
        check_out(out, identity, force=True)  # nobody put another file there meanwhile
        atomic_write_text(path, text)
    return path
