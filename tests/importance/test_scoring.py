"""Importance scores: gradient equals an independent autograd computation, ablation equals
explicit gated forward passes, normalisations, per-application scores for shared layers."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import ARCH_IDS, tiny_batch, tiny_model

from headcount.core.gates import gated, layout
from headcount.core.masks import Mask
from headcount.importance.scoring import score
from headcount.importance.scores import Scores, normalize_scores


def _batches(model, n=3, size=4, seq=9):
    return [tiny_batch(model, batch=size, seq=seq, seed=i, labels=True) for i in range(n)]


def _reference_gradient(model, batches):
    """sum_b |dL_b/dg| with one [L, H] gate per batch: the contract's definition."""
    n_layers, n_heads = layout(model)
    heads, mlps = torch.zeros(n_layers, n_heads), torch.zeros(n_layers)
    for b in batches:
        g = torch.ones(n_layers, n_heads, requires_grad=True)
        m = torch.ones(n_layers, requires_grad=True)
        with gated(model, heads=g, mlps=m):
            loss = model(**b).loss
        dg, dm = torch.autograd.grad(loss, [g, m])
        heads += dg.abs()
        mlps += dm.abs()
    return heads, mlps


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_gradient_equals_independent_autograd(arch):
    model = tiny_model(arch)
    batches = _batches(model)
    s = score(model, batches, method="gradient")
    ref_h, ref_m = _reference_gradient(model, batches)
    assert s.heads.shape == ref_h.shape
    assert torch.allclose(s.heads, ref_h, atol=1e-5, rtol=1e-4)
    assert torch.allclose(s.mlps, ref_m, atol=1e-5, rtol=1e-4)
    assert float(s.heads.sum()) > 0
    assert s.n_examples == 12
    assert s.n_tokens == sum(int(b["attention_mask"].sum()) for b in batches)


def test_scoring_leaves_weights_untouched_and_grad_free():
    model = tiny_model("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    score(model, _batches(model), method="gradient")
    assert all(p.grad is None for p in model.parameters())  # no weight gradient computed
    assert [p.requires_grad for p in model.parameters()] == flags
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_gradient_token_is_michel_per_token_abs():
    model = tiny_model("bert")
    batches = _batches(model, n=2)
    s = score(model, batches, method="gradient-token")
    n_layers, n_heads = layout(model)
    ref = torch.zeros(n_layers, n_heads)
    for b in batches:
        bs, seq = b["input_ids"].shape
        g = torch.ones(bs, seq, n_layers, n_heads, requires_grad=True)
        with gated(model, heads=g):
            loss = model(**b).loss
        (dg,) = torch.autograd.grad(loss, [g])
        ref += dg.abs().sum(dim=(0, 1))
    assert torch.allclose(s.heads, ref, atol=1e-5, rtol=1e-4)
    # per-token absolute values dominate the absolute value of their sum
    assert bool((s.heads >= score(model, batches).heads - 1e-6).all())


def test_ablation_equals_explicit_gated_passes():
    model = tiny_model("bert")
    batches = _batches(model, n=2)
    s = score(model, batches, method="ablation")
    n_layers, n_heads = layout(model)
    with torch.no_grad():
        base = [float(model(**b).loss) for b in batches]
        for layer, head in [(0, 0), (1, 3), (2, 2)]:
            g = torch.ones(n_layers, n_heads)
            g[layer, head] = 0
            with gated(model, heads=g):
                expected = sum(float(model(**b).loss) - l0 for b, l0 in zip(batches, base))
            assert math.isclose(float(s.heads[layer, head]), expected, rel_tol=1e-4, abs_tol=1e-6)
        m = torch.ones(n_layers)
        m[1] = 0
        with gated(model, mlps=m):
            expected = sum(float(model(**b).loss) - l0 for b, l0 in zip(batches, base))
    assert math.isclose(float(s.mlps[1]), expected, rel_tol=1e-4, abs_tol=1e-6)
    agreement = s.meta["rank_agreement_with_gradient"]
    assert -1 <= agreement["spearman"] <= 1


def test_normalisations():
    heads = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    mlps = torch.tensor([2.0, 4.0])
    h, m = normalize_scores(heads, mlps, "none")
    assert torch.equal(h, heads)
    h, m = normalize_scores(heads, mlps, "layer")
    assert torch.allclose(h, torch.tensor([[0.6, 0.8], [1.0, 0.0]]))
    assert torch.equal(m, mlps)
    h, m = normalize_scores(heads, mlps, "layer+global")
    assert float(h.min()) == 0.0 and float(h.max()) == 1.0
    assert torch.allclose(h, torch.tensor([[0.6, 0.8], [1.0, 0.0]]))
    assert torch.allclose(m, torch.tensor([0.0, 1.0]))


def test_shared_layer_scores_nonzero_at_every_depth():
    model = tiny_model("albert")
    s = score(model, _batches(model), method="gradient")
    n_layers, _ = layout(model)
    assert n_layers == 4  # applications, not physical layers
    assert bool((s.heads.sum(dim=1) > 0).all())
    assert bool((s.mlps > 0).all())
    # depths differ: each application has its own gates
    assert not torch.allclose(s.heads[0], s.heads[-1])


def test_masked_scoring_and_pruned_model_agree():
    """Scores with a mask held fixed equal scores on the physically shrunk model (kept heads)."""
    from headcount.core.gates import clone_model
    from headcount.core.surgery import shrink

    model = tiny_model("bert")
    batches = _batches(model)
    mask = Mask.full(*layout(model)).without_heads([(0, 1), (2, 0), (2, 3)])
    masked = score(model, batches, mask=mask)
    small = shrink(clone_model(model), mask)
    pruned = score(small, batches)
    keep = mask.heads.bool()
    assert torch.allclose(masked.heads[keep], pruned.heads[keep], atol=1e-5, rtol=1e-4)
    assert bool((pruned.heads[~keep] == 0).all())


def test_magnitude_and_entropy():
    model = tiny_model("bert")
    mag = score(model, method="magnitude")
    block_q = model.bert.encoder.layer[0].attention.self.query.weight[:8]
    assert float(mag.heads[0, 0]) > float(block_q.detach().norm())
    ent = score(model, _batches(model, n=1), method="entropy")
    assert bool((ent.heads > 0).all())
    assert bool((ent.heads <= math.log(9) + 1e-4).all())  # at most log(seq)


def test_scores_json_round_trip(tmp_path):
    s = Scores(torch.rand(2, 3), torch.rand(2), method="gradient", normalize="none", n_examples=5, n_tokens=40,
               meta={"task": "t", "objective": "task", "model": "m"})
    s.save(tmp_path / "scores.json")
    t = Scores.load(tmp_path / "scores.json")
    assert torch.allclose(t.heads, s.heads) and torch.allclose(t.mlps, s.mlps)
    assert t.meta["task"] == "t" and t.n_tokens == 40


def test_bad_method():
    from headcount.runtime.errors import HeadcountError

    with pytest.raises(HeadcountError):
        score(tiny_model("bert"), [], method="nope")


def _reference_cumulative(model, batches, head_mask=None, mlp_mask=None):
    """run_bertology / Prasanna et al.'s loop: one gate tensor (the mask itself) requiring grad,
    ``loss.backward()`` per batch and never zeroed, ``importance += gate.grad.abs()`` after each."""
    n_layers, n_heads = layout(model)
    g = (torch.ones(n_layers, n_heads) if head_mask is None else head_mask.clone()).requires_grad_(True)
    m = (torch.ones(n_layers) if mlp_mask is None else mlp_mask.clone()).requires_grad_(True)
    heads, mlps = torch.zeros(n_layers, n_heads), torch.zeros(n_layers)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        for b in batches:
            with gated(model, heads=g, mlps=m):
                model(**b).loss.backward()
            heads += g.grad.abs()
            mlps += m.grad.abs()
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
    return heads, mlps


def _ragged_batches(model):
    """Batches of different sizes and lengths; neighbours of the same rounded length (9-12 -> 16,
    6-7 -> 8 on the CPU) are merged under a token budget."""
    shapes = [(3, 9), (5, 10), (2, 12), (4, 7), (3, 6)]
    return [tiny_batch(model, batch=n, seq=s, seed=i, labels=True) for i, (n, s) in enumerate(shapes)]


def test_cumulative_equals_reference_loop_without_zero_grad():
    model = tiny_model("bert")
    batches = _ragged_batches(model)
    s = score(model, batches, method="gradient", accumulate="cumulative", tokens_per_batch=0)
    ref_h, ref_m = _reference_cumulative(model, batches)
    assert torch.allclose(s.heads, ref_h, atol=1e-5, rtol=1e-4)
    assert torch.allclose(s.mlps, ref_m, atol=1e-5, rtol=1e-4)
    assert s.meta["accumulate"] == "cumulative" and s.to_dict()["accumulate"] == "cumulative"
    # and it is another quantity than the per-batch sum (which stays the independent autograd one)
    per_batch = score(model, batches, method="gradient", tokens_per_batch=0)
    assert per_batch.meta["accumulate"] == "per-batch"
    pb_h, pb_m = _reference_gradient(model, batches)
    assert torch.allclose(per_batch.heads, pb_h, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(s.heads, per_batch.heads, rtol=1e-2)
    # the first batch's term is the same in both orders
    first = score(model, batches[:1], accumulate="cumulative")
    assert torch.allclose(first.heads, score(model, batches[:1]).heads, atol=1e-6)


@pytest.mark.parametrize("accumulate", ["per-batch", "cumulative"])
def test_accumulation_is_over_the_batches_as_given_whatever_the_token_budget(accumulate):
    model = tiny_model("bert")
    batches = _ragged_batches(model)
    from headcount.data.tasks.batching import pack_batches
    from headcount.runtime.device import runtime

    alone = score(model, batches, accumulate=accumulate, tokens_per_batch=0)
    pad = runtime(model).pad_multiple
    for budget, groups in ((128, [[3, 5], [2], [4, 3]]), (10_000, [[3, 5, 2], [4, 3]])):
        assert [sizes for _, sizes in pack_batches(batches, budget, pad)] == groups  # merging happens
        merged = score(model, batches, accumulate=accumulate, tokens_per_batch=budget)
        assert torch.allclose(merged.heads, alone.heads, atol=1e-5, rtol=1e-4), budget
        assert torch.allclose(merged.mlps, alone.mlps, atol=1e-5, rtol=1e-4), budget


def test_at_mask_takes_the_gradient_at_the_masks_gate_values():
    """A removed head scores 0 while the mask is held fixed, its gradient at gate 0 with ``at_mask``
    (the references' gate tensor is the mask itself)."""
    model = tiny_model("bert")
    batches = _batches(model, n=2)
    mask = Mask.full(3, 4).without_heads([(0, 1), (2, 3)]).without_mlps([1])
    held = score(model, batches, mask=mask)
    assert float(held.heads[0, 1]) == 0 and float(held.mlps[1]) == 0
    at = score(model, batches, mask=mask, at_mask=True, accumulate="cumulative")
    ref_h, ref_m = _reference_cumulative(model, batches, mask.heads, mask.mlps)
    assert torch.allclose(at.heads, ref_h, atol=1e-5, rtol=1e-4)
    assert torch.allclose(at.mlps, ref_m, atol=1e-5, rtol=1e-4)
    assert float(at.heads[0, 1]) > 0 and float(at.mlps[1]) > 0
    kept = mask.heads.bool()
    assert torch.allclose(score(model, batches, mask=mask, accumulate="cumulative").heads[kept], at.heads[kept],
                          atol=1e-5, rtol=1e-4)  # kept heads: the same either way


def test_accumulate_is_checked():
    from headcount.runtime.errors import HeadcountError

    model = tiny_model("bert")
    with pytest.raises(HeadcountError, match="accumulat"):
        score(model, _batches(model, n=1), accumulate="running")
    with pytest.raises(HeadcountError, match="cumulative"):
        score(model, _batches(model, n=1), method="gradient-token", accumulate="cumulative")
    assert score(model, _batches(model, n=1), method="gradient-token").meta["accumulate"] == "per-token"


def test_cli_accumulate_is_recorded_and_checked(tmp_path, capsys):
    """``--accumulate`` on score and prune: recorded in scores.json, mask.json and trace.csv; a
    cumulative per-token score is refused with one error line (exit 2)."""
    import csv
    import json

    from training_helpers import make_checkpoint, make_task

    from headcount.cli.app import main

    ckpt = make_checkpoint(tmp_path / "clf", head="classification")
    task = make_task(tmp_path / "task", n_train=48, n_dev=32)

    def run(args):
        try:
            code = main(args) or 0
        except SystemExit as e:
            code = e.code
        return code, capsys.readouterr()

    common = ["--model", str(ckpt), "--task", str(task), "--max-examples", "32", "--batch-size", "8"]
    code, out = run(["score", *common, "--accumulate", "cumulative", "--out", str(tmp_path / "s")])
    assert code == 0, out.err
    assert json.loads((tmp_path / "s" / "scores.json").read_text())["accumulate"] == "cumulative"
    code, out = run(["score", *common, "--out", str(tmp_path / "d")])
    assert code == 0 and json.loads((tmp_path / "d" / "scores.json").read_text())["accumulate"] == "per-batch"
    code, out = run(["prune", *common, "--max-eval-examples", "32", "--mlps", "--step-of", "total",
                     "--accumulate", "cumulative", "--out", str(tmp_path / "p")])
    assert code == 0, out.err
    assert json.loads((tmp_path / "p" / "mask.json").read_text())["accumulate"] == "cumulative"
    rows = list(csv.DictReader((tmp_path / "p" / "trace.csv").open()))
    assert {r["accumulate"] for r in rows} == {"cumulative"} and rows[1]["importance"] == "fresh"
    code, out = run(["score", *common, "--method", "gradient-token", "--accumulate", "cumulative",
                     "--out", str(tmp_path / "bad")])
    assert code == 2 and out.err.strip().startswith("error:") and len(out.err.strip().splitlines()) == 1
    assert "cumulative" in out.err and not (tmp_path / "bad" / "scores.json").exists()


def test_cumulative_importance_takes_the_split_in_file_order_as_the_reference_does(tmp_path):
    """``accumulate: cumulative`` with the default batch order equals run_bertology's loop over the
    split in file order (``SequentialSampler``), fixed-size batches each padded to its longest
    example; the length-grouped order (what per-batch keeps) gives other numbers."""
    from training_helpers import make_checkpoint, make_task

    from headcount.data.tasks import get_task
    from headcount.importance.pipeline import batches_for, load_for
    from headcount.importance.settings import DataConfig, ScoreSettings

    ckpt = make_checkpoint(tmp_path / "clf", head="classification")
    task = get_task(str(make_task(tmp_path / "task", n_train=8, n_dev=22)))
    how = ScoreSettings(accumulate="cumulative")
    assert how.batch_order == "auto" and not how.grouped  # auto -> file order for cumulative
    assert ScoreSettings().grouped  # per-batch keeps length grouping
    model, tok, _ = load_for(str(ckpt), task, "task")
    data = DataConfig(batch_size=4, max_length=32, split=task.validation_split)
    ours = score(model, batches_for(task, tok, "task", data, group_by_length=how.grouped),
                 method="gradient", accumulate="cumulative", tokens_per_batch=0)
    # the reference: the dev file's rows in order, slices of 4 (the last one shorter), tokenizer padding
    loaded = task.load(task.validation_split)
    ref_batches = []
    for a in range(0, len(loaded), 4):
        texts = [t[0] for t in loaded.texts[a:a + 4]]
        enc = tok(texts, padding=True, truncation=True, max_length=32, return_tensors="pt")
        ref_batches.append({**enc, "labels": torch.tensor(loaded.labels[a:a + 4])})
    assert len(ref_batches) == 6
    ref_h, ref_m = _reference_cumulative(model, ref_batches)
    assert torch.allclose(ours.heads, ref_h, atol=1e-5, rtol=1e-4)
    assert torch.allclose(ours.mlps, ref_m, atol=1e-5, rtol=1e-4)
    grouped = score(model, batches_for(task, tok, "task", data, group_by_length=True), method="gradient",
                    accumulate="cumulative", tokens_per_batch=0)
    assert not torch.allclose(grouped.heads, ref_h, rtol=1e-3)  # the order matters: the test can fail
