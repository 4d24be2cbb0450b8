"""KV budgets from head scores: which key/value heads keep the full cache under a memory target.

A budget ([`headcount.core.kvbudget.KVBudget`][headcount.core.kvbudget.KVBudget]) gives every KV head of a decoder either
the full cache or a sink + recent window. Three ways to choose, under the same memory target
(a fraction of the full KV cache at ``context`` tokens):

- [`budget_from_scores`][headcount.importance.budgets.budget_from_scores]: KV heads ranked by score keep the full cache, highest
  first, as long as the target allows; the rest stream (DuoAttention's deployment rule, arXiv
  2410.10819, with a memory target in place of its share of streaming heads);
- [`random_budget`][headcount.importance.budgets.random_budget]: as many full KV heads, chosen at random (seeded): the baseline that
  says whether the scores matter;
- [`uniform_budget`][headcount.importance.budgets.uniform_budget]: every KV head streams, its window as wide as the target allows
  (StreamingLLM, arXiv 2309.17453).

Scores are per query head (``heads [L, H]``, as ``headcount score`` writes them) and, when
present, per KV head (``kv_groups [L, n_kv]``). Without ``kv_groups`` a KV head's score is the
**maximum** over the query heads that read it: the KV head serves its neediest query head, and
streaming it would cut that head's long-range reads whatever its siblings do. Non-finite scores
rank last.

The memory arithmetic: a full KV head holds ``context`` tokens, a streaming one
``min(context, sink + window)``; each token costs ``2 x head_dim x`` bytes per element (K and V)
in every KV head, so the fraction of the full cache is the fraction of token slots.

Layers with a sliding window of their own (``model_window``, from
[`model_windows`][headcount.core.kvbudget.model_windows]) keep ``min(context, W - 1)`` tokens in
the model's cache: the target is a fraction of that real cache, their KV heads keep the model's
own window (a fixed cost) and only the layers that cache every token are budgeted; a model whose
every layer is windowed has nothing to budget (refused).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from headcount.core.kvbudget import ELEMENT_SIZES, KVBudget
from headcount.runtime.bounds import Bound, check_bounds
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import read_json

#: tokens: a sink, a window, a context length
TOKENS = Bound(0, 10**7, integer=True)
CONTEXT = Bound(1, 10**7, integer=True)
#: the memory target: a fraction of the full KV cache, above 0
MEMORY = Bound(0, 1, low_open=True)
#: how a KV head's score is made from its query heads' when the scores give none per KV head
POOLING = "max"


@dataclass(frozen=True)
class KVBudgetSettings:
    """What a budget is made under (the defaults of ``headcount kv-budget``).

    Attributes:
        memory: the KV cache's target size, a fraction of the full cache at ``context`` tokens.
        context: the prompt + generation length the target is computed at.
        sink: tokens a streaming KV head keeps from the start (DuoAttention's deployment: 64).
        window: the most recent tokens a streaming KV head keeps (DuoAttention's: 256).
        dtype: the cache's element type, for the bytes the budget file states.
    """

    memory: float = 0.5
    context: int = 2048
    sink: int = 64
    window: int = 256
    dtype: str = "float32"

    BOUNDS = {"memory": MEMORY, "context": CONTEXT, "sink": TOKENS, "window": TOKENS}

    def __post_init__(self):
        check_bounds(self, self.BOUNDS)
        if self.dtype not in ELEMENT_SIZES:
            raise HeadcountError(f"unknown cache dtype {self.dtype!r}; choose one of {', '.join(ELEMENT_SIZES)}")

    @property
    def element_size(self) -> int:
        return ELEMENT_SIZES[self.dtype]


# --- scores ------------------------------------------------------------------------------------
def _numbers(value, what: str, rows: int, cols: int | None) -> list[list[float]]:
    """A ``[rows][cols]`` grid of numbers (null and non-finite read as NaN: they rank last)."""
    if not isinstance(value, list) or len(value) != rows:
        got = f"{len(value)} rows" if isinstance(value, list) else type(value).__name__
        raise HeadcountError(f"scores '{what}' must have {rows} rows (the model's layers), got {got}")
    out = []
    for i, row in enumerate(value):
        if not isinstance(row, list) or (cols is not None and len(row) != cols) or not row:
            got = f"{len(row)} entries" if isinstance(row, list) else type(row).__name__
            raise HeadcountError(f"scores '{what}[{i}]' must list {cols} heads, got {got}")
        vals = []
        for j, v in enumerate(row):
            if v is None:
                v = math.nan
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise HeadcountError(f"scores '{what}[{i}][{j}]' must be a number, got {json.dumps(v)[:40]}")
            vals.append(float(v))
        out.append(vals)
    return out


def read_scores(path, n_layers: int, n_heads: int, n_kv: int) -> tuple[list[list[float]], dict, str]:
    """KV-head scores from a ``scores.json`` for a model of ``n_layers x n_heads`` query heads
    on ``n_kv`` KV heads.

    Returns:
        ``(kv_scores [n_layers][n_kv], the file's other entries, pooling)``: ``pooling`` is
        ``"kv_groups"`` when the file gives per-KV-head scores, else ``"max"`` (the query heads'
        maximum per group).

    Raises:
        HeadcountError: a missing or malformed file, or one whose grid does not fit the model.
    """
    path = Path(path)
    d = read_json(path, "scores file")
    if not isinstance(d, dict) or "heads" not in d:
        raise HeadcountError(f"{path} is not a scores file: it needs a 'heads' [n_layers][n_heads] grid")
    try:
        heads = _numbers(d["heads"], "heads", n_layers, n_heads)
        if d.get("kv_groups") is not None:
            return _numbers(d["kv_groups"], "kv_groups", n_layers, n_kv), d, "kv_groups"
    except HeadcountError as e:
        raise HeadcountError(f"{path}: {e}") from None
    return kv_head_scores(heads, n_kv), d, POOLING


def kv_head_scores(heads: list[list[float]], n_kv: int) -> list[list[float]]:
    """``[L][n_kv]``: each KV head's score, the maximum over its query heads (query head h reads
    KV head ``h // (H / n_kv)``); NaN scores are left out (a group of NaN only: NaN).

    >>> kv_head_scores([[0.1, 0.9, 0.3, float("nan")]], 2)
    [[0.9, 0.3]]
    """
    group = len(heads[0]) // n_kv
    out = []
    for row in heads:
        kv = []
        for g in range(n_kv):
            vals = [v for v in row[g * group:(g + 1) * group] if math.isfinite(v)]
            kv.append(max(vals) if vals else math.nan)
        out.append(kv)
    return out


# --- choosing the full heads -------------------------------------------------------------------
def _open_layers(n_layers: int, model_window) -> tuple[tuple[int | None, ...], list[int]]:
    """``(model_window per layer, the layers that cache every token)``: the only ones a budget streams."""
    windows = KVBudget.full_cache(n_layers, 1, 1, 1, model_window=model_window).model_window
    open_layers = [layer for layer, w in enumerate(windows) if w is None]
    if not open_layers:
        raise HeadcountError(f"every layer of the model attends within a sliding window ({max(windows)} tokens: its "
                             "own cache is bounded already): a KV budget has no layer to stream")
    return windows, open_layers


def _windowed_share(windows: tuple[int | None, ...], context: int) -> str:
    """``" with the windowed layers' own windows (...)"``, or ``""`` for a model without them: what
    a refusal adds when the windowed layers' fixed cost is part of the arithmetic."""
    own = KVBudget.full_cache(len(windows), 1, 1, 1, model_window=windows)
    if all(w is None for w in windows):
        return ""
    share = 1 - sum(own.cached(context)[layer] for layer, w in enumerate(windows) if w is None) / sum(own.cached(context))
    n = sum(w is not None for w in windows)
    return (f" with the windowed layers' own windows ({n} of {len(windows)} layers: {share:.3f} of the model's own "
            "cache by themselves)")


def _streaming(n_layers: int, n_heads: int, n_kv: int, head_dim: int, sink: int, window: int,
               windows: tuple[int | None, ...]) -> KVBudget:
    """Every KV head of the layers that cache every token streams; the windowed layers' keep the model's window."""
    rows = [((None, None) if w is not None else (sink, window)) for w in windows]
    return KVBudget([(s,) * n_kv for s, _ in rows], [(w,) * n_kv for _, w in rows], n_heads, head_dim,
                    model_window=windows)


def _fits(budget: KVBudget, s: KVBudgetSettings) -> bool:
    full = budget.full_bytes(s.context, element_size=s.element_size)
    return budget.kv_bytes(s.context, element_size=s.element_size) <= s.memory * full * (1 + 1e-12)


def n_full_allowed(n_layers: int, n_heads: int, n_kv: int, head_dim: int, s: KVBudgetSettings, *,
                   model_window=None) -> int:
    """How many KV heads (of the layers that cache every token) may keep the full cache, the
    others streaming with ``s.sink`` and ``s.window``, with the cache at ``s.context`` tokens
    within ``s.memory`` of the model's own (``model_window``: its layers' sliding windows).

    Raises:
        HeadcountError: the target is below what every head's sink + window takes, or every
            layer is windowed (nothing to budget).

    >>> n_full_allowed(30, 9, 3, 64, KVBudgetSettings(memory=0.5, context=2048, sink=4, window=256))
    38
    """
    windows, open_layers = _open_layers(n_layers, model_window)
    stream = _streaming(n_layers, n_heads, n_kv, head_dim, s.sink, s.window, windows)
    total = len(open_layers) * n_kv  # the KV heads a budget may stream
    if not _fits(stream, s):
        low = stream.kv_bytes(s.context, element_size=s.element_size)
        full = stream.full_bytes(s.context, element_size=s.element_size)
        local = _windowed_share(windows, s.context)
        raise HeadcountError(
            f"--memory {s.memory:g} is below the smallest cache these settings allow: every KV head's sink + window "
            f"({s.sink} + {s.window} tokens){local} takes {low:,} of the full {full:,} bytes at {s.context} tokens "
            f"({low / full:.4f}); lower --sink / --window or raise --memory")
    per_stream = min(s.context, s.sink + s.window)
    if per_stream >= s.context:  # a window that covers the context costs (and does) what the full cache does
        return total
    fixed = n_kv * sum(stream.cached(s.context)[layer] for layer, w in enumerate(windows) if w is not None)
    # slots: k x context + (total - k) x per_stream + fixed <= memory x (total x context + fixed)
    k = math.floor((s.memory * (total * s.context + fixed) - fixed - total * per_stream) / (s.context - per_stream)
                   + 1e-9)
    return max(0, min(total, k))


def rank_kv_heads(kv_scores: list[list[float]]) -> list[tuple[int, int]]:
    """``(layer, kv_head)`` from the highest score to the lowest; ties in (layer, head) order,
    non-finite scores last.

    >>> rank_kv_heads([[0.2, 0.9], [float("nan"), 0.2]])
    [(0, 1), (0, 0), (1, 1), (1, 0)]
    """
    keyed = [(-(v if math.isfinite(v) else -math.inf), layer, head)
             for layer, row in enumerate(kv_scores) for head, v in enumerate(row)]
    return [(layer, head) for _, layer, head in sorted(keyed)]


def _made(budget: KVBudget, s: KVBudgetSettings, made_from: dict) -> KVBudget:
    """``budget`` with what it was made from and its bytes at ``s.context`` tokens in its meta."""
    full = budget.full_bytes(s.context, element_size=s.element_size)
    used = budget.kv_bytes(s.context, element_size=s.element_size)
    meta = {"made_from": {**made_from, "context": s.context, "memory": s.memory},
            "n_full": budget.n_full, "n_streaming": budget.n_layers * budget.n_kv_heads - budget.n_full,
            "bytes": {"context": s.context, "batch": 1, "dtype": s.dtype, "full_cache": full, "budget": used,
                      "ratio": used / full}}
    return KVBudget(budget.sink, budget.window, budget.n_heads, budget.head_dim, meta, budget.model_window)


def budget_from_scores(kv_scores: list[list[float]], n_heads: int, head_dim: int, settings: KVBudgetSettings,
                       meta: dict | None = None, *, model_window=None) -> KVBudget:
    """The KV heads with the highest scores keep the full cache, as many as ``settings.memory``
    allows; the others stream with ``settings.sink`` and ``settings.window`` (of the layers that
    cache every token: a windowed layer's heads keep the model's own window, whatever their score).

    Args:
        kv_scores: ``[n_layers][n_kv_heads]`` (higher = needs the long context more).
        n_heads: query heads per layer.
        head_dim: size of one head.
        settings: the memory target and the streaming heads' sizes.
        meta: what the scores came from (written into the budget).
        model_window: the model's sliding window per layer (None: every layer caches every token).

    Examples:
        >>> s = KVBudgetSettings(memory=0.6, context=100, sink=4, window=16)
        >>> b = budget_from_scores([[0.1, 0.7], [0.9, 0.2]], 4, 16, s)
        >>> b.full, b.meta["bytes"]["ratio"]
        ([[False, True], [True, False]], 0.6)
    """
    n_layers, n_kv = len(kv_scores), len(kv_scores[0])
    k = n_full_allowed(n_layers, n_heads, n_kv, head_dim, settings, model_window=model_window)
    windows, _ = _open_layers(n_layers, model_window)
    stream = _streaming(n_layers, n_heads, n_kv, head_dim, settings.sink, settings.window, windows)
    chosen = [head for head in rank_kv_heads(kv_scores) if windows[head[0]] is None][:k]
    return _made(stream.with_full(chosen), settings,
                 {"mode": "scores", **(meta or {}), "sink": settings.sink, "window": settings.window,
                  "kv_scores": kv_scores})


def random_budget(n_layers: int, n_heads: int, n_kv: int, head_dim: int, settings: KVBudgetSettings, seed: int,
                  meta: dict | None = None, *, model_window=None) -> KVBudget:
    """As many full KV heads as [`budget_from_scores`][headcount.importance.budgets.budget_from_scores] would keep, chosen uniformly at
    random (``seed``: Python's ``random.Random``, the same choice on every machine) among the
    layers that cache every token."""
    k = n_full_allowed(n_layers, n_heads, n_kv, head_dim, settings, model_window=model_window)
    windows, open_layers = _open_layers(n_layers, model_window)
    heads = [(layer, head) for layer in open_layers for head in range(n_kv)]
    chosen = sorted(random.Random(seed).sample(heads, k))
    stream = _streaming(n_layers, n_heads, n_kv, head_dim, settings.sink, settings.window, windows)
    return _made(stream.with_full(chosen), settings,
                 {"mode": "random", **(meta or {}), "seed": seed, "sink": settings.sink, "window": settings.window})


def uniform_budget(n_layers: int, n_heads: int, n_kv: int, head_dim: int, settings: KVBudgetSettings,
                   window: int | None = None, meta: dict | None = None, *, model_window=None) -> KVBudget:
    """Every KV head streams with ``settings.sink`` and a window of ``window`` tokens, or (None)
    the widest window the memory target allows: ``floor(memory x context) - sink`` tokens
    (with windowed layers, whose heads keep the model's own window: what the target leaves them,
    shared by the KV heads of the layers that cache every token).

    Raises:
        HeadcountError: the target leaves fewer tokens than the sink, or the window given
            exceeds the target.

    >>> uniform_budget(2, 4, 2, 16, KVBudgetSettings(memory=0.5, context=100, sink=4)).window[0]
    (46, 46)
    """
    s = settings
    windows, open_layers = _open_layers(n_layers, model_window)
    if window is None:
        own = KVBudget.full_cache(n_layers, n_heads, n_kv, head_dim, model_window=windows).cached(s.context)
        fixed = sum(own[layer] for layer, w in enumerate(windows) if w is not None) / len(open_layers)
        # per open KV head: memory x (context + fixed) - fixed = memory x context - (1 - memory) x fixed
        slots = math.floor(s.memory * s.context - (1 - s.memory) * fixed + 1e-9)
        if slots < s.sink:
            raise HeadcountError(f"--memory {s.memory:g} gives each KV head {max(slots, 0)} of {s.context} tokens"
                                 f"{_windowed_share(windows, s.context)}, fewer than its --sink {s.sink}: lower --sink "
                                 "or raise --memory")
        window = slots - s.sink
    budget = _streaming(n_layers, n_heads, n_kv, head_dim, s.sink, window, windows)
    if not _fits(budget, s):
        raise HeadcountError(f"--sink {s.sink} + --window {window} tokens per KV head exceed --memory {s.memory:g} "
                             f"of the full cache at {s.context} tokens; leave --window out to fit it")
    return _made(budget, s, {"mode": "uniform", **(meta or {}), "sink": s.sink, "window": window})


__all__ = ["KVBudgetSettings", "POOLING", "budget_from_scores", "kv_head_scores", "n_full_allowed", "random_budget",
           "rank_kv_heads", "read_scores", "uniform_budget"]
