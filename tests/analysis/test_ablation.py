"""The causal test of a head ranking (``headcount.analysis.ablation``): top-k gated vs k random,
against a plain re-computation with explicit gates on a tiny random Llama (4 query heads on 2 KV
heads, 3 layers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headcount.analysis.ablation import _unit_gates, ablation_test, head_set_p_value
from headcount.core.gates import gated
from headcount.importance.retrieval import retrieval_scores
from headcount.runtime.errors import HeadcountError

NEW = 6  # decoded tokens per example (the tiny model's answers are what it says in 6 tokens)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from niah_helpers import self_answered_niah

    # each example's answer is what the full model answers: full accuracy 1, so gating can lower it
    return self_answered_niah(tmp_path_factory.mktemp("niah"), NEW)


def _reference_successes(model, batches, off):
    """Needle success per example with the heads of ``off`` ([L, H] booleans) gated to 0."""
    gates = torch.as_tensor(~off, dtype=torch.float32)
    with gated(model, heads=gates):
        s = retrieval_scores(model, batches, max_new_tokens=NEW)
    return [int(r["exact"]) for r in s.meta["retrieval"]["examples"]]


def test_top_and_random_sets_are_gated_as_a_plain_recomputation_says(setup):
    model, batches = setup
    scores = torch.arange(12, dtype=torch.float32).reshape(3, 4)  # head (2, 3) first, then (2, 2), ...
    r = ablation_test(model, batches, scores, fraction=0.25, draws=2, seed=7, max_new_tokens=NEW)
    assert r.k == 3 and r.n_units == 12 and r.top == [[2, 1], [2, 2], [2, 3]]
    assert r.accuracy_full == 1.0 and r.per_example["full"] == [1, 1, 1, 1]
    top = np.zeros((3, 4), dtype=bool)
    top[2, 1:] = True
    assert r.per_example["top"] == _reference_successes(model, batches, top)
    outside = np.flatnonzero(~top.ravel())  # the random sets: k heads from outside the top set, seed [seed, d]
    for d in range(2):
        pick = np.zeros(12, dtype=bool)
        pick[np.random.default_rng([7, d]).choice(outside, size=3, replace=False)] = True
        assert r.per_example["random"][d] == _reference_successes(model, batches, pick.reshape(3, 4))
    for i, got in enumerate(r.per_example["theirs"]):  # Wu et al.'s protocol: a set per example, seed [seed, 1, i]
        pick = np.zeros(12, dtype=bool)
        pick[np.random.default_rng([7, 1, i]).choice(outside, size=3, replace=False)] = True
        assert got == _reference_successes(model, batches, pick.reshape(3, 4))[i]
    rand = np.array(r.per_example["random"]).mean(0)
    assert r.difference == pytest.approx(float((rand - np.array(r.per_example["top"])).mean()))
    assert r.accuracy_top == pytest.approx(np.mean(r.per_example["top"])) and 0 <= r.p_value_prompts <= 1
    assert (r.p_value, r.n_as_harmful) == head_set_p_value(r.accuracy_top, r.accuracy_random)
    assert r.mask == "remove" and r.n_sets == 2 and r.p_min == pytest.approx(1 / 3)


def test_half_the_heads_gated_leaves_the_other_half_for_the_random_set(setup):
    model, batches = setup
    r = ablation_test(model, batches, torch.rand(3, 4), fraction=0.5, draws=1, theirs=False, max_new_tokens=NEW)
    top = np.zeros(12, dtype=bool)
    top[[u * 4 + h for u, h in r.top]] = True
    rest = _reference_successes(model, batches, ~top.reshape(3, 4))  # the one set outside the top 6
    assert r.k == 6 and r.per_example["random"][0] == rest and "theirs" not in r.per_example
    assert r.accuracy_random_theirs is None


def test_a_kv_group_gates_every_query_head_that_reads_it():
    chosen = np.array([[True, False], [False, True]])  # [L=2, n_kv=2]; 4 query heads: 2 per group
    gates = _unit_gates(chosen, 4, "kv-groups")
    assert gates.tolist() == [[0, 0, 1, 1], [1, 1, 0, 0]]
    assert _unit_gates(np.array([[True, False, False, True]]), 4, "heads").tolist() == [[0, 1, 1, 0]]


def test_kv_group_ranking_chooses_whole_groups(setup):
    model, batches = setup
    r = ablation_test(model, batches, torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]), fraction=1 / 6, draws=1,
                      unit="kv-groups", max_new_tokens=NEW)
    assert r.k == 1 and r.n_units == 6 and r.top == [[0, 1]]
    off = np.zeros((3, 4), dtype=bool)
    off[0, 2:] = True  # KV head 1 of layer 0 is read by query heads 2 and 3
    assert r.per_example["top"] == _reference_successes(model, batches, off)


@pytest.mark.parametrize("scores, kwargs, message", [
    (torch.zeros(3, 3), {}, "ranking of this model is"),
    (torch.zeros(3, 4), {"unit": "kv-groups"}, "ranking of this model is"),
    (torch.zeros(3, 4), {"unit": "layers"}, "unknown unit"),
    (torch.zeros(3, 4), {"draws": 0}, "draws must be"),
    (torch.zeros(3, 4), {"mask": "query"}, "unknown mask"),
    (torch.zeros(3, 4), {"fraction": 1.0}, "random sets need 12 heads outside the top 12, and only 0 are"),
])
def test_bad_rankings_are_refused_in_one_line(setup, scores, kwargs, message):
    model, batches = setup
    with pytest.raises(HeadcountError, match=message):
        ablation_test(model, batches, scores, **kwargs)
