"""Where headcount keeps fetched data and caches (all overridable by environment variables).

- ``HEADCOUNT_DATA``: fetched offline data (default ``~/.cache/headcount/data``).
- ``HEADCOUNT_CACHE``: caches that can always be rebuilt: tokenized splits, fitted masked-LM
  heads, GGUF files converted to checkpoints (default ``~/.cache/headcount``; tokens under ``tokens/``,
  heads under ``mlm-heads/``, conversions under ``gguf/``).
- ``HEADCOUNT_GGUF_CACHE``: ``off`` keeps GGUF files out of the cache: every load reads (and
  dequantises) the GGUF file itself and nothing is written under ``gguf/``; unset or ``on``: a
  GGUF file is converted once to a float32 checkpoint under ``gguf/`` that later loads read
  ([`headcount.core.gguf`][headcount.core.gguf]). An environment variable, not a command-line
  flag: every command that takes ``--model`` loads through the same function.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from headcount.runtime.errors import HeadcountError

#: the environment variable that switches the GGUF conversion cache off (``off``) or on (``on``, or unset)
GGUF_CACHE_ENV = "HEADCOUNT_GGUF_CACHE"


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


def gguf_cache_on() -> bool:
    """Whether GGUF files are converted into the cache (``HEADCOUNT_GGUF_CACHE``: ``on`` or unset,
    ``off``; anything else is refused with one line, so that a typo does not fill a disk).

    >>> os.environ.get(GGUF_CACHE_ENV) is not None or gguf_cache_on()
    True
    """
    value = os.environ.get(GGUF_CACHE_ENV, "").strip().lower()
    if value in ("", "on"):
        return True
    if value == "off":
        return False
    raise HeadcountError(f"{GGUF_CACHE_ENV} must be 'on' or 'off' (got {os.environ[GGUF_CACHE_ENV]!r})")


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
