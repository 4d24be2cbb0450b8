"""What a KV policy is: a name, the settings it takes, and one ``make(request) -> KVBudget``.

A policy chooses, for every KV head of a decoder, the full cache or a sink + recent window, under
a memory target ([`KVBudgetSettings`][headcount.kv.memory.KVBudgetSettings]). Every policy gets
the same [`BudgetRequest`][headcount.kv.policy.BudgetRequest] (the model's shape, the target,
the KV-head scores when it ranks by them, its own options by name) and returns a
[`KVBudget`][headcount.kv.budget.KVBudget]; the registry
([`headcount.kv.policies`][headcount.kv.policies]) holds them by name, and ``headcount
kv-budget``, ``headcount kv-eval`` and the retrieval study ask it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from headcount.kv.budget import KVBudget
from headcount.kv.memory import KVBudgetSettings


@dataclass(frozen=True)
class BudgetRequest:
    """What every policy's ``make`` is given.

    Attributes:
        n_layers / n_heads / n_kv_heads / head_dim: the decoder's shape (query heads per layer;
            query head h reads KV head ``h // (n_heads / n_kv_heads)``).
        settings: the memory target, the context it is computed at, the streaming heads' sink
            and window, the cache dtype.
        model_window: ``[n_layers]``: the model's own sliding window per layer (None: every
            layer caches every token; [`model_windows`][headcount.kv.budget.model_windows]).
        kv_scores: ``[n_layers][n_kv_heads]`` (higher = needs the long context more), for a
            policy with ``needs_scores``; None otherwise.
        options: the policy's own settings by name (``Policy.options``: random's ``seed``,
            uniform's ``window``); a setting left out is absent (or None).
        meta: what the budget is made from (the model, the study), written into ``made_from``.
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    settings: KVBudgetSettings
    model_window: tuple[int | None, ...] | None = None
    kv_scores: list[list[float]] | None = None
    options: Mapping = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(n_layers, n_heads, n_kv_heads, head_dim)``."""
        return self.n_layers, self.n_heads, self.n_kv_heads, self.head_dim


@dataclass(frozen=True)
class Policy:
    """One way to choose a budget.

    Attributes:
        name: what ``--policy``, the study's ``kinds`` and ``made_from.mode`` call it.
        make: ``make(request: BudgetRequest) -> KVBudget``.
        options: the settings of its own it reads from ``request.options`` (beyond the target).
        needs_scores: it ranks KV heads by ``request.kv_scores`` (``--scores`` is then required).
        description: one line for ``--help`` and the docs.
    """

    name: str
    make: Callable[[BudgetRequest], KVBudget]
    options: tuple[str, ...] = ()
    needs_scores: bool = False
    description: str = ""


__all__ = ["BudgetRequest", "Policy"]
