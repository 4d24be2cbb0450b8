"""Checks of a local checkpoint folder before anything loads from it, each refusal one line:
its ``config.json`` (UTF-8 JSON holding an object, finite numbers), pickle-only weights, the
safetensors index and the shards it names, and each shard's safetensors header.

They read files only (no torch, no transformers), so that a study config naming a checkpoint is
checked while it is validated ([`model_ref`][headcount.experiments.runner.config.model_ref]),
before any job runs.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from headcount.runtime.errors import HeadcountError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")

_JSON_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def check_config(path: Path) -> dict:
    """A checkpoint's ``config.json`` must be UTF-8 JSON holding an object (transformers and the
    pruning record read it as a mapping); anything else is refused with one line."""
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise HeadcountError(f"{path} is not UTF-8 text") from None
    except ValueError as e:
        raise HeadcountError(f"{path} is corrupt (not JSON: {e})") from None
    except OSError as e:
        raise HeadcountError(f"cannot read {path}: {e.strerror or e}") from None
    if not isinstance(doc, dict):
        raise HeadcountError(f"{path} holds {_JSON_KINDS.get(type(doc), type(doc).__name__)}, not a JSON object "
                             "(a model config maps names to values: {\"model_type\": ...})")
    check_finite_config(doc, str(path.parent))
    return doc


def check_finite_config(doc, spec) -> None:
    """Refuse a config holding a non-finite number (``layer_norm_eps: NaN`` makes every output NaN)."""
    def walk(value, where):
        if isinstance(value, float) and not math.isfinite(value):
            raise HeadcountError(f"the config.json of {spec!r} sets {where} to {value}; a model config needs "
                                 "finite numbers")
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
    walk(doc, "")


def check_checkpoint_files(path: Path) -> None:
    """Refuse what a local checkpoint must not be loaded from, with one line each.

    - only pickle weights (``pytorch_model.bin``): headcount loads safetensors only, since
      unpickling can run code;
    - a ``model.safetensors.index.json`` that is not JSON, has no ``weight_map``, or names a
      shard outside the checkpoint folder (``../other/model.safetensors``) or one that is missing;
    - an empty or truncated ``model.safetensors`` (its header is checked, not the tensors).
    """
    files = {p.name for p in path.iterdir() if p.is_file()}
    safetensors = {f for f in files if f.endswith(".safetensors")}
    if not safetensors and any(f.endswith(PICKLE_SUFFIXES) for f in files):
        pickled = sorted(f for f in files if f.endswith(PICKLE_SUFFIXES))[0]
        raise HeadcountError(f"{path} holds only pickle weights ({pickled}); headcount refuses to unpickle "
                             "(it can run code): save the model with safe_serialization=True (safetensors)")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            doc = json.loads(index.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise HeadcountError(f"{index} is corrupt (not JSON)") from None
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise HeadcountError(f"{index} has no weight_map (tensor name -> shard file)")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
                raise HeadcountError(f"{index}: shard {shard!r} of {name!r} is not a file inside {path}")
            if not (path / shard).is_file():
                raise HeadcountError(f"{index}: shard {shard!r} is missing from {path}")
        shards = set(weight_map.values())
    else:
        shards = {"model.safetensors"} & safetensors
    for shard in sorted(shards):
        _check_safetensors_header(path / shard)


def _check_safetensors_header(f: Path) -> None:
    """An 8-byte little-endian header size, then that many bytes of a JSON object, then the data.

    Read here, not by ``safetensors.safe_open``: its one error type names neither the bad header
    entry nor the size the header describes (both in the lines below), and it refuses more
    (trailing bytes, gaps between tensors: refused later by the load, which uses it).
    """
    size = f.stat().st_size
    what = f"{f} is not a valid safetensors file"
    if size < 8:
        raise HeadcountError(f"{what} ({'empty' if size == 0 else 'truncated'})")
    with open(f, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > size - 8 or n > 100_000_000:
            raise HeadcountError(f"{what} (truncated or bad header)")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError):
            raise HeadcountError(f"{what} (bad header)") from None
    if not isinstance(header, dict):
        raise HeadcountError(f"{what} (bad header)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise HeadcountError(f"{what} (bad header entry {name!r})")
        end = max(end, offsets[1])
    if 8 + n + end > size:
        raise HeadcountError(f"{what} (truncated: {size} bytes, the header describes {8 + n + end})")
