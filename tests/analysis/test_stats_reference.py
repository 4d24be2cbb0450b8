"""headcount.analysis' honest-statistics procedures against small reference implementations.

Each reference below is written here with plain numpy/scipy loops (it does not call the code
under test) and checked on synthetic data with a known truth:

- the within-layer (stratified) permutation test is calibrated under a null with strong layer
  effects, where the global permutation test rejects far too often;
- the interval of a mean over seeds (t over the seed estimates; hierarchical bootstrap samples)
  covers the true mean over seeds at about the nominal rate with 3 seeds, whether seed variance or
  example noise dominates, where averaging each seed's example-bootstrap bounds does not and the
  earlier ``t-resampled`` interval (example noise counted twice) over-covers;
- the paired bootstrap pairs examples by id and is narrower than an unpaired one for
  positively correlated contributions.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats as sps

from headcount.analysis import (
    bootstrap_ci,
    hierarchical_bootstrap_ci,
    hierarchical_ci_from_replicates,
    paired_bootstrap_ci,
    permutation_test,
)
from headcount.runtime.errors import HeadcountError

N_LAYERS, N_HEADS = 12, 12


def layer_effect_null(rng: np.random.Generator, layer_sd: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Two ``[layer, head]`` grids that share each layer's mean; heads independent within a layer."""
    layer_mean = layer_sd * rng.standard_normal((N_LAYERS, 1))
    a = layer_mean + rng.standard_normal((N_LAYERS, N_HEADS))
    b = layer_mean + rng.standard_normal((N_LAYERS, N_HEADS))
    return a, b


def reference_within_layer_p(a: np.ndarray, b: np.ndarray, n_permutations: int, seed: int) -> float:
    """Two-sided Spearman permutation p-value, shuffling b's heads inside each layer (plain loops).

    Two-sided = twice the smaller one-sided p, capped at 1 (the null is not centred at 0 here).
    """
    rng = np.random.default_rng(seed)
    observed = sps.spearmanr(a.ravel(), b.ravel()).statistic
    above = below = 0
    for _ in range(n_permutations):
        shuffled = np.stack([row[rng.permutation(row.size)] for row in b])
        r = sps.spearmanr(a.ravel(), shuffled.ravel()).statistic
        above += r >= observed - 1e-12
        below += r <= observed + 1e-12
    return min(1.0, 2 * (1 + min(above, below)) / (1 + n_permutations))


def reference_two_sided(null: np.ndarray, observed: float) -> float:
    """The two-sided rule written out: 2 x the smaller one-sided Monte Carlo p, at most 1."""
    n = len(null)
    p_greater = (1 + sum(1 for v in null if v >= observed - 1e-12)) / (1 + n)
    p_less = (1 + sum(1 for v in null if v <= observed + 1e-12)) / (1 + n)
    return min(1.0, 2 * min(p_greater, p_less))


def old_abs_rule(null: np.ndarray, observed: float) -> float:
    """The rule before: (1 + #{|null| >= |observed|}) / (1 + n), one-sided when the null is off 0."""
    return (1 + np.count_nonzero(np.abs(null) >= abs(observed) - 1e-12)) / (1 + len(null))


def layered(sign: float, layer_effects: bool, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    """Grids sharing a rising layer effect (or none), heads associated within layers with ``sign``."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((N_LAYERS, N_HEADS))
    b = sign * 0.8 * a + 0.6 * rng.standard_normal((N_LAYERS, N_HEADS))
    ramp = (2 / 3) * np.arange(N_LAYERS, dtype=float)[:, None] if layer_effects else 0.0
    return a + ramp, b + ramp


# --------------------------------------------------------------------------- stratified permutation


def test_within_layer_permutation_is_calibrated_where_the_global_one_is_not():
    rng = np.random.default_rng(20261201)
    n_rep, n_perm = 200, 199
    p_within, p_global = np.empty(n_rep), np.empty(n_rep)
    for r in range(n_rep):
        a, b = layer_effect_null(rng)
        p_within[r] = permutation_test(a, b, n_permutations=n_perm, seed=r, strata="rows").pvalue
        p_global[r] = permutation_test(a, b, n_permutations=n_perm, seed=r).pvalue
    # under the null p is ~uniform on {2/200, 4/200, ..., 1}: 5% below 0.05 (binomial sd over 200: 1.5%)
    assert 0.015 <= np.mean(p_within <= 0.05) <= 0.09
    assert sps.kstest(p_within, "uniform").pvalue > 0.01
    assert 0.4 < np.median(p_within) < 0.6
    # the global test sees the shared layer means as head-level agreement
    assert np.mean(p_global <= 0.05) > 0.8


def test_within_layer_permutation_agrees_with_the_reference_loop():
    rng = np.random.default_rng(7)
    a, b = layer_effect_null(rng, layer_sd=1.0)
    b = b + 0.1 * (a - a.mean(axis=1, keepdims=True))  # a weak within-layer association
    ours = permutation_test(a, b, n_permutations=4000, seed=1, strata="rows")
    ref = reference_within_layer_p(a, b, n_permutations=1500, seed=2)
    assert ours.statistic == pytest.approx(sps.spearmanr(a.ravel(), b.ravel()).statistic)
    assert 0.03 < ref < 0.4
    # Monte Carlo sd of the difference ~0.02 (two-sided p ~0.24 = 2 x a one-sided p ~0.12)
    assert ours.pvalue == pytest.approx(ref, abs=0.06)
    assert ours.pvalue == reference_two_sided(ours.null, ours.statistic)
    assert permutation_test(a, b, n_permutations=4000, seed=1).pvalue < 0.01  # the global test: "significant"


def test_stratified_permutations_never_move_a_value_to_another_layer():
    rng = np.random.default_rng(3)
    a = rng.random((4, 6))
    b = rng.random((4, 6))
    layer = np.repeat(np.arange(4), 6)  # the flattened entries' layers

    def same_layer_multisets(x, y_perm):  # 1.0 when each layer holds the same values as before
        return float(all(np.array_equal(np.sort(y_perm[layer == i]), np.sort(b.ravel()[layer == i]))
                         for i in range(4)))

    r = permutation_test(a, b, same_layer_multisets, n_permutations=200, seed=0, strata="rows")
    assert np.all(r.null == 1.0)
    g = permutation_test(a, b, same_layer_multisets, n_permutations=200, seed=0)
    assert np.mean(g.null) < 0.05  # a global permutation mixes the layers
    # the vectorised Kendall path uses the same within-layer draws
    k = permutation_test(a, b, "kendall", n_permutations=500, seed=0, strata="rows")
    assert 0 < k.pvalue <= 1 and np.isfinite(k.null).all()


# two-sided p = min(1, 2 min(p_greater, p_less)): right also when the null is not centred at 0


@pytest.mark.parametrize("layer_effects", [True, False], ids=["layer-effects", "no-layer-effects"])
@pytest.mark.parametrize("sign", [-1.0, 1.0], ids=["negative", "positive"])
def test_two_sided_p_finds_a_within_layer_association_of_either_sign(sign, layer_effects):
    a, b = layered(sign, layer_effects)
    n = 999
    p = {alt: permutation_test(a, b, n_permutations=n, seed=0, strata="rows", alternative=alt)
         for alt in ("two-sided", "greater", "less")}
    r = p["two-sided"]
    # every within-layer permutation lies on the side of no association: known answers
    with_sign, against = ("greater", "less") if sign > 0 else ("less", "greater")
    assert p[with_sign].pvalue == pytest.approx(1 / (n + 1))
    assert p[against].pvalue == 1.0
    assert r.pvalue == pytest.approx(2 / (n + 1))
    assert r.pvalue == reference_two_sided(r.null, r.statistic)
    if layer_effects:  # the null sits far from 0: the shared layer ramp gives every permutation rho > 0.8
        assert r.null.min() > 0.8 and r.statistic > 0
        if sign < 0:  # ... and |null| >= |observed| would call a strong negative association p = 1
            assert old_abs_rule(r.null, r.statistic) == 1.0


@pytest.mark.parametrize("layer_effects", [True, False], ids=["layer-effects", "no-layer-effects"])
def test_no_within_layer_association_is_not_significant(layer_effects):
    a, b = layered(0.0, layer_effects)
    for alt in ("two-sided", "greater", "less"):
        r = permutation_test(a, b, n_permutations=999, seed=0, strata="rows", alternative=alt)
        assert r.pvalue > 0.3, alt
    r = permutation_test(a, b, n_permutations=999, seed=0, strata="rows")
    assert r.pvalue == reference_two_sided(r.null, r.statistic)
    if layer_effects:
        assert permutation_test(a, b, n_permutations=999, seed=0).pvalue == pytest.approx(2 / 1000)  # global: layers


@pytest.mark.parametrize("layer_sd", [2.0, 0.0], ids=["layer-effects", "no-layer-effects"])
def test_two_sided_within_layer_p_is_calibrated_on_both_sides(layer_sd):
    rng = np.random.default_rng(20270101)
    n_rep, n_perm = 400, 199
    p, low_side = np.empty(n_rep), np.empty(n_rep, dtype=bool)
    for r in range(n_rep):
        a, b = layer_effect_null(rng, layer_sd=layer_sd)
        res = permutation_test(a, b, n_permutations=n_perm, seed=r, strata="rows")
        p[r], low_side[r] = res.pvalue, res.statistic < np.median(res.null)
    reject = p <= 0.05
    # 5% overall (binomial sd over 400: 1.1%), about half of it on each side of the null: the
    # rule |null| >= |observed| rejected (almost) only above a null centred > 0
    assert 0.02 <= reject.mean() <= 0.09
    assert 0.005 <= np.mean(reject & low_side) <= 0.05
    assert 0.005 <= np.mean(reject & ~low_side) <= 0.05


def test_two_sided_p_matches_the_reference_rule_and_the_old_one_for_a_centred_null():
    rng = np.random.default_rng(5)
    for k in range(12):
        a = rng.standard_normal((8, 8))
        b = (0.25 * rng.standard_normal()) * a + rng.standard_normal((8, 8))
        if k % 3 == 0:  # ties
            a, b = np.round(a), np.round(b)
        for kwargs in ({}, {"strata": "rows"}, {"statistic": "kendall"}):
            r = permutation_test(a, b, n_permutations=2000, seed=k, **kwargs)
            assert r.pvalue == reference_two_sided(r.null, r.statistic)
            if "strata" not in kwargs:  # global, null centred on 0: close to |null| >= |observed|
                assert abs(r.null.mean()) < 0.02
                assert r.pvalue == pytest.approx(old_abs_rule(r.null, r.statistic), abs=0.02)
    # one-sided alternatives are unchanged: (1 + #{null as extreme}) / (1 + n)
    r = permutation_test(a, b, n_permutations=2000, seed=0, alternative="less")
    assert r.pvalue == (1 + np.count_nonzero(r.null <= r.statistic + 1e-12)) / 2001


# --------------------------------------------------------------------------- hierarchical bootstrap


N_SEEDS, N_EXAMPLES, SEED_SD, EXAMPLE_SD, TRUE_MEAN = 5, 40, 1.0, 1.0, 1.0


def synthetic_seeds(rng: np.random.Generator) -> list[np.ndarray]:
    """Per-example values of N_SEEDS seeds: seed means scatter around TRUE_MEAN, examples around them."""
    seed_means = TRUE_MEAN + SEED_SD * rng.standard_normal(N_SEEDS)
    return [m + EXAMPLE_SD * rng.standard_normal(N_EXAMPLES) for m in seed_means]


def reference_per_seed_percentiles(values: np.ndarray, rng: np.random.Generator, n_boot: int) -> tuple[float, float]:
    """One seed's example-bootstrap 95% percentile interval of the mean."""
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    means = values[idx].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def reference_hierarchical(seeds: list[np.ndarray], rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """Two-level bootstrap by loops: draw seeds with replacement, then fresh examples for each draw."""
    out = np.empty(n_boot)
    for k in range(n_boot):
        picked = rng.integers(0, len(seeds), len(seeds))
        out[k] = np.mean([seeds[s][rng.integers(0, seeds[s].size, seeds[s].size)].mean() for s in picked])
    return out


def test_hierarchical_bootstrap_covers_the_truth_and_the_averaged_bounds_do_not():
    rng = np.random.default_rng(11)
    n_rep, n_boot = 200, 200
    covered_ours, covered_old, covered_pct = 0, 0, 0
    for r in range(n_rep):
        seeds = synthetic_seeds(rng)
        ours = hierarchical_bootstrap_ci(None, seeds, n_boot=n_boot, seed=r)
        covered_ours += ours.low <= TRUE_MEAN <= ours.high
        pct = hierarchical_bootstrap_ci(None, seeds, n_boot=n_boot, seed=r, interval="percentile")
        covered_pct += pct.low <= TRUE_MEAN <= pct.high
        bounds = np.array([reference_per_seed_percentiles(s, rng, n_boot) for s in seeds])  # the old summary
        low, high = bounds.mean(axis=0)
        covered_old += low <= TRUE_MEAN <= high
    assert covered_ours / n_rep >= 0.90
    assert covered_old / n_rep < 0.90
    assert covered_old / n_rep < 0.75  # far off: it only sees example noise
    assert covered_pct <= covered_ours  # percentile bounds over 5 seeds are narrower than the t bounds


def test_hierarchical_bootstrap_matches_the_reference_loop():
    rng = np.random.default_rng(5)
    seeds = synthetic_seeds(rng)
    ours = hierarchical_bootstrap_ci(None, seeds, n_boot=3000, seed=0, interval="percentile")
    ref = reference_hierarchical(seeds, np.random.default_rng(1), n_boot=3000)
    assert ours.estimate == pytest.approx(np.mean([s.mean() for s in seeds]))
    assert ours.samples.std() == pytest.approx(ref.std(), rel=0.08)
    assert ours.low == pytest.approx(np.quantile(ref, 0.025), abs=0.15 * ref.std())  # tails: MC error ~0.05 sd
    assert ours.high == pytest.approx(np.quantile(ref, 0.975), abs=0.15 * ref.std())
    old = hierarchical_bootstrap_ci(None, seeds, n_boot=3000, seed=0, interval="t-resampled")  # the earlier interval
    half = sps.t.ppf(0.975, N_SEEDS - 1) * ref.std(ddof=1) * np.sqrt(N_SEEDS / (N_SEEDS - 1))
    assert (old.high - old.low) / 2 == pytest.approx(half, rel=0.08)
    t = hierarchical_bootstrap_ci(None, seeds, n_boot=3000, seed=0)  # the default: t over the seed estimates
    means = np.array([x.mean() for x in seeds])
    assert (t.high - t.low) / 2 == pytest.approx(sps.t.ppf(0.975, N_SEEDS - 1) * means.std(ddof=1) / np.sqrt(N_SEEDS),
                                                 rel=1e-12)
    assert t.interval == "t" and t.n_seeds == N_SEEDS and t.to_dict()["n_seeds"] == N_SEEDS


def _coverage(rng, seed_sd, example_sd, n_rep, shared=False, **kw):
    """(coverage of the truth 1.0, median width) of the interval over 3 seeds x 40 examples. With
    ``shared``, every seed scores the same 40 examples: an example effect common to the seeds plus
    a seed-specific one (0.3 x example_sd)."""
    hit, widths = 0, []
    for r in range(n_rep):
        a = seed_sd * rng.standard_normal(3)
        common = example_sd * rng.standard_normal(40)
        seeds = [1.0 + a[s] + (common + 0.3 * example_sd * rng.standard_normal(40) if shared
                               else example_sd * rng.standard_normal(40)) for s in range(3)]
        ci = hierarchical_bootstrap_ci(None, seeds, n_boot=100, seed=r, **kw)
        hit += ci.low <= 1.0 <= ci.high
        widths.append(ci.high - ci.low)
    return hit / n_rep, float(np.median(widths))


@pytest.mark.parametrize("regime, seed_sd", [("seed variance dominates", 1.0), ("example noise dominates", 0.02)])
def test_the_interval_over_3_seeds_covers_at_the_nominal_rate_in_both_regimes(regime, seed_sd):
    """Independent examples per seed: each seed's estimate carries its own example noise, so the
    spread of the seed estimates already measures it. The default t interval (over the seed
    estimates) covers ~95%; the earlier one (t-resampled: each seed's bootstrap variance added
    again) over-covers, most where example noise dominates. Measured (1,000 replications, seeds
    fixed; a count of hits, no kernel can change it): seed variance dominating t 0.950,
    t-resampled 0.967; example noise dominating t 0.953, t-resampled 1.000 at 1.79x the width."""
    n_rep = 1000
    t, t_width = _coverage(np.random.default_rng(21), seed_sd, 1.0, n_rep)
    old, old_width = _coverage(np.random.default_rng(21), seed_sd, 1.0, n_rep, interval="t-resampled")
    print(f"{regime}: coverage t {t:.3f} (width {t_width:.3f}), t-resampled {old:.3f} (width {old_width:.3f})")
    assert 0.93 <= t <= 0.97
    if seed_sd < 0.1:
        assert old >= 0.99 and old_width / t_width > 1.5  # example noise counted twice


def test_shared_examples_add_the_noise_the_seeds_share():
    """Every seed scored the same examples: their common noise is not in the spread of the seed
    estimates, so the t interval over them alone under-covers; ``examples="shared"`` adds it
    (aligned replicates: their covariance). Measured (600 replications): t over the seeds alone
    0.492, with the shared noise 0.925 (a little under nominal: Welch-Satterthwaite's df)."""
    n_rep = 600
    alone, _ = _coverage(np.random.default_rng(4), 0.02, 1.0, n_rep, shared=True)
    shared, _ = _coverage(np.random.default_rng(4), 0.02, 1.0, n_rep, shared=True, examples="shared")
    print(f"shared examples: coverage t over seeds alone {alone:.3f}, with the shared noise {shared:.3f}")
    assert alone < 0.6 and 0.9 <= shared <= 0.97
    with pytest.raises(HeadcountError, match="same number of examples"):
        hierarchical_bootstrap_ci(None, [np.zeros(3), np.zeros(4)], examples="shared")
    with pytest.raises(HeadcountError, match="unknown examples"):
        hierarchical_bootstrap_ci(None, [np.zeros(3)], examples="some")


def test_hierarchical_bootstrap_of_a_statistic_of_paired_grids():
    rng = np.random.default_rng(9)
    # 3 seeds x [n, 4] contributions to two grids computed on the same examples
    a = [rng.random((30, 4)) + np.arange(4) for _ in range(3)]
    b = [x + 0.3 * rng.random((30, 4)) for x in a]

    def diff(x, y):
        return x.sum() - y.sum()

    # the resampled interval reads the example bootstrap (the t interval over seed estimates does not)
    r = hierarchical_bootstrap_ci(diff, a, b, paired=True, reduce="sum", n_boot=300, seed=0, interval="t-resampled")
    assert r.estimate == pytest.approx(np.mean([diff(x.sum(0), y.sum(0)) for x, y in zip(a, b)]))
    assert r.low < r.estimate < r.high
    unpaired = hierarchical_bootstrap_ci(diff, a, b, reduce="sum", n_boot=300, seed=0, interval="t-resampled")
    assert (r.high - r.low) < (unpaired.high - unpaired.low)
    again = hierarchical_bootstrap_ci(diff, a, b, paired=True, reduce="sum", n_boot=300, seed=0, interval="t-resampled")
    np.testing.assert_array_equal(again.samples, r.samples)
    # the same numbers from each seed's own bootstrap samples
    pools = [bootstrap_ci(diff, x, y, n_boot=300, seed=s, paired=True) for s, (x, y) in enumerate(zip(a, b))]
    combined = hierarchical_ci_from_replicates([p.estimate for p in pools], [p.samples for p in pools],
                                               n_boot=2000, seed=0, interval="t-resampled")
    assert combined.estimate == pytest.approx(r.estimate)
    assert combined.high - combined.low == pytest.approx(r.high - r.low, rel=0.25)


# --------------------------------------------------------------------------- paired bootstrap


def reference_paired(stat, a, b, ids_a, ids_b, n_boot, seed):
    """Pair rows by id, then draw one index set per resample (rng.integers, as bootstrap_ci does)."""
    row_of_b = {v: i for i, v in enumerate(ids_b)}
    b = b[[row_of_b[v] for v in ids_a]]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(ids_a), len(ids_a))
        out.append(stat(a[idx].sum(axis=0), b[idx].sum(axis=0)))
    return np.array(out)


def test_paired_bootstrap_agrees_with_the_reference_on_a_tiny_example():
    a = np.array([[1.0, 0.0], [2.0, 1.0], [0.5, 3.0], [4.0, 2.0], [1.5, 1.5]])  # 5 examples x 2 heads
    ids_a = ["s3", "s1", "s4", "s0", "s2"]
    ids_b = ["s0", "s1", "s2", "s3", "s4"]
    b = np.array([[3.0, 2.5], [2.0, 0.5], [1.0, 1.0], [1.5, 0.0], [0.0, 2.5]])

    def stat(x, y):
        return np.array([x[0] - y[0], x[1] / y[1]])

    ours = paired_bootstrap_ci(stat, a, b, ids_a, ids_b, n_boot=50, seed=3)
    ref = reference_paired(stat, a, b, ids_a, ids_b, n_boot=50, seed=3)
    np.testing.assert_allclose(ours.samples, ref, rtol=1e-12)
    np.testing.assert_allclose(ours.low, np.quantile(ref, 0.025, axis=0), rtol=1e-12)
    np.testing.assert_allclose(ours.estimate, stat(a.sum(0), b[[3, 1, 4, 0, 2]].sum(0)))


def test_paired_bootstrap_is_narrower_than_unpaired_for_correlated_examples():
    rng = np.random.default_rng(4)
    n = 300
    difficulty = rng.standard_normal(n)  # shared by both objectives: hard examples are hard for both
    a = difficulty + 0.3 * rng.standard_normal(n)
    b = difficulty + 0.3 * rng.standard_normal(n) + 0.1
    ids = np.arange(n)
    order = rng.permutation(n)  # b's rows stored in another order
    diff = lambda x, y: x - y  # noqa: E731
    paired = paired_bootstrap_ci(diff, a, b[order], ids, ids[order], reduce="mean", n_boot=500, seed=0)
    unpaired = bootstrap_ci(diff, a, b, reduce="mean", n_boot=500, seed=0)
    assert paired.estimate == pytest.approx(unpaired.estimate)
    assert (paired.high - paired.low) < 0.5 * (unpaired.high - unpaired.low)
    # pairing by position after the reordering would lose the pairing: as wide as unpaired
    by_position = bootstrap_ci(diff, a, b[order], reduce="mean", n_boot=500, seed=0, paired=True)
    assert (by_position.high - by_position.low) > 0.8 * (unpaired.high - unpaired.low)


def test_paired_bootstrap_refuses_ids_it_cannot_pair():
    a, b = np.ones((3, 2)), np.ones((3, 2))
    with pytest.raises(HeadcountError, match=r"id sets differ.*only in a, e.g. \['z'\]"):
        paired_bootstrap_ci(lambda x, y: x.sum(), a, b, ["x", "y", "z"], ["x", "y", "w"])
    with pytest.raises(HeadcountError, match="repeated example ids"):
        paired_bootstrap_ci(lambda x, y: x.sum(), a, b, [1, 1, 2], [1, 2, 3])
    with pytest.raises(HeadcountError, match="3 rows but 2 example ids"):
        paired_bootstrap_ci(lambda x, y: x.sum(), a, b, [1, 2], [1, 2, 3])
