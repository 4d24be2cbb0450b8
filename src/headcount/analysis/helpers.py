"""Shared pieces of the statistics modules: the resampling defaults (declared once), seeds, array checks.
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import scipy.stats as _sps

from headcount.runtime.errors import HeadcountError

#: Fractions of components compared by ``top_k_overlap`` by default (top 10%, 25%, 50%).
DEFAULT_FRACTIONS: tuple[float, ...] = (0.1, 0.25, 0.5)
#: defaults of the resampling statistics, declared once (the functions here, the coherence
#: analysis and the study configs read them): bootstrap resamples, permutations (9999 + the
#: observed one: p-values in steps of 1e-4), two-sided confidence level
N_BOOT = 1000
N_PERMUTATIONS = 9999
LEVEL = 0.95

Seed = int | np.random.Generator | np.random.SeedSequence
#: how a hierarchical interval is read; whether the seeds scored the same examples (``headcount.analysis.resampling``)
Interval = Literal["t", "t-resampled", "percentile"]
Examples = Literal["independent", "shared"]


# --------------------------------------------------------------------------- helpers


def _np(x) -> np.ndarray:
    """A float64 numpy copy of an array-like or a (possibly grad-requiring, GPU) torch tensor."""
    if hasattr(x, "detach"):  # torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def normal_interval(estimate, replicates, level: float) -> tuple[np.ndarray, np.ndarray]:
    """``estimate`` +- z x the standard deviation of ``replicates`` ``[n, ...]`` (non-finite ones
    left out; NaN where fewer than 2 are finite): an interval centred on the estimate, for
    replicates whose spread is right but whose centre is not (a proxy's, a resample's).

    >>> [round(float(v), 3) for v in normal_interval(0.5, [0.6, 0.7, 0.8], 0.95)]
    [0.304, 0.696]
    """
    r = _np(replicates)
    r = np.where(np.isfinite(r), r, np.nan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # fewer than 2 finite: NaN, said above
        half = float(_sps.norm.ppf(0.5 + level / 2)) * np.nanstd(r, axis=0, ddof=1)
    return estimate - half, estimate + half


def _check_resampling(level: float, n_boot: int) -> None:
    """The checks every bootstrap shares: a confidence level in (0, 1), at least one resample."""
    if not 0 < level < 1:
        raise HeadcountError(f"level must be in (0, 1), got {level}")
    if n_boot < 1:
        raise HeadcountError(f"n_boot must be >= 1, got {n_boot}")


def _rng(seed: Seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def _paired_flat(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Flatten two grids of the same shape and drop positions where either is not finite."""
    a, b = _np(a), _np(b)
    if a.shape != b.shape:
        raise HeadcountError(f"score grids differ in shape: {a.shape} vs {b.shape}")
    a, b = a.ravel(), b.ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    return a[ok], b[ok]


def _is_constant(x: np.ndarray) -> bool:
    return x.size == 0 or bool(np.all(x == x[0]))


def _mask01(masks, name: str = "masks") -> np.ndarray:
    m = _np(masks)
    if m.size and not np.all((m == 0) | (m == 1)):
        raise HeadcountError(f"{name} must contain only 0 and 1 (1 = kept)")
    return m.astype(np.int64)


def _check_interval(interval: str, examples: str) -> None:
    if interval not in ("t", "t-resampled", "percentile"):
        raise HeadcountError(f"unknown interval {interval!r}; use 't', 't-resampled' or 'percentile'")
    if examples not in ("independent", "shared"):
        raise HeadcountError(f"unknown examples {examples!r}; use 'independent' or 'shared'")


def _id_list(ids, name: str) -> list:
    out = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if len(set(out)) != len(out):
        seen: set = set()
        dup = [v for v in out if v in seen or seen.add(v)]
        raise HeadcountError(f"{name} has repeated example ids, e.g. {dup[:3]}")
    return out


__all__ = ["DEFAULT_FRACTIONS", "LEVEL", "N_BOOT", "N_PERMUTATIONS"]
