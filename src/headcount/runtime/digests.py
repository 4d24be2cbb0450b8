"""SHA-256 of files, each read once: cached by ``(real path, size, mtime_ns, inode, ctime_ns)`` in
memory and in ``<cache>/digests.json`` (the headcount cache, ``$HEADCOUNT_CACHE``; headcount
before 2026-12-02 kept 16-character digests in ``fingerprints.json``: another file, so that two
versions sharing a cache never read each other's entries).

Two places hash files this way: run identities and job keys
([`file_digest`][headcount.data.fingerprint.file_digest], 16 characters) and the key of a GGUF file's
conversion ([`converted_dir`][headcount.core.gguf.converted_dir], 24). The inode change time is in
the key because nobody can set it back: a file rewritten in place with its size, inode and mtime
restored (``os.utime``) is hashed again. Files over 1 MiB are remembered across processes (on disk);
smaller ones cost less to hash than to look up.
"""

from __future__ import annotations

import os
from pathlib import Path

from headcount.runtime.atomic import atomic_write_json
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import parse_json
from headcount.runtime.paths import cache_root, sha256_file

_MEMORY: dict[str, str] = {}
_DISK: dict[str, str] | None = None
_CACHE_FILE = "digests.json"
_HEX = 64  # a full sha256; an entry of another length is not one of ours (ignored)
_REMEMBER = 1 << 20  # bytes: larger files are remembered on disk
_BOUND = 5000  # entries kept on disk


def _cache_path() -> Path | None:
    try:
        return cache_root() / _CACHE_FILE
    except Exception:  # pragma: no cover - no cache directory: memory only
        return None


def _disk() -> dict[str, str]:
    global _DISK
    if _DISK is None:
        path = _cache_path()
        try:
            data = parse_json(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else {}
        except (OSError, ValueError, HeadcountError):  # a corrupt cache is rebuilt
            data = {}
        _DISK = ({k: v for k, v in data.items() if isinstance(v, str) and len(v) == _HEX}
                 if isinstance(data, dict) else {})
    return _DISK


def _save_disk() -> None:
    path = _cache_path()
    if path is None:
        return
    try:
        atomic_write_json(path, dict(list(_disk().items())[-_BOUND:]))
    except OSError:  # a read-only cache only costs time
        pass


def file_sha256(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's content (64 characters), hashed once per content.

    >>> import tempfile; f = tempfile.NamedTemporaryFile(delete=False); _ = f.write(b"x"); f.close()
    >>> file_sha256(f.name)[:16]
    '2d711642b726b044'
    """
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_ctime_ns}"
    if key in _MEMORY:
        return _MEMORY[key]
    disk = _disk()
    if key in disk:
        _MEMORY[key] = disk[key]
        return disk[key]
    digest = sha256_file(p)
    _MEMORY[key] = disk[key] = digest
    if st.st_size > _REMEMBER:
        _save_disk()
    return digest


__all__ = ["file_sha256"]
