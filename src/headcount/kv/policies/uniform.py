"""``uniform``: every KV head streams, its window as wide as the target allows (StreamingLLM,
arXiv 2309.17453): the baseline that spends the memory evenly."""

from __future__ import annotations

import math

from headcount.kv.budget import KVBudget
from headcount.kv.memory import KVBudgetSettings, fits, made, open_layers, streaming, windowed_share
from headcount.kv.policy import BudgetRequest, Policy
from headcount.runtime.errors import HeadcountError


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
    windows, layers = open_layers(n_layers, model_window)
    if window is None:
        own = KVBudget.full_cache(n_layers, n_heads, n_kv, head_dim, model_window=windows).cached(s.context)
        fixed = sum(own[layer] for layer, w in enumerate(windows) if w is not None) / len(layers)
        # per open KV head: memory x (context + fixed) - fixed = memory x context - (1 - memory) x fixed
        slots = math.floor(s.memory * s.context - (1 - s.memory) * fixed + 1e-9)
        if slots < s.sink:
            raise HeadcountError(f"--memory {s.memory:g} gives each KV head {max(slots, 0)} of {s.context} tokens"
                                 f"{windowed_share(windows, s.context)}, fewer than its --sink {s.sink}: lower --sink "
                                 "or raise --memory")
        window = slots - s.sink
    budget = streaming(n_layers, n_heads, n_kv, head_dim, s.sink, window, windows)
    if not fits(budget, s):
        raise HeadcountError(f"--sink {s.sink} + --window {window} tokens per KV head exceed --memory {s.memory:g} "
                             f"of the full cache at {s.context} tokens; leave --window out to fit it")
    return made(budget, s, {"mode": "uniform", **(meta or {}), "sink": s.sink, "window": window})


def make(request: BudgetRequest) -> KVBudget:
    """``options["window"]``: the streaming window (None or absent: the widest the target allows;
    ``settings.window`` is not read: it is the scores policy's default)."""
    return uniform_budget(*request.shape, request.settings, request.options.get("window"), request.meta,
                          model_window=request.model_window)


POLICY = Policy("uniform", make, options=("window",),
                description="every KV head streams, its window as wide as the memory allows (StreamingLLM): a baseline")
