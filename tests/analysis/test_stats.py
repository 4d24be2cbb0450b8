"""headcount.analysis against scipy, reference implementations, worked examples and hand computations."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats as sps

from headcount.analysis.coherence import seed_mean_ci
from headcount.analysis import (
    bad_control,
    bootstrap_ci,
    cochrans_q,
    compare_scores,
    draw_controls,
    expected_jaccard,
    hierarchical_bootstrap_ci,
    hierarchical_ci_from_replicates,
    jaccard,
    kendall_tau,
    krippendorff_alpha_nominal,
    largest_contiguous_passing,
    layer_mass,
    mask_stability,
    normalize_layers,
    pairwise_jaccard,
    pairwise_matrix,
    permutation_test,
    random_control,
    rank_correlation,
    seed_summary,
    spearman,
    super_survivors,
    top_k_mask,
    top_k_overlap,
)
from headcount.runtime.errors import HeadcountError


def grid(seed: int = 0, shape=(12, 12), integers: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 6, shape).astype(float) if integers else rng.random(shape)


# --------------------------------------------------------------------------- rank correlation


@pytest.mark.parametrize("integers", [False, True], ids=["continuous", "ties"])
def test_rank_correlations_match_scipy(integers):
    a, b = grid(1, integers=integers), grid(2, integers=integers)
    b = b + 0.5 * a  # some real association
    assert spearman(a, b) == pytest.approx(sps.spearmanr(a.ravel(), b.ravel()).statistic, abs=1e-12)
    assert kendall_tau(a, b) == pytest.approx(sps.kendalltau(a.ravel(), b.ravel()).statistic, abs=1e-12)
    assert rank_correlation(a, b, "kendall") == kendall_tau(a, b)
    assert spearman(a, b) > 0.2


def test_rank_correlation_drops_nan_pairs_and_constant_grid_is_nan():
    a, b = grid(3), grid(4)
    a[0, 0] = np.nan
    keep = ~np.isnan(a.ravel())
    assert spearman(a, b) == pytest.approx(sps.spearmanr(a.ravel()[keep], b.ravel()[keep]).statistic)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConstantInputWarning, no RuntimeWarning
        assert math.isnan(spearman(np.ones((3, 4)), grid(5, (3, 4))))
        assert math.isnan(kendall_tau(grid(5, (3, 4)), np.zeros((3, 4))))
        assert math.isnan(spearman([1.0], [2.0]))
    with pytest.raises(HeadcountError):
        spearman(np.ones((2, 3)), np.ones((3, 2)))
    with pytest.raises(HeadcountError):
        rank_correlation([1, 2], [1, 2], "pearson")


def test_permuted_scores_give_the_expected_correlation():
    # the task's scores are the MLM scores with two heads swapped: rho and tau have closed forms
    rng = np.random.default_rng(7)
    n = 144
    mlm = rng.permutation(n).astype(float).reshape(12, 12)  # ranks 0..143, no ties
    i, j = 20, 50  # swap the heads holding ranks i and j
    task = mlm.copy()
    pi, pj = np.argwhere(mlm == i)[0], np.argwhere(mlm == j)[0]
    task[tuple(pi)], task[tuple(pj)] = j, i
    d = j - i
    assert spearman(mlm, task) == pytest.approx(1 - 6 * 2 * d**2 / (n * (n**2 - 1)))
    discordant = 2 * (d - 1) + 1
    assert kendall_tau(mlm, task) == pytest.approx(1 - 2 * discordant / (n * (n - 1) / 2))
    # a monotone transform is a perfect agreement, a reversal a perfect disagreement
    assert spearman(mlm, np.exp(mlm / 50)) == pytest.approx(1.0)
    assert kendall_tau(mlm, -mlm) == pytest.approx(-1.0)
    assert top_k_overlap(mlm, -mlm) == {0.1: 0.0, 0.25: 0.0, 0.5: 0.0}


# --------------------------------------------------------------------------- top-k, mass


def test_top_k_overlap_known_values_and_ties():
    a = np.arange(20, dtype=float)  # top 10% = {19, 18}; top 25% = {19..15}; top 50% = {19..10}
    b = a.copy()
    b[19], b[0] = b[0], b[19]  # the best component becomes the worst
    ov = top_k_overlap(a, b)
    assert ov[0.1] == pytest.approx(1 / 3)  # {19,18} vs {0,18}
    assert ov[0.25] == pytest.approx(4 / 6)
    assert ov[0.5] == pytest.approx(9 / 11)
    assert top_k_overlap(a, a) == {0.1: 1.0, 0.25: 1.0, 0.5: 1.0}
    ties = np.ones(8)
    assert top_k_mask(ties, 0.25).tolist() == [True, True] + [False] * 6  # earlier positions win ties
    nan_grid = np.array([np.nan, 3.0, 1.0, 2.0])
    assert top_k_mask(nan_grid, 0.5).tolist() == [False, True, False, True]
    with pytest.raises(HeadcountError):
        top_k_mask(a, 0.0)


def test_layer_mass_and_compare_scores():
    s = np.array([[1.0, 3.0], [2.0, 2.0], [0.0, 2.0]])
    np.testing.assert_allclose(layer_mass(s), [0.4, 0.4, 0.2])
    assert layer_mass(s).sum() == pytest.approx(1.0)
    assert np.isnan(layer_mass(np.zeros((3, 2)))).all()
    out = compare_scores(s, s[::-1])
    assert out["layer_mass_l1"] == pytest.approx(0.4)
    assert set(out["top_k_jaccard"]) == {"0.1", "0.25", "0.5"}
    assert out["spearman"] == pytest.approx(spearman(s, s[::-1]))


def test_pairwise_matrix_is_the_task_by_task_correlation():
    grids = {"mlm": grid(0), "a": grid(1), "b": grid(0) + 0.1 * grid(2)}
    m = pairwise_matrix(grids)
    assert m.shape == (3, 3)
    np.testing.assert_allclose(m, m.T)
    np.testing.assert_allclose(np.diag(m), 1.0)
    assert m[0, 2] == pytest.approx(spearman(grids["mlm"], grids["b"]))
    assert m[0, 2] > 0.9 > abs(m[0, 1])
    jac = pairwise_matrix(list(grids.values()), "jaccard@0.1")
    assert jac[0, 0] == 1.0 and 0 <= jac[0, 1] < 1
    k = pairwise_matrix(grids, "kendall")
    assert k[1, 2] == pytest.approx(kendall_tau(grids["a"], grids["b"]))


# --------------------------------------------------------------------------- bootstrap


def test_bootstrap_is_seeded_and_contains_the_estimate():
    rng = np.random.default_rng(0)
    base = rng.random((1, 6, 4))
    a = base + 0.3 * rng.random((80, 6, 4))  # per-example contributions, [n_examples, layer, head]
    b = base + 0.3 * rng.random((80, 6, 4))
    r1 = bootstrap_ci(spearman, a, b, n_boot=300, seed=5, paired=True)
    r2 = bootstrap_ci(spearman, a, b, n_boot=300, seed=5, paired=True)
    r3 = bootstrap_ci(spearman, a, b, n_boot=300, seed=6, paired=True)
    np.testing.assert_array_equal(r1.samples, r2.samples)
    assert not np.array_equal(r1.samples, r3.samples)
    assert r1.estimate == pytest.approx(spearman(a.sum(0), b.sum(0)))
    assert r1.low <= r1.estimate <= r1.high
    assert r1.high - r1.low > 0
    assert r1.n_valid == 300 and r1.to_dict()["level"] == 0.95
    # unpaired (different example sets: MLM corpus vs task data)
    r4 = bootstrap_ci(spearman, a, b[:50], n_boot=200, seed=1)
    assert r4.low <= r4.estimate <= r4.high
    with pytest.raises(HeadcountError):
        bootstrap_ci(spearman, a, b[:50], paired=True)


def test_bootstrap_width_matches_the_standard_error_of_a_mean():
    rng = np.random.default_rng(1)
    x = rng.normal(5.0, 1.0, size=(400, 1))
    r = bootstrap_ci(lambda g: g[0], x, n_boot=2000, seed=0, reduce="mean")
    expected = 2 * 1.96 * x.std(ddof=1) / math.sqrt(400)
    assert r.high - r.low == pytest.approx(expected, rel=0.15)
    assert r.estimate == pytest.approx(x.mean())


def test_bootstrap_vector_statistic_and_constant_grids():
    rng = np.random.default_rng(2)
    c = rng.random((30, 4, 3))
    r = bootstrap_ci(layer_mass, c, n_boot=100, seed=0)
    assert r.samples.shape == (100, 4)
    assert np.all(r.low <= r.estimate) and np.all(r.estimate <= r.high)
    np.testing.assert_allclose(r.samples.sum(1), 1.0)
    const = np.ones((20, 2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc = bootstrap_ci(spearman, const, c[:20, :2, :2], n_boot=50, seed=0)
    assert math.isnan(rc.estimate) and math.isnan(rc.low) and rc.n_valid == 0


# --------------------------------------------------------------------------- permutation


def test_permutation_p_small_for_identical_large_for_independent():
    a = grid(0)
    same = permutation_test(a, a, n_permutations=999, seed=0)
    assert same.statistic == pytest.approx(1.0)
    assert same.pvalue == pytest.approx(2 / 1000)  # two-sided: twice the smallest one-sided p, 1 / 1000
    assert permutation_test(a, a, n_permutations=999, seed=0, alternative="greater").pvalue == pytest.approx(1 / 1000)
    indep = permutation_test(grid(10), grid(11), n_permutations=999, seed=0)
    assert indep.pvalue > 0.05
    again = permutation_test(grid(10), grid(11), n_permutations=999, seed=0)
    assert again.pvalue == indep.pvalue
    np.testing.assert_array_equal(again.null, indep.null)
    assert abs(indep.null.mean()) < 0.02  # the null is centred on 0
    k = permutation_test(a, a, "kendall", n_permutations=499, seed=0)
    assert k.statistic == pytest.approx(1.0) and k.pvalue == pytest.approx(2 / 500)


@pytest.mark.parametrize("method", ["spearman", "kendall"])
def test_permutation_p_agrees_with_scipy(method):
    rng = np.random.default_rng(3)
    x = rng.random(40)
    y = 0.35 * x + rng.random(40)
    ours = permutation_test(x, y, method, n_permutations=4000, seed=1)
    fn = {"spearman": sps.spearmanr, "kendall": sps.kendalltau}[method]
    ref = sps.permutation_test((x, y), lambda u, v: fn(u, v).statistic, permutation_type="pairings",
                               n_resamples=4000, random_state=0)
    assert ours.statistic == pytest.approx(ref.statistic)
    assert ours.pvalue == pytest.approx(ref.pvalue, abs=0.02)
    assert 0.001 < ours.pvalue < 0.3
    # the vectorised null equals the generic per-permutation one in distribution
    generic = permutation_test(x, y, {"spearman": spearman, "kendall": kendall_tau}[method],
                               n_permutations=1500, seed=2)
    assert generic.pvalue == pytest.approx(ours.pvalue, abs=0.025)


def test_permutation_constant_grid_is_nan_and_one_sided():
    r = permutation_test(np.ones(10), np.arange(10), n_permutations=50)
    assert math.isnan(r.statistic) and math.isnan(r.pvalue)
    up = permutation_test(np.arange(30), -np.arange(30.0), alternative="greater", n_permutations=200)
    down = permutation_test(np.arange(30), -np.arange(30.0), alternative="less", n_permutations=200)
    assert up.pvalue == 1.0 and down.pvalue == pytest.approx(1 / 201)


# --------------------------------------------------------------------------- mask stability


NAN = np.nan
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", example C: 4 observers,
# 12 units, nominal values, missing data; alpha_nominal = 0.743.
KRIPPENDORFF_EXAMPLE = np.array([
    [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
    [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
])


def _reference_alpha(data) -> float:
    """Krippendorff's alpha (nominal) from the coincidence matrix, as Krippendorff (2011) computes it:
    ``1 - (n - 1) * sum_{c != k} o_ck / sum_{c != k} n_c n_k`` over pairable units (>= 2 values)."""
    d = np.asarray(data, dtype=float).reshape(len(data), -1)
    values = np.unique(d[np.isfinite(d)])
    o = np.zeros((len(values), len(values)))
    for unit in d.T:
        vals = unit[np.isfinite(unit)]
        if len(vals) < 2:
            continue
        for i, a in enumerate(vals):  # every ordered pair of values from different raters
            for j, b in enumerate(vals):
                if i != j:
                    o[np.searchsorted(values, a), np.searchsorted(values, b)] += 1 / (len(vals) - 1)
    n_c = o.sum(axis=1)
    n = n_c.sum()
    return 1 - (n - 1) * (o.sum() - np.trace(o)) / (n ** 2 - (n_c ** 2).sum())


def test_krippendorff_alpha_worked_example():
    alpha = krippendorff_alpha_nominal(KRIPPENDORFF_EXAMPLE)
    assert round(alpha, 3) == 0.743  # Krippendorff (2011), the nominal worked example
    assert alpha == pytest.approx(_reference_alpha(KRIPPENDORFF_EXAMPLE), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_krippendorff_alpha_matches_the_reference_on_masks(seed):
    rng = np.random.default_rng(seed)
    truth = rng.random(144) < 0.6
    flips = rng.random((5, 144)) < 0.1 + 0.1 * seed
    masks = (truth ^ flips).astype(float)  # 5 seeds' head masks, correlated through `truth`
    if seed % 2:
        masks[rng.random(masks.shape) < 0.05] = np.nan  # missing values too
    ours = krippendorff_alpha_nominal(masks.reshape(5, 12, 12))
    assert ours == pytest.approx(_reference_alpha(masks), abs=1e-10)


def test_krippendorff_alpha_edge_cases():
    assert krippendorff_alpha_nominal([[1, 0, 1, 0], [1, 0, 1, 0]]) == pytest.approx(1.0)
    assert math.isnan(krippendorff_alpha_nominal(np.ones((3, 5))))  # one category: undefined
    assert math.isnan(krippendorff_alpha_nominal([[1, NAN], [NAN, 0]]))  # nothing pairable
    assert math.isnan(krippendorff_alpha_nominal([[1, NAN], [1, 0]]))  # one category among the pairable values
    assert krippendorff_alpha_nominal([[1, 0, 1, 0], [0, 1, 0, 1]]) < 0  # systematic disagreement


def test_cochrans_q_hand_computation():
    masks = np.array([
        [1, 1, 0, 1, 0, 1],  # seed A keeps 4
        [1, 0, 0, 1, 0, 0],  # seed B keeps 2
        [1, 1, 1, 1, 0, 0],  # seed C keeps 4
    ])
    # k = 3, C = (4, 2, 4), N = 10, R = (3, 2, 1, 3, 0, 1), sum R^2 = 24
    # Q = (k - 1)(k sum C^2 - N^2) / (k N - sum R^2) = 2 (3 * 36 - 100) / (30 - 24) = 8 / 3
    r = cochrans_q(masks)
    assert r.q == pytest.approx(8 / 3)
    assert r.df == 2
    assert r.pvalue == pytest.approx(math.exp(-4 / 3))  # chi2(2) survival = exp(-q / 2)
    # the statsmodels form: Q = k (k - 1) sum (C_j - mean C)^2 / (k N - sum R^2)
    c = masks.sum(1)
    assert r.q == pytest.approx(3 * 2 * ((c - c.mean()) ** 2).sum() / (3 * 10 - 24))
    same = cochrans_q(np.array([[1, 1, 0], [1, 1, 0]]))
    assert math.isnan(same.q) and math.isnan(same.pvalue)
    with pytest.raises(HeadcountError):
        cochrans_q([[0, 2], [1, 1]])


def test_pairwise_jaccard_and_mask_stability():
    masks = np.array([[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 0]])
    pj = pairwise_jaccard(masks)
    np.testing.assert_allclose(pj, [[1, 1 / 3, 1], [1 / 3, 1, 1 / 3], [1, 1 / 3, 1]])
    s = mask_stability(masks)
    assert s["mean_pairwise_jaccard"] == pytest.approx((1 / 3 + 1 + 1 / 3) / 3)
    assert s["kept_per_seed"] == [2, 2, 2] and s["n_seeds"] == 3 and s["n_components"] == 4
    assert s["krippendorff_alpha"] == pytest.approx(_reference_alpha(masks))
    assert s["cochran_q"] == 0.0 and s["cochran_p"] == pytest.approx(1.0) and s["cochran_df"] == 2  # equal sizes


# --------------------------------------------------------------------------- subnetworks


def test_super_survivors_and_their_controls():
    rng = np.random.default_rng(0)
    masks = (rng.random((5, 12, 12)) < 0.8).astype(int)
    ss = super_survivors(masks)
    assert ss.shape == (12, 12)
    np.testing.assert_array_equal(ss, masks.all(axis=0).astype(int))
    k = int(ss.sum())
    assert 0 < k < 144
    rand = random_control(ss, seed=1)
    bad = bad_control(ss, seed=1)
    assert rand.sum() == k and bad.sum() == k
    assert rand.shape == bad.shape == ss.shape
    assert not np.any(bad & ss)  # fewer survivors than pruned heads: all drawn from the pruned ones


def test_controls_are_deterministic_for_a_seed():
    good = (np.random.default_rng(4).random((12, 12)) < 0.5).astype(int)
    np.testing.assert_array_equal(random_control(good, seed=3), random_control(good, seed=3))
    np.testing.assert_array_equal(bad_control(good, seed=3), bad_control(good, seed=3))
    assert not np.array_equal(random_control(good, seed=3), random_control(good, seed=4))
    a = draw_controls({"heads": good, "mlps": [1, 1, 0, 1]}, "random", seed=9)
    b = draw_controls({"heads": good, "mlps": [1, 1, 0, 1]}, "random", seed=9)
    assert all(np.array_equal(a[p], b[p]) for p in a)


def test_bad_rule_tops_up_with_kept_components_when_the_good_set_is_larger():
    good = np.zeros(144, dtype=int)
    good[:100] = 1  # 100 kept > 44 pruned
    bad = bad_control(good.reshape(12, 12), seed=0).ravel()
    assert bad.sum() == 100
    assert np.all(bad[100:] == 1)  # every pruned head is in the bad set
    assert bad[:100].sum() == 56  # topped up with 56 randomly chosen kept heads
    small = np.zeros(144, dtype=int)
    small[:30] = 1
    bad_small = bad_control(small, seed=0)
    assert bad_small.sum() == 30 and bad_small[:30].sum() == 0
    parts = draw_controls({"heads": good.reshape(12, 12), "mlps": np.array([1] * 9 + [0] * 3)}, "bad", seed=1)
    assert parts["heads"].sum() == 100 and parts["mlps"].sum() == 9 and parts["mlps"][9:].sum() == 3


def test_bernoulli_control_matches_size_on_average_only():
    good = np.zeros((12, 12), dtype=int)
    good.ravel()[:90] = 1
    rng = np.random.default_rng(0)
    sizes = np.array([random_control(good, rng, mode="bernoulli").sum() for _ in range(2000)])
    sd = math.sqrt(144 * (90 / 144) * (54 / 144))
    assert abs(sizes.mean() - 90) < 3 * sd / math.sqrt(2000)
    assert sizes.std() == pytest.approx(sd, rel=0.1)
    assert len(set(sizes.tolist())) > 5  # not matched exactly
    assert {int(random_control(good, s).sum()) for s in range(20)} == {90}  # uniform: always 90
    with pytest.raises(HeadcountError):
        random_control(good, 0, mode="gaussian")


# --------------------------------------------------------------------------- across seeds


def test_seed_summary_matches_numpy_and_ignores_nan():
    v = np.array([[0.8, 0.5], [0.9, np.nan], [1.0, 0.7]])
    s = seed_summary(v)
    np.testing.assert_allclose(s["mean"], [0.9, 0.6])
    np.testing.assert_allclose(s["std"], [np.std([0.8, 0.9, 1.0], ddof=1), np.std([0.5, 0.7], ddof=1)])
    np.testing.assert_allclose(s["sem"], [sps.sem([0.8, 0.9, 1.0]), sps.sem([0.5, 0.7])])
    assert s["n"].tolist() == [3, 2]
    one = seed_summary([0.7])
    assert one["mean"] == 0.7 and math.isnan(one["std"]) and math.isnan(one["sem"]) and one["n"] == 1


# --------------------------------------------------------------------------- layer effects


def test_normalize_layers_zscore_l2_rank():
    g = np.array([[1.0, 2.0, 3.0, 6.0], [10.0, 10.0, 10.0, 10.0], [0.0, np.nan, 4.0, 2.0]])
    z = normalize_layers(g)
    np.testing.assert_allclose(z[0], (g[0] - g[0].mean()) / g[0].std())
    np.testing.assert_array_equal(z[1], 0.0)  # a constant layer carries no ordering
    assert np.isnan(z[2, 1]) and np.nanmean(z[2]) == pytest.approx(0.0) and np.nanstd(z[2]) == pytest.approx(1.0)
    l2 = normalize_layers(g, "l2")
    np.testing.assert_allclose(l2[0], g[0] / np.sqrt((g[0] ** 2).sum()))
    np.testing.assert_allclose(l2[2, [0, 2, 3]], g[2, [0, 2, 3]] / math.sqrt(20.0))
    r = normalize_layers(g, "rank")
    np.testing.assert_allclose(r[0], [0, 1 / 3, 2 / 3, 1])
    np.testing.assert_allclose(r[1], 0.5)
    np.testing.assert_allclose(r[2, [0, 2, 3]], [0, 1, 0.5])
    # a grid that is only a layer effect has no within-layer structure left
    layers = np.arange(4.0)[:, None] * np.ones((4, 3)) + np.array([0.0, 0.1, 0.2])
    assert spearman(layers, layers[:, ::-1]) > 0.85  # raw: the layer means agree
    za, zb = normalize_layers(layers), normalize_layers(layers[:, ::-1])
    assert np.corrcoef(za.ravel(), zb.ravel())[0, 1] == pytest.approx(-1.0)  # within layers: reversed
    assert spearman(za, zb) < -0.8  # (ties across layers keep it off -1)
    with pytest.raises(HeadcountError):
        normalize_layers(g, "minmax")
    with pytest.raises(HeadcountError):
        normalize_layers(np.ones(5))


def test_permutation_strata_validation_and_explicit_labels():
    a, b = grid(0, (3, 4)), grid(1, (3, 4))
    rows = permutation_test(a, b, n_permutations=300, seed=0, strata="rows")
    labels = np.repeat(np.arange(3), 4).reshape(3, 4) * 7  # same strata, other label values
    explicit = permutation_test(a, b, n_permutations=300, seed=0, strata=labels)
    np.testing.assert_array_equal(rows.null, explicit.null)
    one = permutation_test(a, b, n_permutations=300, seed=0, strata=np.zeros((3, 4)))
    assert one.pvalue == pytest.approx(permutation_test(a, b, n_permutations=300, seed=5).pvalue, abs=0.1)
    single = permutation_test(a, b, n_permutations=50, seed=0, strata=np.arange(12).reshape(3, 4))
    assert np.allclose(single.null, single.statistic) and single.pvalue == 1.0  # nothing can move
    with pytest.raises(HeadcountError, match="strata"):
        permutation_test(a, b, strata="layers")
    with pytest.raises(HeadcountError, match="strata"):
        permutation_test(a, b, strata=np.zeros(12))
    with pytest.raises(HeadcountError, match="rows"):
        permutation_test(a.ravel(), b.ravel(), strata="rows")
    # default unchanged: no strata argument gives the global test's exact draws
    np.testing.assert_array_equal(permutation_test(a, b, n_permutations=100, seed=3).null,
                                  permutation_test(a, b, n_permutations=100, seed=3, strata=None).null)


# --------------------------------------------------------------------------- hierarchical bootstrap


def test_hierarchical_from_replicates_hand_values_and_errors():
    est = [0.2, 0.4, 0.9]
    reps = [np.full(5, 0.2), np.full(7, 0.4), np.full(3, 0.9)]  # no example noise: only seed choice
    r = hierarchical_ci_from_replicates(est, reps, n_boot=4000, seed=0, interval="percentile")
    assert r.estimate == pytest.approx(0.5)
    assert set(np.round(r.samples * 3, 6)) <= {round(x, 6) for x in np.arange(0.6, 2.8, 0.1)}
    assert r.low >= 0.2 - 1e-12 and r.high <= 0.9 + 1e-12 and r.low < 0.5 < r.high
    sd = np.std(est, ddof=1)
    t = hierarchical_ci_from_replicates(est, reps, n_boot=4000, seed=0)
    # bootstrap sd of a mean of 3 is sqrt(2/3) sd/sqrt(3); the t interval undoes the 2/3
    assert (t.high - t.low) / 2 == pytest.approx(sps.t.ppf(0.975, 2) * sd / math.sqrt(3), rel=0.05)
    clipped = hierarchical_ci_from_replicates(est, reps, n_boot=4000, seed=0, clip=(0.0, 1.0))
    assert (clipped.low, clipped.high) == (0.0, 1.0) and t.low < 0 < 1 < t.high
    vec = hierarchical_ci_from_replicates([[0.0, 1.0], [2.0, 3.0]], [np.zeros((4, 2)), np.ones((4, 2))], n_boot=50)
    assert vec.samples.shape == (50, 2) and vec.estimate.tolist() == [1.0, 2.0]
    with pytest.raises(HeadcountError):
        hierarchical_ci_from_replicates([0.1, 0.2], [np.zeros(3)])
    with pytest.raises(HeadcountError):
        hierarchical_ci_from_replicates([0.1], [np.zeros((3, 2))])
    with pytest.raises(HeadcountError):
        hierarchical_ci_from_replicates([0.1], [np.zeros(3)], interval="bca")


def test_hierarchical_bootstrap_one_seed_is_the_example_bootstrap():
    rng = np.random.default_rng(0)
    x = rng.normal(2.0, 1.0, size=400)
    r = hierarchical_bootstrap_ci(None, [x], n_boot=2000, seed=1)
    assert r.interval == "normal" and r.n_seeds == 1  # no seed variance can be estimated
    assert r.high - r.low == pytest.approx(2 * 1.96 * x.std(ddof=1) / math.sqrt(400), rel=0.15)
    assert (r.low + r.high) / 2 == pytest.approx(r.estimate)  # centred on the estimate
    p = hierarchical_bootstrap_ci(None, [x], n_boot=2000, seed=1, interval="percentile")
    assert p.interval == "percentile" and p.high - p.low == pytest.approx(r.high - r.low, rel=0.15)
    assert r.estimate == pytest.approx(x.mean())
    s = hierarchical_bootstrap_ci(None, [x.reshape(100, 4), x.reshape(100, 4)[::-1]], reduce="sum", n_boot=20)
    assert s.samples.shape == (20, 4) and np.allclose(s.estimate, x.reshape(100, 4).sum(0))
    with pytest.raises(HeadcountError):
        hierarchical_bootstrap_ci(None, [x], [x])  # statistic=None: one sequence only
    with pytest.raises(HeadcountError):
        hierarchical_bootstrap_ci(lambda p, q: p - q, [x, x], [x])  # seed counts differ
    with pytest.raises(HeadcountError):
        hierarchical_bootstrap_ci(lambda p, q: p - q, [x], [x[:10]], paired=True)


def test_one_pair_interval_contains_its_estimate_where_the_paired_bootstrap_is_biased():
    """Two grids scored on the same examples agree more on a bootstrap resample than on the data.

    Two fine-tuning seeds differ by a fixed amount per head (``offset``) while each example moves
    both models' gradients alike (``shared``, per example and head): a resample repeats examples,
    which adds example noise common to both grids, so the resample's Spearman lies above the full
    data's. The percentile interval of the replicates then leaves out the estimate (what the
    offline decoder's seed-vs-seed row showed); the one-seed interval is centred on it.
    """
    rng = np.random.default_rng(3)
    n, shape = 64, (30, 9)                                    # SmolLM2's 270 query heads
    mean = rng.normal(size=shape)                             # [layers, heads]: what both models share
    shared = 8.0 * rng.normal(size=(n, *shape))               # [examples, layers, heads], common to both
    a = mean + rng.normal(size=shape) + shared                # + each model's own per-head offset
    b = mean + rng.normal(size=shape) + shared

    def spearman(x, y):  # of the summed grids, the coherence statistic
        return float(sps.spearmanr(np.abs(x).ravel(), np.abs(y).ravel())[0])

    est = spearman(a.sum(0), b.sum(0))
    idx = rng.integers(0, n, size=(400, n))
    reps = np.array([spearman(a[i].sum(0), b[i].sum(0)) for i in idx])   # the paired example bootstrap
    lo, hi = np.quantile(reps, [0.025, 0.975])
    assert reps.mean() > est                                  # the resample agrees more ...
    assert not lo <= est <= hi                                # ... enough to leave the estimate out
    one = seed_mean_ci([est], [reps], "spearman", n_boot=1000)
    assert one["low"] < est < one["high"] and one["interval"] == "normal"
    assert one["high"] - one["low"] == pytest.approx(2 * sps.norm.ppf(0.975) * reps.std(ddof=1), rel=1e-9)
    two = seed_mean_ci([est, est + 0.02], [reps, reps + 0.02], "spearman", n_boot=1000)
    assert two["interval"] == "t, shared examples"           # several seeds: unchanged


# --------------------------------------------------------------------------- curves, chance, Cochran


def reference_contiguous(levels, passes):
    out = None
    for lv, ok in sorted(zip(levels, passes)):
        if not ok:
            return out
        out = lv
    return out


@pytest.mark.parametrize("seed", range(20))
def test_largest_contiguous_passing_matches_a_reference(seed):
    rng = np.random.default_rng(seed)
    levels = rng.permutation(np.round(np.arange(0, 1.0, 0.1), 1)).tolist()
    passes = (rng.random(len(levels)) < 0.8).tolist()
    assert largest_contiguous_passing(levels, passes) == reference_contiguous(levels, passes)


def test_largest_contiguous_passing_edge_cases():
    assert largest_contiguous_passing([0.0, 0.1, 0.2, 0.3], [True, True, False, True]) == 0.1  # not 0.3
    assert largest_contiguous_passing([0.1, 0.2], [True, True]) == 0.2
    assert largest_contiguous_passing([0.1, 0.2], [False, True]) is None
    assert largest_contiguous_passing([], []) is None
    assert largest_contiguous_passing(np.array([0.2, 0.1]), np.array([True, True])) == 0.2
    assert largest_contiguous_passing([0.1, 0.2, 0.3], [True, float("nan"), True]) == 0.1
    assert largest_contiguous_passing([0.1, 0.2, 0.3], [True, None, True]) == 0.1
    with pytest.raises(HeadcountError):
        largest_contiguous_passing([0.1, 0.1], [True, True])
    with pytest.raises(HeadcountError):
        largest_contiguous_passing([0.1, 0.2], [True])


def test_expected_jaccard_against_random_masks():
    rng = np.random.default_rng(0)
    n, ka, kb = 30, 12, 7
    draws = [jaccard(np.isin(np.arange(n), rng.choice(n, ka, replace=False)),
                     np.isin(np.arange(n), rng.choice(n, kb, replace=False))) for _ in range(4000)]
    assert expected_jaccard(ka, kb, n) == pytest.approx(np.mean(draws), abs=4 * np.std(draws) / math.sqrt(4000))
    assert expected_jaccard(n, 5, n) == pytest.approx(5 / n)  # one mask keeps all: J = kb / n exactly
    assert math.isnan(expected_jaccard(0, 0, 10)) and expected_jaccard(0, 3, 10) == 0.0
    with pytest.raises(HeadcountError):
        expected_jaccard(11, 1, 10)


def test_cochrans_q_ignores_which_components_are_kept():
    # two seeds keeping disjoint halves: nothing in common, yet Q = 0 (p = 1): equal proportions
    disjoint = np.array([[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]])
    q = cochrans_q(disjoint)
    assert q.q == 0.0 and q.pvalue == pytest.approx(1.0)
    s = mask_stability(disjoint)
    assert s["mean_pairwise_jaccard"] == 0.0 < s["mean_pairwise_jaccard_chance"]
    assert s["krippendorff_alpha"] < 0  # alpha sees the disagreement
    assert s["mean_pairwise_jaccard_chance"] == pytest.approx(expected_jaccard(3, 3, 6))
