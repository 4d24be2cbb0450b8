"""Removing the least important heads at a level, and how much removal a model can afford.

Pure functions on score grids: ``removal_mask`` (one-shot ranking, Michel et al.: the
``round(fraction x units)`` lowest heads go) and [`acceptable_deduction`][headcount.analysis.removal.acceptable_deduction] (Chiang & Chen
2021: the largest loss of masked-LM quality at which a fine-tuned pruned model keeps a share of
the full model's score). Nothing here loads a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from headcount.analysis.coherence import view_of
from headcount.analysis.summaries import largest_contiguous_passing
from headcount.core.masks import Mask
from headcount.importance.pruning import select_lowest
from headcount.runtime.errors import HeadcountError

__all__ = ["acceptable_deduction", "removal_mask"]


def removal_mask(grid, fraction: float, *, view: str = "application", groups=None, normalize: str = "layer") -> Mask:
    """The mask that removes ``round(fraction x units)`` least important heads of ``grid``.

    Args:
        grid: importance ``[n_layers, n_heads]`` (higher = more important; NaN = least).
        fraction: share of units removed, in [0, 1].
        view: ``application`` (units = heads per depth) or ``shared`` (units = shared heads,
            removed at every depth of their group).
        groups: the shared-layer groups (needed for ``shared``).
        normalize: ``layer`` divides each row (layer / group) by its L2 norm first; ``none``.

    Returns:
        A [`headcount.core.masks.Mask`][headcount.core.masks.Mask] over ``[n_layers, n_heads]`` (MLPs kept).

    >>> removal_mask([[1.0, 5.0], [2.0, 3.0]], 0.5, normalize="none").heads.tolist()
    [[0.0, 1.0], [0.0, 1.0]]
    """
    g = np.asarray(grid, dtype=np.float64)
    n_layers, n_heads = g.shape
    units = view_of(g, view, groups)  # [n_rows, n_heads]: rows are depths or shared layers
    if normalize == "layer":
        norm = np.sqrt(np.nansum(units ** 2, axis=-1, keepdims=True))
        units = units / np.where(norm > 0, norm, 1.0)
    elif normalize != "none":
        raise HeadcountError(f"unknown normalisation {normalize!r}; use 'layer' or 'none'")
    if not 0 <= fraction <= 1:
        raise HeadcountError(f"fraction must be in [0, 1], got {fraction}")
    n = int(round(fraction * units.size))
    keep = select_lowest(torch.from_numpy(units), torch.ones(units.shape), n)
    if view == "shared":  # a shared head goes at every depth that runs its layer
        heads = torch.ones(n_layers, n_heads)
        for row, apps in enumerate(groups):
            heads[list(apps)] = keep[row]
    else:
        heads = keep
    return Mask(heads, torch.ones(n_layers), {"fraction": fraction, "view": view})


def acceptable_deduction(rows: Sequence[Mapping], threshold: float) -> dict:
    """The largest MLM-quality loss at which the fine-tuned pruned model keeps ``threshold`` of the full score.

    A level counts only when it and every lower level are acceptable
    ([`largest_contiguous_passing`][headcount.analysis.summaries.largest_contiguous_passing]): a noisy curve whose 40% level
    passes after 30% failed does not make 40% acceptable. Among the levels up to that one, the
    row with the largest loss increase is returned.

    Args:
        rows: one per pruning level: ``level``, ``mlm_loss_increase``, ``mlm_accuracy_drop``,
            ``relative_score`` (fine-tuned pruned score / full fine-tuned score).
        threshold: the share of the full score that counts as acceptable (the transfer study's
            ``before_after.threshold``).

    Returns:
        ``{"level", "mlm_loss_increase", "mlm_accuracy_drop", "relative_score"}`` of that row
        (all None when the lowest level is not acceptable), and ``level_raw``: the largest
        acceptable level ignoring failures below it (the raw curve's answer).

    >>> rows = [{"level": .2, "mlm_loss_increase": .1, "mlm_accuracy_drop": .01, "relative_score": .99},
    ...         {"level": .4, "mlm_loss_increase": .5, "mlm_accuracy_drop": .05, "relative_score": .85},
    ...         {"level": .6, "mlm_loss_increase": 1.5, "mlm_accuracy_drop": .2, "relative_score": .92}]
    >>> r = acceptable_deduction(rows, threshold=0.9)
    >>> r["level"], r["level_raw"]
    (0.2, 0.6)
    """
    def ok(r) -> bool:
        return (r.get("relative_score") is not None and r["relative_score"] >= threshold
                and r.get("mlm_loss_increase") is not None and math.isfinite(r["mlm_loss_increase"]))

    passing = [r for r in rows if ok(r)]
    raw = max((float(r["level"]) for r in passing), default=None)
    lim = largest_contiguous_passing([r["level"] for r in rows], [ok(r) for r in rows]) if rows else None
    keys = ("level", "mlm_loss_increase", "mlm_accuracy_drop", "relative_score")
    if lim is None:
        return {**{k: None for k in keys}, "level_raw": raw}
    best = max((r for r in passing if r["level"] <= lim), key=lambda r: (r["mlm_loss_increase"], r["level"]))
    return {**{k: best.get(k) for k in keys}, "level_raw": raw}
