"""Uncertainty by resampling: percentile bootstrap over examples ([`bootstrap_ci`][headcount.analysis.resampling.bootstrap_ci]), paired by
example id ([`paired_bootstrap_ci`][headcount.analysis.resampling.paired_bootstrap_ci]), and hierarchical over seeds then examples
([`hierarchical_bootstrap_ci`][headcount.analysis.resampling.hierarchical_bootstrap_ci], [`hierarchical_ci_from_replicates`][headcount.analysis.resampling.hierarchical_ci_from_replicates]).

Own code: no library resamples seeds then examples within each with per-example contributions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as _sps

from headcount.analysis.batched import BatchedRows, batching_rng, rebuilt
from headcount.analysis.helpers import (LEVEL, N_BOOT, Examples, Interval, Seed, _check_interval, _check_resampling,
                                       _id_list, _np, _rng, normal_interval)
from headcount.runtime.errors import HeadcountError

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
    replacement, re-aggregates, and recomputes ``statistic(grid_1, grid_2, ...)``. A
    ``headcount.analysis.batched.BatchedRows`` is not summed: its estimator (``sum_b |G_b|``) is
    rebuilt on the resample (random batches of the original sizes; one order for the arrays of a
    paired draw that were batched alike), so the replicates are the estimator's own.

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
        A [`BootstrapResult`][headcount.analysis.resampling.BootstrapResult]; non-finite resample values are ignored for the percentiles
        (an all-NaN statistic gives ``nan`` bounds).

    >>> from headcount.analysis import spearman
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
    arrays = [_rows(c) for c in contributions]
    for c in arrays:
        if c.ndim < 1 or c.shape[0] < 1:
            raise HeadcountError("each contributions array needs a leading n_examples axis with >= 1 row")
    if paired and len({c.shape[0] for c in arrays}) > 1:
        raise HeadcountError("paired=True needs the same number of examples in every array")
    rng = _rng(seed)
    order_rng = batching_rng(rng, arrays)  # None without batched rows: the draws are what they were
    ns = [c.shape[0] for c in arrays]
    flat = [None if isinstance(c, BatchedRows) else np.nan_to_num(c.reshape(c.shape[0], -1), nan=0.0) for c in arrays]

    def agg(weights: np.ndarray, i: int, orders: dict | None = None) -> np.ndarray:  # weights [n] resample counts
        c = arrays[i]
        if isinstance(c, BatchedRows):  # the estimator rebuilt; paired: one order per way of batching
            return c.estimate() if orders is None else rebuilt(c, weights, orders, c.partition() if paired else i,
                                                               order_rng)
        g = weights @ flat[i]
        return (g / ns[i] if reduce == "mean" else g).reshape(c.shape[1:])

    full = [agg(np.ones(n), i) for i, n in enumerate(ns)]
    estimate = np.asarray(statistic(*full), dtype=np.float64)
    samples = np.empty((n_boot, *estimate.shape))
    for k in range(n_boot):
        orders: dict = {}
        if paired:
            w = np.bincount(rng.integers(0, ns[0], ns[0]), minlength=ns[0]).astype(np.float64)
            grids = [agg(w, i, orders) for i in range(len(arrays))]
        else:
            grids = []
            for i, n in enumerate(ns):
                w = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
                grids.append(agg(w, i, orders))
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
    put in ``ids_a``'s order first, then [`bootstrap_ci`][headcount.analysis.resampling.bootstrap_ci] draws one index set per resample.

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
        A [`BootstrapResult`][headcount.analysis.resampling.BootstrapResult] (same draws as ``bootstrap_ci(..., paired=True)`` on the
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
    xa, xb = _rows(a), _rows(b)
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
        order = [pos_b[v] for v in la]
        xb = xb.take(order) if isinstance(xb, BatchedRows) else xb[order]
    return bootstrap_ci(statistic, xa, xb, n_boot=n_boot, level=level, seed=seed, reduce=reduce, paired=True)


def _rows(x):
    """Contributions as resampled: ``BatchedRows`` as they are, anything else as float64."""
    return x if isinstance(x, BatchedRows) else _np(x)


@dataclass(frozen=True)
class HierarchicalBootstrapResult(BootstrapResult):
    """A confidence interval for a mean over seeds from a two-level (seeds, then examples) bootstrap.

    Attributes (beyond [`BootstrapResult`][headcount.analysis.resampling.BootstrapResult]'s; ``estimate`` is the mean over seeds of each
    seed's statistic, ``samples`` ``[n_boot, ...]`` the mean over a resample of seeds):
        n_seeds: number of seeds.
        interval: how ``low``/``high`` were read: ``"t"``, ``"t-resampled"``, ``"percentile"`` or,
            with one seed, ``"normal"`` (example noise only).
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
    interval: Interval = "t",
    clip: tuple[float, float] | None = None,
    examples: Examples = "independent",
) -> HierarchicalBootstrapResult:
    """CI for a mean over seeds of a per-seed statistic: resample seeds, then examples within each.

    The quantity is ``mean_s statistic(grids of seed s)`` where seed s's grids aggregate its
    per-example contributions (as in [`bootstrap_ci`][headcount.analysis.resampling.bootstrap_ci]). Both sources of error count: which
    seeds were trained (seed variance) and which examples were scored (example noise).
    Averaging each seed's example-bootstrap bounds, the old summary, ignores the first: with
    seed variance comparable to example noise it covers the truth far less often than nominal.

    Each seed gets ``n_boot`` example resamples of its statistic (a pool); a hierarchical
    resample then draws ``n_seeds`` seeds with replacement and, for each, a random member of its
    pool, and averages ([`hierarchical_ci_from_replicates`][headcount.analysis.resampling.hierarchical_ci_from_replicates]).

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
        interval: how the bounds are read; see [`hierarchical_ci_from_replicates`][headcount.analysis.resampling.hierarchical_ci_from_replicates]
            (``"t"``, the default: example noise counted once; ``"t-resampled"``: headcount's
            earlier interval, which counts it twice; ``"percentile"``).
        clip: ``(lowest, highest)`` possible value of the statistic (e.g. ``(-1, 1)`` for a
            correlation): the bounds are clipped to it.
        examples: ``"independent"`` (default: each seed scored its own examples) or ``"shared"``
            (every seed scored the same examples, rows in the same order: one example resample
            is drawn for all seeds, so that the replicates are aligned and the example noise the
            seeds share is estimated from their covariance; needs the same number of rows in
            every seed).

    Returns:
        A [`HierarchicalBootstrapResult`][headcount.analysis.resampling.HierarchicalBootstrapResult].

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
    _check_interval(interval, examples)
    groups = [list(g) for g in per_seed]
    if any(isinstance(x, BatchedRows) for g in groups for x in g):
        raise HeadcountError("hierarchical_bootstrap_ci sums rows; for batched rows bootstrap each seed "
                             "(bootstrap_ci) and combine with hierarchical_ci_from_replicates")
    n_seeds = len(groups[0])
    if n_seeds < 1 or any(len(g) != n_seeds for g in groups):
        raise HeadcountError(f"every argument needs the same number (>= 1) of seeds, got {[len(g) for g in groups]}")
    shared = examples == "shared"
    if shared and len({_np(x).shape[0] for g in groups for x in g}) > 1:
        raise HeadcountError("examples='shared' needs the same number of examples in every seed")
    rng = _rng(seed)
    shared_seed = int(rng.integers(2 ** 63)) if shared else None
    estimates, pools = [], []
    for s in range(n_seeds):
        # shared examples: the same example resamples for every seed (aligned replicates)
        wrng = np.random.default_rng(shared_seed) if shared else rng
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
                w = w if paired and i else _example_weights(wrng, x.shape[0], m)  # [m, n_s]
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
                                           clip=clip, examples=examples, aligned=shared)


def hierarchical_ci_from_replicates(
    estimates,
    replicates: Sequence,
    *,
    n_boot: int = 2000,
    level: float = LEVEL,
    seed: Seed = 0,
    interval: Interval = "t",
    clip: tuple[float, float] | None = None,
    examples: Examples = "independent",
    aligned: bool = False,
) -> HierarchicalBootstrapResult:
    """Combine per-seed example-bootstrap replicates into a CI for the mean over seeds.

    For results that already hold each seed's bootstrap samples (``BootstrapResult.samples`` of
    one comparison per seed): a hierarchical resample draws ``n_seeds`` seeds with replacement
    and one random replicate of each, then averages them (``samples``). This is the second stage
    of [`hierarchical_bootstrap_ci`][headcount.analysis.resampling.hierarchical_bootstrap_ci].

    Bounds (``interval``):

    - ``"t"`` (default): estimate +- t_df x sqrt(s^2 / n + C), s the sample standard deviation of
      the n seed estimates. Each seed's estimate already carries its own example noise, so its
      spread over seeds measures seed variance *and* example noise: with ``examples="independent"``
      (each seed scored its own examples) C = 0 and df = n - 1, the t interval over the seed
      estimates (~95% coverage in both regimes, seed or example noise dominating; measured in
      ``tests/analysis/test_stats_reference.py``). With ``examples="shared"`` (every seed scored
      the same examples) the noise those examples put into every seed does not show in the spread:
      C is its variance, the mean covariance of two seeds' replicates when they are ``aligned``
      (replicate k of every seed drawn from the same example resample), else its upper bound, the
      mean of the seeds' bootstrap variances (exact when all example noise is shared; wider when
      part of it is seed-specific); df = (n - 1) (1 + n C / s^2)^2 (Welch-Satterthwaite, C taken as known).
    - ``"t-resampled"``: headcount's earlier interval: estimate +- t_{n-1} x the samples' standard
      deviation x sqrt(n / (n - 1)). The samples' variance adds each seed's bootstrap variance to a
      spread of the seed estimates that already contains it: example noise counted twice (with 3
      seeds it covered 0.97 when seed variance dominates and 1.00 when example noise does, 1.7-1.8x
      as wide as the t interval over the seed means).
    - ``"percentile"``: the samples' quantiles (with few seeds, below nominal).

    With one seed (no seed variance to estimate): estimate +- z x the replicates' standard deviation,
    example noise only (``"normal"``; ``"percentile"`` when asked by name). Centred on the estimate:
    the replicates' centre can be off (a per-example proxy's, the ``gradient`` scorer's; repeated
    examples shared by two grids), which left a percentile interval without its estimate
    (docs/statistics.md, "One seed").

    Args:
        estimates: ``[n_seeds, ...]`` each seed's statistic on its full data.
        replicates: ``n_seeds`` arrays ``[n_boot_s, ...]`` (each seed's example-bootstrap samples;
            non-finite members make the hierarchical samples that draw them invalid).
        n_boot: number of hierarchical resamples.
        level: confidence level in (0, 1).
        seed: int or ``numpy.random.Generator``.
        interval: ``"t"``, ``"t-resampled"`` or ``"percentile"`` (above).
        clip: ``(lowest, highest)`` possible value: bounds are clipped to it.
        examples: ``"independent"`` or ``"shared"`` (above).
        aligned: the replicates are aligned across seeds (``examples="shared"`` only).

    Returns:
        A [`HierarchicalBootstrapResult`][headcount.analysis.resampling.HierarchicalBootstrapResult]; ``estimate`` is the mean of ``estimates``.

    >>> est = [0.5, 0.7]; reps = [np.full(10, 0.5), np.full(10, 0.7)]   # no example noise
    >>> r = hierarchical_ci_from_replicates(est, reps, n_boot=400, interval="percentile")
    >>> r.estimate, float(r.low), float(r.high)
    (0.6, 0.5, 0.7)
    >>> one = hierarchical_ci_from_replicates([0.89], [np.linspace(0.91, 0.94, 50)], n_boot=400)  # replicates above
    >>> one.interval, bool(one.low < 0.89 < one.high)
    ('normal', True)
    """
    _check_resampling(level, n_boot)
    _check_interval(interval, examples)
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
    use = interval if n_seeds > 1 or interval == "percentile" else "normal"
    masked = np.where(finite, samples, np.nan)
    if n_valid < 2:
        low = np.full(shape, math.nan)
        high = low.copy()
    elif use == "normal":  # one seed: the replicates' spread around the estimate, not their location
        low, high = normal_interval(estimate, pools[0], level)
    elif use == "percentile":
        low = np.nanquantile(masked, alpha, axis=0)
        high = np.nanquantile(masked, 1 - alpha, axis=0)
    elif use == "t-resampled":
        half = (_sps.t.ppf(1 - alpha, n_seeds - 1) * np.nanstd(masked, axis=0, ddof=1)
                * math.sqrt(n_seeds / (n_seeds - 1)))
        low, high = estimate - half, estimate + half
    else:
        low, high = _t_bounds(est, pools, alpha, examples == "shared", aligned)
    if clip is not None:
        low, high = np.clip(low, *clip), np.clip(high, *clip)

    def out(v):
        v = np.asarray(v, dtype=np.float64)
        return float(v) if v.ndim == 0 else v

    return HierarchicalBootstrapResult(out(estimate), out(low), out(high), level, n_boot, n_valid, samples,
                                       n_seeds=n_seeds, interval=use)


def _t_bounds(est: np.ndarray, pools: list[np.ndarray], alpha: float, shared: bool, aligned: bool):
    """The ``"t"`` bounds of [`hierarchical_ci_from_replicates`][headcount.analysis.resampling.hierarchical_ci_from_replicates] (elementwise for vector statistics)."""
    n = est.shape[0]
    with np.errstate(all="ignore"):
        mean = est.mean(axis=0)
        between = est.var(axis=0, ddof=1) / n  # s^2 / n: seed variance and each seed's own example noise
        common = np.zeros_like(mean)
        if shared:
            if aligned and len({p.shape[0] for p in pools}) == 1:
                centred = [p - np.nanmean(p, axis=0) for p in pools]
                covs = [np.nanmean(centred[a] * centred[b], axis=0) for a in range(n) for b in range(a + 1, n)]
                common = np.maximum(np.mean(covs, axis=0), 0.0)
            else:
                common = np.mean([np.nanvar(p, axis=0, ddof=1) for p in pools], axis=0)
        total = between + common
        df = np.where(between > 0, (n - 1) * (total / np.where(between > 0, between, 1.0)) ** 2, np.inf)
        half = _sps.t.ppf(1 - alpha, df) * np.sqrt(total)
    return mean - half, mean + half


__all__ = ["BatchedRows", "BootstrapResult", "HierarchicalBootstrapResult", "bootstrap_ci", "hierarchical_bootstrap_ci", "hierarchical_ci_from_replicates", "paired_bootstrap_ci"]
