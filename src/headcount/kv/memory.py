"""The memory target every KV policy works under, and its arithmetic.

A target is a fraction of the model's own KV cache at ``context`` tokens
([`KVBudgetSettings`][headcount.kv.memory.KVBudgetSettings]). A full KV head holds ``context``
tokens, a streaming one ``min(context, sink + window)``; each token costs ``2 x head_dim x``
bytes per element (K and V) in every KV head, so the fraction of the full cache is the fraction
of token slots. [`n_full_allowed`][headcount.kv.memory.n_full_allowed] says how many KV heads may
keep the full cache; [`streaming`][headcount.kv.memory.streaming] is the budget in which every
KV head that may stream does; [`made`][headcount.kv.memory.made] writes what a budget was made
from and its bytes into its meta (every policy's budget.json states them the same way).

Layers with a sliding window of their own (``model_window``, from
[`model_windows`][headcount.kv.budget.model_windows]) keep ``min(context, W - 1)`` tokens in
the model's cache: the target is a fraction of that real cache, their KV heads keep the model's
own window (a fixed cost) and only the layers that cache every token are budgeted; a model whose
every layer is windowed has nothing to budget (refused).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headcount.kv.budget import ELEMENT_SIZES, KVBudget
from headcount.runtime.bounds import Bound, check_bounds
from headcount.runtime.errors import HeadcountError

#: tokens: a sink, a window, a context length
TOKENS = Bound(0, 10**7, integer=True)
CONTEXT = Bound(1, 10**7, integer=True)
#: the memory target: a fraction of the full KV cache, above 0
MEMORY = Bound(0, 1, low_open=True)


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


def open_layers(n_layers: int, model_window) -> tuple[tuple[int | None, ...], list[int]]:
    """``(model_window per layer, the layers that cache every token)``: the only ones a budget streams."""
    windows = KVBudget.full_cache(n_layers, 1, 1, 1, model_window=model_window).model_window
    layers = [layer for layer, w in enumerate(windows) if w is None]
    if not layers:
        raise HeadcountError(f"every layer of the model attends within a sliding window ({max(windows)} tokens: its "
                             "own cache is bounded already): a KV budget has no layer to stream")
    return windows, layers


def windowed_share(windows: tuple[int | None, ...], context: int) -> str:
    """``" with the windowed layers' own windows (...)"``, or ``""`` for a model without them: what
    a refusal adds when the windowed layers' fixed cost is part of the arithmetic."""
    own = KVBudget.full_cache(len(windows), 1, 1, 1, model_window=windows)
    if all(w is None for w in windows):
        return ""
    share = 1 - sum(own.cached(context)[layer] for layer, w in enumerate(windows) if w is None) / sum(own.cached(context))
    n = sum(w is not None for w in windows)
    return (f" with the windowed layers' own windows ({n} of {len(windows)} layers: {share:.3f} of the model's own "
            "cache by themselves)")


def streaming(n_layers: int, n_heads: int, n_kv: int, head_dim: int, sink: int, window: int,
              windows: tuple[int | None, ...]) -> KVBudget:
    """Every KV head of the layers that cache every token streams; the windowed layers' keep the model's window."""
    rows = [((None, None) if w is not None else (sink, window)) for w in windows]
    return KVBudget([(s,) * n_kv for s, _ in rows], [(w,) * n_kv for _, w in rows], n_heads, head_dim,
                    model_window=windows)


def fits(budget: KVBudget, s: KVBudgetSettings) -> bool:
    """Whether ``budget``'s cache at ``s.context`` tokens is within ``s.memory`` of the full cache."""
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
    windows, layers = open_layers(n_layers, model_window)
    stream = streaming(n_layers, n_heads, n_kv, head_dim, s.sink, s.window, windows)
    total = len(layers) * n_kv  # the KV heads a budget may stream
    if not fits(stream, s):
        low = stream.kv_bytes(s.context, element_size=s.element_size)
        full = stream.full_bytes(s.context, element_size=s.element_size)
        local = windowed_share(windows, s.context)
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


def made(budget: KVBudget, s: KVBudgetSettings, made_from: dict) -> KVBudget:
    """``budget`` with what it was made from and its bytes at ``s.context`` tokens in its meta."""
    full = budget.full_bytes(s.context, element_size=s.element_size)
    used = budget.kv_bytes(s.context, element_size=s.element_size)
    meta = {"made_from": {**made_from, "context": s.context, "memory": s.memory},
            "n_full": budget.n_full, "n_streaming": budget.n_layers * budget.n_kv_heads - budget.n_full,
            "bytes": {"context": s.context, "batch": 1, "dtype": s.dtype, "full_cache": full, "budget": used,
                      "ratio": used / full}}
    return KVBudget(budget.sink, budget.window, budget.n_heads, budget.head_dim, meta, budget.model_window)


__all__ = ["CONTEXT", "MEMORY", "TOKENS", "KVBudgetSettings", "fits", "made", "n_full_allowed", "open_layers",
           "streaming", "windowed_share"]
