"""Where headcount keeps fetched data and caches (all overridable by environment variables).

- ``HEADCOUNT_DATA``: fetched offline data (default ``~/.cache/headcount/data``).
- ``HEADCOUNT_CACHE``: caches that can always be rebuilt: tokenized splits, fitted masked-LM
  heads, GGUF files converted to checkpoints (default ``~/.cache/headcount``; tokens under ``tokens/``,
  heads under ``mlm-heads/``, conversions under ``gguf/``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def data_root() -> Path:
    """The folder that ``headcount data fetch`` fills.

    >>> data_root().name in ("data",) or "HEADCOUNT_DATA" in os.environ
    True
    """
    env = os.environ.get("HEADCOUNT_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "headcount" / "data"


def cache_root() -> Path:
    """The root of rebuildable caches (tokenization, fitted masked-LM heads)."""
    env = os.environ.get("HEADCOUNT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "headcount"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_text(*parts: str) -> str:
    """Hex sha256 of strings joined by a separator that cannot occur in text (``\\x1e``)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\x1e")
    return h.hexdigest()
