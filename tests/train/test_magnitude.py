"""Magnitude pruning: the weight-mask primitives (headcount.importance.magnitude), the procedures
(headcount.train.magnitude_search and magnitude_prune: the paper's search without retraining, IMP with rewinding), the CLI."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil

import pytest
import torch
import transformers
from training_helpers import make_checkpoint, make_task, one_thread, stop_after

from headcount.cli.app import main
from headcount.core.models import load_model
from headcount.importance.magnitude import (
    apply_weight_mask,
    load_weight_mask,
    magnitude_mask,
    mask_sparsity,
    masked_weights,
    model_sparsity,
    remove_weight_mask,
    save_weight_mask,
    weight_mask_of,
    weight_targets,
)
from headcount.runtime.errors import HeadcountError
from headcount.train import TrainConfig, finetune
from headcount.train.magnitude_search import MagnitudeConfig, check_procedure, prasanna_magnitude_mask
from headcount.train.magnitude_prune import magnitude_prune, prasanna_magnitude_prune

FAST = TrainConfig(lr=1e-2, batch_size=16, epochs=2, save_steps=4, max_train_examples=128, max_eval_examples=64,
                   use_cpu=True)


_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("magnitude")
    return {"pre": str(make_checkpoint(root / "pre")), "task": str(make_task(root / "task")), "root": root}


def _model(world, head="classification"):
    transformers.set_seed(0)
    return load_model(world["pre"], head=head, num_labels=2)


# -- which weights, which masks ---------------------------------------------------------------------
def test_targets_prasanna_and_chen(world):
    model = _model(world)
    p, c = weight_targets(model, "prasanna"), weight_targets(model, "chen")
    # per layer: q,k,v,o,ffn_in weights+biases (10) + ffn_out weight (1); 2 layers
    assert len(p) == 22 and "encoder.layer.0.attention.self.query.bias" in p
    assert "encoder.layer.1.output.dense.weight" in p and "encoder.layer.1.output.dense.bias" not in p
    # chen: weights only (6 per layer) + the pooler
    assert len(c) == 13 and "pooler.dense.weight" in c and not any(k.endswith("bias") for k in c)
    assert set(weight_targets(_model(world, "base"), "chen")) == set(c)  # names fit base and task models


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.77])
def test_controls_have_exactly_the_same_sparsity(world, sparsity):
    model = _model(world)
    masks = {c: magnitude_mask(model, sparsity, control=c, seed=1) for c in ("good", "random", "bad")}
    total = sum(m.numel() for m in masks["good"].values())
    for m in masks.values():
        assert mask_sparsity(m)["pruned"] == round(sparsity * total)
    if sparsity:
        w = {n: getattr(mod, a).detach().abs() for n, (mod, a) in weight_targets(model).items()}
        pruned = lambda m: torch.cat([w[n][~m[n]] for n in w])  # noqa: E731
        kept = lambda m: torch.cat([w[n][m[n]] for n in w])  # noqa: E731
        assert pruned(masks["good"]).max() <= kept(masks["good"]).min()  # smallest go first
        assert pruned(masks["bad"]).min() >= kept(masks["bad"]).max()  # largest go first
        same = lambda a, b: all(torch.equal(a[n], b[n]) for n in a)  # noqa: E731
        assert not same(masks["random"], masks["good"]) and not same(masks["random"], masks["bad"])
        assert same(masks["random"], magnitude_mask(model, sparsity, control="random", seed=1))  # seeded
        assert not same(masks["random"], magnitude_mask(model, sparsity, control="random", seed=2))


def test_iterative_masks_nest_and_model_is_untouched(world):
    model = _model(world)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    m1 = magnitude_mask(model, 0.1)
    m2 = magnitude_mask(model, 0.19, current=m1, control="bad")
    assert all(bool((m2[n] <= m1[n]).all()) for n in m1)  # what m1 pruned stays pruned
    assert mask_sparsity(m2)["pruned"] == round(0.19 * mask_sparsity(m2)["total"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(HeadcountError, match=r"\[0, 1\)"):
        magnitude_mask(model, 1.0)
    with pytest.raises(HeadcountError, match="below the current"):
        magnitude_mask(model, 0.05, current=m1)


def test_apply_save_load_remove(world, tmp_path):
    model = _model(world)
    mask = magnitude_mask(model, 0.4)
    save_weight_mask(mask, tmp_path / "weight_mask.safetensors", meta={"control": "good"})
    loaded = load_weight_mask(tmp_path)
    assert loaded.keys() == mask.keys() and all(torch.equal(loaded[k], mask[k]) for k in mask)
    apply_weight_mask(model, loaded)
    assert model_sparsity(model)["pruned"] == mask_sparsity(mask)["pruned"]  # hooks zero the weights
    assert all(torch.equal(weight_mask_of(model)[k], mask[k]) for k in mask)
    remove_weight_mask(model)
    assert not weight_mask_of(model) and model_sparsity(model)["sparsity"] == pytest.approx(0.4, abs=1e-4)
    # a mask for another model shape
    other = load_model(str(make_checkpoint(tmp_path / "wide", hidden_size=48)), head="base")
    with pytest.raises(HeadcountError, match="another model shape"):
        apply_weight_mask(other, mask)


# -- retraining ------------------------------------------------------------------------------------------
def test_magnitude_retraining_keeps_exactly_the_masked_weights_zero(world, tmp_path):
    mask = magnitude_mask(_model(world), 0.5)
    m = finetune(world["pre"], world["task"], weight_mask=mask, seed=1, config=FAST, out_dir=tmp_path / "r")
    assert m["weight_mask"]["sparsity"] == 0.5 or abs(m["weight_mask"]["sparsity"] - 0.5) < 1e-4
    trained = load_model(str(tmp_path / "r" / "model"), head="classification", num_labels=2)
    for name, (module, attr) in weight_targets(trained).items():
        w = getattr(module, attr)
        assert torch.equal(w == 0, ~mask[name]), name  # zero exactly where masked
    assert model_sparsity(trained)["pruned"] == mask_sparsity(mask)["pruned"]


def test_magnitude_retraining_resumes(world, tmp_path):
    mask = magnitude_mask(_model(world), 0.3, control="random", seed=4)
    full = finetune(world["pre"], world["task"], weight_mask=mask, seed=2, config=FAST, out_dir=tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        finetune(world["pre"], world["task"], weight_mask=mask, seed=2, config=FAST, out_dir=tmp_path / "b",
                 callbacks=[stop_after(10)])
    resumed = finetune(world["pre"], world["task"], weight_mask=mask, seed=2, config=FAST, out_dir=tmp_path / "b")
    # checkpoint-8 is the last step of epoch 1, saved before that epoch's evaluation
    assert resumed["resumed_from"] == "checkpoint-8" and resumed["final"] == full["final"]
    assert resumed["epochs"] == full["epochs"] and len(full["epochs"]) == 2


class _Starts(transformers.TrainerCallback):
    """Records the weights each fine-tuning starts from: effective (masked) and underlying."""

    def __init__(self):
        self.starts = []

    def on_train_begin(self, args, state, control, model=None, **kw):
        targets = weight_targets(model)
        self.starts.append({
            "weight": {n: getattr(m, a).detach().clone() for n, (m, a) in targets.items()},
            "orig": {n: getattr(m, a + "_orig", getattr(m, a)).detach().clone() for n, (m, a) in targets.items()},
        })


def test_imp_rewinds_to_pretrained_and_stops(world, tmp_path):
    starts = _Starts()
    out = tmp_path / "imp"
    r = magnitude_prune(world["pre"], world["task"], config=MagnitudeConfig(procedure="imp", rounds=2, threshold=0.0),
                        train=FAST, seed=1, out_dir=out, callbacks=[starts])
    assert r["procedure"] == "imp"
    pre = load_model(world["pre"], head="base")
    pre_w = {n: getattr(m, a).detach() for n, (m, a) in weight_targets(pre).items()}
    m1, m2 = load_weight_mask(out / "round_01"), load_weight_mask(out / "round_02")
    total = mask_sparsity(m1)["total"]
    n1 = round(0.1 * total)
    assert mask_sparsity(m1)["pruned"] == n1
    assert mask_sparsity(m2)["pruned"] == n1 + round(0.1 * (total - n1))  # 10% of the remaining
    assert len(starts.starts) == 3  # the full run, round 1, round 2
    # every round rewinds to the pre-trained weights, masked
    for start, mask in zip(starts.starts[1:], (m1, m2)):
        for n, w in pre_w.items():
            assert torch.equal(start["orig"][n], w), n
            assert torch.equal(start["weight"][n], w * mask[n]), n
    # ... while round 2's mask came from round 1's trained weights (which differ from pre-trained)
    r1 = load_model(str(out / "round_01" / "model"), head="classification", num_labels=2)
    assert not torch.equal(r1.base_model.encoder.layer[0].attention.self.query.weight,
                           pre.encoder.layer[0].attention.self.query.weight)
    assert r["round"] == 2 and r["sparsity"] == mask_sparsity(m2)["sparsity"]
    rows = list(csv.DictReader((out / "trace.csv").open()))
    assert [int(x["round"]) for x in rows] == [0, 1, 2]
    assert [float(x["sparsity"]) for x in rows][1:] == [mask_sparsity(m1)["sparsity"], mask_sparsity(m2)["sparsity"]]
    assert set(rows[0]) >= {"round", "sparsity", "metric", "seconds"}
    assert all(torch.equal(a, b) for a, b in zip(load_weight_mask(out).values(), m2.values()))
    # a control matched to the good run: one shot at exactly its sparsity, the full run reused
    bad = magnitude_prune(world["pre"], world["task"], config=MagnitudeConfig(control="bad"), train=FAST, seed=1,
                          out_dir=tmp_path / "bad", match=out)
    assert bad["pruned"] == mask_sparsity(m2)["pruned"] and not (tmp_path / "bad" / "full").exists()
    assert bad["full_metric"] == r["full_metric"]
    # the stop rule: an impossible threshold stops after round 1 (rounds are reused); no round passed: no mask,
    # a NaN result flagged no_passing_mask (not the full model at sparsity 0)
    r2 = magnitude_prune(world["pre"], world["task"], config=MagnitudeConfig(procedure="imp", rounds=2, threshold=2.0),
                         train=FAST, seed=1, out_dir=out)
    assert r2["round"] == 0 and len(r2["trace"]) == 2 and not r2["trace"][1]["passed"]
    assert r2["no_passing_mask"] is True and r2["metric"] is None and r2["sparsity"] is None
    assert not (out / "weight_mask.safetensors").exists()
    # ... and a control matched to it is skipped: nothing trained
    skipped = magnitude_prune(world["pre"], world["task"], config=MagnitudeConfig(control="random"), train=FAST,
                              seed=1, out_dir=tmp_path / "random", match=out)
    assert skipped["skipped"] and skipped["no_passing_mask"] and skipped["metric"] is None
    assert not list((tmp_path / "random").glob("round_*"))
    # the same folder with another control is another run
    with pytest.raises(HeadcountError, match="different magnitude run"):
        magnitude_prune(world["pre"], world["task"], config=MagnitudeConfig(procedure="imp", rounds=2, control="random"),
                        train=FAST, seed=1, out_dir=out)


# -- the paper's procedure: prune the fine-tuned weights without retraining ------------------------------
#: The weights Prasanna et al. prune, by name (a plain-torch restatement for the reference below).
_PAPER_SET = re.compile(r"encoder\.layer\.\d+\.(attention\.self\.(query|key|value)|attention\.output\.dense"
                        r"|intermediate\.dense)\.(weight|bias)$|encoder\.layer\.\d+\.output\.dense\.weight$")


def _fine_tuned(world):
    """The tiny classifier with every weight moved (as fine-tuning would): distinct magnitudes, no ties."""
    model = _model(world)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def _reference_masks(model, rate, steps):
    """Global L1 over the paper's parameter set, ``rate`` of the remaining weights per step: the
    mask after each step (True = kept), by a plain sort of all magnitudes."""
    params = {n: p.detach() for n, p in model.base_model.named_parameters() if _PAPER_SET.search(n)}
    flat = torch.cat([p.abs().flatten() for p in params.values()])
    order = torch.argsort(flat)  # smallest first
    masks, pruned = [], 0
    for _ in range(steps):
        pruned += round(rate * (flat.numel() - pruned))
        keep = torch.ones(flat.numel(), dtype=torch.bool)
        keep[order[:pruned]] = False
        out, i = {}, 0
        for n, p in params.items():
            out[n] = keep[i:i + p.numel()].view(p.shape)
            i += p.numel()
        masks.append(out)
    return masks


class _Scripted:
    """An evaluation we control: the full model scores 1.0, step k scores ``scores[k - 1]``; it
    records what the model looked like at each call (zeros among the paper's weights)."""

    def __init__(self, scores):
        self.scores, self.calls = list(scores), []

    def __call__(self, model):
        zeros = {n: (p == 0) for n, p in model.base_model.named_parameters() if _PAPER_SET.search(n)}
        self.calls.append(zeros)
        return 1.0 if len(self.calls) == 1 else self.scores[len(self.calls) - 2]


def test_prasanna_search_matches_a_plain_torch_reference_and_stops_at_the_failing_step(world):
    model = _fine_tuned(world)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ref = _reference_masks(model, 0.1, 6)
    assert set(ref[0]) == set(weight_targets(model, "prasanna"))  # the same parameter set
    # steps 1-3 keep >= 0.9 x full, step 4 falls to 0.85: stop there, keep step 3
    evaluate = _Scripted([0.95, 0.92, 0.9, 0.85, 0.99, 0.99])
    found = prasanna_magnitude_mask(model, evaluate, config=MagnitudeConfig(rate=0.1, rounds=10, threshold=0.9))
    assert found.step == 3 and not found.no_passing_mask and found.metric == 0.9 and found.full_metric == 1.0
    assert all(torch.equal(found.mask[n], ref[2][n]) for n in ref[2])  # the reference's step-3 mask
    assert [r["step"] for r in found.trace] == [0, 1, 2, 3, 4]  # step 4 evaluated, step 5 never
    assert [r["passed"] for r in found.trace] == [True, True, True, True, False]
    assert [r["metric"] for r in found.trace] == [1.0, 0.95, 0.92, 0.9, 0.85]
    total = sum(m.numel() for m in ref[0].values())
    assert [r["pruned"] for r in found.trace[1:]] == [total - sum(int(m.sum()) for m in r.values()) for r in ref[:4]]
    # each evaluation saw the fine-tuned weights with exactly that step's weights zeroed, no retraining between
    assert not any(bool(z.any()) for z in evaluate.calls[0].values())
    for k, zeros in enumerate(evaluate.calls[1:], start=1):
        assert all(torch.equal(zeros[n], ~ref[k - 1][n]) for n in zeros), k
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # restored exactly
    assert found.stopped == "threshold"


def _reference_loop(scores, masks, total_steps, threshold):
    """``mask_global`` of the reference code (sai-prasanna/bert-experiments,
    ``src/find_global_weight_mask.py``), transcribed: ``masks[k]`` stands for the mask
    ``prune_model`` returns at its k-th call (``masks[0]``: the identity call, nothing pruned),
    ``scores[k]`` for the evaluation after it (``scores[0]``: the original score). Returns the
    index of the mask it saves and the scores it evaluated, in order."""
    original_score = scores[0]
    evaluated = [original_score]
    new_mask = 0  # new_mask = prune_model(model, amount=None, mode=prune.Identity)
    current_score = original_score
    while total_steps != 0 and current_score >= original_score * threshold:
        total_steps -= 1
        mask = new_mask  # mask = {k: v.clone() for k, v in new_mask.items()}  # save current head mask
        new_mask += 1  # new_mask = prune_model(model, amount=args.masking_amount, mode=prune.L1Unstructured)
        current_score = scores[new_mask]  # evaluate(...); compute_metrics(...)
        evaluated.append(current_score)
    return mask, evaluated


#: un-retrained scores after steps 1..10 (full model: 1.0; threshold 0.9): all pass, step k fails, step 1 fails
_STOPS = {"all-pass": [0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.93, 0.92, 0.91, 0.9],
          "step-2-fails": [0.95, 0.89, 0.99],
          "step-5-fails": [0.95, 0.94, 0.93, 0.92, 0.5, 0.99],
          "step-10-fails": [0.99] * 9 + [0.8],
          "step-1-fails": [0.89, 0.99]}


@pytest.mark.parametrize("case", list(_STOPS))
@pytest.mark.parametrize("at_cap", ["reference", "last"])
def test_prasanna_search_keeps_the_step_the_reference_loop_keeps(world, case, at_cap):
    model = _fine_tuned(world)
    steps = _reference_masks(model, 0.1, 10)
    masks = [{n: torch.ones_like(m) for n, m in steps[0].items()}, *steps]  # prune_model's k-th mask
    scores = [1.0, *_STOPS[case]]
    saved, evaluated = _reference_loop(scores, masks, total_steps=10, threshold=0.9)
    found = prasanna_magnitude_mask(model, _Scripted(_STOPS[case]),
                                    config=MagnitudeConfig(rate=0.1, rounds=10, threshold=0.9, at_cap=at_cap))
    # the same evaluations, in the same order
    assert [r["metric"] for r in found.trace] == evaluated and [r["step"] for r in found.trace] == list(range(len(evaluated)))
    capped = len(evaluated) == 11 and evaluated[-1] >= 0.9
    assert found.stopped == ("cap" if capped else "threshold")
    if at_cap == "last" and capped:  # the option: the last passing step, one beyond the reference's
        saved += 1
    assert found.step == saved
    if saved:
        assert found.metric == scores[saved]  # the kept mask's un-retrained metric
    else:  # the reference keeps the identity mask (nothing pruned); headcount keeps no mask (a NaN row)
        assert case == "step-1-fails" and found.mask is None and math.isnan(found.metric)
        assert all(bool(m.all()) for m in masks[saved].values())
    if saved:
        assert all(torch.equal(found.mask[n], masks[saved][n]) for n in masks[saved])
    expected = {"all-pass": 10 if at_cap == "last" else 9, "step-2-fails": 1, "step-5-fails": 4, "step-10-fails": 9,
                "step-1-fails": 0}
    assert found.step == expected[case]  # stated, not only derived from the transcription
    if case == "all-pass":  # the sparsity the paper's kept mask has: 1 - 0.9^9, not 1 - 0.9^10
        assert mask_sparsity(found.mask)["sparsity"] == pytest.approx(1 - 0.9 ** found.step, abs=1e-3)


def test_prasanna_search_at_a_short_cap_and_when_it_runs_out_of_weights(world):
    model = _fine_tuned(world)
    ref = _reference_masks(model, 0.1, 2)
    # max steps 2, both pass: the reference keeps step 1 (the mask before the last step); "last" keeps step 2
    capped = prasanna_magnitude_mask(model, _Scripted([1.0] * 10), config=MagnitudeConfig(rounds=2))
    assert capped.step == 1 and capped.stopped == "cap" and all(torch.equal(capped.mask[n], ref[0][n]) for n in ref[0])
    assert [r["step"] for r in capped.trace] == [0, 1, 2] and capped.trace[2]["passed"]  # step 2 evaluated, not kept
    last = prasanna_magnitude_mask(model, _Scripted([1.0] * 10), config=MagnitudeConfig(rounds=2, at_cap="last"))
    assert last.step == 2 and last.stopped == "cap" and all(torch.equal(last.mask[n], ref[1][n]) for n in ref[1])
    # one step under "reference" keeps nothing (the mask before step 1): the library says so, the CLI refuses it
    one = prasanna_magnitude_mask(model, _Scripted([1.0]), config=MagnitudeConfig(rounds=1))
    assert one.step == 0 and one.mask is None and one.stopped == "cap"
    with pytest.raises(HeadcountError, match="1 step"):
        check_procedure(MagnitudeConfig(rounds=1))
    check_procedure(MagnitudeConfig(rounds=1, at_cap="last"))
    check_procedure(MagnitudeConfig(procedure="imp", rounds=1))
    # a step that would prune every weight ends the search before the cap: the last passing step, either way
    for at_cap in ("reference", "last"):
        out = prasanna_magnitude_mask(model, _Scripted([1.0] * 10),
                                      config=MagnitudeConfig(rate=0.5, schedule="original", at_cap=at_cap))
        assert out.stopped == "exhausted" and out.step == 1 and [r["step"] for r in out.trace] == [0, 1]
    with pytest.raises(HeadcountError, match="unknown at cap 'meh'; choose one of reference, last"):
        MagnitudeConfig(at_cap="meh")


def test_prasanna_search_without_a_passing_step_keeps_no_mask(world):
    model = _fine_tuned(world)
    found = prasanna_magnitude_mask(model, _Scripted([0.5, 1.0]), config=MagnitudeConfig(threshold=0.9))
    assert found.no_passing_mask and found.mask is None and found.step == 0 and math.isnan(found.metric)
    assert [r["passed"] for r in found.trace] == [True, False] and found.stopped == "threshold"
    nan = prasanna_magnitude_mask(model, _Scripted([float("nan")]), config=MagnitudeConfig())
    assert nan.no_passing_mask  # a NaN metric does not pass


def test_masked_weights_zeroes_and_restores(world):
    model = _fine_tuned(world)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mask = magnitude_mask(model, 0.3)
    with masked_weights(model, mask):
        assert model_sparsity(model)["pruned"] == mask_sparsity(mask)["pruned"] and not weight_mask_of(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_prasanna_end_to_end_retrains_the_kept_mask_once_from_pretrained(world, tmp_path):
    starts = _Starts()
    out = tmp_path / "paper"
    r = magnitude_prune(world["pre"], world["task"], config=MagnitudeConfig(rounds=3, threshold=0.0), train=FAST,
                        seed=1, out_dir=out, callbacks=[starts])
    # all 3 steps pass: at the cap the reference keeps the mask from before the last step (step 2)
    assert r["procedure"] == "prasanna" and r["step"] == r["round"] == 2 and not r["no_passing_mask"]
    assert r["stopped"] == "cap" and r["config"]["at_cap"] == "reference"
    assert json.loads((out / "magnitude.json").read_text())["stopped"] == "cap"
    mask = load_weight_mask(out)
    assert r["pruned"] == mask_sparsity(mask)["pruned"] > 0 and r["sparsity"] == r["trace"][2]["sparsity"]
    assert r["unretrained_metric"] == r["trace"][2]["metric"] and r["trace"][3]["passed"]
    assert len(starts.starts) == 2  # the full fine-tuning and ONE retraining (no retraining between steps)
    pre = load_model(world["pre"], head="base")
    for n, (m, a) in weight_targets(pre).items():  # the retraining starts from the pre-trained weights, masked
        w = getattr(m, a).detach()
        assert torch.equal(starts.starts[1]["orig"][n], w) and torch.equal(starts.starts[1]["weight"][n], w * mask[n])
    # the mask is the search on the full fine-tuned weights (no retraining): step 2 of 10% of the remaining
    ft = load_model(str(out / "full" / "model"), head="classification", num_labels=2)
    ref = _reference_masks(ft, 0.1, 3)[1]
    assert all(torch.equal(mask[n], ref[n]) for n in ref)
    rows = list(csv.DictReader((out / "trace.csv").open()))
    assert [int(x["step"]) for x in rows] == [0, 1, 2, 3] and set(rows[0]) >= {"sparsity", "metric", "passed"}
    assert float(rows[0]["metric"]) == r["full_unretrained"]
    assert r["metric"] == json.loads((out / "retrain" / "metrics.json").read_text())["final"]["score"]
    # a bad control at exactly its sparsity: ranked on the same fine-tuned weights, retrained once
    bad = magnitude_prune(world["pre"], world["task"], config=MagnitudeConfig(control="bad"), train=FAST, seed=1,
                          out_dir=tmp_path / "bad", match=out)
    assert bad["pruned"] == r["pruned"] and bad["full_metric"] == r["full_metric"]
    # the folder is this setting's: at_cap "last" is another run (refused before any work)
    with pytest.raises(HeadcountError, match="different at_cap"):
        magnitude_prune(world["pre"], world["task"], config=MagnitudeConfig(rounds=3, threshold=0.0, at_cap="last"),
                        train=FAST, seed=1, out_dir=out)
    # no passing step: a NaN result flagged, nothing retrained (the full run is reused)
    none = tmp_path / "none"
    none.mkdir()
    shutil.copytree(out / "full", none / "full")
    n = prasanna_magnitude_prune(world["pre"], world["task"], config=MagnitudeConfig(threshold=2.0), train=FAST,
                                 seed=1, out_dir=none)
    assert n["no_passing_mask"] and n["metric"] is None and n["sparsity"] is None and n["step"] == 0
    assert n["stopped"] == "threshold"
    assert not (none / "weight_mask.safetensors").exists() and not (none / "retrain").exists()
    assert [x["step"] for x in n["trace"]] == [0, 1]


def test_lottery_magnitude_jobs_carry_at_cap_so_that_only_their_keys_change(world):
    from headcount.experiments.studies.lottery import lottery_jobs
    from headcount.experiments.studies.lottery.config import (
        LotterySettings,
        MagnitudeParams,
        MagnitudeSettings,
    )

    def jobs(**magnitude):
        plan = lottery_jobs(LotterySettings(model=world["pre"], tasks=[world["task"]], seeds=[1], magnitude=magnitude))
        return {j.name: j for j in plan}

    ref, last = jobs(), jobs(at_cap="last")
    mag = sorted(n for n in ref if n.startswith("magnitude/"))
    assert len(mag) == 3 and len(ref) > 3 and ref.keys() == last.keys()
    # the default is the reference's, and it is in the params: new keys for the magnitude jobs, and only those
    assert all(ref[n].params["magnitude"]["at_cap"] == "reference" and ref[n].key != last[n].key for n in mag)
    assert all(ref[n].key == last[n].key for n in ref if n not in mag)
    # both are in the params, resolved (0.x keeps no earlier versions' keys)
    assert all(last[n].params["magnitude"]["at_cap"] == "last" for n in mag)
    assert [MagnitudeParams.model_validate(j[mag[0]].params).magnitude.config().at_cap for j in (ref, last)] == [
        "reference", "last"]
    # IMP does not read it: never in its params, its keys the same either way
    imp, imp_last = jobs(procedure="imp"), jobs(procedure="imp", at_cap="last")
    assert all("at_cap" not in imp[n].params["magnitude"] and imp[n].key == imp_last[n].key for n in mag)
    # a study refuses what the command line refuses: one step keeps nothing under "reference"
    with pytest.raises(ValueError, match="1 step"):
        MagnitudeSettings(rounds=1)
    assert MagnitudeSettings(rounds=1, at_cap="last").config().at_cap == "last"


# -- command line -------------------------------------------------------------------------------------------
def _cli(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
        raise SystemExit(0)
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def test_cli_bad_inputs(world, tmp_path, capsys):
    base = ["--model", world["pre"], "--task", world["task"]]
    code, _, err = _cli(["magnitude", *base, "--sparsity", "1.2", "--out", str(tmp_path / "a")], capsys)
    assert code == 2 and err.strip() == "error: sparsity must be in [0, 1), got 1.2"
    code, _, err = _cli(["magnitude", *base, "--rate", "-0.1", "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and err.startswith("error: rate must be in (0, 1)") and len(err.strip().splitlines()) == 1
    (tmp_path / "mask.json").write_text(json.dumps({"heads": [[1] * 4] * 3, "mlps": [1] * 3}))
    code, _, err = _cli(["finetune", *base, "--mask", str(tmp_path / "mask.json"), "--out", str(tmp_path / "c")], capsys)
    assert code == 2 and "mask is for 3 layers x 4 heads, the model has 2 x 4" in err
    clf = make_checkpoint(tmp_path / "clf", head="classification", num_labels=3)
    code, _, err = _cli(["finetune", "--model", str(clf), "--task", world["task"], "--out", str(tmp_path / "d")], capsys)
    assert code == 2 and "classifier with 3 labels" in err and len(err.strip().splitlines()) == 1


def test_cli_finetune_and_magnitude(world, tmp_path, capsys):
    small = ["--model", world["pre"], "--task", world["task"], "--epochs", "1", "--lr", "0.01", "--batch-size", "16",
             "--max-train-examples", "64", "--max-eval-examples", "32"]
    code, out, _ = _cli(["finetune", *small, "--seed", "3", "--out", str(tmp_path / "ft")], capsys)
    assert code == 0 and "metrics.json" in out
    assert json.loads((tmp_path / "ft" / "metrics.json").read_text())["seed"] == 3
    code, out, _ = _cli(["magnitude", *small, "--sparsity", "0.25", "--control", "random", "--variant", "chen",
                         "--out", str(tmp_path / "mag")], capsys)
    assert code == 0 and "sparsity 0.2500" in out
    assert abs(mask_sparsity(load_weight_mask(tmp_path / "mag"))["sparsity"] - 0.25) < 1e-4
    code, out, _ = _cli(["finetune", *small, "--weight-mask", str(tmp_path / "mag" / "weight_mask.safetensors"),
                         "--out", str(tmp_path / "ft2")], capsys)
    assert code == 0 and "weight sparsity 0.2500" in out


def test_cli_procedure_options(world, tmp_path, capsys):
    base = ["--model", world["pre"], "--task", world["task"]]
    for extra, expected in ((["--procedure", "meh"], "error: unknown procedure 'meh'; choose one of prasanna, imp"),
                            (["--max-steps", "0"], "error: rounds (max steps) must be at least 1, got 0"),
                            (["--procedure", "prasanna", "--rate", "1.5"], "error: rate must be in (0, 1), got 1.5"),
                            (["--control", "bad"], "error: the prasanna search finds the good mask"),
                            (["--rewind-step", "2"], "error: rewind step is an imp setting"),
                            (["--at-cap", "meh"], "error: unknown at cap 'meh'; choose one of reference, last"),
                            (["--max-steps", "1"], "error: with at cap 'reference' the search keeps the mask from")):
        out = tmp_path / "x"
        code, _, err = _cli(["magnitude", *base, *extra, "--out", str(out)], capsys)
        assert code == 2 and err.startswith(expected) and len(err.strip().splitlines()) == 1, (extra, err)
        assert not out.exists()  # refused before any output
    small = [*base, "--epochs", "1", "--lr", "0.01", "--batch-size", "16", "--max-train-examples", "64",
             "--max-eval-examples", "32"]
    code, out, _ = _cli(["magnitude", *small, "--max-steps", "2", "--threshold", "0", "--out", str(tmp_path / "p")],
                        capsys)
    # the default procedure; --max-steps = --rounds; both steps pass: the reference keeps step 1
    assert code == 0 and "prasanna step 1" in out
    summary = json.loads((tmp_path / "p" / "magnitude.json").read_text())
    assert summary["procedure"] == "prasanna" and summary["stopped"] == "cap" and len(summary["trace"]) == 3
    code, out, _ = _cli(["magnitude", *small, "--max-steps", "1", "--at-cap", "last", "--threshold", "0",
                         "--out", str(tmp_path / "last")], capsys)
    assert code == 0 and "prasanna step 1" in out  # --at-cap last: the last step, so one step is allowed
    assert json.loads((tmp_path / "last" / "magnitude.json").read_text())["config"]["at_cap"] == "last"
    code, out, _ = _cli(["magnitude", *small, "--procedure", "imp", "--rounds", "1", "--threshold", "0",
                         "--out", str(tmp_path / "i")], capsys)
    assert code == 0 and "imp round 1" in out and (tmp_path / "i" / "round_01").is_dir()


def test_rewind_to_an_early_checkpoint(world, tmp_path):
    starts = _Starts()
    out = tmp_path / "early"
    r = magnitude_prune(world["pre"], world["task"],
                        config=MagnitudeConfig(procedure="imp", rounds=1, threshold=0.0, rewind_step=3),
                        train=FAST, seed=1, out_dir=out, callbacks=[starts])
    snap = load_model(str(out / "full" / "rewind"), head="classification", num_labels=2)
    snap_w = {n: getattr(m, a).detach() for n, (m, a) in weight_targets(snap).items()}
    pre = load_model(world["pre"], head="base")
    q = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(snap_w[q], getattr(*weight_targets(pre)[q]))  # 3 steps of training moved it
    mask = load_weight_mask(out / "round_01")
    for n, w in snap_w.items():  # round 1 starts from the step-3 weights, masked
        assert torch.equal(starts.starts[1]["weight"][n], w * mask[n]), n
    assert r["rewind"] == "step 3"


def test_the_procedures_live_in_magnitude_search_only():
    """0.x keeps no moved-name shims: the weight-mask primitives, the searches and the runs each have one home."""
    import headcount.importance.magnitude as primitives

    import headcount.train.magnitude_search as search

    for name in ("MagnitudeConfig", "magnitude_prune", "iterative_magnitude_prune", "prasanna_magnitude_mask"):
        assert not hasattr(primitives, name)
    for name in ("magnitude_prune", "iterative_magnitude_prune", "prasanna_magnitude_prune"):
        assert not hasattr(search, name)
    assert MagnitudeConfig().procedure == "prasanna" and MagnitudeConfig().rounds == 10


@pytest.mark.parametrize("module", ["headcount.importance.magnitude", "headcount.train.magnitude_search",
                                    "headcount.train.magnitude_prune", "headcount.train"])
def test_each_module_imports_alone(module):
    """A fresh interpreter imports each alone (no partially initialised module from a cycle)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
