"""Coherence of two score grids: rank correlation (Spearman, Kendall tau-b), top-k overlap, layer mass,
per-layer normalisation, and all of them at once ([`compare_scores`][headcount.analysis.correlation.compare_scores], [`pairwise_matrix`][headcount.analysis.correlation.pairwise_matrix]).

scipy computes the ranks and tau-b; headcount adds the NaN handling, the flattening of grids and
the top-k selection (ties to the earlier head).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import numpy as np
from scipy import stats as _sps

from headcount.analysis.helpers import DEFAULT_FRACTIONS, _is_constant, _np, _paired_flat
from headcount.runtime.errors import HeadcountError

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
            ``headcount.analysis.removal.removal_mask``: rescales but keeps the layer mean)
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


__all__ = ["compare_scores", "jaccard", "kendall_tau", "layer_mass", "normalize_layers", "pairwise_matrix", "rank_correlation", "spearman", "top_k_mask", "top_k_overlap"]
