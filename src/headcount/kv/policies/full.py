"""``full``: every KV head keeps the full cache (the model as it is): the reference of the curve."""

from __future__ import annotations

from dataclasses import replace

from headcount.kv.budget import KVBudget
from headcount.kv.memory import made
from headcount.kv.policy import BudgetRequest, Policy


def make(request: BudgetRequest) -> KVBudget:
    """The full cache, its bytes stated at the request's context (memory 1.0: it is its own target)."""
    s = replace(request.settings, memory=1.0)
    budget = KVBudget.full_cache(*request.shape, model_window=request.model_window)
    return made(budget, s, {**request.meta, "mode": "full"})


POLICY = Policy("full", make, description="every KV head keeps the full cache (the model as it is)")
