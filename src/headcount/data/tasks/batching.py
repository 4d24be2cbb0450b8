"""Tokenization (cached on disk) and batches (dynamic padding, grouped by length).

The cache key is the tokenizer's content (its serialised pipeline or vocabulary and special
tokens, not its name), the texts and ``max_length``; labels are not cached (they come from the
[`TaskData`][headcount.data.tasks.base.TaskData]), so a cache entry serves every task with the same texts.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from headcount.data.tasks.base import IGNORE, TaskData
from headcount.runtime.paths import cache_root
from headcount.runtime.atomic import atomic_write_bytes
from headcount.runtime.errors import HeadcountError

_CHUNK = 4096  # texts per tokenizer call


class Encoded(Sequence):
    """Tokenized examples, stored flat (ids of example ``i`` = ``ids[offsets[i]:offsets[i+1]]``).

    Indexing gives ``{"input_ids": [...], "token_type_ids": [...], "labels": int | float}``
    (``token_type_ids`` only when the tokenizer makes them); there is no attention mask:
    [`make_batches`][headcount.data.tasks.batching.make_batches] adds it after padding.
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, type_ids: np.ndarray | None,
                 labels: np.ndarray | None, cache_file: str | None = None):
        self.ids = ids            # [total tokens] int32
        self.offsets = offsets    # [n + 1] int64
        self.type_ids = type_ids  # [total tokens] int8, or None
        self.labels = labels      # [n] int64 / float32, or None
        self.cache_file = cache_file

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example, ``[n]``."""
        return np.diff(self.offsets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        a, b = self.offsets[i], self.offsets[i + 1]
        out = {"input_ids": self.ids[a:b].tolist()}
        if self.type_ids is not None:
            out["token_type_ids"] = self.type_ids[a:b].tolist()
        if self.labels is not None:
            out["labels"] = self.labels[i].item()
        return out

    def __repr__(self) -> str:
        return f"Encoded({len(self)} examples, {len(self.ids)} tokens)"


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of what decides the tokens: pipeline or vocabulary, special tokens, input names."""
    h = hashlib.sha256()
    h.update(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        state.pop("truncation", None)  # call-time settings, not the tokenizer itself
        state.pop("padding", None)
        h.update(json.dumps(state, sort_keys=True).encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
        h.update(json.dumps(getattr(tokenizer, "init_kwargs", {}), sort_keys=True, default=str).encode())
    h.update(json.dumps(sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())).encode())
    h.update(json.dumps([list(getattr(tokenizer, "model_input_names", [])),
                         getattr(tokenizer, "truncation_side", "right")]).encode())
    return h.hexdigest()


def _texts_hash(texts: Sequence[tuple[str, ...]]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update("\x1f".join(t).encode("utf-8", "surrogatepass"))
        h.update(b"\x1e")
    return h.hexdigest()


def tokenize(texts: Sequence[tuple[str, ...]], tokenizer, max_length: int = 128,
             cache_dir: str | os.PathLike | bool | None = None) -> Encoded:
    """Tokenize text tuples (1 or 2 strings each), truncated to ``max_length``; no labels.

    ``cache_dir``: ``None`` = ``$HEADCOUNT_CACHE/tokens`` (default ``~/.cache/headcount/tokens``),
    ``False`` = no cache.
    """
    if max_length < 2:
        raise HeadcountError(f"max_length must be at least 2, not {max_length}")
    limit = getattr(tokenizer, "model_max_length", None)  # the model's positions (load_tokenizer sets it)
    if isinstance(limit, int) and 2 <= limit < max_length:
        max_length = limit
    widths = {len(t) for t in texts}
    if len(widths) > 1 or widths - {1, 2}:
        raise HeadcountError("every example must have one text, or every example two (a pair)")
    path = None
    if cache_dir is not False:
        folder = Path(cache_dir) if cache_dir else cache_root() / "tokens"
        key = hashlib.sha256(f"{tokenizer_fingerprint(tokenizer)}|{max_length}|{_texts_hash(texts)}".encode()).hexdigest()
        path = folder / f"{key[:32]}.npz"
        if path.is_file():
            try:
                with np.load(path) as z:
                    type_ids = z["type_ids"] if z["has_type_ids"] else None
                    return Encoded(z["ids"], z["offsets"], type_ids, None, cache_file=str(path))
            except (OSError, ValueError, KeyError):
                pass  # a damaged entry: tokenize again and overwrite it
    ids, type_ids, offsets = [], [], [0]
    make_types = None
    for start in range(0, len(texts), _CHUNK):
        chunk = texts[start:start + _CHUNK]
        first = [t[0] for t in chunk]
        second = [t[1] for t in chunk] if chunk and len(chunk[0]) == 2 else None
        enc = tokenizer(first, second, truncation=True, max_length=max_length, padding=False,
                        return_attention_mask=False)
        if make_types is None:
            make_types = "token_type_ids" in enc
        for i, seq in enumerate(enc["input_ids"]):
            ids.extend(seq)
            offsets.append(offsets[-1] + len(seq))
            if make_types:
                type_ids.extend(enc["token_type_ids"][i])
    flat = np.asarray(ids, dtype=np.int32)
    offs = np.asarray(offsets, dtype=np.int64)
    types = np.asarray(type_ids, dtype=np.int8) if make_types else None
    if path is not None:
        buf = io.BytesIO()
        np.savez(buf, ids=flat, offsets=offs, type_ids=types if types is not None else np.zeros(0, np.int8),
                 has_type_ids=np.asarray(bool(make_types)))
        try:
            atomic_write_bytes(path, buf.getvalue())
        except OSError:
            path = None  # a read-only cache is not an error: just slower next time
    return Encoded(flat, offs, types, None, cache_file=str(path) if path else None)


def encode(data: TaskData, tokenizer, max_length: int = 128, cache_dir=None) -> Encoded:
    """Tokenize a split (cached on disk) and attach its labels.

    Args:
        data: from ``Task.load``.
        tokenizer: a Hugging Face tokenizer.
        max_length: truncation length (pairs: longest first).
        cache_dir: ``None`` = default cache, ``False`` = no cache, or a folder.

    Returns:
        An [`Encoded`][headcount.data.tasks.batching.Encoded] (list-like of ``{"input_ids", "token_type_ids", "labels"}``).

    >>> enc = encode(task.load("validation"), tokenizer, max_length=64)   # doctest: +SKIP
    >>> enc[0]["input_ids"][:3]                                           # doctest: +SKIP
    [101, 1996, 2143]
    """
    enc = tokenize(data.texts, tokenizer, max_length=max_length, cache_dir=cache_dir)
    enc.labels = np.asarray(data.labels)
    return enc


def _columns(encoded):
    """(ids list-of-arrays, type ids or None, labels or None, lengths) from Encoded or dicts."""
    if isinstance(encoded, Encoded):
        o = encoded.offsets
        ids = [encoded.ids[o[i]:o[i + 1]] for i in range(len(encoded))]
        types = None if encoded.type_ids is None else [encoded.type_ids[o[i]:o[i + 1]] for i in range(len(encoded))]
        return ids, types, encoded.labels, encoded.lengths
    rows = list(encoded)
    ids = [np.asarray(r["input_ids"], dtype=np.int64) for r in rows]
    types = [np.asarray(r["token_type_ids"]) for r in rows] if rows and "token_type_ids" in rows[0] else None
    labels = np.asarray([r["labels"] for r in rows]) if rows and "labels" in rows[0] else None
    return ids, types, labels, np.asarray([len(x) for x in ids], dtype=np.int64)


def batch_order(lengths: np.ndarray, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                group_by_length: bool = True) -> list[np.ndarray]:
    """Indices of each batch.

    Grouped, not shuffled: longest first (stable), so padding is minimal and the largest batch
    comes first. Grouped and shuffled: a seeded permutation, cut into groups of 50 batches, each
    sorted by length, then the batches in seeded random order. Not grouped: data order, or a
    seeded permutation.
    """
    if batch_size < 1:
        raise HeadcountError(f"batch_size must be at least 1, not {batch_size}")
    n = len(lengths)
    rng = np.random.default_rng(seed)
    order = rng.permutation(n) if shuffle else np.arange(n)
    if group_by_length:
        if shuffle:
            group = 50 * batch_size
            order = np.concatenate([g[np.argsort(-lengths[g], kind="stable")]
                                    for g in np.split(order, range(group, n, group))]) if n else order
        else:
            order = np.argsort(-lengths, kind="stable")
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    if shuffle and group_by_length:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def round_up(n: int, multiple: int | None) -> int:
    """``n`` rounded up to a multiple (``None`` or 1: unchanged).

    >>> round_up(45, 8), round_up(45, None)
    (48, 45)
    """
    return -(-int(n) // multiple) * multiple if multiple and multiple > 1 else int(n)


def pad_batch(seqs: list, pad_token_id: int, types: list | None = None, pad_to_multiple_of: int | None = None) -> dict:
    """Right-pad to the longest (rounded up to ``pad_to_multiple_of``): ``input_ids``,
    ``attention_mask`` (and ``token_type_ids``)."""
    import torch  # lazy: headcount.tasks imports without torch (0.4 s; torch adds ~2 s) for data-only use

    width = round_up(max(len(s) for s in seqs), pad_to_multiple_of)
    ids = torch.full((len(seqs), width), int(pad_token_id), dtype=torch.long)  # [batch, seq]
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    tt = torch.zeros((len(seqs), width), dtype=torch.long) if types is not None else None
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.as_tensor(np.asarray(s, dtype=np.int64))
        mask[r, :len(s)] = 1
        if tt is not None:
            tt[r, :len(s)] = torch.as_tensor(np.asarray(types[r], dtype=np.int64))
    out = {"input_ids": ids, "attention_mask": mask}
    if tt is not None:
        out["token_type_ids"] = tt
    return out


def make_batches(encoded, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                 group_by_length: bool = True, pad_token_id: int = 0,
                 pad_to_multiple_of: int | None = None) -> list[dict]:
    """Cut encoded examples into padded tensor batches.

    Args:
        encoded: an [`Encoded`][headcount.data.tasks.batching.Encoded] (or a list of dicts with ``input_ids`` ...).
        batch_size: examples per batch (the last one may be smaller).
        shuffle: seeded random order (for training).
        seed: the seed; same seed, same batches.
        group_by_length: put similar lengths together (less padding).
        pad_token_id: the tokenizer's ``pad_token_id``.
        pad_to_multiple_of: round padded lengths up to this multiple (fewer distinct shapes).

    Returns:
        Batches ``{"input_ids": [b, t], "attention_mask": [b, t], "token_type_ids": [b, t]?,
        "labels": [b]}``; labels are long for classification, float for regression.

    >>> batches = make_batches(encode(data, tokenizer), 32, pad_token_id=tokenizer.pad_token_id)  # doctest: +SKIP
    >>> batches[0]["input_ids"].shape                                                            # doctest: +SKIP
    torch.Size([32, 47])
    """
    import torch  # lazy: keeps headcount.tasks torch-free on import (see pad_batch)

    ids, types, labels, lengths = _columns(encoded)
    batches = []
    for idx in batch_order(lengths, batch_size, shuffle=shuffle, seed=seed, group_by_length=group_by_length):
        b = pad_batch([ids[i] for i in idx], pad_token_id, None if types is None else [types[i] for i in idx],
                      pad_to_multiple_of)
        if labels is not None:
            lab = np.asarray(labels)[idx]
            b["labels"] = (torch.as_tensor(lab, dtype=torch.float32) if lab.dtype.kind == "f"
                           else torch.as_tensor(lab.astype(np.int64)))
        batches.append(b)
    return batches


# -- packing prepared batches for a device: rounded lengths, a token budget ------------------------------
#: fill value of each per-token key when a batch is padded further (others: 0)
_FILL = {"labels": IGNORE, "attention_mask": 0}


def padding_id(model) -> int:
    """The token id ``model`` takes for padding (its config's ``pad_token_id``; 0 without one).

    A decoder's sequence classifier reads the last token that is not this id, so positions added
    to a batch must hold it.

    >>> from types import SimpleNamespace as NS
    >>> padding_id(NS(config=NS(pad_token_id=2))), padding_id(NS(config=NS(pad_token_id=None)))
    (2, 0)
    """
    pid = getattr(getattr(model, "config", None), "pad_token_id", None)
    return 0 if pid is None else int(pid)


def _widen(batch: dict, width: int, pad_token_id: int = 0) -> dict:
    """``batch`` padded on the right to ``width`` tokens; per-token keys (``[b, seq]``) only.

    A batch without ``attention_mask`` gets one (ones over its own tokens), so the added
    positions are masked and the model's outputs at real positions do not change. ``input_ids``
    are filled with ``pad_token_id``: a decoder's sequence classifier finds each row's last real
    token by that id, not by the attention mask (filled with 0 instead, a SmolLM2 classifier
    whose padding id is 2 read the added positions and scored 0.49 where it scores 0.91).
    """
    import torch  # lazy: keeps headcount.tasks torch-free on import (see pad_batch)
    import torch.nn.functional as F

    seq = batch["input_ids"].shape[1]
    if "attention_mask" not in batch:
        batch = {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
    if width == seq:
        return batch
    out = {}
    for k, v in batch.items():
        if torch.is_tensor(v) and v.dim() == 2 and v.shape[1] == seq and not (k == "labels" and v.is_floating_point()):
            v = F.pad(v, (0, width - seq), value=pad_token_id if k == "input_ids" else _FILL.get(k, 0))
        out[k] = v
    return out


def pack_batches(batches, tokens_per_batch: int, pad_to_multiple_of: int | None = None, pad_token_id: int = 0):
    """Merge consecutive prepared batches up to a token budget; yield ``(batch, sizes)``.

    ``sizes`` lists the examples of each original batch in the merged one, in order, so that
    per-batch quantities (the ``gradient`` score's absolute value of each batch's gradient) can
    be taken exactly as on the batches as given. Every batch is padded to its longest sequence
    rounded up to ``pad_to_multiple_of``, and only neighbours with the same rounded length merge,
    so merging adds no padding; the added positions are masked (``attention_mask`` 0, token
    ``labels`` -100), so losses and gradients do not change. Batches grouped by length
    ([`make_batches`][headcount.data.tasks.batching.make_batches]) thus give a handful of shapes (one per rounded length, plus the
    remainders), each filled up to the budget.

    Args:
        batches: dicts with ``input_ids [b, seq]`` (and ``attention_mask``, ``labels`` ...).
        tokens_per_batch: at most this many (padded) tokens per merged batch; a batch larger on
            its own passes alone (1: rounding only, no merging). 0: every batch as given (no
            merging, no rounding).
        pad_to_multiple_of: round padded lengths up to this multiple.
        pad_token_id: the id added positions of ``input_ids`` get (the model's:
            [`padding_id`][headcount.data.tasks.batching.padding_id]).

    >>> import torch
    >>> bs = [{"input_ids": torch.ones(2, 5, dtype=torch.long)}, {"input_ids": torch.ones(2, 3, dtype=torch.long)}]
    >>> [(b["input_ids"].shape, sizes) for b, sizes in pack_batches(bs, 32, 8)]
    [(torch.Size([4, 8]), [2, 2])]
    """
    import torch  # lazy: keeps headcount.tasks torch-free on import (see pad_batch)

    if not tokens_per_batch:
        for b in batches:
            yield b, [int(b["input_ids"].shape[0])]
        return
    group: list[dict] = []
    width = 0

    def flush():
        w = round_up(width, pad_to_multiple_of)
        parts = [_widen(b, w, pad_token_id) for b in group]
        sizes = [int(b["input_ids"].shape[0]) for b in group]
        if len(parts) == 1:
            return parts[0], sizes
        merged = {}
        for k, v in parts[0].items():
            if torch.is_tensor(v):
                merged[k] = torch.cat([p[k] for p in parts])
            elif all(p.get(k) == v for p in parts):
                merged[k] = v
            else:
                raise HeadcountError(f"cannot merge batches that differ in {k!r}")
        return merged, sizes

    for b in batches:
        n, seq = b["input_ids"].shape
        rows = sum(int(g["input_ids"].shape[0]) for g in group)
        bucket = round_up(seq, pad_to_multiple_of)
        # only batches of the same rounded length merge: merging never adds padding
        if group and (bucket != round_up(width, pad_to_multiple_of) or (rows + n) * bucket > tokens_per_batch):
            yield flush()
            group, width = [], 0
        group.append(b)
        width = max(width, int(seq))
    if group:
        yield flush()


def batch_groups(sizes: list[int], device=None):
    """Index of the original batch of each example of a merged batch: ``[sum(sizes)]`` long.

    >>> batch_groups([2, 1]).tolist()
    [0, 0, 1]
    """
    import torch  # lazy: keeps headcount.tasks torch-free on import (see pad_batch)

    return torch.repeat_interleave(torch.arange(len(sizes)), torch.as_tensor(sizes)).to(device or "cpu")
