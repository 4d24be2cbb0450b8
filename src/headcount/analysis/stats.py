"""Statistics on score grids and masks: pure functions on arrays, no models.

Everything here takes numpy arrays (or CPU torch tensors) and returns floats, numpy arrays or
small frozen dataclasses. Grids are ``[layer, head]`` (or any shape: they are flattened), masks
are ``1 = kept``. Random procedures take a ``seed`` (an int or a ``numpy.random.Generator``) and
are deterministic for it. Invalid input (shapes that differ, a fraction outside (0, 1], ...)
raises :class:`headcount.errors.HeadcountError`. Where a statistic is undefined (a constant grid, fewer than two
values, a single category) the result is ``nan``, never an exception or a warning.

Groups:

- coherence of two score grids: :func:`spearman`, :func:`kendall_tau`, :func:`top_k_overlap`,
  :func:`layer_mass`, :func:`compare_scores`, :func:`pairwise_matrix`;
- uncertainty: :func:`bootstrap_ci` (resampling examples / batches), :func:`permutation_test`;
- stability of masks over seeds: :func:`krippendorff_alpha_nominal`, :func:`cochrans_q`,
  :func:`pairwise_jaccard`, :func:`mask_stability`;
- subnetworks: :func:`super_survivors`, :func:`random_control`, :func:`bad_control`,
  :func:`draw_controls`;
- across seeds: :func:`seed_summary`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as _sps

from ..errors import HeadcountError

__all__ = [
    "BootstrapResult",
    "CochranQResult",
    "PermutationResult",
    "DEFAULT_FRACTIONS",
    "bad_control",
    "bootstrap_ci",
    "cochrans_q",
    "compare_scores",
    "draw_controls",
    "jaccard",
    "kendall_tau",
    "krippendorff_alpha_nominal",
    "layer_mass",
    "mask_stability",
    "pairwise_jaccard",
    "pairwise_matrix",
    "permutation_test",
    "random_control",
    "rank_correlation",
    "seed_summary",
    "spearman",
    "super_survivors",
    "top_k_mask",
    "top_k_overlap",
]

#: Fractions of components compared by :func:`top_k_overlap` by default (top 10%, 25%, 50%).
DEFAULT_FRACTIONS: tuple[float, ...] = (0.1, 0.25, 0.5)

Seed = int | np.random.Generator | np.random.SeedSequence


# --------------------------------------------------------------------------- helpers


def _np(x) -> np.ndarray:
    """A float64 numpy copy of an array-like or a (possibly grad-requiring, GPU) torch tensor."""
    if hasattr(x, "detach"):  # torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


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


# --------------------------------------------------------------------------- rank correlation


def spearman(a, b) -> float:
    """Spearman rank correlation of two score grids (flattened; average ranks for ties).

    Positions where either grid is NaN/inf are dropped. Constant input gives ``nan``.

    Args:
        a: scores, any shape, e.g. ``[n_layers, n_heads]``.
        b: scores of the same shape.

    Returns:
        The correlation in [-1, 1], or ``nan`` when undefined.

    >>> spearman([[1, 2], [3, 4]], [[10, 20], [30, 40]])
    1.0
    """
    x, y = _paired_flat(a, b)
    if x.size < 2 or _is_constant(x) or _is_constant(y):
        return math.nan
    rx, ry = _sps.rankdata(x), _sps.rankdata(y)
    return float(np.clip(np.corrcoef(rx, ry)[0, 1], -1.0, 1.0))


def kendall_tau(a, b) -> float:
    """Kendall rank correlation tau-b of two score grids (flattened; tie-corrected).

    Positions where either grid is NaN/inf are dropped. Constant input gives ``nan``.

    Args:
        a: scores, any shape.
        b: scores of the same shape.

    Returns:
        tau-b in [-1, 1], or ``nan`` when undefined.

    >>> kendall_tau([1, 2, 3, 4], [1, 3, 2, 4])
    0.6666666666666669
    """
    x, y = _paired_flat(a, b)
    if x.size < 2 or _is_constant(x) or _is_constant(y):
        return math.nan
    return float(_sps.kendalltau(x, y, variant="b").statistic)


_CORRELATIONS: dict[str, Callable[[object, object], float]] = {"spearman": spearman, "kendall": kendall_tau}


def rank_correlation(a, b, method: Literal["spearman", "kendall"] = "spearman") -> float:
    """Rank correlation by name: ``"spearman"`` or ``"kendall"`` (tau-b).

    Args:
        a: scores, any shape.
        b: scores of the same shape.
        method: ``"spearman"`` or ``"kendall"``.

    Returns:
        The correlation, or ``nan`` when undefined.

    >>> rank_correlation([1, 2, 3], [3, 2, 1], "kendall")
    -1.0
    """
    try:
        return _CORRELATIONS[method](a, b)
    except KeyError:
        raise HeadcountError(f"unknown correlation {method!r}; use 'spearman' or 'kendall'") from None


# --------------------------------------------------------------------------- top-k overlap


def top_k_mask(scores, fraction: float) -> np.ndarray:
    """Boolean mask of the top ``fraction`` of components by score (same shape as ``scores``).

    The count is ``max(1, round(fraction * n))`` over finite entries; ties are broken by
    position (earlier first), so the result is deterministic. NaN entries are never selected.

    Args:
        scores: any shape, e.g. ``[n_layers, n_heads]``.
        fraction: in (0, 1].

    Returns:
        A bool array shaped like ``scores``.

    >>> top_k_mask([[0.1, 0.9], [0.5, 0.2]], 0.5).astype(int).tolist()
    [[0, 1], [1, 0]]
    """
    s = _np(scores)
    if not 0 < fraction <= 1:
        raise HeadcountError(f"fraction must be in (0, 1], got {fraction}")
    flat = s.ravel()
    finite = np.flatnonzero(np.isfinite(flat))
    out = np.zeros(flat.shape, dtype=bool)
    if finite.size:
        k = max(1, int(round(fraction * finite.size)))
        order = finite[np.argsort(-flat[finite], kind="stable")]
        out[order[:k]] = True
    return out.reshape(s.shape)


def jaccard(a, b) -> float:
    """Jaccard index |A and B| / |A or B| of two boolean / 0-1 masks; ``nan`` if both are empty.

    Args:
        a: mask, any shape.
        b: mask of the same shape.

    Returns:
        A float in [0, 1], or ``nan``.

    >>> jaccard([1, 1, 0, 0], [1, 0, 1, 0])
    0.3333333333333333
    """
    x, y = _np(a).astype(bool), _np(b).astype(bool)
    if x.shape != y.shape:
        raise HeadcountError(f"masks differ in shape: {x.shape} vs {y.shape}")
    union = np.logical_or(x, y).sum()
    return math.nan if union == 0 else float(np.logical_and(x, y).sum() / union)


def top_k_overlap(a, b, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> dict[float, float]:
    """Jaccard overlap of the top-k% components of two score grids, for each fraction.

    Args:
        a: scores, any shape, e.g. ``[n_layers, n_heads]``.
        b: scores of the same shape.
        fractions: fractions of components (default 10%, 25%, 50%).

    Returns:
        ``{fraction: jaccard}``. Chance level for a fraction f is about f / (2 - f).

    >>> top_k_overlap([4, 3, 2, 1], [4, 3, 1, 2], fractions=(0.25, 0.75))
    {0.25: 1.0, 0.75: 0.5}
    """
    sa, sb = _np(a), _np(b)
    if sa.shape != sb.shape:
        raise HeadcountError(f"score grids differ in shape: {sa.shape} vs {sb.shape}")
    return {float(f): jaccard(top_k_mask(sa, f), top_k_mask(sb, f)) for f in fractions}


# --------------------------------------------------------------------------- layer mass


def layer_mass(scores) -> np.ndarray:
    """Share of total importance in each layer: ``|s|`` summed over heads, divided by the total.

    Args:
        scores: ``[n_layers, n_heads]`` (absolute values are used; NaN counts as 0).

    Returns:
        ``[n_layers]`` summing to 1, or all ``nan`` when the grid is all zero.

    >>> layer_mass([[1, 1], [2, 0]]).tolist()
    [0.5, 0.5]
    """
    s = np.nan_to_num(np.abs(_np(scores)), nan=0.0)
    if s.ndim != 2:
        raise HeadcountError(f"layer_mass expects [n_layers, n_heads], got shape {s.shape}")
    per_layer = s.sum(axis=1)
    total = per_layer.sum()
    if total <= 0:
        return np.full(per_layer.shape, math.nan)
    return per_layer / total


def compare_scores(a, b, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> dict[str, object]:
    """All coherence numbers of two ``[layer, head]`` grids in one JSON-ready dict.

    Keys: ``spearman``, ``kendall``, ``top_k_jaccard`` (``{"0.1": ..}``), ``layer_mass_a``,
    ``layer_mass_b`` (lists) and ``layer_mass_l1`` (L1 distance of the two mass profiles, in [0, 2]).

    Args:
        a: ``[n_layers, n_heads]`` scores.
        b: scores of the same shape.
        fractions: top-k fractions for the Jaccard overlap.

    Returns:
        A dict of floats and lists.

    >>> compare_scores([[1, 2], [3, 4]], [[1, 2], [3, 4]])["kendall"]
    1.0
    """
    ma, mb = layer_mass(a), layer_mass(b)
    return {
        "spearman": spearman(a, b),
        "kendall": kendall_tau(a, b),
        "top_k_jaccard": {str(f): v for f, v in top_k_overlap(a, b, fractions).items()},
        "layer_mass_a": ma.tolist(),
        "layer_mass_b": mb.tolist(),
        "layer_mass_l1": float(np.abs(ma - mb).sum()),
    }


def pairwise_matrix(
    grids: Mapping[str, object] | Sequence[object],
    statistic: str | Callable[[np.ndarray, np.ndarray], float] = "spearman",
) -> np.ndarray:
    """Symmetric matrix of a statistic between every pair of grids (e.g. task x task Spearman).

    Args:
        grids: a mapping name -> grid (row order = the mapping's order) or a sequence of grids,
            all of the same shape.
        statistic: ``"spearman"``, ``"kendall"``, ``"jaccard@F"`` (top-F Jaccard, e.g.
            ``"jaccard@0.1"``), or a callable ``f(a, b) -> float`` assumed symmetric.

    Returns:
        ``[n, n]`` float array; the diagonal is the statistic of a grid with itself (1 for a
        non-constant grid, ``nan`` for a constant one).

    >>> pairwise_matrix({"mlm": [1, 2, 3], "sst2": [3, 2, 1]}).tolist()
    [[1.0, -1.0], [-1.0, 1.0]]
    """
    items = list(grids.values()) if isinstance(grids, Mapping) else list(grids)
    if isinstance(statistic, str):
        if statistic.startswith("jaccard@"):
            frac = float(statistic.split("@", 1)[1])

            def fn(x, y):
                return jaccard(top_k_mask(x, frac), top_k_mask(y, frac))
        else:
            name = statistic

            def fn(x, y):
                return rank_correlation(x, y, name)  # type: ignore[arg-type]
    else:
        fn = statistic
    arrays = [_np(g) for g in items]
    n = len(arrays)
    out = np.full((n, n), math.nan)
    for i in range(n):
        for j in range(i, n):
            out[i, j] = out[j, i] = fn(arrays[i], arrays[j])
    return out


# --------------------------------------------------------------------------- bootstrap


@dataclass(frozen=True)
class BootstrapResult:
    """A percentile bootstrap confidence interval.

    Attributes:
        estimate: the statistic on the full data (float, or an array for vector statistics).
        low: lower bound of the interval (same shape as ``estimate``).
        high: upper bound.
        level: the confidence level, e.g. 0.95.
        n_boot: number of resamples drawn.
        n_valid: resamples whose statistic was finite (per element for vector statistics: min).
        samples: ``[n_boot, ...]`` the statistic on each resample.
    """

    estimate: float | np.ndarray
    low: float | np.ndarray
    high: float | np.ndarray
    level: float
    n_boot: int
    n_valid: int
    samples: np.ndarray

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary (without the samples)."""

        def conv(v):
            return v.tolist() if isinstance(v, np.ndarray) else v

        return {"estimate": conv(self.estimate), "low": conv(self.low), "high": conv(self.high),
                "level": self.level, "n_boot": self.n_boot, "n_valid": self.n_valid}


def bootstrap_ci(
    statistic: Callable[..., float | np.ndarray],
    *contributions,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: Seed = 0,
    reduce: Literal["sum", "mean"] = "sum",
    paired: bool = False,
) -> BootstrapResult:
    """Percentile bootstrap over examples (or batches) for a statistic of aggregated scores.

    Each contribution array is ``[n_examples, ...]``: row i is example (or batch) i's
    contribution to a score grid, so the grid is ``contributions.sum(0)`` (``reduce="sum"``, the
    gradient-importance convention) or ``.mean(0)``. A resample draws n_examples rows with
    replacement, re-aggregates, and recomputes ``statistic(grid_1, grid_2, ...)``.

    With ``paired=True`` all arrays share one index draw (they must have the same n_examples:
    use it when both grids were computed on the same examples, e.g. before vs after
    fine-tuning); otherwise each array is resampled independently (e.g. MLM corpus vs task data).

    Args:
        statistic: function of the aggregated grids returning a float or an array.
        *contributions: one or more ``[n_examples, ...]`` arrays.
        n_boot: number of resamples.
        level: confidence level in (0, 1).
        seed: int or ``numpy.random.Generator``; same seed -> same result.
        reduce: ``"sum"`` or ``"mean"`` over examples.
        paired: resample all arrays with the same indices.

    Returns:
        A :class:`BootstrapResult`; non-finite resample values are ignored for the percentiles
        (an all-NaN statistic gives ``nan`` bounds).

    >>> rng = np.random.default_rng(0)
    >>> a = rng.random((50, 2, 3)); b = a + 0.1 * rng.random((50, 2, 3))
    >>> r = bootstrap_ci(spearman, a, b, n_boot=200, seed=1, paired=True)
    >>> bool(r.low <= r.estimate <= r.high)
    True
    """
    if not contributions:
        raise HeadcountError("bootstrap_ci needs at least one contributions array")
    if not 0 < level < 1:
        raise HeadcountError(f"level must be in (0, 1), got {level}")
    if n_boot < 1:
        raise HeadcountError(f"n_boot must be >= 1, got {n_boot}")
    if reduce not in ("sum", "mean"):
        raise HeadcountError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
    arrays = [_np(c) for c in contributions]
    for c in arrays:
        if c.ndim < 1 or c.shape[0] < 1:
            raise HeadcountError("each contributions array needs a leading n_examples axis with >= 1 row")
    if paired and len({c.shape[0] for c in arrays}) > 1:
        raise HeadcountError("paired=True needs the same number of examples in every array")
    rng = _rng(seed)
    ns = [c.shape[0] for c in arrays]
    flat = [np.nan_to_num(c.reshape(c.shape[0], -1), nan=0.0) for c in arrays]

    def agg(weights: np.ndarray, i: int) -> np.ndarray:  # weights [n_examples] resample counts
        g = weights @ flat[i]
        if reduce == "mean":
            g = g / ns[i]
        return g.reshape(arrays[i].shape[1:])

    full = [agg(np.ones(n), i) for i, n in enumerate(ns)]
    estimate = np.asarray(statistic(*full), dtype=np.float64)
    samples = np.empty((n_boot, *estimate.shape))
    for k in range(n_boot):
        if paired:
            w = np.bincount(rng.integers(0, ns[0], ns[0]), minlength=ns[0]).astype(np.float64)
            grids = [agg(w, i) for i in range(len(arrays))]
        else:
            grids = []
            for i, n in enumerate(ns):
                w = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
                grids.append(agg(w, i))
        samples[k] = statistic(*grids)
    alpha = (1 - level) / 2
    finite = np.isfinite(samples)
    n_valid = int(finite.sum(axis=0).min()) if samples.size else 0
    if n_valid == 0:
        low = np.full(estimate.shape, math.nan)
        high = low.copy()
    else:
        with np.errstate(all="ignore"):
            low = np.nanquantile(np.where(finite, samples, np.nan), alpha, axis=0)
            high = np.nanquantile(np.where(finite, samples, np.nan), 1 - alpha, axis=0)

    def out(v):
        v = np.asarray(v, dtype=np.float64)
        return float(v) if v.ndim == 0 else v

    return BootstrapResult(out(estimate), out(low), out(high), level, n_boot, n_valid, samples)


# --------------------------------------------------------------------------- permutation test


@dataclass(frozen=True)
class PermutationResult:
    """A permutation test of association between two grids.

    Attributes:
        statistic: the observed statistic.
        pvalue: ``(1 + #{null as extreme}) / (1 + n_permutations)`` (never 0), ``nan`` if undefined.
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


def permutation_test(
    a,
    b,
    statistic: Literal["spearman", "kendall"] | Callable[[np.ndarray, np.ndarray], float] = "spearman",
    n_permutations: int = 9999,
    seed: Seed = 0,
    alternative: Literal["two-sided", "greater", "less"] = "two-sided",
) -> PermutationResult:
    """Permutation p-value for the association of two grids: permute one grid's flattened entries.

    The null hypothesis is that the positions of ``b``'s scores are exchangeable (no relation
    to ``a``). Spearman and Kendall are vectorised; a callable is evaluated per permutation.

    Args:
        a: scores, any shape.
        b: scores of the same shape.
        statistic: ``"spearman"``, ``"kendall"``, or ``f(a_flat, b_flat) -> float``.
        n_permutations: number of random permutations.
        seed: int or ``numpy.random.Generator``.
        alternative: ``"two-sided"`` (|null| >= |observed|), ``"greater"`` or ``"less"``.

    Returns:
        A :class:`PermutationResult`; ``nan`` statistic and p-value for constant grids.

    >>> permutation_test(np.arange(20), np.arange(20), n_permutations=999).pvalue
    0.001
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise HeadcountError(f"unknown alternative {alternative!r}")
    if n_permutations < 1:
        raise HeadcountError(f"n_permutations must be >= 1, got {n_permutations}")
    x, y = _paired_flat(a, b)
    n = x.size
    rng = _rng(seed)
    if n < 2 or _is_constant(x) or _is_constant(y):
        return PermutationResult(math.nan, math.nan, n_permutations, alternative, np.full(n_permutations, math.nan))
    null = np.empty(n_permutations)
    chunk = max(1, min(n_permutations, 2_000_000 // max(n, 1)))
    if statistic == "spearman":
        observed = spearman(x, y)
        rx = _sps.rankdata(x)
        ry = _sps.rankdata(y)
        rx = (rx - rx.mean()) / np.linalg.norm(rx - rx.mean())
        ry = (ry - ry.mean()) / np.linalg.norm(ry - ry.mean())
        for s in range(0, n_permutations, chunk):
            m = min(chunk, n_permutations - s)
            null[s:s + m] = ry[_permuted_rows(rng, n, m)] @ rx
    elif statistic == "kendall" and n <= 2000:
        observed = kendall_tau(x, y)
        iu, ju = np.triu_indices(n, k=1)
        sx = np.sign(x[iu] - x[ju])
        # tau-b denominator: sqrt((n0 - ties_x) (n0 - ties_y)); ties are permutation invariant
        denom = math.sqrt(np.count_nonzero(sx) * np.count_nonzero(np.sign(y[iu] - y[ju])))
        pchunk = max(1, min(n_permutations, 20_000_000 // iu.size))
        for s in range(0, n_permutations, pchunk):
            m = min(pchunk, n_permutations - s)
            yp = y[_permuted_rows(rng, n, m)]  # [m, n]
            null[s:s + m] = (np.sign(yp[:, iu] - yp[:, ju]) @ sx) / denom
    else:
        if isinstance(statistic, str) and statistic not in _CORRELATIONS:
            raise HeadcountError(f"unknown statistic {statistic!r}; use 'spearman', 'kendall' or a callable")
        fn = _CORRELATIONS[statistic] if isinstance(statistic, str) else statistic
        observed = float(fn(x, y))
        for k in range(n_permutations):
            null[k] = fn(x, y[rng.permutation(n)])
    if not math.isfinite(observed):
        return PermutationResult(math.nan, math.nan, n_permutations, alternative, null)
    eps = 1e-12 * max(1.0, abs(observed))  # float noise must not turn a tie into "less extreme"
    if alternative == "two-sided":
        hits = np.count_nonzero(np.abs(null) >= abs(observed) - eps)
    elif alternative == "greater":
        hits = np.count_nonzero(null >= observed - eps)
    else:
        hits = np.count_nonzero(null <= observed + eps)
    return PermutationResult(float(observed), float((1 + hits) / (1 + n_permutations)), n_permutations, alternative, null)


# --------------------------------------------------------------------------- mask stability


def krippendorff_alpha_nominal(data) -> float:
    """Krippendorff's alpha for nominal data (any number of categories, missing values allowed).

    Computed from the coincidence matrix (Krippendorff 2011, "Computing Krippendorff's
    Alpha-Reliability"): ``alpha = 1 - (n - 1) * sum_{c != k} o_ck / sum_{c != k} n_c n_k``,
    where only units with at least two values are pairable.

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
    d = d.reshape(d.shape[0], -1)
    present = np.isfinite(d)
    values = np.unique(d[present])
    if values.size < 2:
        return math.nan
    # counts[u, c]: how many raters gave unit u the value c
    counts = np.stack([((d == v) & present).sum(axis=0) for v in values], axis=1).astype(np.float64)
    m_u = counts.sum(axis=1)
    pairable = m_u >= 2
    counts, m_u = counts[pairable], m_u[pairable]
    if counts.shape[0] == 0:
        return math.nan
    # coincidences: o = sum_u (n_u n_u^T - diag(n_u)) / (m_u - 1)
    w = counts / (m_u - 1)[:, None]
    o = w.T @ counts - np.diag(w.sum(axis=0))  # [n_values, n_values]
    n_c = o.sum(axis=1)
    n = n_c.sum()
    observed = o.sum() - np.trace(o)
    expected = n_c.sum() ** 2 - (n_c**2).sum()
    if expected <= 0:
        return math.nan
    return float(1.0 - (n - 1) * observed / expected)


@dataclass(frozen=True)
class CochranQResult:
    """Cochran's Q test: do k related binary samples (seeds) have the same proportion of 1s?

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
    ``cochrans_q`` on the transposed table).

    Args:
        masks: ``[n_seeds, ...]`` 0/1 (trailing dims flattened).

    Returns:
        A :class:`CochranQResult`; ``nan`` q and p-value when every component is kept by all
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


def mask_stability(masks) -> dict[str, object]:
    """Summary of mask agreement across seeds: alpha, Cochran's Q, mean pairwise Jaccard.

    Args:
        masks: ``[n_seeds, ...]`` 0/1, e.g. ``[n_seeds, n_layers, n_heads]``.

    Returns:
        ``{"krippendorff_alpha", "cochran_q", "cochran_df", "cochran_p", "mean_pairwise_jaccard",
        "n_seeds", "n_components", "kept_per_seed"}`` (JSON-ready).

    >>> mask_stability([[1, 1, 0, 0], [1, 1, 0, 0]])["mean_pairwise_jaccard"]
    1.0
    """
    m = _mask01(masks)
    flat = m.reshape(m.shape[0], -1)
    q = cochrans_q(flat)
    pj = pairwise_jaccard(flat)
    off = pj[~np.eye(len(pj), dtype=bool)]
    off = off[np.isfinite(off)]
    return {
        "krippendorff_alpha": krippendorff_alpha_nominal(flat),
        "cochran_q": q.q,
        "cochran_df": q.df,
        "cochran_p": q.pvalue,
        "mean_pairwise_jaccard": float(off.mean()) if off.size else math.nan,
        "n_seeds": int(flat.shape[0]),
        "n_components": int(flat.shape[1]),
        "kept_per_seed": flat.sum(axis=1).astype(int).tolist(),
    }


# --------------------------------------------------------------------------- subnetworks


def super_survivors(masks) -> np.ndarray:
    """Components kept in every seed (logical AND over the seed axis).

    Args:
        masks: ``[n_seeds, ...]`` 0/1.

    Returns:
        int64 0/1 array shaped like one mask.

    >>> super_survivors([[[1, 1], [0, 1]], [[1, 0], [0, 1]]]).tolist()
    [[1, 0], [0, 1]]
    """
    m = _mask01(masks)
    if m.ndim < 1 or m.shape[0] < 1:
        raise HeadcountError("super_survivors needs at least one mask")
    return m.min(axis=0).astype(np.int64)


def random_control(
    good,
    seed: Seed = 0,
    mode: Literal["uniform", "bernoulli"] = "uniform",
) -> np.ndarray:
    """A random subnetwork matched to a good mask.

    ``"uniform"`` (default): exactly as many components as ``good`` keeps, chosen uniformly
    among all components. ``"bernoulli"`` (Prasanna et al.): each component kept independently
    with p = kept fraction of ``good``, so the size matches only on average.

    Args:
        good: 0/1 mask, any shape (apply separately to heads and MLPs).
        seed: int or ``numpy.random.Generator``.
        mode: ``"uniform"`` or ``"bernoulli"``.

    Returns:
        int64 0/1 mask shaped like ``good``.

    >>> int(random_control([[1, 1, 0], [0, 0, 1]], seed=3).sum())
    3
    """
    g = _mask01(good, "good")
    rng = _rng(seed)
    n, k = g.size, int(g.sum())
    out = np.zeros(n, dtype=np.int64)
    if mode == "uniform":
        out[rng.choice(n, size=k, replace=False)] = 1
    elif mode == "bernoulli":
        p = k / n if n else 0.0
        out[:] = (rng.random(n) < p).astype(np.int64)
    else:
        raise HeadcountError(f"unknown random mode {mode!r}; use 'uniform' or 'bernoulli'")
    return out.reshape(g.shape)


def bad_control(good, seed: Seed = 0) -> np.ndarray:
    """A "bad" subnetwork of the same size as ``good`` (Prasanna et al.'s rule).

    Components are drawn uniformly from those ``good`` pruned; when ``good`` keeps more
    components than it pruned, all pruned ones are taken and the rest is topped up with
    randomly chosen kept ones.

    Args:
        good: 0/1 mask, any shape (apply separately to heads and MLPs).
        seed: int or ``numpy.random.Generator``.

    Returns:
        int64 0/1 mask shaped like ``good`` with ``good.sum()`` ones.

    >>> bad_control([1, 1, 0, 0, 0], seed=0).tolist()[:2]
    [0, 0]
    """
    g = _mask01(good, "good").ravel()
    rng = _rng(seed)
    kept, pruned = np.flatnonzero(g == 1), np.flatnonzero(g == 0)
    k = kept.size
    out = np.zeros(g.size, dtype=np.int64)
    if k <= pruned.size:
        out[rng.choice(pruned, size=k, replace=False)] = 1
    else:
        out[pruned] = 1
        out[rng.choice(kept, size=k - pruned.size, replace=False)] = 1
    return out.reshape(_np(good).shape)


def draw_controls(
    good: Mapping[str, object],
    kind: Literal["random", "bad"],
    seed: Seed = 0,
    mode: Literal["uniform", "bernoulli"] = "uniform",
) -> dict[str, np.ndarray]:
    """Controls for a mask with several parts (e.g. ``{"heads": ..., "mlps": ...}``), matched per part.

    One generator is seeded once and used for the parts in the mapping's order, so the result
    is deterministic for a seed and the parts are independent draws.

    Args:
        good: part name -> 0/1 mask.
        kind: ``"random"`` (see :func:`random_control`) or ``"bad"`` (see :func:`bad_control`).
        seed: int or ``numpy.random.Generator``.
        mode: random mode, ``"uniform"`` or ``"bernoulli"`` (ignored for ``"bad"``).

    Returns:
        part name -> int64 0/1 mask.

    >>> c = draw_controls({"heads": [[1, 0], [1, 1]], "mlps": [1, 0]}, "bad", seed=0)
    >>> c["mlps"].tolist()
    [0, 1]
    """
    rng = _rng(seed)
    if kind == "random":
        return {name: random_control(m, rng, mode) for name, m in good.items()}
    if kind == "bad":
        return {name: bad_control(m, rng) for name, m in good.items()}
    raise HeadcountError(f"unknown control kind {kind!r}; use 'random' or 'bad'")


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
