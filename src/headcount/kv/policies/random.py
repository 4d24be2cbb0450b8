"""``random``: as many full KV heads as the scores policy keeps, chosen at random (seeded): the
baseline that says whether the scores matter."""

from __future__ import annotations

import random as _random

from headcount.kv.budget import KVBudget
from headcount.kv.memory import KVBudgetSettings, made, n_full_allowed, open_layers, streaming
from headcount.kv.policy import BudgetRequest, Policy
from headcount.runtime.errors import HeadcountError


def random_budget(n_layers: int, n_heads: int, n_kv: int, head_dim: int, settings: KVBudgetSettings, seed: int,
                  meta: dict | None = None, *, model_window=None) -> KVBudget:
    """As many full KV heads as [`budget_from_scores`][headcount.kv.policies.scores.budget_from_scores]
    would keep, chosen uniformly at random (``seed``: Python's ``random.Random``, the same choice on
    every machine) among the layers that cache every token."""
    k = n_full_allowed(n_layers, n_heads, n_kv, head_dim, settings, model_window=model_window)
    windows, layers = open_layers(n_layers, model_window)
    heads = [(layer, head) for layer in layers for head in range(n_kv)]  # in (layer, head) order: the draw's population
    chosen = sorted(_random.Random(seed).sample(heads, k))
    stream = streaming(n_layers, n_heads, n_kv, head_dim, settings.sink, settings.window, windows)
    return made(stream.with_full(chosen), settings,
                {"mode": "random", **(meta or {}), "seed": seed, "sink": settings.sink, "window": settings.window})


def make(request: BudgetRequest) -> KVBudget:
    seed = request.options.get("seed")
    if seed is None:
        raise HeadcountError("the KV policy 'random' draws its full KV heads with a seed: give one (--random SEED)")
    return random_budget(*request.shape, request.settings, int(seed), request.meta, model_window=request.model_window)


POLICY = Policy("random", make, options=("seed",),
                description="as many full KV heads as the scores would get, chosen at random (seeded): a baseline")
