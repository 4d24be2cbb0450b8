"""Reading a JSON file headcount needs, or refusing it in one line that names the file.

Where a file is optional or a best guess (a checkpoint's extra config, a Trainer's history),
readers return None instead and stay with their callers; this is the reader for files whose absence
or corruption stops the command.
"""

from __future__ import annotations

import json
from pathlib import Path

from headcount.runtime.errors import HeadcountError


def read_json(path: Path, what: str = "", *, kind: type | None = None, fix: str = ""):
    """``json.loads`` of ``path``, or one line (HeadcountError) that names it.

    Args:
        path: the file.
        what: what the file is, in words, put before its path in the line (``"scores file"``).
        kind: the JSON type the file must hold (``dict``, ``list``), or None for any.
        fix: what to do about an unreadable or corrupt file, appended to that line.

    >>> read_json("/nonexistent/scores.json", "scores file")
    Traceback (most recent call last):
    headcount.runtime.errors.HeadcountError: scores file /nonexistent/scores.json is missing
    """
    name = f"{what} {path}" if what else str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HeadcountError(f"{name} is missing") from None
    except (OSError, ValueError) as e:  # ValueError: bad JSON and bad UTF-8 (UnicodeDecodeError) alike
        raise HeadcountError(f"{name} is unreadable or corrupt ({type(e).__name__})" + (f"; {fix}" if fix else "")) from None
    if kind is not None and not isinstance(data, kind):
        raise HeadcountError(f"{name} is corrupt (a JSON {kind.__name__} was expected)")
    return data
