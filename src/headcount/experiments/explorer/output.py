"""Writing an explorer page: one file, with the promises of an ``--out`` directory (docs/promises.md).

The page is written atomically (the old file or the complete new one, never half), under a
lock beside it (``.headcount.lock.<name>``, held with flock, removed after; a run killed while
writing leaves it, and the next run removes that run's temporary files). An existing file is
replaced only when it is an explorer page (its marker line, [`headcount.experiments.explorer.page.marker`][headcount.experiments.explorer.page.marker])
that nobody edited since (the seal line after it: [`sealed_page`][headcount.experiments.explorer.output.sealed_page]), and, unless ``force``, one of the same identity (the same run or model and settings).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from headcount.experiments.explorer.page import marker
from headcount.runtime.atomic import atomic_write_bytes
from headcount.runtime.io import check_file_out, one_file_out
from headcount.runtime.record import SEAL_PLACEHOLDER, seal_bytes


def identity_of(settings: dict) -> str:
    """A short digest of what a page shows (its settings, paths resolved)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _page_marker(path: Path) -> dict | None:
    with open(path, "rb") as f:
        return marker(f.read(512))


def check_out(out, identity: str | None, force: bool, echo=None) -> Path:
    """Refuse an ``--out`` that is a directory, a link, a file headcount did not write, or (without
    ``force``) the page of another run or settings; return it as a Path."""
    return check_file_out(out, "explore", _page_marker, identity, force, echo, example="explore.html")


def sealed_page(text: str) -> bytes:
    """The page's bytes with a seal line after its marker line: the SHA-256 of the page, so that a
    later run replaces the file only while it is byte for byte what headcount wrote (a note the
    user added makes it theirs; [`headcount.runtime.record.sealed_intact`][headcount.runtime.record.sealed_intact])."""
    head, sep, rest = text.partition(" -->\n")
    return seal_bytes(f"{head}{sep}<!-- {SEAL_PLACEHOLDER} -->\n{rest}".encode())


def write_page(out, text: str, identity: str | None = None, force: bool = False, echo=None) -> Path:
    """Write the page ``text`` to ``out`` (see the module docstring); returns the path."""
    path = check_out(out, identity, force, echo)
    with one_file_out(path, "explore"):
        check_out(out, identity, force=True)  # nobody put another file there meanwhile
        atomic_write_bytes(path, sealed_page(text))
    return path
