"""Permutation tests of a rank correlation: global, or within layers (``strata="rows"``).

Own code: the within-layer permutation (a stratified null) has no library equivalent; the
two-sided p-value follows ``scipy.stats.permutation_test``'s rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as _sps

from headcount.analysis.correlation import _CORRELATIONS, kendall_tau, spearman
from headcount.analysis.helpers import N_PERMUTATIONS, Seed, _is_constant, _np, _paired_flat, _rng
from headcount.runtime.errors import HeadcountError

# --------------------------------------------------------------------------- permutation test


@dataclass(frozen=True)
class PermutationResult:
    """A permutation test of association between two grids.

    Attributes:
        statistic: the observed statistic.
        pvalue: one-sided ``(1 + #{null as extreme}) / (1 + n_permutations)`` (never 0); two-sided
            twice the smaller one-sided p, capped at 1 (see [`permutation_test`][headcount.analysis.permutation.permutation_test]); ``nan`` if
            undefined.
        n_permutations: number of permutations drawn.
        alternative: ``"two-sided"``, ``"greater"`` or ``"less"``.
        null: ``[n_permutations]`` the statistic under permutation.
    """

    statistic: float
    pvalue: float
    n_permutations: int
    alternative: str
    null: np.ndarray

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary (without the null distribution)."""
        return {"statistic": self.statistic, "pvalue": self.pvalue,
                "n_permutations": self.n_permutations, "alternative": self.alternative}


def _permuted_rows(rng: np.random.Generator, n: int, rows: int) -> np.ndarray:
    return np.argsort(rng.random((rows, n)), axis=1)  # [rows, n] independent permutations


def _strata_codes(a, b, strata) -> np.ndarray | None:
    """Integer stratum codes of the entries [`_paired_flat`][headcount.analysis.helpers._paired_flat] keeps (None: no strata).

    Codes are consecutive (0..K-1) so that ``code + uniform[0, 1)`` sorts by stratum first.
    """
    if strata is None:
        return None
    sa, sb = _np(a), _np(b)
    if sa.shape != sb.shape:
        raise HeadcountError(f"score grids differ in shape: {sa.shape} vs {sb.shape}")
    if isinstance(strata, str):
        if strata != "rows":
            raise HeadcountError(f"unknown strata {strata!r}; use None, 'rows' or an array of labels")
        if sa.ndim < 2:
            raise HeadcountError(f"strata='rows' needs a grid with rows ([layer, head]), got shape {sa.shape}")
        labels = np.broadcast_to(np.arange(sa.shape[0]).reshape(-1, *([1] * (sa.ndim - 1))), sa.shape)
    else:
        labels = np.asarray(strata)
        if labels.shape != sa.shape:
            raise HeadcountError(f"strata shape {labels.shape} differs from the grids' {sa.shape}")
    ok = np.isfinite(sa.ravel()) & np.isfinite(sb.ravel())
    return np.unique(labels.ravel()[ok], return_inverse=True)[1].astype(np.float64)


def permutation_test(
    a,
    b,
    statistic: Literal["spearman", "kendall"] | Callable[[np.ndarray, np.ndarray], float] = "spearman",
    n_permutations: int = N_PERMUTATIONS,
    seed: Seed = 0,
    alternative: Literal["two-sided", "greater", "less"] = "two-sided",
    strata=None,
) -> PermutationResult:
    """Permutation p-value for the association of two grids: permute one grid's flattened entries.

    The null hypothesis is that the positions of ``b``'s scores are exchangeable (no relation
    to ``a``). Spearman and Kendall are vectorised; a callable is evaluated per permutation.

    With ``strata`` the permutations stay inside each stratum (a *stratified* or *within-layer*
    test): the null is only that ``b``'s scores are exchangeable among the heads of one layer.
    Use ``strata="rows"`` on ``[layer, head]`` grids whose layers differ systematically (layer
    means that correlate between the grids make the global test reject although no head is
    related within its layer; see ``normalize_layers`` for the matching statistic).

    Args:
        a: scores, any shape.
        b: scores of the same shape.
        statistic: ``"spearman"``, ``"kendall"``, or ``f(a_flat, b_flat) -> float``.
        n_permutations: number of random permutations.
        seed: int or ``numpy.random.Generator``.
        alternative: ``"two-sided"``, ``"greater"`` (``p = (1 + #{null >= observed}) / (1 + n)``)
            or ``"less"`` (``null <= observed``). Two-sided is ``min(1, 2 * min(p_greater,
            p_less))``: twice the smaller one-sided p. It needs no centre for the null, which
            matters within layers: permutations inside each layer keep the layer effects, so the
            null of the global Spearman is centred away from 0, and ``|null| >= |observed|`` would
            in effect be one-sided (an association against the layer effects' sign could not come
            out significant). Doubling is the usual convention for asymmetric nulls (the one
            ``scipy.stats.permutation_test`` uses); for a null symmetric about 0 it differs
            from ``|null| >= |observed|`` by Monte Carlo noise and ``1 / (1 + n)`` (its smallest
            value is ``2 / (1 + n)``).
        strata: ``None`` (default: permute all entries, the global test), ``"rows"`` (each
            index of the first axis is a stratum: within-layer for ``[layer, head]``), or an
            array of stratum labels shaped like ``a``.

    Returns:
        A [`PermutationResult`][headcount.analysis.permutation.PermutationResult]; ``nan`` statistic and p-value for constant grids.

    >>> permutation_test(np.arange(20), np.arange(20), n_permutations=999).pvalue  # two-sided: 2 / 1000
    0.002
    >>> permutation_test(np.arange(20), np.arange(20), n_permutations=999, alternative="greater").pvalue
    0.001
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise HeadcountError(f"unknown alternative {alternative!r}")
    if n_permutations < 1:
        raise HeadcountError(f"n_permutations must be >= 1, got {n_permutations}")
    codes = _strata_codes(a, b, strata)
    x, y = _paired_flat(a, b)
    n = x.size
    rng = _rng(seed)
    if n < 2 or _is_constant(x) or _is_constant(y):
        return PermutationResult(math.nan, math.nan, n_permutations, alternative, np.full(n_permutations, math.nan))
    null = np.empty(n_permutations)
    chunk = max(1, min(n_permutations, 2_000_000 // max(n, 1)))
    if codes is None:
        perm_rows = _permuted_rows
    else:
        # within strata: a random order of each stratum's positions (sorting code + U groups
        # them by stratum) is placed on that stratum's positions (``home``, grouped the same way)
        home = np.argsort(codes, kind="stable")  # [n]

        def perm_rows(rng: np.random.Generator, n: int, rows: int) -> np.ndarray:  # [rows, n]
            src = np.argsort(codes[None, :] + rng.random((rows, n)), axis=1)
            out = np.empty_like(src)
            out[:, home] = src
            return out
    if statistic == "spearman":
        observed = spearman(x, y)
        rx = _sps.rankdata(x)
        ry = _sps.rankdata(y)
        rx = (rx - rx.mean()) / np.linalg.norm(rx - rx.mean())
        ry = (ry - ry.mean()) / np.linalg.norm(ry - ry.mean())
        for s in range(0, n_permutations, chunk):
            m = min(chunk, n_permutations - s)
            null[s:s + m] = ry[perm_rows(rng, n, m)] @ rx
    elif statistic == "kendall" and n <= 2000:
        observed = kendall_tau(x, y)
        iu, ju = np.triu_indices(n, k=1)
        sx = np.sign(x[iu] - x[ju])
        # tau-b denominator: sqrt((n0 - ties_x) (n0 - ties_y)); ties are permutation invariant
        denom = math.sqrt(np.count_nonzero(sx) * np.count_nonzero(np.sign(y[iu] - y[ju])))
        pchunk = max(1, min(n_permutations, 20_000_000 // iu.size))
        for s in range(0, n_permutations, pchunk):
            m = min(pchunk, n_permutations - s)
            yp = y[perm_rows(rng, n, m)]  # [m, n]
            null[s:s + m] = (np.sign(yp[:, iu] - yp[:, ju]) @ sx) / denom
    else:
        if isinstance(statistic, str) and statistic not in _CORRELATIONS:
            raise HeadcountError(f"unknown statistic {statistic!r}; use 'spearman', 'kendall' or a callable")
        fn = _CORRELATIONS[statistic] if isinstance(statistic, str) else statistic
        observed = float(fn(x, y))
        for k in range(n_permutations):
            null[k] = fn(x, y[rng.permutation(n) if codes is None else perm_rows(rng, n, 1)[0]])
    if not math.isfinite(observed):
        return PermutationResult(math.nan, math.nan, n_permutations, alternative, null)
    return PermutationResult(float(observed), _permutation_pvalue(null, float(observed), alternative),
                             n_permutations, alternative, null)


def _permutation_pvalue(null: np.ndarray, observed: float, alternative: str) -> float:
    """p-value of ``observed`` against a Monte Carlo ``null`` (see [`permutation_test`][headcount.analysis.permutation.permutation_test]).

    One-sided: ``(1 + #{null >= observed}) / (1 + n)`` (``"greater"``; ``<=`` for ``"less"``).
    Two-sided: ``min(1, 2 * min(p_greater, p_less))``, which needs no centre for the null.
    """
    n = null.size
    eps = 1e-12 * max(1.0, abs(observed))  # float noise must not turn a tie into "less extreme"
    p_greater = (1 + np.count_nonzero(null >= observed - eps)) / (1 + n)
    p_less = (1 + np.count_nonzero(null <= observed + eps)) / (1 + n)
    if alternative == "greater":
        return float(p_greater)
    if alternative == "less":
        return float(p_less)
    return float(min(1.0, 2 * min(p_greater, p_less)))


__all__ = ["PermutationResult", "permutation_test"]
