"""headcount.analysis.subnetworks: stability of masks across seeds and overlap across tasks; the
reference's super-survivor controls (headcount.analysis.super_controls)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from headcount.analysis import (
    always_pruned,
    jaccard,
    mask_stability,
    super_bad_control,
    super_controls,
    super_random_control,
    super_survivors,
)
from headcount.analysis.subnetworks import cross_task_overlap, seed_stability
from headcount.runtime.errors import HeadcountError


def test_cross_task_overlap_is_the_mean_jaccard_over_seed_pairs():
    rng = np.random.default_rng(0)
    heads = (rng.random((3, 2, 4, 6)) < 0.5).astype(int)  # 3 tasks x 2 seeds
    mlps = (rng.random((3, 2, 4)) < 0.5).astype(int)
    ov = cross_task_overlap(heads, mlps)
    a, b = 0, 2
    brute = np.mean([jaccard(heads[a, s], heads[b, t]) for s in range(2) for t in range(2)])
    assert np.isclose(ov["heads_jaccard"][a, b], brute) and np.isclose(ov["heads_jaccard"][b, a], brute)
    assert np.isclose(ov["heads_jaccard"][1, 1], jaccard(heads[1, 0], heads[1, 1]))  # diagonal: across seeds
    sup = heads.min(axis=1)
    assert np.isclose(ov["super_heads_jaccard"][a, b], jaccard(sup[a], sup[b]))
    single = cross_task_overlap(heads[:, :1], mlps[:, :1])  # one seed: no pair on the diagonal
    assert np.isnan(np.diag(single["heads_jaccard"])).all() and np.isfinite(single["heads_jaccard"][0, 1])


def test_seed_stability_covers_heads_mlps_and_both():
    heads = np.array([[[1, 1], [0, 1]], [[1, 0], [0, 1]], [[1, 1], [1, 1]]])
    mlps = np.array([[1, 0], [1, 1], [1, 0]])
    r = seed_stability(heads, mlps)
    both = np.concatenate([heads.reshape(3, -1), mlps], axis=1)
    assert r["all"] == mask_stability(both) and r["heads"]["kept_per_seed"] == [3, 2, 4]
    assert r["super_heads"].tolist() == [[1, 0], [0, 1]] and r["super_mlps"].tolist() == [1, 0]
    assert np.allclose(r["head_survival"], [[1, 2 / 3], [1 / 3, 1]])


# -- super-survivor controls: the reference's rule ---------------------------------------------------
# Transcribed from Prasanna et al.'s code (sai-prasanna/bert-experiments, src/compute_super_masks.py):
# sample_bad_to_similar_size, sample_random_middlings and the loop that calls them, with the sampler
# as a parameter (the reference's is Python's random.sample).


def ref_sample_bad_to_similar_size(bad, good, sample):
    total_good = good.sum()
    total_bad = bad.sum()
    bad = bad.copy()
    if total_good > total_bad:
        to_add = total_good - total_bad
        selection = np.argwhere((good == 0) & (bad == 0)).tolist()
        if len(selection) < to_add:
            selection = np.argwhere(bad == 0).tolist()
        add_indices = sample(selection, int(to_add))
        for idx in add_indices:
            if len(idx) == 2:
                bad[idx[0], idx[1]] = 1
            else:
                bad[idx[0]] = 1
    elif total_good < total_bad:
        to_remove = total_bad - total_good
        remove_indices = sample(np.argwhere(bad == 1).tolist(), int(to_remove))
        for idx in remove_indices:
            if len(idx) == 2:
                bad[idx[0], idx[1]] = 0
            else:
                bad[idx[0]] = 0
    return bad


def ref_sample_random_middlings(bad, good, sample):
    midling = np.ones_like(good)
    midling[good == 1] = 0
    midling[bad == 1] = 0
    if midling.sum() >= good.sum():
        to_remove = midling.sum() - good.sum()
        remove_indices = sample(np.argwhere(midling == 1).tolist(), int(to_remove))
        for idx in remove_indices:
            if len(idx) == 2:
                midling[idx[0], idx[1]] = 0
            else:
                midling[idx[0]] = 0
    else:
        to_add = good.sum() - midling.sum()
        add_indices = sample(np.argwhere(midling == 0).tolist(), int(to_add))
        for idx in add_indices:
            if len(idx) == 2:
                midling[idx[0], idx[1]] = 1
            else:
                midling[idx[0]] = 1
    return midling


def ref_super_controls(heads, mlps, sample):
    """The reference's main loop for one task (first seed): super, bizzaro (bad), midling (random)."""
    super_head, super_mlp = np.ones(heads.shape[1:]), np.ones(mlps.shape[1:])
    super_bad_head, super_bad_mlp = np.ones(heads.shape[1:]), np.ones(mlps.shape[1:])
    for h, m in zip(heads, mlps):
        super_head *= h
        super_mlp *= m
        super_bad_head *= (1 - h)
        super_bad_mlp *= (1 - m)
    super_bad_head = ref_sample_bad_to_similar_size(super_bad_head, super_head, sample)
    super_bad_mlp = ref_sample_bad_to_similar_size(super_bad_mlp, super_mlp, sample)
    super_midling_head = ref_sample_random_middlings(super_bad_head, super_head, sample)
    super_midling_mlp = ref_sample_random_middlings(super_bad_mlp, super_mlp, sample)
    return {"super": (super_head, super_mlp), "bad": (super_bad_head, super_bad_mlp),
            "random": (super_midling_head, super_midling_mlp)}


def numpy_sampler(rng):
    """random.sample(population, k) drawn with a numpy Generator as headcount draws (no draw for k = 0)."""
    def sample(population, k):
        if k == 0:
            return []
        return [population[i] for i in rng.choice(len(population), size=k, replace=False)]
    return sample


def _mask_sets():
    """[n_seeds, 4, 3] heads and [n_seeds, 4] MLPs: typical draws and the edge cases."""
    rng = np.random.default_rng(3)
    out = {"typical": ((rng.random((3, 4, 3)) < 0.5).astype(int), (rng.random((3, 4)) < 0.5).astype(int))}
    # no always-pruned component: every component kept by some seed, so bad = middlings only
    h = np.zeros((2, 4, 3), dtype=int)
    h[0].ravel()[:8] = 1
    h[1].ravel()[4:] = 1  # 4 super-survivors, 4 + 4 middlings, none always pruned
    out["no always-pruned"] = (h, np.array([[1, 1, 0, 0], [1, 0, 1, 1]]))
    # too few middlings: identical seeds keep 8 of 12 heads (4 always pruned, 0 middlings), so bad is
    # topped up from all non-pruned components (super-survivors) and random from super + bad
    same = np.zeros((4, 3), dtype=int)
    same.ravel()[[0, 1, 2, 3, 5, 6, 8, 11]] = 1
    out["too few middlings"] = (np.stack([same, same]), np.array([[1, 1, 1, 0], [1, 1, 1, 0]]))
    # some middlings, but fewer than bad lacks: 7 super, 2 always pruned, 3 middlings, 5 to add
    h = np.zeros((2, 12), dtype=int)
    h[0, :9] = 1
    h[1, [0, 1, 2, 3, 4, 5, 6, 9]] = 1
    out["some but too few middlings"] = (h.reshape(2, 4, 3), np.array([[1, 1, 1, 0], [1, 1, 0, 0]]))
    # more always pruned than super-survivors: bad is subsampled, the pruned ones left out become middlings
    h = np.zeros((3, 4, 3), dtype=int)
    h[:, 0, 0] = 1
    h[0, 1, :] = 1
    h[1, 1, 1] = 1
    out["many always-pruned"] = (h, np.array([[0, 0, 0, 1], [0, 1, 0, 1], [0, 0, 0, 1]]))
    # no super-survivor at all: empty controls (the reference removes everything)
    out["no super-survivor"] = (np.stack([same, 1 - same]), np.array([[1, 0, 1, 0], [0, 1, 0, 1]]))
    out["one seed"] = (same[None], np.array([[1, 0, 0, 1]]))
    return out


MASK_SETS = _mask_sets()


@pytest.mark.parametrize("case", sorted(MASK_SETS))
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_super_controls_are_the_reference_draws(case, seed):
    """With the reference's sampler drawing from headcount's generator, the masks are identical:
    same candidates in the same (row-major) order, same sizes, same calls in the same order."""
    heads, mlps = MASK_SETS[case]
    ref = ref_super_controls(heads, mlps, numpy_sampler(np.random.default_rng(seed)))
    parts = {"heads": heads, "mlps": mlps}
    random_ = super_controls(parts, "random", seed=np.random.default_rng(seed))  # bad, then middlings: one stream
    assert np.array_equal(random_["heads"], ref["random"][0]) and np.array_equal(random_["mlps"], ref["random"][1])
    bad = super_controls(parts, "bad", seed=seed)
    assert np.array_equal(bad["heads"], ref["bad"][0]) and np.array_equal(bad["mlps"], ref["bad"][1])
    assert np.array_equal(super_survivors(heads), ref["super"][0])
    # random around the bad control of another generator (the bad job's): that control, rebuilt
    own = super_controls(parts, "random", seed=np.random.default_rng([seed, 9]), bad_seed=seed)
    rng = np.random.default_rng([seed, 9])
    for part in ("heads", "mlps"):
        assert np.array_equal(own[part], super_random_control(super_survivors(parts[part]), bad[part], rng))


def _support(draw, n=300):
    """(components in every draw, components in some draw) over n draws."""
    draws = np.stack([np.asarray(draw(i), dtype=int).ravel() for i in range(n)])
    return set(np.flatnonzero(draws.all(0))), set(np.flatnonzero(draws.any(0))), {int(d.sum()) for d in draws}


@pytest.mark.parametrize("case", sorted(MASK_SETS))
def test_super_controls_follow_the_references_rules_under_its_own_sampler(case):
    """Against the reference run with Python's random.sample (its own RNG): per part, the same
    size, the same components always taken and the same components ever taken (sets drawn from,
    top-up behaviour)."""
    heads, mlps = MASK_SETS[case]
    parts = {"heads": heads, "mlps": mlps}

    def ref_draw(kind, part):
        return lambda i: ref_super_controls(heads, mlps, random.Random(i).sample)[kind][part]

    for kind in ("bad", "random"):
        for p, part in enumerate(("heads", "mlps")):
            ours = _support(lambda i, kind=kind, part=part: super_controls(parts, kind, seed=i)[part])
            assert ours == _support(ref_draw(kind, p)), (case, kind, part)
            assert ours[2] == {int(super_survivors(parts[part]).sum())}  # exactly the super-survivors' size


def test_super_controls_edge_cases_by_hand():
    h, m = MASK_SETS["too few middlings"]
    sup, pruned = super_survivors(h), always_pruned(h)
    assert sup.sum() == 8 and pruned.sum() == 4 and not (1 - sup - pruned).any()  # no middling
    bad = super_bad_control(sup, pruned, seed=0)
    assert bad.sum() == 8 and bad[pruned == 1].all() and (bad * sup).sum() == 4  # topped up from the super-survivors
    rnd = super_random_control(sup, bad, seed=0)
    assert rnd.sum() == 8 and not (rnd * (1 - sup) * (1 - bad)).any()  # no middling: all from super + bad
    h, _ = MASK_SETS["no always-pruned"]
    assert not always_pruned(h).any()
    bad = super_bad_control(super_survivors(h), always_pruned(h), seed=0)
    assert bad.sum() == 4 and not (bad * super_survivors(h)).any()  # from the 8 middlings only
    h, _ = MASK_SETS["many always-pruned"]
    sup, pruned = super_survivors(h), always_pruned(h)
    assert sup.sum() == 1 and pruned.sum() == 8
    bad = super_bad_control(sup, pruned, seed=0)
    assert bad.sum() == 1 and bad[pruned == 1].sum() == 1
    mid = 1 - sup - bad  # the reference's middlings: around the resized bad control (7 pruned ones in)
    rnd = super_random_control(sup, bad, seed=0)
    assert rnd.sum() == 1 and rnd[mid == 1].sum() == 1
    h, m = MASK_SETS["no super-survivor"]
    c = super_controls({"heads": h, "mlps": m}, "random", seed=0)
    assert not c["heads"].any() and not c["mlps"].any()
    with pytest.raises(HeadcountError, match="unknown control kind"):
        super_controls({"heads": h}, "worst")
