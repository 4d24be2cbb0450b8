"""Statistics on score grids and masks: pure functions on arrays, no models.

Everything here takes numpy arrays (or CPU torch tensors) and returns floats, numpy arrays or
small frozen dataclasses. Grids are ``[layer, head]`` (or any shape: they are flattened), masks
are ``1 = kept``. Random procedures take a ``seed`` (an int or a ``numpy.random.Generator``) and
are deterministic for it. Invalid input (shapes that differ, a fraction outside (0, 1], ...)
raises :class:`headcount.errors.HeadcountError`. Where a statistic is undefined (a constant grid, fewer than two
values, a single category) the result is ``nan``, never an exception or a warning.

Groups:

- coherence of two score grids: :func:`spearman`, :func:`kendall_tau`, :func:`top_k_overlap`,
  :func:`layer_mass`, :func:`compare_scores`, :func:`pairwise_matrix`, :func:`normalize_layers`
  (per-layer normalisation that takes out layer effects);
- uncertainty: :func:`bootstrap_ci` (resampling examples / batches), :func:`paired_bootstrap_ci`
  (two grids of the same examples, paired by example id), :func:`hierarchical_bootstrap_ci` and
  :func:`hierarchical_ci_from_replicates` (a mean over seeds: resample seeds, then examples),
  :func:`permutation_test` (global, or within layers with ``strata="rows"``);
- stability of masks over seeds: :func:`krippendorff_alpha_nominal` and :func:`pairwise_jaccard`
  against :func:`expected_jaccard` (do the seeds keep the *same* components?), :func:`cochrans_q` (do they keep the same
  *proportion*? not which ones), :func:`mask_stability`;
- subnetworks: :func:`super_survivors`, :func:`random_control`, :func:`bad_control`,
  :func:`draw_controls`; the reference's super-survivor controls: :func:`always_pruned`,
  :func:`super_bad_control`, :func:`super_random_control`, :func:`super_controls`;
- pruning curves: :func:`largest_contiguous_passing`;
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
    "HierarchicalBootstrapResult",
    "PermutationResult",
    "DEFAULT_FRACTIONS",
    "LEVEL",
    "N_BOOT",
    "N_PERMUTATIONS",
    "always_pruned",
    "bad_control",
    "bootstrap_ci",
    "cochrans_q",
    "compare_scores",
    "draw_controls",
    "expected_jaccard",
    "hierarchical_bootstrap_ci",
    "hierarchical_ci_from_replicates",
    "jaccard",
    "kendall_tau",
    "krippendorff_alpha_nominal",
    "largest_contiguous_passing",
    "layer_mass",
    "mask_stability",
    "normalize_layers",
    "paired_bootstrap_ci",
    "pairwise_jaccard",
    "pairwise_matrix",
    "permutation_test",
    "random_control",
    "rank_correlation",
    "seed_summary",
    "spearman",
    "super_bad_control",
    "super_controls",
    "super_random_control",
    "super_survivors",
    "top_k_mask",
    "top_k_overlap",
]

#: Fractions of components compared by :func:`top_k_overlap` by default (top 10%, 25%, 50%).
DEFAULT_FRACTIONS: tuple[float, ...] = (0.1, 0.25, 0.5)
#: defaults of the resampling statistics, declared once (the functions here, the coherence
#: analysis and the study configs read them): bootstrap resamples, permutations (9999 + the
#: observed one: p-values in steps of 1e-4), two-sided confidence level
N_BOOT = 1000
N_PERMUTATIONS = 9999
LEVEL = 0.95

Seed = int | np.random.Generator | np.random.SeedSequence


# --------------------------------------------------------------------------- helpers


def _np(x) -> np.ndarray:
    """A float64 numpy copy of an array-like or a (possibly grad-requiring, GPU) torch tensor."""
    if hasattr(x, "detach"):  # torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


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


def normalize_layers(scores, method: Literal["zscore", "l2", "rank"] = "zscore") -> np.ndarray:
    """Each layer (row) of a ``[layer, head]`` grid normalised on its own, to take out layer effects.

    Coherence computed on normalised grids asks "do the two grids order the heads *within* each
    layer alike?", the question the within-layer permutation test (``permutation_test(...,
    strata="rows")``) answers; on raw grids, layer means that differ alike in both grids
    (early layers matter for both tasks) dominate a global correlation.

    Args:
        scores: ``[n_layers, n_heads]`` (NaN entries stay NaN and are ignored in the row's
            statistics).
        method: ``"zscore"`` (default: minus the row mean, divided by the row's standard
            deviation, ddof 0; a constant row becomes 0), ``"l2"`` (divided by the row's L2 norm,
            Michel et al.'s per-layer normalisation, as in
            :func:`headcount.analysis.removal.removal_mask`: rescales but keeps the layer mean)
            or ``"rank"`` (average ranks within the row, scaled to [0, 1]; constant row -> 0.5).

    Returns:
        A float64 array shaped like ``scores``.

    >>> normalize_layers([[1.0, 3.0], [10.0, 30.0]]).tolist()
    [[-1.0, 1.0], [-1.0, 1.0]]
    """
    s = _np(scores)
    if s.ndim != 2:
        raise HeadcountError(f"normalize_layers expects [n_layers, n_heads], got shape {s.shape}")
    finite = np.isfinite(s)
    n = finite.sum(axis=1, keepdims=True)
    if method == "zscore":
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(finite, s, 0.0).sum(axis=1, keepdims=True) / np.maximum(n, 1)
            dev = np.where(finite, s - mean, 0.0)
            sd = np.sqrt((dev**2).sum(axis=1, keepdims=True) / np.maximum(n, 1))
        out = dev / np.where(sd > 0, sd, 1.0)
    elif method == "l2":
        norm = np.sqrt((np.where(finite, s, 0.0) ** 2).sum(axis=1, keepdims=True))
        out = s / np.where(norm > 0, norm, 1.0)
    elif method == "rank":
        out = np.empty_like(s)
        for i, row in enumerate(s):
            ok = finite[i]
            r = _sps.rankdata(row[ok])
            out[i, ok] = (r - 1) / (ok.sum() - 1) if ok.sum() > 1 and not _is_constant(row[ok]) else 0.5
    else:
        raise HeadcountError(f"unknown layer normalisation {method!r}; use 'zscore', 'l2' or 'rank'")
    return np.where(finite, out, math.nan)


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
    n_boot: int = N_BOOT,
    level: float = LEVEL,
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
    _check_resampling(level, n_boot)
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


def paired_bootstrap_ci(
    statistic: Callable[..., float | np.ndarray],
    a,
    b,
    ids_a: Sequence,
    ids_b: Sequence,
    *,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: Seed = 0,
    reduce: Literal["sum", "mean"] = "sum",
) -> BootstrapResult:
    """Bootstrap of ``statistic(grid_a, grid_b)`` that resamples the same example ids for both.

    For two importance grids computed on the same texts (MLM and task importance on a task's
    examples): an unpaired bootstrap resamples the two independently and ignores that an example
    that is hard for one is often hard for the other, so its intervals are too wide for
    differences and wrong for correlations. Rows are paired by id, not by position: ``b`` is
    put in ``ids_a``'s order first, then :func:`bootstrap_ci` draws one index set per resample.

    Args:
        statistic: function of the two aggregated grids (float or array).
        a: ``[n_examples, ...]`` per-example contributions.
        b: ``[n_examples, ...]`` per-example contributions of the same examples.
        ids_a: ``n_examples`` example ids of ``a``'s rows (ints or strings, unique).
        ids_b: the ids of ``b``'s rows: the same set, in any order.
        n_boot: number of resamples.
        level: confidence level in (0, 1).
        seed: int or ``numpy.random.Generator``.
        reduce: ``"sum"`` (importance convention) or ``"mean"`` over examples.

    Returns:
        A :class:`BootstrapResult` (same draws as ``bootstrap_ci(..., paired=True)`` on the
        aligned arrays).

    Raises:
        HeadcountError: an id list whose length differs from its array's rows, repeated ids, or
            id sets that differ (the message names a few ids found on one side only).

    >>> x = np.array([1.0, 2.0, 3.0, 4.0])
    >>> r = paired_bootstrap_ci(lambda p, q: p - q, x, x[::-1] + 1, ["a", "b", "c", "d"], ["d", "c", "b", "a"],
    ...                         reduce="mean", n_boot=200)
    >>> (r.estimate, float(r.low), float(r.high))    # b is a + 1 once paired by id: no spread
    (-1.0, -1.0, -1.0)
    """
    xa, xb = _np(a), _np(b)
    la, lb = _id_list(ids_a, "ids_a"), _id_list(ids_b, "ids_b")
    for name, x, ids in (("a", xa, la), ("b", xb, lb)):
        if x.ndim < 1 or x.shape[0] != len(ids):
            raise HeadcountError(f"{name} has {x.shape[0] if x.ndim else 0} rows but {len(ids)} example ids")
    if la != lb:
        pos_b = {v: i for i, v in enumerate(lb)}
        only_a = [v for v in la if v not in pos_b]
        set_a = set(la)
        only_b = [v for v in lb if v not in set_a]
        if only_a or only_b:
            raise HeadcountError(
                "cannot pair the examples: the id sets differ "
                f"({len(only_a)} only in a, e.g. {only_a[:3]}; {len(only_b)} only in b, e.g. {only_b[:3]})")
        xb = xb[[pos_b[v] for v in la]]
    return bootstrap_ci(statistic, xa, xb, n_boot=n_boot, level=level, seed=seed, reduce=reduce, paired=True)


def _id_list(ids, name: str) -> list:
    out = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if len(set(out)) != len(out):
        seen: set = set()
        dup = [v for v in out if v in seen or seen.add(v)]
        raise HeadcountError(f"{name} has repeated example ids, e.g. {dup[:3]}")
    return out


@dataclass(frozen=True)
class HierarchicalBootstrapResult(BootstrapResult):
    """A confidence interval for a mean over seeds from a two-level (seeds, then examples) bootstrap.

    Attributes (beyond :class:`BootstrapResult`'s; ``estimate`` is the mean over seeds of each
    seed's statistic, ``samples`` ``[n_boot, ...]`` the mean over a resample of seeds):
        n_seeds: number of seeds.
        interval: how ``low``/``high`` were read from the samples: ``"t"`` or ``"percentile"``
            (with one seed always ``"percentile"``: example noise only, no seed variance).
    """

    n_seeds: int = 1
    interval: str = "t"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary (without the samples)."""
        return {**super().to_dict(), "n_seeds": self.n_seeds, "interval": self.interval}


def _example_weights(rng: np.random.Generator, n: int, n_boot: int) -> np.ndarray:
    """``[n_boot, n]`` bootstrap resample counts of n examples (each row sums to n)."""
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64)


def hierarchical_bootstrap_ci(
    statistic: Callable[..., float | np.ndarray] | None,
    *per_seed: Sequence,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: Seed = 0,
    reduce: Literal["sum", "mean"] = "mean",
    paired: bool = False,
    interval: Literal["t", "percentile"] = "t",
    clip: tuple[float, float] | None = None,
) -> HierarchicalBootstrapResult:
    """CI for a mean over seeds of a per-seed statistic: resample seeds, then examples within each.

    The quantity is ``mean_s statistic(grids of seed s)`` where seed s's grids aggregate its
    per-example contributions (as in :func:`bootstrap_ci`). Both sources of error count: which
    seeds were trained (seed variance) and which examples were scored (example noise).
    Averaging each seed's example-bootstrap bounds, the old summary, ignores the first: with
    seed variance comparable to example noise it covers the truth far less often than nominal.

    Each seed gets ``n_boot`` example resamples of its statistic (a pool); a hierarchical
    resample then draws ``n_seeds`` seeds with replacement and, for each, a random member of its
    pool, and averages (:func:`hierarchical_ci_from_replicates`).

    Args:
        statistic: function of one seed's aggregated grids (one per ``per_seed`` argument);
            ``None`` with a single argument: the aggregated grid itself (vectorised; e.g. the mean
            accuracy over examples).
        *per_seed: one or more sequences over seeds, each item ``[n_examples_s, ...]`` (seed s's
            per-example contributions; seeds may have different numbers of examples).
        n_boot: example resamples per seed, and hierarchical resamples.
        level: confidence level in (0, 1).
        seed: int or ``numpy.random.Generator``.
        reduce: ``"mean"`` (default) or ``"sum"`` over a seed's examples.
        paired: within a seed, resample all arrays with the same indices (same examples).
        interval: ``"t"`` (default): estimate +- t_{n_seeds-1} x the samples' standard deviation
            x sqrt(n_seeds / (n_seeds - 1)), which keeps its coverage with the 2-5 seeds the
            studies train (the percentile interval of a bootstrap over 5 seeds covers ~85% when
            seed variance dominates); ``"percentile"``: the samples' quantiles.
        clip: ``(lowest, highest)`` possible value of the statistic (e.g. ``(-1, 1)`` for a
            correlation): the t bounds are clipped to it.

    Returns:
        A :class:`HierarchicalBootstrapResult`.

    >>> rng = np.random.default_rng(0)
    >>> seeds = [rng.normal(mu, 1.0, size=200) for mu in (0.9, 1.0, 1.1, 1.2)]  # 4 seeds x 200 examples
    >>> r = hierarchical_bootstrap_ci(None, seeds, n_boot=500)
    >>> round(r.estimate, 3), bool(r.low < 1.05 < r.high), r.n_seeds
    (1.024, True, 4)
    """
    if not per_seed:
        raise HeadcountError("hierarchical_bootstrap_ci needs at least one sequence of per-seed contributions")
    if statistic is None and len(per_seed) != 1:
        raise HeadcountError("statistic=None works on a single sequence of per-seed contributions")
    if reduce not in ("sum", "mean"):
        raise HeadcountError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
    _check_resampling(level, n_boot)
    if interval not in ("t", "percentile"):
        raise HeadcountError(f"unknown interval {interval!r}; use 't' or 'percentile'")
    groups = [list(g) for g in per_seed]
    n_seeds = len(groups[0])
    if n_seeds < 1 or any(len(g) != n_seeds for g in groups):
        raise HeadcountError(f"every argument needs the same number (>= 1) of seeds, got {[len(g) for g in groups]}")
    rng = _rng(seed)
    estimates, pools = [], []
    for s in range(n_seeds):
        arrays = [_np(g[s]) for g in groups]
        for x in arrays:
            if x.ndim < 1 or x.shape[0] < 1:
                raise HeadcountError(f"seed {s}: each contributions array needs a leading n_examples axis, >= 1 row")
        if paired and len({x.shape[0] for x in arrays}) > 1:
            raise HeadcountError(f"seed {s}: paired=True needs the same number of examples in every array")
        flat = [np.nan_to_num(x.reshape(x.shape[0], -1), nan=0.0) for x in arrays]  # [n_s, F]
        scale = [1.0 / x.shape[0] if reduce == "mean" else 1.0 for x in arrays]
        full = [(f.sum(0) * c).reshape(x.shape[1:]) for f, c, x in zip(flat, scale, arrays)]
        boot = [np.empty((n_boot, f.shape[1])) for f in flat]  # [n_boot, F] resampled grids
        step = max(1, 4_000_000 // max(x.shape[0] for x in arrays))  # weight blocks of <= 32 MB
        for lo in range(0, n_boot, step):
            m = min(step, n_boot - lo)
            w = None
            for i, x in enumerate(arrays):
                w = w if paired and i else _example_weights(rng, x.shape[0], m)  # [m, n_s]
                boot[i][lo:lo + m] = w @ flat[i] * scale[i]
        boot = [b.reshape(n_boot, *x.shape[1:]) for b, x in zip(boot, arrays)]
        if statistic is None:
            estimates.append(full[0])
            pools.append(boot[0])
        else:
            estimates.append(np.asarray(statistic(*full), dtype=np.float64))
            pools.append(np.stack([np.asarray(statistic(*[g[k] for g in boot]), dtype=np.float64)
                                   for k in range(n_boot)]))
    return hierarchical_ci_from_replicates(estimates, pools, n_boot=n_boot, level=level, seed=rng, interval=interval,
                                           clip=clip)


def hierarchical_ci_from_replicates(
    estimates,
    replicates: Sequence,
    *,
    n_boot: int = 2000,
    level: float = LEVEL,
    seed: Seed = 0,
    interval: Literal["t", "percentile"] = "t",
    clip: tuple[float, float] | None = None,
) -> HierarchicalBootstrapResult:
    """Combine per-seed example-bootstrap replicates into a CI for the mean over seeds.

    For results that already hold each seed's bootstrap samples (``BootstrapResult.samples`` of
    one comparison per seed): a hierarchical resample draws ``n_seeds`` seeds with replacement
    and one random replicate of each, then averages them. This is the second stage of
    :func:`hierarchical_bootstrap_ci`; see its ``interval`` for the two ways to read the bounds.

    Args:
        estimates: ``[n_seeds, ...]`` each seed's statistic on its full data.
        replicates: ``n_seeds`` arrays ``[n_boot_s, ...]`` (each seed's example-bootstrap samples;
            non-finite members make the hierarchical samples that draw them invalid).
        n_boot: number of hierarchical resamples.
        level: confidence level in (0, 1).
        seed: int or ``numpy.random.Generator``.
        interval: ``"t"`` or ``"percentile"``.
        clip: ``(lowest, highest)`` possible value: bounds are clipped to it.

    Returns:
        A :class:`HierarchicalBootstrapResult`; ``estimate`` is the mean of ``estimates``.

    >>> est = [0.5, 0.7]; reps = [np.full(10, 0.5), np.full(10, 0.7)]   # no example noise
    >>> r = hierarchical_ci_from_replicates(est, reps, n_boot=400, interval="percentile")
    >>> r.estimate, float(r.low), float(r.high)
    (0.6, 0.5, 0.7)
    """
    _check_resampling(level, n_boot)
    if interval not in ("t", "percentile"):
        raise HeadcountError(f"unknown interval {interval!r}; use 't' or 'percentile'")
    est = np.stack([_np(e) for e in estimates]) if len(estimates) else np.empty(0)
    pools = [_np(r) for r in replicates]
    n_seeds = len(pools)
    if n_seeds < 1 or est.shape[0] != n_seeds:
        raise HeadcountError(f"need one estimate and one replicate array per seed (>= 1), "
                             f"got {est.shape[0]} and {n_seeds}")
    shape = est.shape[1:]
    for s, p in enumerate(pools):
        if p.ndim < 1 or p.shape[0] < 1 or p.shape[1:] != shape:
            raise HeadcountError(f"seed {s}: replicates must be [n_boot, *{shape}], got {p.shape}")
    rng = _rng(seed)
    sizes = np.array([p.shape[0] for p in pools])
    padded = np.full((n_seeds, sizes.max(), *shape), math.nan)  # [n_seeds, max n_boot_s, ...]
    for s, p in enumerate(pools):
        padded[s, :p.shape[0]] = p
    pick_seed = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    pick_rep = (rng.random((n_boot, n_seeds)) * sizes[pick_seed]).astype(np.int64)
    samples = padded[pick_seed, pick_rep].mean(axis=1)  # [n_boot, ...]
    estimate = est.mean(axis=0)
    finite = np.isfinite(samples)
    n_valid = int(finite.sum(axis=0).min()) if samples.size else 0
    alpha = (1 - level) / 2
    use = interval if n_seeds > 1 else "percentile"
    masked = np.where(finite, samples, np.nan)
    if n_valid < 2:
        low = np.full(shape, math.nan)
        high = low.copy()
    elif use == "percentile":
        low = np.nanquantile(masked, alpha, axis=0)
        high = np.nanquantile(masked, 1 - alpha, axis=0)
    else:
        half = (_sps.t.ppf(1 - alpha, n_seeds - 1) * np.nanstd(masked, axis=0, ddof=1)
                * math.sqrt(n_seeds / (n_seeds - 1)))
        low, high = estimate - half, estimate + half
    if clip is not None:
        low, high = np.clip(low, *clip), np.clip(high, *clip)

    def out(v):
        v = np.asarray(v, dtype=np.float64)
        return float(v) if v.ndim == 0 else v

    return HierarchicalBootstrapResult(out(estimate), out(low), out(high), level, n_boot, n_valid, samples,
                                       n_seeds=n_seeds, interval=use)


# --------------------------------------------------------------------------- permutation test


@dataclass(frozen=True)
class PermutationResult:
    """A permutation test of association between two grids.

    Attributes:
        statistic: the observed statistic.
        pvalue: one-sided ``(1 + #{null as extreme}) / (1 + n_permutations)`` (never 0); two-sided
            twice the smaller one-sided p, capped at 1 (see :func:`permutation_test`); ``nan`` if
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
    """Integer stratum codes of the entries :func:`_paired_flat` keeps (None: no strata).

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
    related within its layer; see :func:`normalize_layers` for the matching statistic).

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
            :func:`scipy.stats.permutation_test` uses); for a null symmetric about 0 it differs
            from ``|null| >= |observed|`` by Monte Carlo noise and ``1 / (1 + n)`` (its smallest
            value is ``2 / (1 + n)``).
        strata: ``None`` (default: permute all entries, the global test), ``"rows"`` (each
            index of the first axis is a stratum: within-layer for ``[layer, head]``), or an
            array of stratum labels shaped like ``a``.

    Returns:
        A :class:`PermutationResult`; ``nan`` statistic and p-value for constant grids.

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
    """p-value of ``observed`` against a Monte Carlo ``null`` (see :func:`permutation_test`).

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

    It tests *how many* components each seed keeps, not *which*: two seeds that keep disjoint
    halves of the heads have Q = 0 (p = 1). Stability claims need
    :func:`krippendorff_alpha_nominal` or :func:`pairwise_jaccard` against its chance level
    (:func:`expected_jaccard`).

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
    ``mean_pairwise_jaccard_chance`` (the mean over pairs of :func:`expected_jaccard` for the two
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


# Super-survivor controls as the reference draws them (Prasanna et al.'s code,
# sai-prasanna/bert-experiments, src/compute_super_masks.py: ``sample_bad_to_similar_size`` and
# ``sample_random_middlings``), transcribed rule for rule. The reference samples with Python's
# ``random.sample`` on the row-major list of candidate indices; here a numpy Generator's
# ``choice(candidates, k, replace=False)`` on the same (flattened, row-major) candidates, and no
# draw at all where the reference samples 0 items (as ``random.sample(x, 0)`` uses no randomness).


def _sample(rng: np.random.Generator, candidates: np.ndarray, k: int) -> np.ndarray:
    """``k`` of the flat indices ``candidates`` without replacement (no draw for k = 0)."""
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    return rng.choice(candidates, size=k, replace=False)


def _seed_masks(masks, name: str = "masks") -> np.ndarray:
    m = _mask01(masks, name)
    if m.ndim < 1 or m.shape[0] < 1:
        raise HeadcountError(f"{name} must be [n_seeds, ...] with at least one seed")
    return m


def always_pruned(masks) -> np.ndarray:
    """Components pruned in every seed (the complement's logical AND over the seed axis).

    Args:
        masks: ``[n_seeds, ...]`` 0/1 good masks.

    Returns:
        int64 0/1 array shaped like one mask.

    >>> always_pruned([[1, 0, 0], [1, 1, 0]]).tolist()
    [0, 0, 1]
    """
    return (1 - _seed_masks(masks)).min(axis=0).astype(np.int64)


def super_bad_control(good, pruned, seed: Seed = 0) -> np.ndarray:
    """The reference's super-survivor "bad" control: ``pruned`` resized to ``good``'s size.

    Transcribes ``sample_bad_to_similar_size(bad=pruned, good=good)``: when ``good`` keeps more
    components than ``pruned`` holds, the missing ones are drawn uniformly from the components in
    neither mask (the "middlings"), or, when those are too few, uniformly from *every* component
    outside ``pruned`` (super-survivors included, middlings not preferred); when ``pruned`` holds
    more, randomly chosen ones are dropped; of equal size, it is ``pruned`` itself (no draw).

    Args:
        good: 0/1 mask (the super-survivors), any shape (apply separately to heads and MLPs).
        pruned: 0/1 mask of the same shape (the components pruned in every seed).
        seed: int or ``numpy.random.Generator``.

    Returns:
        int64 0/1 mask shaped like ``good`` with ``good.sum()`` ones.

    >>> super_bad_control([1, 1, 0, 0, 0], [0, 0, 0, 1, 1], seed=0).tolist()
    [0, 0, 0, 1, 1]
    """
    g, b = _mask01(good, "good"), _mask01(pruned, "pruned")
    if g.shape != b.shape:
        raise HeadcountError(f"good and pruned differ in shape: {g.shape} vs {b.shape}")
    rng = _rng(seed)
    g, out = g.ravel(), b.ravel().copy()
    total_good, total_bad = int(g.sum()), int(out.sum())
    if total_good > total_bad:
        to_add = total_good - total_bad
        selection = np.flatnonzero((g == 0) & (out == 0))
        if selection.size < to_add:
            selection = np.flatnonzero(out == 0)
        out[_sample(rng, selection, to_add)] = 1
    elif total_good < total_bad:
        out[_sample(rng, np.flatnonzero(out == 1), total_bad - total_good)] = 0
    return out.reshape(b.shape)


def super_random_control(good, bad, seed: Seed = 0) -> np.ndarray:
    """The reference's super-survivor "random" control: middlings resized to ``good``'s size.

    Transcribes ``sample_random_middlings(bad, good)``: the middlings are the components in
    neither ``good`` nor ``bad``; when there are at least as many as ``good`` keeps, randomly
    chosen ones are dropped down to its size; when too few, all are kept and the missing ones are
    drawn uniformly from the components that are *not* middlings (those of ``good`` or ``bad``).
    In the reference, ``bad`` is the resized bad control (:func:`super_bad_control`), not the
    always-pruned set: always-pruned components it left out are middlings, middlings it took are not.

    Args:
        good: 0/1 mask (the super-survivors), any shape (apply separately to heads and MLPs).
        bad: 0/1 mask of the same shape (the super-survivors' bad control).
        seed: int or ``numpy.random.Generator``.

    Returns:
        int64 0/1 mask shaped like ``good`` with ``good.sum()`` ones.

    >>> super_random_control([1, 0, 0, 0], [0, 0, 0, 1], seed=0).sum().item()
    1
    """
    g, b = _mask01(good, "good"), _mask01(bad, "bad")
    if g.shape != b.shape:
        raise HeadcountError(f"good and bad differ in shape: {g.shape} vs {b.shape}")
    rng = _rng(seed)
    g = g.ravel()
    mid = np.ones_like(g)
    mid[g == 1] = 0
    mid[b.ravel() == 1] = 0
    n_mid, n_good = int(mid.sum()), int(g.sum())
    if n_mid >= n_good:
        mid[_sample(rng, np.flatnonzero(mid == 1), n_mid - n_good)] = 0
    else:
        mid[_sample(rng, np.flatnonzero(mid == 0), n_good - n_mid)] = 1
    return mid.reshape(b.shape)


def super_controls(
    masks: Mapping[str, object],
    kind: Literal["random", "bad"],
    seed: Seed = 0,
    bad_seed: Seed | None = None,
) -> dict[str, np.ndarray]:
    """Controls of the super-survivors of good masks over seeds, as the reference draws them.

    Per part (e.g. ``{"heads": [n_seeds, n_layers, n_heads], "mlps": [n_seeds, n_layers]}``),
    with ``good`` = :func:`super_survivors` and ``pruned`` = :func:`always_pruned` of its masks:
    ``"bad"`` is :func:`super_bad_control` (``pruned`` resized to ``good``'s size), ``"random"``
    is :func:`super_random_control` around that bad control (middlings resized). Both have
    exactly as many components as ``good`` per part.

    One generator per draw, used for the parts in the mapping's order, as the reference's single
    stream: bad heads, bad MLPs, then (random) middling heads, middling MLPs. ``"random"`` first
    draws the bad control it is built around: from ``bad_seed`` when given (pass the bad
    control's own seed to rebuild exactly that control), else from ``seed``'s generator before
    the middlings (the reference's order of calls).

    Args:
        masks: part name -> ``[n_seeds, ...]`` 0/1 good masks.
        kind: ``"random"`` or ``"bad"``.
        seed: int or ``numpy.random.Generator`` of this draw.
        bad_seed: int or ``numpy.random.Generator`` of the bad control a random one is built
            around (``"random"`` only; default: ``seed``'s generator).

    Returns:
        part name -> int64 0/1 mask shaped like one of its masks.

    >>> m = {"heads": [[[1, 1], [0, 0]], [[1, 0], [0, 0]]], "mlps": [[1, 0, 0], [1, 1, 0]]}
    >>> super_controls(m, "bad", seed=0)["mlps"].tolist()
    [0, 0, 1]
    """
    if kind not in ("random", "bad"):
        raise HeadcountError(f"unknown control kind {kind!r}; use 'random' or 'bad'")
    rng = _rng(seed)
    parts = {name: _seed_masks(m, f"masks[{name!r}]") for name, m in masks.items()}
    good = {name: super_survivors(m) for name, m in parts.items()}
    brng = rng if bad_seed is None or kind == "bad" else _rng(bad_seed)
    bad = {name: super_bad_control(good[name], always_pruned(m), brng) for name, m in parts.items()}
    if kind == "bad":
        return bad
    return {name: super_random_control(good[name], bad[name], rng) for name in parts}


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
