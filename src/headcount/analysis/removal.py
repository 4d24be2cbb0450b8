"""Removing the least important heads at a level, and how much removal a model can afford.

Pure functions on score grids: :func:`removal_mask` (one-shot ranking, Michel et al.: the
``round(fraction x units)`` lowest heads go) and :func:`acceptable_deduction` (Chiang & Chen
2021: the largest loss of masked-LM quality at which a fine-tuned pruned model keeps a share of
the full model's score). Nothing here loads a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..errors import HeadcountError
from ..masks import Mask
from ..pruning import select_lowest
from .coherence import view_of

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
        A :class:`headcount.masks.Mask` over ``[n_layers, n_heads]`` (MLPs kept).

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

    Args:
        rows: one per pruning level: ``level``, ``mlm_loss_increase``, ``mlm_accuracy_drop``,
            ``relative_score`` (fine-tuned pruned score / full fine-tuned score).
        threshold: the share of the full score that counts as acceptable (the transfer study's
            ``before_after.threshold``).

    Returns:
        ``{"level", "mlm_loss_increase", "mlm_accuracy_drop", "relative_score"}`` of the
        acceptable row with the largest loss increase (all None when no level is acceptable).

    >>> acceptable_deduction([{"level": .2, "mlm_loss_increase": .1, "mlm_accuracy_drop": .01, "relative_score": .99},
    ...                       {"level": .4, "mlm_loss_increase": .5, "mlm_accuracy_drop": .05, "relative_score": .95},
    ...                       {"level": .6, "mlm_loss_increase": 1.5, "mlm_accuracy_drop": .2, "relative_score": .7}],
    ...                      threshold=0.9)["level"]
    0.4
    """
    ok = [r for r in rows if r.get("relative_score") is not None and r["relative_score"] >= threshold
          and r.get("mlm_loss_increase") is not None and math.isfinite(r["mlm_loss_increase"])]
    if not ok:
        return {"level": None, "mlm_loss_increase": None, "mlm_accuracy_drop": None, "relative_score": None}
    best = max(ok, key=lambda r: (r["mlm_loss_increase"], r["level"]))
    return {k: best.get(k) for k in ("level", "mlm_loss_increase", "mlm_accuracy_drop", "relative_score")}
