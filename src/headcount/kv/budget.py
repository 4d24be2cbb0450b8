"""The KV budget value: which key/value heads of a decoder keep the full cache and which keep
only a sink and a recent window, with JSON I/O and the memory arithmetic.

A budget is per **KV head** (grouped-query attention: one K/V head serves ``n_heads / n_kv``
query heads, which all follow its budget; the K/V are never repeated per query head). A full KV
head caches every token; a streaming KV head caches its first ``sink`` tokens (the attention
sinks) and its ``window`` most recent ones, as DuoAttention's streaming heads
(arXiv 2410.10819). [`headcount.kv.cache`][headcount.kv.cache] applies a budget to a model;
the policies of [`headcount.kv.policies`][headcount.kv.policies] make one (from head scores, uniform, random).

``budget.json`` (``docs/kv-budgets.md`` has an example)::

    {"format": "headcount.kv-budget", "version": 1,
     "n_layers": L, "n_heads": H, "n_kv_heads": K, "head_dim": D,
     "full":   [[0|1]*K]*L,          # 1 = the full cache, 0 = sink + window
     "sink":   [[int|null]*K]*L,     # tokens; null where full is 1
     "window": [[int|null]*K]*L,     # tokens; null where full is 1
     "model_window": [int|null]*L,   # the model's own sliding window per layer; null: every token
     ...what it was made from (model, context, memory, scores, method), "bytes": {...}}

Everything else in the file is kept as ``meta`` and written back as it was.

**Windowed layers.** A layer whose attention the model itself bounds by a sliding window of
``W`` tokens (Mistral with a window, Gemma 2/3's local layers) keeps ``min(n, W - 1)`` tokens in
the model's own cache (transformers' ``DynamicCache``), not ``n``: a budget counts that
(``model_window``, from [`model_windows`][headcount.kv.budget.model_windows], which asks the
model's adapter) and streams only KV heads of layers that cache every token; a "full" KV head of
a windowed layer keeps the model's own window.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from headcount.runtime.atomic import atomic_write_json
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import read_json

FORMAT = "headcount.kv-budget"
VERSION = 1
#: the most layers, heads or tokens a budget file may state (a larger count would only exhaust memory)
MAX_SIZE = 10_000
MAX_TOKENS = 2**40
#: bytes of one element of each cache dtype a budget's arithmetic may assume
ELEMENT_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}
_SHAPE = ("n_layers", "n_heads", "n_kv_heads", "head_dim")

#: how a budget's streaming heads attend inside one forward call (a prefill): ``masked`` (the sink +
#: window mask in every call, DuoAttention's training mask: the result does not depend on how the
#: prompt is chunked) or ``full`` (causal over every key the call is given, evicted after it:
#: DuoAttention's inference and kvpress). Decoding one token a call is the same under both.
PREFILL_RULES = ("masked", "full")


def check_prefill(prefill: str) -> str:
    """``prefill`` if it is one of ``PREFILL_RULES``, else one error line.

    >>> check_prefill("full")
    'full'
    """
    if prefill not in PREFILL_RULES:
        raise HeadcountError(f"prefill must be one of {', '.join(PREFILL_RULES)}, not {prefill!r}")
    return prefill


def _json(value) -> str:
    try:
        return json.dumps(value)[:40]
    except (TypeError, ValueError):
        return type(value).__name__


def _whole(value, what: str, low: int, high: int) -> int:
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
          and value == int(value) and low <= value <= high)
    if not ok:
        raise HeadcountError(f"budget '{what}' must be a whole number in {low}..{high}, got {_json(value)}")
    return int(value)


def _entry(value, what: str) -> int | None:
    """A grid entry: null (the full cache) or a whole number of tokens."""
    return None if value is None else _whole(value, what, 0, MAX_TOKENS)


def _rows(value, what: str) -> tuple[tuple, ...]:
    """A ``[n_layers][n_kv]`` grid given in Python (lists or tuples), as tuples (entries unchecked)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise HeadcountError(f"budget '{what}' must be a [n_layers][n_kv_heads] grid (a list of lists), "
                             f"got {_json(value)}")
    for i, row in enumerate(value):
        if not isinstance(row, (list, tuple)) or not row:
            raise HeadcountError(f"budget '{what}[{i}]' must list the layer's KV heads, got {_json(row)}")
    if len(value) > MAX_SIZE or len(value[0]) > MAX_SIZE:
        raise HeadcountError(f"budget '{what}' has more than {MAX_SIZE} layers or KV heads")
    return tuple(tuple(r) for r in value)


def _windows(value, n_layers: int) -> tuple[int | None, ...]:
    """``model_window``: per layer, null or the model's sliding window (>= 1 token)."""
    if value is None:
        return (None,) * n_layers
    if not isinstance(value, (list, tuple)) or len(value) != n_layers:
        got = f"{len(value)} entries" if isinstance(value, (list, tuple)) else _json(value)
        raise HeadcountError(f"budget 'model_window' must list {n_layers} layers (null or the layer's sliding window), "
                             f"got {got}")
    return tuple(None if w is None else _whole(w, f"model_window[{i}]", 1, MAX_TOKENS) for i, w in enumerate(value))


def model_windows(model_or_config) -> tuple[int | None, ...]:
    """Per layer, the sliding window of the model's own attention (None: the layer attends to,
    and caches, every token): the one place budgets ask, and it asks the model's adapter
    (``cache_windows`` of ``headcount.core.arch.decoder.DecoderAdapter``, which a family may override)."""
    from headcount.core.arch import get_adapter

    config = decoder_config(model_or_config)
    return tuple(get_adapter(config).cache_windows(config))


def decoder_config(model_or_config, name: str | None = None):
    """The config of a decoder (``model.config``, or the config itself); an encoder is refused in
    [`require_decoder`][headcount.core.arch.registry.require_decoder]'s one line. Asked of the adapter
    here, not through ``require_decoder`` alone: that returns the layout, which a bare config (what
    ``headcount kv-budget`` reads: no weights) does not have."""
    from headcount.core.arch import is_decoder, require_decoder

    config = getattr(model_or_config, "config", model_or_config)
    if not is_decoder(config):
        require_decoder(config, "a KV budget", name)  # raises for an encoder: the one wording of it
    return config


def _grid(value, what: str, n_layers: int, n_kv: int) -> list:
    """A ``[n_layers][n_kv]`` list of lists (entries checked by the caller)."""
    if not isinstance(value, list) or len(value) != n_layers:
        got = f"{len(value)} rows" if isinstance(value, list) else _json(value)
        raise HeadcountError(f"budget '{what}' must be a list of {n_layers} layers (n_layers), got {got}")
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) != n_kv:
            got = f"{len(row)} entries" if isinstance(row, list) else _json(row)
            raise HeadcountError(f"budget '{what}[{i}]' must list {n_kv} KV heads (n_kv_heads), got {got}")
    return value


@dataclass(frozen=True)
class KVBudget:
    """Per KV head: the full cache, or a sink and a recent window (in tokens).

    Attributes:
        sink: ``[n_layers][n_kv_heads]``: tokens a streaming KV head keeps from the start; None
            for a full KV head.
        window: ``[n_layers][n_kv_heads]``: the most recent tokens a streaming KV head keeps
            (the token being processed is always seen besides them); None for a full KV head.
        n_heads: query heads per layer (query head h reads KV head ``h // (n_heads / n_kv_heads)``).
        head_dim: size of one head's key (and value) vector.
        meta: what the budget was made from (written back as it was read).
        model_window: ``[n_layers]``: the model's own sliding window of each layer, or None where
            the layer caches every token (default: None everywhere). A windowed layer's KV heads
            keep the full (the model's own, window-bounded) cache: they are never streamed.

    Every field is checked when the budget is made (one line naming the field).

    >>> b = KVBudget.uniform(2, 4, 2, 16, sink=4, window=8).with_full([(0, 1)])
    >>> b.full, b.n_full
    ([[False, True], [False, False]], 1)
    >>> b.kv_bytes(100) / b.full_bytes(100)   # (1 x 100 + 3 x 12) / (4 x 100)
    0.34
    """

    sink: Sequence[Sequence[int | None]]
    window: Sequence[Sequence[int | None]]
    n_heads: int
    head_dim: int
    meta: dict = field(default_factory=dict, compare=False)
    model_window: Sequence[int | None] | None = None

    def __post_init__(self):
        sink, window = _rows(self.sink, "sink"), _rows(self.window, "window")
        n_kv = len(sink[0])
        for what, grid in (("sink", sink), ("window", window)):
            if len(grid) != len(sink):
                raise HeadcountError(f"budget '{what}' must list {len(sink)} layers (as 'sink' does), got {len(grid)}")
            for i, row in enumerate(grid):
                if len(row) != n_kv:
                    raise HeadcountError(f"budget '{what}[{i}]' must list {n_kv} KV heads (every layer the same), "
                                         f"got {len(row)}")
        sink = tuple(tuple(_entry(v, f"sink[{i}][{j}]") for j, v in enumerate(r)) for i, r in enumerate(sink))
        window = tuple(tuple(_entry(v, f"window[{i}][{j}]") for j, v in enumerate(r)) for i, r in enumerate(window))
        windows = _windows(self.model_window, len(sink))
        for i, (row_s, row_w) in enumerate(zip(sink, window)):
            for j, (s, w) in enumerate(zip(row_s, row_w)):
                if (s is None) != (w is None):
                    null, given = ("sink", "window") if s is None else ("window", "sink")
                    raise HeadcountError(f"budget '{null}[{i}][{j}]' is null but '{given}[{i}][{j}]' is not: a KV "
                                         "head's sink and window are both null (the full cache) or both given")
                if s is not None and windows[i] is not None:
                    raise HeadcountError(f"budget KV head [{i}][{j}] streams in layer {i}, whose attention is the "
                                         f"model's own sliding window of {windows[i]} tokens: a budget streams only "
                                         "layers that cache every token")
        n_heads, head_dim = _whole(self.n_heads, "n_heads", 1, MAX_SIZE), _whole(self.head_dim, "head_dim", 1, MAX_SIZE)
        if n_heads % n_kv:
            raise HeadcountError(f"budget 'n_heads' {n_heads} is not a multiple of 'n_kv_heads' {n_kv}")
        meta = {} if self.meta is None else self.meta
        if not isinstance(meta, dict):
            raise HeadcountError(f"budget 'meta' must be a dict (what the budget was made from), got {_json(meta)}")
        for name, value in (("sink", sink), ("window", window), ("n_heads", n_heads), ("head_dim", head_dim),
                            ("meta", meta), ("model_window", windows)):
            object.__setattr__(self, name, value)

    # --- making one ----------------------------------------------------------------------
    @classmethod
    def uniform(cls, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, *, sink: int, window: int,
                meta: dict | None = None) -> "KVBudget":
        """Every KV head streams with the same ``sink`` and ``window`` (StreamingLLM)."""
        n_layers, n_kv_heads = _whole(n_layers, "n_layers", 1, MAX_SIZE), _whole(n_kv_heads, "n_kv_heads", 1, MAX_SIZE)
        return cls(((sink,) * n_kv_heads,) * n_layers, ((window,) * n_kv_heads,) * n_layers, n_heads, head_dim,
                   dict(meta or {}))

    @classmethod
    def full_cache(cls, n_layers: int, n_heads: int, n_kv_heads: int, head_dim: int, *,
                   model_window: Sequence[int | None] | None = None) -> "KVBudget":
        """Every KV head keeps the full cache (the model as it is; ``model_window``: its layers' own
        sliding windows, from [`model_windows`][headcount.kv.budget.model_windows])."""
        n_layers, n_kv_heads = _whole(n_layers, "n_layers", 1, MAX_SIZE), _whole(n_kv_heads, "n_kv_heads", 1, MAX_SIZE)
        none = ((None,) * n_kv_heads,) * n_layers
        return cls(none, none, n_heads, head_dim, {}, model_window)

    def with_full(self, heads) -> "KVBudget":
        """A copy in which the KV heads ``heads`` (``(layer, kv_head)`` pairs) keep the full cache."""
        sink, window = [list(r) for r in self.sink], [list(r) for r in self.window]
        try:
            pairs = [tuple(pair) for pair in heads]
        except TypeError:
            raise HeadcountError(f"with_full takes (layer, kv_head) pairs, got {_json(heads)}") from None
        for pair in pairs:
            ok = len(pair) == 2 and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in pair)
            if not ok or not (0 <= pair[0] < self.n_layers and 0 <= pair[1] < self.n_kv_heads):
                raise HeadcountError(f"with_full: {_json([str(v) for v in pair])} is not a (layer, kv_head) pair of "
                                     f"the budget's {self.n_layers} layers x {self.n_kv_heads} KV heads")
            sink[int(pair[0])][int(pair[1])] = window[int(pair[0])][int(pair[1])] = None
        return KVBudget(sink, window, self.n_heads, self.head_dim, dict(self.meta), self.model_window)

    # --- shape ---------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.sink)

    @property
    def n_kv_heads(self) -> int:
        return len(self.sink[0])

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def full(self) -> list[list[bool]]:
        """``[n_layers][n_kv_heads]``: True where the KV head keeps the full cache."""
        return [[s is None for s in row] for row in self.sink]

    @property
    def n_full(self) -> int:
        return sum(map(sum, self.full))

    # --- memory --------------------------------------------------------------------------
    def cached(self, tokens: int) -> list[int]:
        """``[n_layers]``: the tokens the model's own cache keeps per KV head after ``tokens``
        tokens: all of them, or in a layer with a sliding window ``W`` the last ``W - 1`` (the
        current token is added to them when it is processed, as transformers' cache does)."""
        tokens = _whole(tokens, "tokens", 0, MAX_TOKENS)
        return [tokens if w is None else min(tokens, w - 1) for w in self.model_window]

    def slots(self, tokens: int) -> list[list[int]]:
        """``[n_layers][n_kv_heads]``: the tokens each KV head's cache holds after ``tokens``
        tokens: the model's own (full: [`cached`][headcount.kv.budget.KVBudget.cached]), or
        ``min(tokens, sink + window)`` (streaming)."""
        own = self.cached(tokens)
        return [[own[layer] if s is None else min(own[layer], s + (w or 0)) for s, w in zip(rs, rw)]
                for layer, (rs, rw) in enumerate(zip(self.sink, self.window))]

    def _per_slot(self, batch: int, element_size: int) -> int:
        """Bytes of one cached token of one KV head: K and V of ``head_dim`` elements, per row."""
        return (2 * _whole(batch, "batch", 1, MAX_TOKENS) * self.head_dim
                * _whole(element_size, "element_size", 1, 64))

    def kv_bytes(self, tokens: int, *, batch: int = 1, element_size: int = 4) -> int:
        """Bytes of the K and V tensors a cache under this budget holds after ``tokens`` tokens:
        ``2 x batch x head_dim x element_size x`` the sum of [`slots`][headcount.kv.budget.KVBudget.slots]."""
        return self._per_slot(batch, element_size) * sum(map(sum, self.slots(tokens)))

    def full_bytes(self, tokens: int, *, batch: int = 1, element_size: int = 4) -> int:
        """Bytes of the model's own cache after ``tokens`` tokens: every KV head keeps every token,
        or the last ``W - 1`` in a layer with a sliding window ``W`` (what transformers'
        ``DynamicCache(config=...)`` holds)."""
        return self._per_slot(batch, element_size) * self.n_kv_heads * sum(self.cached(tokens))

    # --- checks --------------------------------------------------------------------------
    def check_model(self, model) -> "KVBudget":
        """Raise a one-line error unless this budget fits ``model`` (layers, query heads, KV heads,
        head size)."""
        from headcount.core.arch import require_decoder

        grid = require_decoder(model, "a KV budget")
        if len({len(g) for g in grid.groups}) > 1 or len(grid.groups) != grid.n_layers:
            raise HeadcountError("a KV budget needs a model whose layers each run once (no shared layers)")
        want = {"n_layers": grid.n_layers, "n_heads": grid.n_heads, "n_kv_heads": grid.n_kv_heads,
                "head_dim": grid.head_dim}
        for name, value in want.items():
            if getattr(self, name) != value:
                raise HeadcountError(f"the budget is for {self.n_layers} layers x {self.n_kv_heads} KV heads "
                                     f"({self.n_heads} query heads of {self.head_dim}), the model has {grid.n_layers} x "
                                     f"{grid.n_kv_heads} ({grid.n_heads} of {grid.head_dim}): {name} differs")
        windows = model_windows(model)
        if tuple(self.model_window) != windows:
            raise HeadcountError(f"the budget is for layers with the sliding windows {list(self.model_window)}, the "
                                 f"model's are {list(windows)} (null: every token): model_window differs")
        return self

    # --- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        shape = {"n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv_heads,
                 "head_dim": self.head_dim}
        grids = {"full": [[int(f) for f in row] for row in self.full], "sink": [list(r) for r in self.sink],
                 "window": [list(r) for r in self.window], "model_window": list(self.model_window)}
        meta = {k: v for k, v in self.meta.items() if k not in ("format", "version", *shape, *grids)}
        return {"format": FORMAT, "version": VERSION, **shape, **grids, **meta}

    def save(self, path) -> Path:
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, d) -> "KVBudget":
        """A budget from its JSON form; every field is checked (one line naming the field)."""
        if not isinstance(d, dict):
            raise HeadcountError(f"a budget file holds a JSON object, got {_json(d)}")
        if d.get("format") != FORMAT:
            raise HeadcountError(f"not a KV budget: 'format' must be {FORMAT!r}, got {_json(d.get('format'))}")
        if d.get("version") != VERSION:
            raise HeadcountError(f"budget 'version' {_json(d.get('version'))} is not one this headcount reads ({VERSION})")
        missing = [k for k in (*_SHAPE, "full", "sink", "window") if k not in d]
        if missing:
            raise HeadcountError(f"the budget has no {', '.join(repr(m) for m in missing)}")
        n_layers, n_heads, n_kv, head_dim = (_whole(d[k], k, 1, MAX_SIZE) for k in _SHAPE)
        if n_heads % n_kv:
            raise HeadcountError(f"budget 'n_heads' {n_heads} is not a multiple of 'n_kv_heads' {n_kv}")
        full = _grid(d["full"], "full", n_layers, n_kv)
        sinks, windows = _grid(d["sink"], "sink", n_layers, n_kv), _grid(d["window"], "window", n_layers, n_kv)
        sink: list[list[int | None]] = []
        window: list[list[int | None]] = []
        for layer in range(n_layers):
            sink.append([])
            window.append([])
            for head in range(n_kv):
                f, s, w, at = full[layer][head], sinks[layer][head], windows[layer][head], f"[{layer}][{head}]"
                if isinstance(f, bool) or f not in (0, 1):
                    raise HeadcountError(f"budget 'full{at}' must be 0 or 1, got {_json(f)}")
                if f:
                    if s is not None or w is not None:
                        raise HeadcountError(f"budget KV head {at} keeps the full cache (full 1): its sink and window "
                                             f"must be null, got {_json(s)} and {_json(w)}")
                    sink[-1].append(None)
                    window[-1].append(None)
                else:
                    sink[-1].append(_whole(s, f"sink{at}", 0, MAX_TOKENS))
                    window[-1].append(_whole(w, f"window{at}", 0, MAX_TOKENS))
        meta = {k: v for k, v in d.items()
                if k not in ("format", "version", *_SHAPE, "full", "sink", "window", "model_window")}
        return cls(sink, window, n_heads, head_dim, meta, _windows(d.get("model_window"), n_layers))

    @classmethod
    def load(cls, path) -> "KVBudget":
        """Read and check ``budget.json`` (a missing, unreadable or malformed file: one error line)."""
        path = Path(path)
        d = read_json(path, "budget file")
        try:
            return cls.from_dict(d)
        except HeadcountError as e:
            raise HeadcountError(f"{path}: {e}") from None


__all__ = ["KVBudget", "FORMAT", "VERSION", "ELEMENT_SIZES", "decoder_config", "model_windows"]
