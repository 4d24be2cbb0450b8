"""headcount.analysis.subnetworks: stability of masks across seeds and overlap across tasks."""

from __future__ import annotations

import doctest

import numpy as np

import headcount.analysis.subnetworks as subnetworks_mod
from headcount.analysis import jaccard, mask_stability
from headcount.analysis.subnetworks import cross_task_overlap, seed_stability


def test_docstring_examples_run():
    result = doctest.testmod(subnetworks_mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 2 and result.failed == 0


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
