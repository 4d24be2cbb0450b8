"""``scores``: the KV heads ranked highest by their scores keep the full cache, as many as the
memory target allows; the rest stream (DuoAttention's deployment rule, arXiv 2410.10819, with a
memory target in place of its share of streaming heads).

Scores are per query head (``heads [L, H]``, as ``headcount score`` writes them) and, when
present, per KV head (``kv_groups [L, n_kv]``, the scorer's own: it wins).
[`kv_scores`][headcount.kv.policies.scores.kv_scores] makes the per-KV-head grid: without
``kv_groups`` a KV head's score is the **maximum** over the query heads that read it
([`kv_pool`][headcount.importance.scores.kv_pool] ``max``): the KV head serves its neediest
query head, and streaming it would cut that head's long-range reads whatever its siblings do.
Non-finite scores rank last.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from headcount.kv.budget import KVBudget
from headcount.kv.memory import KVBudgetSettings, made, n_full_allowed, open_layers, streaming
from headcount.kv.policy import BudgetRequest, Policy
from headcount.runtime.errors import HeadcountError

if TYPE_CHECKING:
    from headcount.importance.scores import Scores

#: how a KV head's score is made from its query heads' when the scores give none per KV head
POOLING = "max"


def kv_scores(scores: Scores, n_kv: int) -> tuple[list[list[float]], str]:
    """``(kv_scores [L][n_kv], pooling)``: the scores' own ``kv_groups`` (``pooling``
    ``"kv_groups"``; null read as NaN), else the maximum over each group's finite query-head
    scores (``"max"``; a group without one: NaN). ``scores``: read with ``dtype=torch.float64``
    to keep a file's numbers as they are (the budget writes them back)."""
    import torch  # here, not at the top: the registry (and the CLI's --help) stays free of torch

    from headcount.importance.scores import kv_pool

    own = scores.meta.get("kv_groups")
    if own is not None:
        return [[math.nan if v is None else float(v) for v in row] for row in own], "kv_groups"
    heads = torch.where(torch.isfinite(scores.heads), scores.heads, math.nan)  # +-inf rank last, as NaN
    return kv_pool(heads, n_kv, POOLING).tolist(), POOLING


def read_kv_scores(doc, path, n_layers: int, n_heads: int, n_kv: int) -> tuple[list[list[float]], str]:
    """The per-KV-head grid ([`kv_scores`][headcount.kv.policies.scores.kv_scores]) of a scores
    file's JSON ``doc`` (read once by the caller) for a model of ``n_layers x n_heads`` query
    heads on ``n_kv`` KV heads; one line naming ``path`` for a file that is not a scores file or
    whose grids do not fit the model."""
    import torch

    from headcount.importance.scores import Scores, score_grid

    if not isinstance(doc, dict) or "heads" not in doc:
        raise HeadcountError(f"{path} is not a scores file: it needs a 'heads' [n_layers][n_heads] grid")
    try:
        score_grid(doc["heads"], "heads", (n_layers, n_heads))
        if doc.get("kv_groups") is not None:
            score_grid(doc["kv_groups"], "kv_groups", (n_layers, n_kv))
        return kv_scores(Scores.from_dict(doc, torch.float64), n_kv)
    except HeadcountError as e:
        raise HeadcountError(f"{path}: {e}") from None


def rank_kv_heads(kv_scores: list[list[float]]) -> list[tuple[int, int]]:
    """``(layer, kv_head)`` from the highest score to the lowest; ties in (layer, head) order,
    non-finite scores last.

    >>> rank_kv_heads([[0.2, 0.9], [float("nan"), 0.2]])
    [(0, 1), (0, 0), (1, 1), (1, 0)]
    """
    keyed = [(-(v if math.isfinite(v) else -math.inf), layer, head)
             for layer, row in enumerate(kv_scores) for head, v in enumerate(row)]
    return [(layer, head) for _, layer, head in sorted(keyed)]


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
    windows, _ = open_layers(n_layers, model_window)
    stream = streaming(n_layers, n_heads, n_kv, head_dim, settings.sink, settings.window, windows)
    chosen = [head for head in rank_kv_heads(kv_scores) if windows[head[0]] is None][:k]
    return made(stream.with_full(chosen), settings,
                {"mode": "scores", **(meta or {}), "sink": settings.sink, "window": settings.window,
                 "kv_scores": kv_scores})


def make(request: BudgetRequest) -> KVBudget:
    grid = request.kv_scores
    if grid is None or len(grid) != request.n_layers or any(len(row) != request.n_kv_heads for row in grid):
        raise HeadcountError(f"the KV-head scores must be a [{request.n_layers}][{request.n_kv_heads}] grid (the "
                             "model's layers x KV heads)")
    return budget_from_scores(grid, request.n_heads, request.head_dim, request.settings, request.meta,
                              model_window=request.model_window)


POLICY = Policy("scores", make, needs_scores=True,
                description="the KV heads ranked highest by their scores keep the full cache (DuoAttention's rule)")

__all__ = ["POLICY", "POOLING", "budget_from_scores", "kv_scores", "rank_kv_heads", "read_kv_scores"]
