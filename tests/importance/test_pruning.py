"""The pruning loop: stops at the threshold, returns the last passing mask; schedules."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_model

from headcount.core.masks import Mask
from headcount.importance.pruning import PruneConfig, iterative_prune, select_lowest
from headcount.importance.scores import Scores
from headcount.runtime.errors import HeadcountError


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
    # which accepted step removed each head and MLP: scores 0..11, lowest first; joint step 1 took
    # heads 0-2 and MLP 0 (MLP scores are 0, 1, 2), heads-only steps 3-6 took heads 3..6 one each
    removed = r.mask.meta["removed_at_step"]
    assert removed["heads"] == [[1, 1, 1, 3], [4, 5, 6, 0], [0, 0, 0, 0]]
    assert removed["mlps"] == [1, 0, 0]
    kept = torch.tensor(removed["heads"]) == 0
    assert torch.equal(kept.float(), r.mask.heads) and torch.equal((torch.tensor(removed["mlps"]) == 0).float(), r.mask.mlps)
    assert r.mask.to_dict()["removed_at_step"] == removed  # mask.json carries it


def test_layer_can_lose_all_heads_and_loop_runs_on_real_model():
    """Real scoring and evaluation on a tiny model, physically shrinking between steps."""
    from headcount.importance.scoring import score

    model = tiny_model("bert")
    batches = [tiny_batch(model, batch=6, seq=8, seed=i, labels=True) for i in range(2)]

    def ev(m, mask):
        with torch.no_grad():
            losses = []
            from headcount.core.gates import gated

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


# -- Prasanna et al.'s schedule against a transcription of their loop -----------------------------


def _fake_importance(head_mask, mlp_mask):
    """Importance that depends on the whole mask it is computed under (as real importance does):
    pseudo-random, seeded by the mask's bits, so a reused importance ranks differently from a fresh one."""
    bits = "".join(str(int(v)) for v in torch.cat([head_mask.flatten(), mlp_mask]).tolist())
    g = torch.Generator().manual_seed(int(bits, 2))
    return torch.rand(head_mask.shape, generator=g), torch.rand(mlp_mask.shape, generator=g)


def _weights_metric(head_weights, mlp_weights):
    """A controllable metric: the summed weights of what is kept."""
    return lambda hm, mm: float((hm * head_weights).sum() + (mm * mlp_weights).sum())


def _reference_prasanna(importance, metric, n_layers, n_heads, amount, threshold):
    """``mask_heads_mlps`` of Prasanna et al.'s code, transcribed: each mask is scored and evaluated
    in one pass (``compute``); ``sort`` made stable (ties by position, as here).

    Returns the steps ``(phase, heads removed, mlps removed, importance, passed)`` (importance:
    ``fresh`` when computed on the masks the step starts from, else ``reused``) and the final masks.
    """
    inf = float("inf")
    steps = []

    def compute(hm, mm):
        h, m = importance(hm, mm)
        return h.clone(), m.clone(), metric(hm, mm), (hm.clone(), mm.clone())

    def label(on, hm, mm):
        return "fresh" if torch.equal(on[0], hm) and torch.equal(on[1], mm) else "reused"

    def select(hi, head_mask, new_head_mask, n):
        hi[head_mask == 0.0] = inf
        selected = []
        for head in hi.view(-1).sort(stable=True)[1].tolist():
            if len(selected) == n or hi.view(-1)[head] == inf:
                break
            new_head_mask.view(-1)[head] = 0.0
            selected.append(head)
        return selected

    new_head_mask, new_mlp_mask = torch.ones(n_layers, n_heads), torch.ones(n_layers)
    hi, mi, original, on = compute(new_head_mask, new_mlp_mask)
    target = original * threshold
    num_to_mask = max(1, int(new_head_mask.numel() * amount))
    best = current = original
    head_mask, mlp_mask = new_head_mask.clone(), new_mlp_mask.clone()
    while current >= target:  # joint
        best = current
        head_mask = new_head_mask.clone()
        selected = select(hi, head_mask, new_head_mask, num_to_mask)
        if not selected:
            break
        mlp_mask = new_mlp_mask.clone()
        mi[mlp_mask == 0.0] = inf
        mlp = int(mi.sort(stable=True)[1][0])
        if mi[mlp] == inf:
            break
        new_mlp_mask[mlp] = 0.0
        how = label(on, head_mask, mlp_mask)
        hi, mi, current, on = compute(new_head_mask, new_mlp_mask)
        steps.append(("joint", len(selected), 1, how, current >= target))
    current = best
    new_head_mask = head_mask
    while current >= target:  # heads only, half the step
        head_mask = new_head_mask.clone()
        best = current
        selected = select(hi, head_mask, new_head_mask, num_to_mask // 2)
        if not selected:
            break
        how = label(on, head_mask, mlp_mask)
        hi, mi, current, on = compute(new_head_mask, mlp_mask)
        steps.append(("heads", len(selected), 0, how, current >= target))
    current = best
    new_mlp_mask = mlp_mask
    while current >= target:  # MLPs only
        best = current
        mlp_mask = new_mlp_mask.clone()
        mi[mlp_mask == 0.0] = inf
        mlp = int(mi.sort(stable=True)[1][0])
        if mi[mlp] == inf:
            break
        new_mlp_mask[mlp] = 0.0
        how = label(on, head_mask, mlp_mask)
        hi, mi, current, on = compute(head_mask, new_mlp_mask)
        steps.append(("mlps", 0, 1, how, current >= target))
    return steps, head_mask, mlp_mask


@pytest.mark.parametrize("case", ["joint-fails", "mlps-run-out", "all-mlps-go"])
def test_prasanna_schedule_reproduces_the_reference_step_sequence(case):
    n_layers, n_heads = (3 if case == "mlps-run-out" else 4), 4  # 3 layers: the MLPs go before the heads
    model = tiny_model("bert", num_hidden_layers=n_layers)
    head_w = torch.linspace(0.5, 1.5, n_layers * n_heads).view(n_layers, n_heads)
    if case == "joint-fails":  # the joint phase fails, heads go on at half the step, then MLPs
        mlp_w, threshold = torch.tensor([0.3, 4.0, 0.2, 3.0]), 0.6
    elif case == "mlps-run-out":  # MLPs cost nothing: the joint phase ends when none is left
        mlp_w, threshold = torch.zeros(n_layers), 0.1
    else:  # MLPs cheap, heads dear: the MLP-only phase removes every MLP
        mlp_w, threshold = torch.full((n_layers,), 0.05), 0.85
    metric = _weights_metric(head_w, mlp_w)
    ref_steps, ref_heads, ref_mlps = _reference_prasanna(_fake_importance, metric, n_layers, n_heads, 0.25, threshold)

    calls = []

    def score_fn(m, mask):
        calls.append(mask)
        h, ml = _fake_importance(mask.heads, mask.mlps)
        return Scores(h, ml)

    cfg = PruneConfig(threshold=threshold, step=0.25, step_of="total", schedule="prasanna", shrink=False)
    r = iterative_prune(model, score_fn, lambda m, mask: (metric(mask.heads, mask.mlps), 0.0), cfg)
    ours, prev = [], r.trace[0]
    accepted = (prev["heads_kept"], prev["mlps_kept"])
    for row in r.trace[1:]:
        ours.append((row["phase"], accepted[0] - row["heads_kept"], accepted[1] - row["mlps_kept"],
                     row["importance"], row["accepted"]))
        if row["accepted"]:
            accepted = (row["heads_kept"], row["mlps_kept"])
    assert ours == ref_steps
    assert torch.equal(r.mask.heads, ref_heads) and torch.equal(r.mask.mlps, ref_mlps)
    phases = [s[0] for s in ref_steps]
    if case == "joint-fails":  # the case the reuse is about: a failed joint step, then heads, then MLPs
        assert ("joint", 4, 1, "fresh", False) in ref_steps
        assert ("heads", 2, 0, "reused", True) in ref_steps and "mlps" in phases
    elif case == "mlps-run-out":
        assert phases.count("joint") == n_layers and all(s[4] for s in ref_steps if s[0] == "joint")
        assert ref_steps[n_layers][:4] == ("heads", 1, 0, "fresh")  # the last passing mask's own importance
    else:
        assert int(r.mask.mlps.sum()) == 0 and phases.count("mlps") >= 1
    # no mask is scored twice; at most one scoring per evaluated mask (as the reference's one pass)
    keys = {(tuple(m.heads.flatten().tolist()), tuple(m.mlps.tolist())) for m in calls}
    assert len(keys) == len(calls) <= len(ref_steps) + 1


def test_prasanna_schedule_with_real_importance_matches_the_reference_loop():
    """On a tiny model with real importance: the running gate gradient taken at the masks' gate
    values (a tensor requiring grad, never zeroed), layer-wise L2 then global min-max as their code,
    against ``score(..., accumulate="cumulative", at_mask=True)`` in the loop (no shrinking)."""
    from test_scoring import _reference_cumulative

    from headcount.importance.scoring import score

    model = tiny_model("bert")  # 3 layers x 4 heads
    batches = [tiny_batch(model, batch=3, seq=8, seed=i, labels=True) for i in range(3)]

    def reference_importance(hm, mm):
        heads, mlps = _reference_cumulative(model, batches, hm, mm)
        heads = heads / (heads.pow(2).sum(-1).pow(0.5).unsqueeze(-1) + 1e-20)
        return (heads - heads.min()) / (heads.max() - heads.min()), (mlps - mlps.min()) / (mlps.max() - mlps.min())

    metric = _weights_metric(torch.linspace(0.5, 1.5, 12).view(3, 4), torch.tensor([0.3, 2.0, 0.2]))
    ref_steps, ref_heads, ref_mlps = _reference_prasanna(reference_importance, metric, 3, 4, 0.25, 0.6)
    cfg = PruneConfig(threshold=0.6, step=0.25, step_of="total", schedule="prasanna", shrink=False)
    r = iterative_prune(
        model,
        lambda m, k: score(m, batches, normalize="layer+global", mask=k, at_mask=True, accumulate="cumulative"),
        lambda m, mask: (metric(mask.heads, mask.mlps), 0.0), cfg)
    assert [(row["phase"], row["importance"], row["accepted"]) for row in r.trace[1:]] == \
        [(s[0], s[3], s[4]) for s in ref_steps]
    assert any(s[3] == "reused" for s in ref_steps)  # the reuse is exercised
    assert torch.equal(r.mask.heads, ref_heads) and torch.equal(r.mask.mlps, ref_mlps)
