"""Summaries of pruning curves and of values across seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from headcount.analysis.helpers import _np
from headcount.runtime.errors import HeadcountError

# --------------------------------------------------------------------------- pruning curves


def largest_contiguous_passing(levels: Sequence[float], passes: Sequence[bool]) -> float | None:
    """The largest level such that it and every lower level pass (None when the lowest fails).

    A pruning curve is noisy: a level can pass again after a lower one failed (e.g. 30% fails,
    40% passes by luck). "How much can be removed" must not jump over a failure, so the answer
    is where the passing run that starts at the lowest level ends. Show the raw curve next to it.

    Args:
        levels: pruning levels (fractions removed), any order, no repeats.
        passes: for each level, whether it passes (e.g. mean score >= threshold x full score).
            NaN / None count as failing.

    Returns:
        A level from ``levels`` (as a float), or None when the lowest level fails or there are
        no levels (callers that need a number use 0.0: nothing can be removed).

    >>> largest_contiguous_passing([0.1, 0.2, 0.3, 0.4], [True, True, False, True])
    0.2
    >>> largest_contiguous_passing([0.3, 0.1, 0.2], [True, False, True]) is None
    True
    """
    lv = _np(levels).ravel()
    ok = [bool(p) if p is not None and not (isinstance(p, float) and math.isnan(p)) else False
          for p in (passes.tolist() if hasattr(passes, "tolist") else list(passes))]
    if lv.size != len(ok):
        raise HeadcountError(f"got {lv.size} levels but {len(ok)} pass flags")
    if not np.all(np.isfinite(lv)):
        raise HeadcountError("levels must be finite numbers")
    if np.unique(lv).size != lv.size:
        raise HeadcountError(f"levels repeat: {sorted(lv.tolist())}")
    best = None
    for i in np.argsort(lv, kind="stable"):
        if not ok[i]:
            break
        best = float(lv[i])
    return best


# --------------------------------------------------------------------------- across seeds


def seed_summary(values, axis: int = 0) -> dict[str, object]:
    """Mean, sample std (ddof=1), standard error and count across seeds, ignoring NaN.

    Args:
        values: ``[n_seeds, ...]`` numbers (or a list of floats).
        axis: the seed axis.

    Returns:
        ``{"mean", "std", "sem", "n"}``: floats for 1-D input, arrays otherwise. ``std`` and
        ``sem`` are ``nan`` with fewer than two finite values.

    >>> seed_summary([1.0, 2.0, 3.0])["std"]
    1.0
    """
    v = _np(values)
    finite = np.isfinite(v)
    n = finite.sum(axis=axis)
    vz = np.where(finite, v, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, vz.sum(axis=axis) / np.maximum(n, 1), math.nan)
        dev = np.where(finite, v - np.expand_dims(mean, axis), 0.0)
        var = np.where(n > 1, (dev**2).sum(axis=axis) / np.maximum(n - 1, 1), math.nan)
        std = np.sqrt(var)
        sem = np.where(n > 1, std / np.sqrt(np.maximum(n, 1)), math.nan)

    def out(x, integer=False):
        x = np.asarray(x)
        if x.ndim == 0:
            return int(x) if integer else float(x)
        return x.astype(np.int64) if integer else x

    return {"mean": out(mean), "std": out(std), "sem": out(sem), "n": out(n, integer=True)}


__all__ = ["largest_contiguous_passing", "seed_summary"]
