"""Stability of masks over seeds: Krippendorff's alpha (nominal), Cochran's Q, pairwise Jaccard
against its chance level, and the summary of all of them ([`mask_stability`][headcount.analysis.agreement.mask_stability]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import krippendorff
import numpy as np
from scipy import stats as _sps

from headcount.analysis.helpers import _mask01, _np
from headcount.runtime.errors import HeadcountError

# --------------------------------------------------------------------------- mask stability


def krippendorff_alpha_nominal(data) -> float:
    """Krippendorff's alpha for nominal data (any number of categories, missing values allowed).

    The ``krippendorff`` package's ``alpha`` (level ``nominal``); headcount adds only the cases the
    package refuses or divides by zero on, which read ``nan`` here: fewer than two categories, or
    no unit with two values, among the values that can be paired.

    Args:
        data: ``[n_raters, n_units]`` (raters = seeds, units = heads / MLPs; trailing dims are
            flattened, so ``[n_seeds, n_layers, n_heads]`` works). ``nan`` marks a missing value.

    Returns:
        alpha (1 = perfect agreement, 0 = chance, < 0 = systematic disagreement), or ``nan``
        when fewer than two values are pairable or only one category occurs.

    >>> krippendorff_alpha_nominal([[1, 1, 0, 0], [1, 1, 0, 1]])
    0.5333333333333333
    """
    d = _np(data)
    if d.ndim < 2:
        raise HeadcountError(f"expected [n_raters, n_units], got shape {d.shape}")
    d = d.reshape(d.shape[0], -1).astype(np.float64)
    present = np.isfinite(d)
    pairable = present.sum(axis=0) >= 2  # [n_units]: units with at least two values
    if np.unique(d[:, pairable][present[:, pairable]]).size < 2:
        return math.nan
    return float(krippendorff.alpha(reliability_data=np.where(present, d, np.nan), level_of_measurement="nominal"))


@dataclass(frozen=True)
class CochranQResult:
    """Cochran's Q test: do k related binary samples (seeds) have the same proportion of 1s?

    It tests *how many* components each seed keeps, not *which*: two seeds that keep disjoint
    halves of the heads have Q = 0 (p = 1). Stability claims need
    [`krippendorff_alpha_nominal`][headcount.analysis.agreement.krippendorff_alpha_nominal] or [`pairwise_jaccard`][headcount.analysis.agreement.pairwise_jaccard] against its chance level
    ([`expected_jaccard`][headcount.analysis.agreement.expected_jaccard]).

    Attributes:
        q: the statistic.
        df: degrees of freedom, k - 1.
        pvalue: upper tail of chi-square(df) at q.
    """

    q: float
    df: int
    pvalue: float

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary."""
        return {"q": self.q, "df": self.df, "pvalue": self.pvalue}


def cochrans_q(masks) -> CochranQResult:
    """Cochran's Q over seeds: treatments = seeds (rows), blocks = components (columns).

    ``Q = (k - 1) * (k * sum_j C_j^2 - N^2) / (k * N - sum_i R_i^2)`` with C_j the number kept
    by seed j, R_i the number of seeds keeping component i, N the total. A small p-value says
    the seeds keep different proportions of components (the same test as statsmodels'
    ``cochrans_q`` on the transposed table). A large one does *not* say they keep the same
    components: Q depends on the masks only through the kept counts per seed and per
    component, and seeds with equal counts give Q = 0 however little their kept sets overlap.
    For "are the good subnetworks stable?" use Krippendorff's alpha and pairwise Jaccard.

    Args:
        masks: ``[n_seeds, ...]`` 0/1 (trailing dims flattened).

    Returns:
        A [`CochranQResult`][headcount.analysis.agreement.CochranQResult]; ``nan`` q and p-value when every component is kept by all
        seeds or by none (no information), or when there are fewer than two seeds.

    >>> cochrans_q([[1, 1, 0, 1], [0, 1, 0, 0]]).q
    2.0
    """
    m = _mask01(masks)
    if m.ndim < 2:
        raise HeadcountError(f"expected [n_seeds, n_components], got shape {m.shape}")
    m = m.reshape(m.shape[0], -1)
    k = m.shape[0]
    if k < 2:
        return CochranQResult(math.nan, max(k - 1, 0), math.nan)
    col = m.sum(axis=1).astype(np.float64)  # C_j per seed
    row = m.sum(axis=0).astype(np.float64)  # R_i per component
    total = col.sum()
    denom = k * total - (row**2).sum()
    if denom <= 0:
        return CochranQResult(math.nan, k - 1, math.nan)
    q = float((k - 1) * (k * (col**2).sum() - total**2) / denom)
    return CochranQResult(q, k - 1, float(_sps.chi2.sf(q, k - 1)))


def pairwise_jaccard(masks) -> np.ndarray:
    """Jaccard index of kept sets between every pair of seeds.

    Args:
        masks: ``[n_seeds, ...]`` 0/1.

    Returns:
        ``[n_seeds, n_seeds]`` (diagonal 1 unless a mask keeps nothing, then ``nan``).

    >>> pairwise_jaccard([[1, 1, 0], [1, 0, 1]]).tolist()
    [[1.0, 0.3333333333333333], [0.3333333333333333, 1.0]]
    """
    m = _mask01(masks)
    m = m.reshape(m.shape[0], -1).astype(np.float64)
    inter = m @ m.T
    sizes = m.sum(axis=1)
    union = sizes[:, None] + sizes[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), math.nan)


def expected_jaccard(k_a: int, k_b: int, n: int) -> float:
    """Expected Jaccard index of two independent uniformly random subsets of sizes k_a, k_b of n.

    The chance level for the overlap of two masks that keep k_a and k_b of n components: the
    intersection X is hypergeometric, and ``E[X / (k_a + k_b - X)]`` is summed exactly.

    Args:
        k_a: size of the first subset, 0 <= k_a <= n.
        k_b: size of the second.
        n: number of components.

    Returns:
        The expectation, or ``nan`` when both subsets are empty.

    >>> round(expected_jaccard(72, 72, 144), 3)   # two random halves of 144 heads
    0.334
    """
    k_a, k_b, n = int(k_a), int(k_b), int(n)
    if not (0 <= k_a <= n and 0 <= k_b <= n):
        raise HeadcountError(f"subset sizes must be in [0, n={n}], got {k_a} and {k_b}")
    if k_a + k_b == 0:
        return math.nan
    x = np.arange(max(0, k_a + k_b - n), min(k_a, k_b) + 1)
    pmf = _sps.hypergeom.pmf(x, n, k_a, k_b)
    return float((pmf * x / (k_a + k_b - x)).sum())


def mask_stability(masks) -> dict[str, object]:
    """Summary of mask agreement across seeds: alpha, mean pairwise Jaccard (and its chance level), Cochran's Q.

    Which components are kept alike: ``krippendorff_alpha`` (chance-corrected: 0 = as random
    masks of the same sizes) and ``mean_pairwise_jaccard`` against
    ``mean_pairwise_jaccard_chance`` (the mean over pairs of [`expected_jaccard`][headcount.analysis.agreement.expected_jaccard] for the two
    masks' sizes). ``cochran_*`` only tests whether the seeds keep equal *proportions*.

    Args:
        masks: ``[n_seeds, ...]`` 0/1, e.g. ``[n_seeds, n_layers, n_heads]``.

    Returns:
        ``{"krippendorff_alpha", "cochran_q", "cochran_df", "cochran_p", "mean_pairwise_jaccard",
        "mean_pairwise_jaccard_chance", "n_seeds", "n_components", "kept_per_seed"}`` (JSON-ready).

    >>> mask_stability([[1, 1, 0, 0], [1, 1, 0, 0]])["mean_pairwise_jaccard"]
    1.0
    """
    m = _mask01(masks)
    flat = m.reshape(m.shape[0], -1)
    q = cochrans_q(flat)
    pj = pairwise_jaccard(flat)
    off = pj[~np.eye(len(pj), dtype=bool)]
    off = off[np.isfinite(off)]
    kept = flat.sum(axis=1)
    chance = [expected_jaccard(kept[i], kept[j], flat.shape[1])
              for i in range(len(kept)) for j in range(i + 1, len(kept))]
    chance = [c for c in chance if math.isfinite(c)]
    return {
        "krippendorff_alpha": krippendorff_alpha_nominal(flat),
        "cochran_q": q.q,
        "cochran_df": q.df,
        "cochran_p": q.pvalue,
        "mean_pairwise_jaccard": float(off.mean()) if off.size else math.nan,
        "mean_pairwise_jaccard_chance": float(np.mean(chance)) if chance else math.nan,
        "n_seeds": int(flat.shape[0]),
        "n_components": int(flat.shape[1]),
        "kept_per_seed": flat.sum(axis=1).astype(int).tolist(),
    }


__all__ = ["CochranQResult", "cochrans_q", "expected_jaccard", "krippendorff_alpha_nominal", "mask_stability", "pairwise_jaccard"]
