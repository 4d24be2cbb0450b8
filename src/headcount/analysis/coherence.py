"""Coherence of two head-importance grids: rank agreement, top-k overlap, layer mass, with uncertainty.

Pure functions on arrays (no models). A grid is ``[n_layers, n_heads]`` importance, higher =
more important; for a model with shared layers (ALBERT) a row is one *application* of a
layer, and the ``shared`` view sums the rows of each group of applications that run the same
physical layer (the groups of :func:`headcount.gates.shared_groups`).

Used by the transfer study (Chiang & Chen 2021) to compare MLM and task importance; nothing here
is specific to it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from ..errors import HeadcountError
from .stats import DEFAULT_FRACTIONS, bootstrap_ci, compare_scores, permutation_test

__all__ = ["VIEWS", "coherence", "pair_seed", "shared_view", "view_of"]

#: the ways a grid is looked at: per application (depth x head) or per shared head
VIEWS = ("application", "shared")


def shared_view(grid, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Per-shared-head importance: the rows of each group of applications summed.

    Args:
        grid: ``[n_applications, n_heads]`` (or ``[..., n_applications, n_heads]``).
        groups: applications that run the same physical layer (``layout`` job, ``shared_groups``).

    Returns:
        ``[..., n_groups, n_heads]``.

    >>> shared_view([[1, 2], [3, 4], [5, 6]], [[0, 2], [1]]).tolist()
    [[6.0, 8.0], [3.0, 4.0]]
    """
    g = np.asarray(grid, dtype=np.float64)
    return np.stack([g[..., list(apps), :].sum(axis=-2) for apps in groups], axis=-2)


def view_of(grid, view: str, groups: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """``grid`` in a view: ``application`` (as is) or ``shared`` (:func:`shared_view`).

    >>> view_of([[1, 2], [3, 4]], "shared", [[0, 1]]).tolist()
    [[4.0, 6.0]]
    """
    if view == "application":
        return np.asarray(grid, dtype=np.float64)
    if view == "shared":
        if not groups:
            raise HeadcountError("the shared view needs the layer groups")
        return shared_view(grid, groups)
    raise HeadcountError(f"unknown view {view!r}; use 'application' or 'shared'")


def pair_seed(base: int, name: str) -> int:
    """A seed for one named comparison: ``base`` mixed with a CRC of ``name`` (stable across runs).

    >>> pair_seed(0, "a") == pair_seed(0, "a") != pair_seed(0, "b")
    True
    """
    return (int(base) * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 32)


def coherence(a, b, contributions: tuple | None = None, *, paired: bool = False,
              fractions: Sequence[float] = DEFAULT_FRACTIONS, n_boot: int = 1000, n_permutations: int = 9999,
              level: float = 0.95, seed: int = 0, view: str = "application", groups=None) -> dict:
    """Coherence of two head-importance grids, with bootstrap intervals and permutation p-values.

    Statistics (on ``view_of(grid, view, groups)``): ``spearman``, ``kendall`` (tau-b),
    ``jaccard@F`` (top-F overlap, for each fraction) and ``layer_mass_l1`` (L1 distance of the
    per-layer importance shares, in [0, 2]).

    Args:
        a: ``[n_layers, n_heads]`` importance (``scores.json`` ``heads``).
        b: the same shape.
        contributions: optional ``(per_example_a, per_example_b)``, each ``[n_examples, n_layers,
            n_heads]``: bootstrap over examples (the grids are re-aggregated as sums).
        paired: resample both with the same indices (same examples in the same order).
        fractions: top-k fractions for the Jaccard overlap.
        n_boot: bootstrap resamples (0: no intervals); the default is :func:`bootstrap_ci`'s.
        n_permutations: permutations for the Spearman and Kendall p-values (0: none); the
            default is :func:`permutation_test`'s.
        level: confidence level.
        seed: seeds both procedures (same seed, same numbers).
        view: ``application`` or ``shared``.
        groups: shared-layer groups for the ``shared`` view.

    Returns:
        ``{statistic: {"estimate", "low", "high", "p_value", "chance"}}``; ``low``/``high`` are
        None without contributions, ``p_value`` None where no test applies, ``chance`` the
        expected value for unrelated grids (0 for correlations, f/(2-f) for Jaccard).

    >>> a = np.arange(12.0).reshape(3, 4)                    # 3 layers x 4 heads
    >>> c = coherence(a, a[::-1], n_boot=0, n_permutations=0)  # the layers in reverse order
    >>> [round(c[k]["estimate"], 2) for k in ("spearman", "jaccard@0.25", "layer_mass_l1")]
    [-0.79, 0.0, 0.97]
    """
    fractions = tuple(float(f) for f in fractions)
    va, vb = view_of(a, view, groups), view_of(b, view, groups)
    names = ["spearman", "kendall", *[f"jaccard@{f:g}" for f in fractions], "layer_mass_l1"]

    def vector(x, y) -> np.ndarray:  # [n_statistics], in the order of ``names``
        c = compare_scores(x, y, fractions)
        return np.array([c["spearman"], c["kendall"], *[c["top_k_jaccard"][str(f)] for f in fractions],
                         c["layer_mass_l1"]], dtype=np.float64)

    est = vector(va, vb)
    out = {n: {"estimate": float(e), "low": None, "high": None, "p_value": None, "chance": 0.0}
           for n, e in zip(names, est)}
    for f in fractions:
        out[f"jaccard@{f:g}"]["chance"] = f / (2 - f)
    out["layer_mass_l1"]["chance"] = None
    rng = np.random.default_rng(seed)  # one stream: the permutations first, then the bootstrap
    if n_permutations > 0:
        for stat in ("spearman", "kendall"):
            r = permutation_test(va, vb, stat, n_permutations=n_permutations, seed=rng)
            out[stat]["p_value"] = None if math.isnan(r.pvalue) else float(r.pvalue)
    if contributions is not None and n_boot > 0 and all(c is not None for c in contributions):
        ca, cb = (np.asarray(c, dtype=np.float64) for c in contributions)

        def stat(x, y):
            return vector(view_of(x, view, groups), view_of(y, view, groups))

        r = bootstrap_ci(stat, ca, cb, n_boot=n_boot, level=level, seed=rng, reduce="sum",
                         paired=paired and ca.shape[0] == cb.shape[0])
        for i, n in enumerate(names):
            lo, hi = float(r.low[i]), float(r.high[i])
            out[n]["low"] = None if math.isnan(lo) else lo
            out[n]["high"] = None if math.isnan(hi) else hi
            out[n]["boot_estimate"] = float(r.estimate[i])
    return out
