"""Content fingerprints of models and task data, so that a result is never reused for other inputs.

A model or a task is named by a path or a name; the files behind the name can change (labels
flipped in a CSV, a checkpoint rewritten in place). Run identities (``finetune``'s ``run.json``,
``magnitude``'s, the ``--out`` marker of ``score``/``prune``/``shrink``) and study job keys
therefore include [`model_fingerprint`][headcount.data.fingerprint.model_fingerprint] and [`task_fingerprint`][headcount.data.fingerprint.task_fingerprint].

Hashes are SHA-256 of the file contents, read once per content ([`headcount.runtime.digests`][headcount.runtime.digests]:
cached by ``(real path, size, mtime_ns, inode, ctime_ns)`` in memory and in
``<cache>/digests.json``), so a large file is read once, not at every run; a file rewritten
in place with its size, inode and mtime restored (``os.utime``) is hashed again. Hub ids are identified by name only (their files
live in the Hugging Face cache, keyed by revision).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from headcount.data.tasks import get_task
from headcount.runtime.digests import file_sha256

def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 (hex, 16 characters) of a file's content, hashed once per content
    ([`file_sha256`][headcount.runtime.digests.file_sha256]: cached by path, size, mtime, inode and
    ctime, the inode change time, which ``os.utime`` cannot set back: any rewrite rehashes).

    >>> import tempfile; f = tempfile.NamedTemporaryFile(delete=False); _ = f.write(b"x"); f.close()
    >>> file_digest(f.name)
    '2d711642b726b044'
    """
    return file_sha256(path)[:16]


def dir_digest(path: str | os.PathLike) -> str:
    """A digest of every file in a directory (recursively; hidden entries and ``checkpoints/`` skipped)."""
    root = Path(path)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or rel.parts[0] == "checkpoints" or not p.is_file():
            continue
        h.update(f"{rel.as_posix()}={file_digest(p)}\n".encode())
    return h.hexdigest()[:16]


def model_fingerprint(spec) -> str | None:
    """The content digest of a local checkpoint (``offline`` included) or GGUF file
    (``offline-decoder`` included); None for a hub id."""
    if spec is None:
        return None
    from headcount.core.offline_models import (  # transformers (1.2 s): not at import, the CLI imports this
        OFFLINE,
        OFFLINE_DECODER,
        offline_decoder_file,
        offline_model_dir,
    )

    try:
        path = (offline_model_dir() if str(spec) == OFFLINE else offline_decoder_file() if str(spec) == OFFLINE_DECODER
                else Path(str(spec)).expanduser())
    except Exception:
        return None
    if path.is_file() and path.suffix == ".gguf":
        return file_digest(path)
    return dir_digest(path) if path.is_dir() else None


def task_fingerprint(task) -> str | None:
    """The digest of a task's definition and of its data files (None when the task cannot be read).

    ``task``: a ``Task``, a registered name or a task YAML path.
    """
    try:
        if not hasattr(task, "source"):
            task = get_task(str(task))
        h = hashlib.sha256(json.dumps(task.describe(), sort_keys=True, default=str).encode())
        h.update(json.dumps([task.label_field, task.train_split, task.validation_split, task.label_ids]).encode())
        files = getattr(task.source, "files", None) or {}
        for split in sorted(files):
            h.update(f"{split}={file_digest(files[split])}\n".encode())
        return h.hexdigest()[:16]
    except Exception:  # the command that uses the task reports the real problem
        return None


def path_fingerprint(value) -> str | None:
    """The digest of a local file or directory named by ``value`` (None when it is not one)."""
    try:
        p = Path(str(value)).expanduser()
        if p.is_file():
            return file_digest(p)
        if p.is_dir():
            return dir_digest(p)
    except (OSError, ValueError):
        pass
    return None


#: params keys that name a model or a task (study jobs); other string values that are local paths
#: (a maps file, a labels file) are fingerprinted as files
_MODEL_KEYS = ("model",)
_TASK_KEYS = ("task", "tasks")


def params_fingerprint(params) -> dict | None:
    """Digests of the inputs a job's params name (models, tasks, local files); None when none.

    >>> params_fingerprint({"steps": 3}) is None
    True
    """
    out: dict[str, str] = {}

    def visit(value, key: str, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                visit(v, str(k), f"{where}.{k}" if where else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(v, key, f"{where}[{i}]")
        elif isinstance(value, str) and value:
            if key in _MODEL_KEYS:
                fp = model_fingerprint(value)
            elif key in _TASK_KEYS:
                fp = task_fingerprint(value)
            elif os.sep in value or value.endswith((".json", ".csv", ".safetensors", ".yaml", ".yml", ".tsv", ".jsonl")):
                fp = path_fingerprint(value)
            else:
                fp = None
            if fp is not None:
                out[where] = fp

    visit(params, "", "")
    return out or None


def run_identity(settings: dict, model=None, task=None, files=()) -> dict:
    """What a command run computes: its settings plus the digests of its model, task and files.

    >>> run_identity({"seed": 1})
    {'settings': {'seed': 1}}
    """
    ident = {"settings": json.loads(json.dumps(settings, default=str))}
    if model is not None:
        ident["model"] = model_fingerprint(model)
    if task is not None:
        ident["task"] = task_fingerprint(task)
    for f in files:
        if f is not None:
            ident.setdefault("files", {})[str(f)] = path_fingerprint(f)
    return ident


__all__ = ["run_identity", "file_digest", "dir_digest", "model_fingerprint", "task_fingerprint", "path_fingerprint",
           "params_fingerprint"]
