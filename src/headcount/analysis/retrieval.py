"""The uncertainty of Wu et al.'s retrieval scores ([`headcount.importance.retrieval`][headcount.importance.retrieval]):
a percentile bootstrap over examples of every head's score, and of the share of heads above the
paper's 0.1.

A head's score is the mean of its per-example counts over the examples that count (successful
retrievals). A resample draws all examples with replacement, counted or not, and takes the mean
over the counted ones it holds, so the interval also carries the chance of which retrievals
succeed: [`bootstrap_ci`][headcount.analysis.resampling.bootstrap_ci] with the paired statistic
``sum(counts) / sum(counted)`` (a resample without a counted example is left out).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from headcount.analysis.helpers import LEVEL, N_BOOT
from headcount.analysis.resampling import bootstrap_ci

#: the score above which the paper counts a head as a retrieval head (its 2.1-6.2% of heads)
RETRIEVAL_THRESHOLD = 0.1


def retrieval_interval(scores, *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0,
                       threshold: float = RETRIEVAL_THRESHOLD) -> dict:
    """The bootstrap interval of a ``retrieval`` [`Scores`][headcount.importance.scores.Scores] (its
    ``per_example`` rows and ``meta["retrieval"]["examples"]``' ``counted``).

    Returns:
        A dict: ``interval`` holds ``low`` and ``high`` (each an ``L x H`` grid), ``level``,
        ``n_boot``, ``seed`` and ``over``; ``share_above_threshold`` holds ``threshold``,
        ``estimate``, ``low`` and ``high`` (NaN for heads that are gone, and where no example counts).

    Examples:
        >>> out = retrieval_interval(retrieval_scores)          # doctest: +SKIP
        >>> out["share_above_threshold"]["estimate"]            # doctest: +SKIP
        0.037
    """
    rows = scores.per_example.double().numpy()  # [n, L, H]
    counted = np.asarray([e["counted"] for e in scores.meta["retrieval"]["examples"]], dtype=np.float64)[:, None]
    gone = np.isnan(rows[0])

    def mean_over_counted(total, n):  # [L, H], [1]
        with np.errstate(all="ignore"):
            return total / n[0]

    def share(total, n):
        grid = mean_over_counted(total, n)
        return float((grid[~gone] > threshold).mean()) if n[0] > 0 else math.nan

    grid = bootstrap_ci(mean_over_counted, rows, counted, n_boot=n_boot, level=level, seed=seed, paired=True)
    above = bootstrap_ci(share, rows, counted, n_boot=n_boot, level=level, seed=seed, paired=True)
    low, high = np.where(gone, np.nan, grid.low), np.where(gone, np.nan, grid.high)
    return {"interval": {"low": low.tolist(), "high": high.tolist(), "level": level, "n_boot": n_boot, "seed": seed,
                         "over": "examples (percentile bootstrap; each resample's mean over its counted examples)"},
            "share_above_threshold": {"threshold": threshold, "estimate": above.estimate, "low": above.low,
                                      "high": above.high}}


def with_retrieval_interval(scores, **kwargs):
    """``scores`` with [`retrieval_interval`][headcount.analysis.retrieval.retrieval_interval] in its
    ``meta``: ``interval`` beside ``heads``, the share above 0.1 in ``meta["retrieval"]``."""
    out = retrieval_interval(scores, **kwargs)
    meta = {**scores.meta, "interval": out["interval"],
            "retrieval": {**scores.meta["retrieval"], "share_above_threshold": out["share_above_threshold"]}}
    return replace(scores, meta=meta)


__all__ = ["RETRIEVAL_THRESHOLD", "retrieval_interval", "with_retrieval_interval"]
