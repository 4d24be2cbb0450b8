"""The pruning loop: stops at the threshold, returns the last passing mask; schedules."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_model

from headcount.errors import HeadcountError
from headcount.masks import Mask
from headcount.pruning import PruneConfig, iterative_prune, select_lowest
from headcount.scoring import Scores


def test_select_lowest_is_pure_and_deterministic():
    scores = torch.tensor([[0.5, 0.1], [0.3, float("nan")]])
    keep = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    out = select_lowest(scores, keep, 2)
    assert out.tolist() == [[1.0, 0.0], [0.0, 0.0]]  # NaN first, then 0.1; 0.3 already gone
    assert keep.tolist() == [[1.0, 1.0], [0.0, 1.0]]  # input untouched
    assert select_lowest(scores, keep, 10).sum() == 0


class _Fake:
    """A fake objective: the metric is the number of heads kept + 2x MLPs kept."""

    def __init__(self, heads_scores):
        self.heads_scores = heads_scores
        self.scored = 0

    def score(self, model, mask):
        self.scored += 1
        return Scores(self.heads_scores.clone(), torch.arange(self.heads_scores.shape[0], dtype=torch.float32))

    @staticmethod
    def eval(model, mask):
        return float(mask.heads.sum() + 2 * mask.mlps.sum()), 0.0


def test_loop_stops_at_threshold_and_returns_last_passing_mask():
    model = tiny_model("bert")  # 3 layers x 4 heads
    fake = _Fake(torch.arange(12, dtype=torch.float32).view(3, 4))
    cfg = PruneConfig(threshold=0.75, step=0.1, step_of="total", shrink=False)  # 1 head a step
    r = iterative_prune(model, fake.score, fake.eval, cfg)
    full = 12 + 6
    assert r.full_metric == full
    # heads go one at a time, lowest score first, while metric >= 0.75 * 18 = 13.5 -> 8 heads kept
    assert r.mask.n_heads_kept == 8
    assert r.mask.heads.flatten().tolist() == [0, 0, 0, 0] + [1] * 8
    assert r.trace[-1]["accepted"] is False and r.trace[-1]["heads_kept"] == 7
    assert all(row["metric"] >= 13.5 for row in r.trace if row["accepted"])
    assert fake.scored == 5  # recomputed at every step


def test_one_shot_scores_once():
    model = tiny_model("bert")
    fake = _Fake(torch.arange(12, dtype=torch.float32).view(3, 4))
    r = iterative_prune(model, fake.score, fake.eval, PruneConfig(threshold=0.75, step=0.1, step_of="total",
                                                                   one_shot=True, shrink=False))
    assert fake.scored == 1
    assert r.mask.n_heads_kept == 8


def test_prasanna_schedule_joint_then_heads_then_mlps():
    model = tiny_model("bert")
    fake = _Fake(torch.arange(12, dtype=torch.float32).view(3, 4))
    cfg = PruneConfig(threshold=0.5, step=0.25, step_of="total", schedule="prasanna", shrink=False)
    r = iterative_prune(model, fake.score, fake.eval, cfg)
    # full 18, target 9. joint: 3 heads + 1 MLP a step; heads: half the step (1 head); mlps: 1 a step
    steps = [(row["phase"], row["heads_kept"], row["mlps_kept"], row["accepted"]) for row in r.trace]
    assert steps == [
        ("full", 12, 3, True),
        ("joint", 9, 2, True), ("joint", 6, 1, False),
        ("heads", 8, 2, True), ("heads", 7, 2, True), ("heads", 6, 2, True), ("heads", 5, 2, True),
        ("heads", 4, 2, False),
        ("mlps", 5, 1, False),
    ]
    assert (r.mask.n_heads_kept, r.mask.n_mlps_kept) == (5, 2)
    assert r.mask.meta["metric"] == 9


def test_layer_can_lose_all_heads_and_loop_runs_on_real_model():
    """Real scoring and evaluation on a tiny model, physically shrinking between steps."""
    from headcount.evaluation import evaluate_batches
    from headcount.scoring import score

    model = tiny_model("bert")
    batches = [tiny_batch(model, batch=6, seq=8, seed=i, labels=True) for i in range(2)]

    def ev(m, mask):
        with torch.no_grad():
            losses = []
            from headcount.gates import gated

            with gated(m, heads=mask.heads, mlps=mask.mlps):
                losses = [float(m(**b).loss) for b in batches]
        return -sum(losses), sum(losses)  # higher = better; threshold on a negative metric is fine here

    results = {}
    for shrink in (False, True):
        cfg = PruneConfig(threshold=1.0, step=0.25, step_of="total", shrink=shrink, max_steps=20)
        # threshold 1.0 on -loss: continue only while loss does not grow: whatever happens, both modes agree
        results[shrink] = iterative_prune(model, lambda m, k: score(m, batches, mask=k), ev, cfg)
    assert results[True].mask == results[False].mask
    assert [r["metric"] for r in results[True].trace] == pytest.approx([r["metric"] for r in results[False].trace], rel=1e-4)
    # a mask with a whole layer removed evaluates (no crash) on both masked and shrunk models
    empty_layer = Mask.full(3, 4).without_heads([(1, h) for h in range(4)])
    assert ev(model, empty_layer)[1] > 0


def test_bad_config():
    with pytest.raises(HeadcountError):
        PruneConfig(threshold=0)
    with pytest.raises(HeadcountError):
        PruneConfig(threshold=1.5)
    with pytest.raises(HeadcountError):
        PruneConfig(step=0)
    with pytest.raises(HeadcountError):
        PruneConfig(schedule="nope")
