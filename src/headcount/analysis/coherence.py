"""Coherence of two head-importance grids: rank agreement, top-k overlap, layer mass, with uncertainty.

Pure functions on arrays (no models). A grid is ``[n_layers, n_heads]`` importance, higher =
more important; for a model with shared layers (ALBERT) a row is one *application* of a
layer, and the ``shared`` view sums the rows of each group of applications that run the same
physical layer (the groups of [`headcount.core.gates.shared_groups`][headcount.core.gates.shared_groups]).

Used by the transfer study (Chiang & Chen 2021) to compare MLM and task importance; nothing here
is specific to it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from headcount.analysis.batched import BatchedRows
from headcount.analysis.correlation import compare_scores, normalize_layers
from headcount.analysis.helpers import DEFAULT_FRACTIONS, LEVEL, N_BOOT, N_PERMUTATIONS, normal_interval
from headcount.analysis.permutation import permutation_test
from headcount.analysis.resampling import (
    bootstrap_ci,
    hierarchical_ci_from_replicates,
    paired_bootstrap_ci,
)
from headcount.runtime.errors import HeadcountError

__all__ = ["LAYER_NORM", "REPLICATES", "UNCALIBRATED", "VIEWS", "coherence", "pair_seed", "seed_mean_ci",
           "shared_view", "statistic_range", "view_of"]

#: the ways a grid is looked at: per application (depth x head) or per shared head
VIEWS = ("application", "shared")
#: what a bootstrap replicate is: the estimator itself on a resample (rows that sum to the grid, or
#: ``BatchedRows`` rebuilt), or a per-example proxy's sum (the ``gradient`` scorer's ``|u_i| / N_b``
#: without its signed rows: too narrow, see ``headcount.analysis.batched``)
REPLICATES = ("estimator", "proxy")
#: how an interval resting on proxy replicates is labelled
UNCALIBRATED = "uncalibrated: replicates of a per-example proxy, not of the estimator"


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
    """``grid`` in a view: ``application`` (as is) or ``shared`` ([`shared_view`][headcount.analysis.coherence.shared_view]).

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


#: suffix of the statistics computed on layer-normalised grids ([`normalize_layers`][headcount.analysis.correlation.normalize_layers])
LAYER_NORM = "@layer-norm"


def statistic_range(name: str) -> tuple[float, float]:
    """The possible values of a coherence statistic (what a confidence interval is clipped to).

    >>> statistic_range("spearman"), statistic_range("jaccard@0.1@layer-norm"), statistic_range("layer_mass_l1")
    ((-1.0, 1.0), (0.0, 1.0), (0.0, 2.0))
    """
    if name.startswith("jaccard@"):
        return (0.0, 1.0)
    if name.startswith("layer_mass_l1"):
        return (0.0, 2.0)
    return (-1.0, 1.0)


def coherence(a, b, contributions: tuple | None = None, *, paired: bool = False, ids: tuple | None = None,
              fractions: Sequence[float] = DEFAULT_FRACTIONS, n_boot: int = N_BOOT, n_permutations: int = N_PERMUTATIONS,
              level: float = LEVEL, seed: int = 0, view: str = "application", groups=None,
              permutation: str = "within-layer", keep_samples: bool = False, replicates: str = "estimator") -> dict:
    """Coherence of two head-importance grids, with bootstrap intervals and permutation p-values.

    Statistics (on ``view_of(grid, view, groups)``): ``spearman``, ``kendall`` (tau-b),
    ``jaccard@F`` (top-F overlap, for each fraction) and ``layer_mass_l1`` (L1 distance of the
    per-layer importance shares, in [0, 2]) on the raw grids; the same but ``layer_mass_l1`` on
    layer-normalised grids (each row z-scored, [`normalize_layers`][headcount.analysis.correlation.normalize_layers]),
    named with the suffix ``@layer-norm``: do the grids order the heads *within* each layer alike,
    with the layers' different means taken out?

    p-values (Spearman and Kendall): ``p_value`` by default from the within-layer permutation
    test (``strata="rows"``: a head's score moves only among the heads of its layer (row), so
    layer means that both grids share cannot make it small); ``p_value_global`` from permuting
    all heads (the earlier default; raw grids only). On layer-normalised grids only Spearman gets
    a p-value (Kendall's permutations are ~40 times as slow).

    Args:
        a: ``[n_layers, n_heads]`` importance (``scores.json`` ``heads``).
        b: the same shape.
        contributions: optional ``(per_example_a, per_example_b)``, each ``[n_examples, n_layers,
            n_heads]`` rows that sum to the grid (re-aggregated as sums on a resample), or a
            ``headcount.analysis.batched.BatchedRows`` (the ``gradient`` scorer's signed rows: the
            estimator ``sum_b |G_b|`` rebuilt on each resample): bootstrap over examples. The
            interval is the estimate +- z x the replicates' standard deviation, clipped to the
            statistic's range ([`statistic_range`][headcount.analysis.coherence.statistic_range]):
            centred on the estimate, because the replicates' centre (``boot_estimate``) is not it
            (a resample's grids are noisier, and repeated examples make two grids agree more).
            It covers the statistic's expected value at this number of examples and batch size
            (~95% in ``tests/analysis/test_interval_coverage.py``), not the noise-free one.
        paired: the two grids come from the same examples: resample them together, matched by
            ``ids`` ([`paired_bootstrap_ci`][headcount.analysis.resampling.paired_bootstrap_ci]; id sets that differ are an
            error). Without ids on both sides the bootstrap is unpaired (``pairing`` says so).
        ids: optional ``(ids_a, ids_b)``: the example id of each row of the contributions.
        fractions: top-k fractions for the Jaccard overlap.
        n_boot: bootstrap resamples (0: no intervals); the default is [`bootstrap_ci`][headcount.analysis.resampling.bootstrap_ci]'s.
        n_permutations: permutations for the Spearman and Kendall p-values (0: none); the
            default is [`permutation_test`][headcount.analysis.permutation.permutation_test]'s.
        level: confidence level.
        seed: seeds both procedures (same seed, same numbers).
        view: ``application`` or ``shared``.
        groups: shared-layer groups for the ``shared`` view.
        permutation: the test behind ``p_value``: ``within-layer`` (default) or ``global``.
        keep_samples: add each statistic's bootstrap ``samples`` (``[n_boot]`` array), e.g. for a
            hierarchical interval over seeds ([`seed_mean_ci`][headcount.analysis.coherence.seed_mean_ci]).
        replicates: ``estimator`` (default) or ``proxy``: the caller's word that the rows are a
            per-example proxy of a grid they do not sum to (``gradient`` rows saved without their
            signed parts); the interval is then labelled ``UNCALIBRATED`` (``replicates``).

    Returns:
        ``{statistic: {"estimate", "low", "high", "p_value", "p_value_global", "chance", "grids",
        "pairing"}}``; ``low``/``high`` are None without contributions, p-values None where no
        test applies, ``chance`` the expected value for unrelated grids (0 for correlations,
        f/(2-f) for Jaccard), ``grids`` ``raw`` or ``layer-normalised``, ``pairing`` ``ids``,
        ``unpaired``, ``unpaired (no example ids)`` (paired asked for; e.g. scores saved before
        ids were) or None (no bootstrap); with a bootstrap also ``replicates``: ``estimator`` or
        ``UNCALIBRATED``.

    >>> a = np.arange(12.0).reshape(3, 4)                    # 3 layers x 4 heads
    >>> c = coherence(a, a[::-1], n_boot=0, n_permutations=0)  # the layers in reverse order
    >>> [round(c[k]["estimate"], 2) for k in ("spearman", "jaccard@0.25", "layer_mass_l1", "spearman@layer-norm")]
    [-0.79, 0.0, 0.97, 1.0]
    """
    fractions = tuple(float(f) for f in fractions)
    va, vb = view_of(a, view, groups), view_of(b, view, groups)
    raw = ["spearman", "kendall", *[f"jaccard@{f:g}" for f in fractions], "layer_mass_l1"]
    normed = [n + LAYER_NORM for n in raw[:-1]]  # layer masses of z-scored rows mean nothing
    names = raw + normed

    def vector(x, y) -> np.ndarray:  # [n_statistics], in the order of ``names``
        c = compare_scores(x, y, fractions)
        n = compare_scores(normalize_layers(x), normalize_layers(y), fractions)
        return np.array([c["spearman"], c["kendall"], *[c["top_k_jaccard"][str(f)] for f in fractions],
                         c["layer_mass_l1"], n["spearman"], n["kendall"],
                         *[n["top_k_jaccard"][str(f)] for f in fractions]], dtype=np.float64)

    est = vector(va, vb)
    out = {n: {"estimate": float(e), "low": None, "high": None, "p_value": None, "p_value_global": None,
               "chance": 0.0, "grids": "layer-normalised" if n in normed else "raw", "pairing": None}
           for n, e in zip(names, est)}
    for f in fractions:
        out[f"jaccard@{f:g}"]["chance"] = out[f"jaccard@{f:g}{LAYER_NORM}"]["chance"] = f / (2 - f)
    out["layer_mass_l1"]["chance"] = None
    rng = np.random.default_rng(seed)  # one stream: the permutations first, then the bootstrap

    def p(r) -> float | None:
        return None if math.isnan(r.pvalue) else float(r.pvalue)

    if replicates not in REPLICATES:
        raise HeadcountError(f"unknown replicates {replicates!r}; use 'estimator' or 'proxy'")
    if permutation not in ("within-layer", "global"):
        raise HeadcountError(f"unknown permutation test {permutation!r}; use 'within-layer' or 'global'")
    strata = "rows" if permutation == "within-layer" else None
    if n_permutations > 0:
        na, nb = normalize_layers(va), normalize_layers(vb)
        for stat in ("spearman", "kendall"):
            glob = p(permutation_test(va, vb, stat, n_permutations=n_permutations, seed=rng))
            out[stat]["p_value_global"] = glob
            out[stat]["p_value"] = glob if strata is None else p(
                permutation_test(va, vb, stat, n_permutations=n_permutations, seed=rng, strata=strata))
            if stat == "spearman":  # Kendall's permutations cost ~40x Spearman's: one test on these grids
                out[stat + LAYER_NORM]["p_value"] = p(permutation_test(na, nb, stat, n_permutations=n_permutations,
                                                                       seed=rng, strata=strata))
    if contributions is not None and n_boot > 0 and all(c is not None for c in contributions):
        ca, cb = (c if isinstance(c, BatchedRows) else np.asarray(c, dtype=np.float64) for c in contributions)

        def stat(x, y):
            return vector(view_of(x, view, groups), view_of(y, view, groups))

        if paired and ids is not None and all(i is not None for i in ids):
            r = paired_bootstrap_ci(stat, ca, cb, ids[0], ids[1], n_boot=n_boot, level=level, seed=rng, reduce="sum")
            pairing = "ids"
        else:  # without ids, rows in the same position need not be the same example (batches group by length)
            r = bootstrap_ci(stat, ca, cb, n_boot=n_boot, level=level, seed=rng, reduce="sum")
            pairing = "unpaired (no example ids)" if paired else "unpaired"
        # centred on the estimate: the replicates give the example noise's spread, not the location
        # (a resample's grids are noisier; repeated examples shared by both grids agree more)
        low, high = normal_interval(est, r.samples, level)  # [n_statistics] each
        for i, n in enumerate(names):
            if math.isfinite(low[i]) and math.isfinite(high[i]):
                lo_b, hi_b = statistic_range(n)
                out[n]["low"], out[n]["high"] = max(lo_b, float(low[i])), min(hi_b, float(high[i]))
            out[n]["boot_estimate"] = float(r.estimate[i])
            out[n]["pairing"] = pairing
            out[n]["replicates"] = "estimator" if replicates == "estimator" else UNCALIBRATED
            if keep_samples:
                out[n]["samples"] = r.samples[:, i]
    return out


def seed_mean_ci(estimates: Sequence[float], samples: Sequence, statistic: str, *, level: float = LEVEL,
                 n_boot: int = 2000, seed: int = 0, examples: str = "shared", interval: str = "t",
                 replicates: str = "estimator") -> dict:
    """A mean over seeds (pairs) of one statistic, with its interval over seeds and examples.

    [`hierarchical_ci_from_replicates`][headcount.analysis.resampling.hierarchical_ci_from_replicates], clipped to
    [`statistic_range`][headcount.analysis.coherence.statistic_range]: by default the t interval over the seed estimates plus the example
    noise the seeds share (``examples="shared"``: the transfer study scores every seed on the same
    examples; the replicates are not aligned, so that noise is bounded by the seeds' mean bootstrap
    variance); ``examples="independent"``: the t interval over the seed estimates alone;
    ``interval="t-resampled"``: headcount's earlier interval (example noise counted twice). Seeds
    whose estimate is not finite (a constant grid) are left out and counted: ``n`` (seeds given)
    vs ``n_finite`` (seeds averaged).

    Args:
        estimates: each seed's statistic.
        samples: each seed's ``[n_boot]`` bootstrap samples (None where there are none).
        statistic: its name (for the range).
        level: confidence level.
        n_boot: hierarchical resamples.
        seed: seed of the resampling.
        examples: ``"shared"`` (default) or ``"independent"``: did the seeds score the same examples?
        interval: ``"t"`` (default), ``"t-resampled"`` or ``"percentile"``.
        replicates: ``estimator`` (default: the samples are the estimator's own replicates) or
            ``proxy``: every interval that reads the samples (one seed; the shared-noise term of
            ``t, shared examples``; ``t-resampled``, ``percentile``) says ``UNCALIBRATED``.

    Returns:
        ``{"estimate", "low", "high", "n", "n_finite", "interval"}`` (bounds None without samples;
        ``interval`` e.g. ``t, shared examples``, ``normal, uncalibrated: ...``).

    >>> r = seed_mean_ci([0.5, 0.7, float("nan")], [np.full(10, 0.5), np.full(10, 0.7), None], "spearman")
    >>> r["estimate"], r["n"], r["n_finite"]
    (0.6, 3, 2)
    """
    if replicates not in REPLICATES:
        raise HeadcountError(f"unknown replicates {replicates!r}; use 'estimator' or 'proxy'")
    keep = [i for i, e in enumerate(estimates) if e is not None and math.isfinite(e)]
    out = {"estimate": float(np.mean([estimates[i] for i in keep])) if keep else math.nan,
           "low": None, "high": None, "n": len(estimates), "n_finite": len(keep), "interval": None}
    if keep and all(samples[i] is not None and len(samples[i]) for i in keep):
        r = hierarchical_ci_from_replicates([estimates[i] for i in keep], [np.asarray(samples[i]) for i in keep],
                                            n_boot=n_boot, level=level, seed=seed, clip=statistic_range(statistic),
                                            interval=interval, examples=examples)
        out["low"] = None if math.isnan(r.low) else float(r.low)
        out["high"] = None if math.isnan(r.high) else float(r.high)
        out["interval"] = r.interval + (f", {examples} examples" if r.interval == "t" else "")
        reads_samples = r.interval != "t" or examples == "shared"  # t over independent seeds reads the estimates only
        if replicates == "proxy" and reads_samples:
            out["interval"] += f", {UNCALIBRATED}"
    return out
