"""The transfer study (headcount.experiments.studies.transfer): statistics, masks, MLM forward, and a whole
study on a tiny checkpoint with two local tasks, run with the local executor."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_batch, tiny_model
from scipy import stats as sps
from training_helpers import WORDS, make_checkpoint, make_task, one_thread

from headcount.core.gates import gated, layout
from headcount.data.evaluation import IGNORE, masked_positions_only
from headcount.experiments import run_study
from headcount.experiments.runner import (
    Plan,
    RunStore,
    load_study_config,
    no_progress,
    parse_study_config,
)
from headcount.analysis.coherence import coherence, shared_view, view_of
from headcount.analysis.removal import acceptable_deduction, removal_mask
from headcount.experiments.studies import transfer as T
from headcount.experiments.studies.transfer.jobs import coherence_job, per_example_of
from headcount.experiments.studies.transfer.report import transfer_sections
from headcount.experiments.studies.transfer.tables import transfer_tables
from headcount.runtime.errors import HeadcountError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

TABLES = ["finetune", "mlm", "coherence_summary", "coherence", "layer_mass", "head_scores", "prunability", "curves",
          "before_after", "before_after_seeds", "acceptable_deduction_summary", "acceptable_deduction"]
FIGURES = ["heatmaps", "scatter", "correlation-matrix", "layer-mass", "prunability", "before-after",
           "acceptable-deduction"]


# ---------------------------------------------------------------------------------- statistics
def test_a_permutation_of_the_mlm_scores_gives_the_expected_correlation():
    rng = np.random.default_rng(3)
    mlm = rng.gamma(2.0, size=(6, 12))
    task = mlm.ravel()[rng.permutation(72)].reshape(6, 12)  # the same values, heads reassigned
    c = coherence(mlm, task, n_boot=0, n_permutations=999, seed=0)
    assert c["spearman"]["estimate"] == pytest.approx(sps.spearmanr(mlm.ravel(), task.ravel())[0])
    assert c["kendall"]["estimate"] == pytest.approx(sps.kendalltau(mlm.ravel(), task.ravel())[0])
    assert c["spearman"]["p_value"] > 0.01  # unrelated placement: no evidence of association
    top = lambda g, k: set(np.argsort(-g.ravel())[:k])  # noqa: E731
    for f, k in ((0.1, 7), (0.25, 18), (0.5, 36)):
        a, b = top(mlm, k), top(task, k)
        assert c[f"jaccard@{f:g}"]["estimate"] == pytest.approx(len(a & b) / len(a | b))
        assert c[f"jaccard@{f:g}"]["chance"] == pytest.approx(f / (2 - f))
    same = coherence(mlm, np.exp(mlm), n_boot=0, n_permutations=999)  # a monotone map: same ranks
    assert same["spearman"]["estimate"] == pytest.approx(1.0) and same["kendall"]["estimate"] == pytest.approx(1.0)
    assert same["jaccard@0.25"]["estimate"] == 1.0 and same["spearman"]["p_value"] == pytest.approx(0.002)
    flipped = coherence(mlm, -mlm, n_boot=0, n_permutations=0)
    assert flipped["spearman"]["estimate"] == pytest.approx(-1.0) and flipped["spearman"]["p_value"] is None
    # per layer: one layer holds a permutation of the layer mass of the other grid
    mass = coherence([[3.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [3.0, 1.0]], n_boot=0, n_permutations=0)
    assert mass["layer_mass_l1"]["estimate"] == pytest.approx(2 * (4 / 6 - 2 / 6))


def test_bootstrap_and_permutation_are_seeded_and_reproducible():
    rng = np.random.default_rng(0)
    a = rng.random((40, 3, 4))
    b = a + 0.3 * rng.random((40, 3, 4))
    ids = [f"t/train/{i}" for i in range(40)]
    kw = dict(n_boot=200, n_permutations=199, paired=True, ids=(ids, ids))
    one = coherence(a.sum(0), b.sum(0), (a, b), seed=5, **kw)
    two = coherence(a.sum(0), b.sum(0), (a, b), seed=5, **kw)
    other = coherence(a.sum(0), b.sum(0), (a, b), seed=6, **kw)
    assert one == two
    assert one != other
    s = one["spearman"]
    # centred on the estimate (the top clipped at 1, the largest Spearman)
    assert 0 < s["low"] < s["estimate"] <= s["high"] and s["high"] - s["estimate"] <= s["estimate"] - s["low"] + 1e-12
    assert 0 < s["p_value"] <= 1


def test_a_pairs_interval_is_centred_on_its_estimate_when_the_bootstrap_is_of_a_proxy():
    """The ``gradient`` scorer's per-example rows are absolute values: they sum to more than the
    grid (a batch's absolute sum), so the replicates centre on the proxy's value, ``boot_estimate``."""
    rng = np.random.default_rng(1)
    signed_a = rng.normal(0.2, 1.0, size=(64, 6, 9))        # [examples, layers, heads] signed gradients
    signed_b = signed_a + 0.5 * rng.normal(size=(64, 6, 9))
    ga, gb = np.abs(signed_a.sum(0)), np.abs(signed_b.sum(0))  # the grids: |sum|
    ids = [f"t/dev/{i}" for i in range(64)]
    c = coherence(ga, gb, (np.abs(signed_a), np.abs(signed_b)), paired=True, ids=(ids, ids), n_boot=300,
                  n_permutations=0, keep_samples=True)
    s = c["spearman"]
    assert s["boot_estimate"] < s["estimate"] - 0.1          # the proxy agrees less ...
    assert s["low"] < s["estimate"] <= s["high"]              # ... and the interval is still about the estimate
    half = 1.959963984540054 * np.std(s["samples"], ddof=1)
    assert (s["low"], s["high"]) == pytest.approx((max(-1, s["estimate"] - half), min(1, s["estimate"] + half)))
    assert all(0.0 <= c[k]["low"] <= c[k]["high"] <= 1.0 for k in c if k.startswith("jaccard@"))  # clipped


def test_views_and_removal_masks():
    grid = np.array([[1.0, 5.0, 2.0], [4.0, 0.5, 3.0], [2.0, 2.0, 9.0], [1.0, 1.0, 1.0]])
    groups = [[0, 2], [1, 3]]  # two shared layers, each run at two depths
    assert shared_view(grid, groups).tolist() == [[3.0, 7.0, 11.0], [5.0, 1.5, 4.0]]
    masks = [removal_mask(grid, f, normalize="none") for f in (0.25, 0.5, 0.75)]
    assert [m.n_heads_kept for m in masks] == [9, 6, 3]
    for small, big in zip(masks, masks[1:]):  # nested: what goes at a level stays gone later
        assert bool((big.heads <= small.heads).all())
    shared = removal_mask(grid, 1 / 3, view="shared", groups=groups, normalize="none")
    # the two least important shared heads: group 1 head 1 (1.5), then group 0 head 0 (3.0)
    assert shared.heads[[1, 3], 1].tolist() == [0.0, 0.0] and shared.heads[[0, 2], 0].tolist() == [0.0, 0.0]
    assert shared.n_heads_kept == 8
    with pytest.raises(HeadcountError):
        view_of(grid, "shared")


def test_acceptable_deduction_takes_the_largest_acceptable_loss():
    rows = [{"level": 0.2, "mlm_loss_increase": 0.2, "mlm_accuracy_drop": 0.02, "relative_score": 0.97},
            {"level": 0.4, "mlm_loss_increase": 0.9, "mlm_accuracy_drop": 0.10, "relative_score": 0.93},
            {"level": 0.6, "mlm_loss_increase": 0.7, "mlm_accuracy_drop": 0.08, "relative_score": 0.91}]
    best = acceptable_deduction(rows, threshold=0.9)
    assert best["level"] == 0.4 and best["mlm_loss_increase"] == 0.9 and best["level_raw"] == 0.6  # largest loss
    none = acceptable_deduction(rows, threshold=0.99)
    assert none["level"] is None and none["mlm_loss_increase"] is None and none["level_raw"] is None


def test_acceptable_deduction_stops_at_the_first_unacceptable_level():
    rows = [{"level": 0.6, "mlm_loss_increase": 1.5, "mlm_accuracy_drop": 0.2, "relative_score": 0.92},  # any order
            {"level": 0.2, "mlm_loss_increase": 0.2, "mlm_accuracy_drop": 0.02, "relative_score": 0.97},
            {"level": 0.4, "mlm_loss_increase": 0.9, "mlm_accuracy_drop": 0.10, "relative_score": 0.85}]
    best = acceptable_deduction(rows, threshold=0.9)  # 0.4 fails: 0.6 passing by luck does not count
    assert (best["level"], best["mlm_loss_increase"], best["level_raw"]) == (0.2, 0.2, 0.6)
    rows[1]["relative_score"] = 0.5  # the lowest level fails: nothing is acceptable, whatever comes later
    assert acceptable_deduction(rows, threshold=0.9)["level"] is None


def test_removable_fraction_stops_at_the_first_failing_level():
    from headcount.experiments.studies.transfer.tables import prunability_table

    def curve(order, scores):  # two replicates per level: the mean decides
        return [{"task": "t", "objective": "task", "view": "application", "order": order, "replicate": r,
                 "fraction": f, "score": v + d} for f, v in zip((0.0, 0.25, 0.5, 0.75), scores) for r, d in
                enumerate((-0.01, 0.01))]

    curves = pd.DataFrame(curve("gap", [0.8, 0.78, 0.5, 0.75]) + curve("smooth", [0.8, 0.79, 0.77, 0.6])
                          + curve("first", [0.8, 0.6, 0.79, 0.79]))
    pr = prunability_table(curves, 0.9).set_index("order")
    assert pr.loc["gap", "removable_fraction"] == 0.25 and pr.loc["gap", "removable_fraction_raw"] == 0.75
    assert pr.loc["smooth", "removable_fraction"] == pr.loc["smooth", "removable_fraction_raw"] == 0.5
    assert pr.loc["first", "removable_fraction"] == 0.0 and pr.loc["first", "removable_fraction_raw"] == 0.75


def test_coherence_reports_within_layer_and_global_p_values_and_layer_normalised_grids():
    rng = np.random.default_rng(1)
    # layers differ a lot in both grids; within a layer the heads are unrelated
    means = np.array([[1.0], [10.0], [100.0], [1000.0]])
    a, b = means * rng.random((4, 6)), means * rng.random((4, 6))
    c = coherence(a, b, n_boot=0, n_permutations=999, seed=0)
    assert c["spearman"]["grids"] == "raw" and c["spearman@layer-norm"]["grids"] == "layer-normalised"
    assert c["spearman"]["p_value_global"] < 0.01  # the shared layer means look like agreement ...
    assert c["spearman"]["p_value"] > 0.05  # ... that the within-layer test (the default) does not see
    assert c["spearman@layer-norm"]["estimate"] < 0.6 and c["spearman@layer-norm"]["p_value"] > 0.05
    assert "layer_mass_l1@layer-norm" not in c and c["jaccard@0.1@layer-norm"]["chance"] == pytest.approx(0.1 / 1.9)
    g = coherence(a, b, n_boot=0, n_permutations=999, seed=0, permutation="global")
    assert g["spearman"]["p_value"] == g["spearman"]["p_value_global"] < 0.01
    same = coherence(a, a * 2 + 1, n_boot=0, n_permutations=999)  # identical orders within every layer
    assert same["spearman@layer-norm"]["estimate"] == pytest.approx(1.0)
    assert same["spearman"]["p_value"] == pytest.approx(0.002) and same["spearman@layer-norm"]["p_value"] == pytest.approx(0.002)


def test_paired_coherence_matches_examples_by_id_and_refuses_other_examples():
    rng = np.random.default_rng(0)
    ca = rng.random((30, 3, 4))
    cb = ca + 0.3 * rng.random((30, 3, 4))
    ids = [f"t/train/{i}" for i in range(30)]
    order = rng.permutation(30)  # b's rows in another order (MLM batches group by other lengths)
    kw = dict(n_boot=100, n_permutations=0, seed=3, paired=True)
    by_id = coherence(ca.sum(0), cb.sum(0), (ca, cb[order]), ids=(ids, [ids[i] for i in order]), **kw)
    aligned = coherence(ca.sum(0), cb.sum(0), (ca, cb), ids=(ids, ids), **kw)
    assert by_id == aligned and by_id["spearman"]["pairing"] == "ids"
    unpaired = coherence(ca.sum(0), cb.sum(0), (ca, cb[order]), ids=(ids, None), **kw)  # ids missing on one side
    assert unpaired["spearman"]["pairing"] == "unpaired (no example ids)" and unpaired != by_id
    other = [f"u/train/{i}" for i in range(30)]  # other texts never pair
    with pytest.raises(HeadcountError, match="cannot pair the examples"):
        coherence(ca.sum(0), cb.sum(0), (ca, cb), ids=(ids, other), **kw)
    with pytest.raises(HeadcountError, match="rows but"):
        coherence(ca.sum(0), cb.sum(0), (ca, cb[:20]), ids=(ids, ids[:25]), **kw)


def test_seed_mean_ci_averages_finite_seeds_and_counts_the_others():
    from headcount.analysis.coherence import seed_mean_ci

    rng = np.random.default_rng(0)
    est = [0.2, 0.4, 0.6, float("nan")]
    samples = [e + 0.05 * rng.standard_normal(200) for e in est[:3]] + [None]
    r = seed_mean_ci(est, samples, "spearman", seed=1)
    assert r["estimate"] == pytest.approx(0.4) and (r["n"], r["n_finite"]) == (4, 3) and r["interval"] == "t, shared examples"
    # the seeds differ much more than the examples: the interval covers the seed spread, not the example noise
    assert r["low"] < 0.25 and r["high"] > 0.55
    clipped = seed_mean_ci([0.95, 0.99], [np.full(50, 0.95), np.full(50, 0.99)], "jaccard@0.1")
    assert clipped["high"] <= 1.0
    assert seed_mean_ci([0.3], [None], "kendall")["low"] is None


def test_nan_cells_say_how_many_seeds_gave_a_number():
    from headcount.experiments.report.format import nan_runs, seed_cell

    assert seed_cell(0.345, float("nan"), n=1, n_total=2, digits=3) == "0.345 (n=1 of 2)"
    assert seed_cell(0.3, 0.01, 0.2, 0.4, n=2, n_total=2) == "0.30 ± 0.01 [0.20, 0.40]"
    assert seed_cell(float("nan"), n=0, n_total=2) == "n/a (n=0 of 2)" and seed_cell(None) == ""
    rows = [{"task": "stsb", "seed": 1, "score": 0.345}, {"task": "stsb", "seed": 2, "score": float("nan")},
            {"task": "stsb", "seed": 3, "score": None}]
    assert [r["seed"] for r in nan_runs(rows, "score", ["task", "seed"])] == [2, 3]


def test_the_report_lists_the_runs_that_produced_nan():
    from headcount.experiments.studies.transfer.report import main_pruning, nan_table

    settings = T.TransferSettings(tasks=["offline/movies"], seeds=[1, 2])
    ft = pd.DataFrame({"task": ["movies", "movies"], "seed": [1, 2], "metric": ["pearson"] * 2,
                       "fine_tuned": [0.345, float("nan")], "head_only": [0.1, 0.2]})
    coh = pd.DataFrame({"pair": ["seed-vs-seed/movies/1/2"] * 2, "view": ["application"] * 2,
                        "statistic": ["spearman", "kendall"], "estimate": [float("nan"), float("nan")]})
    empty = pd.DataFrame()
    tables = {"finetune": ft, "coherence": coh, "prunability": empty, "acceptable_deduction_summary": empty}
    nan = nan_table(tables)
    assert list(nan["table"]) == ["finetune", "coherence"]
    assert nan["run"].iloc[0] == "movies seed 2, fine-tuned" and "constant" in nan["why"].iloc[1]
    assert nan["value"].iloc[1] == "spearman, kendall"
    tables["before_after"] = pd.DataFrame({"task": ["movies"] * 2, "level": [0.5] * 2, "n": [1, 2], "n_total": [2, 2],
                                           "setting": ["prune (mlm) then fine-tune", "fine-tune then prune (task)"]})
    again = nan_table(tables)
    assert list(again["table"]) == ["finetune", "before_after", "coherence"]
    assert again["run"].iloc[1] == "movies prune (mlm) then fine-tune at 50%" and "1 of 2" in again["value"].iloc[1]
    row = main_pruning(tables, settings).iloc[0]
    assert row["fine-tuned"] == "0.34 (n=1 of 2)" and row["head only (frozen encoder)"].startswith("0.15 ± 0.07")


def test_removable_shares_are_n_a_and_listed_when_the_full_metric_is_nan():
    from headcount.experiments.studies.transfer.report import main_pruning, nan_table
    from headcount.experiments.studies.transfer.summary import transfer_summary
    from headcount.experiments.studies.transfer.tables import prunability_table

    nan = float("nan")
    settings = T.TransferSettings(tasks=["offline/movies"], seeds=[1, 2])
    rows = []  # stsb: constant labels, so Pearson is NaN at every level; movies: a defined metric
    for t, full in (("stsb", nan), ("movies", 1.0)):
        for order in ("task", "mlm", "random"):
            rows += [{"task": t, "objective": "task", "view": "application", "order": order, "seed": seed,
                      "fraction": f, "score": share * full}
                     for seed in (1, 2) for f, share in ((0.0, 1.0), (0.25, 0.95), (0.5, 0.5))]
    pr = prunability_table(pd.DataFrame(rows), 0.9)
    stsb, movies = pr[pr["task"] == "stsb"], pr[pr["task"] == "movies"]
    assert len(stsb) == len(movies) == 3
    assert stsb["removable_fraction"].isna().all() and stsb["removable_fraction_raw"].isna().all()  # not 0.0
    assert (movies["removable_fraction"] == 0.25).all() and (movies["removable_fraction_raw"] == 0.25).all()
    # a defined full score with an undefined level: that level fails, the share stays a number
    holed = pd.DataFrame(rows)
    holed = holed[holed["task"] == "movies"].assign(score=lambda d: d["score"].where(d["fraction"] != 0.25, nan))
    assert (prunability_table(holed, 0.9)["removable_fraction"] == 0.0).all()

    ft = pd.DataFrame({"task": ["stsb", "stsb", "movies", "movies"], "seed": [1, 2, 1, 2],
                       "metric": ["pearson", "pearson", "accuracy", "accuracy"],
                       "fine_tuned": [nan, nan, 0.9, 0.92], "head_only": [0.1, 0.2, 0.6, 0.6]})
    ad = pd.DataFrame({"task": ["stsb", "movies"], "threshold": [0.9, 0.9], "level": [None, 0.25],
                       "mlm_loss_increase": [None, 0.3], "mlm_accuracy_drop": [None, 0.02],
                       "relative_score": [None, 0.95], "level_raw": [None, 0.25], "full_score": [nan, 0.91]})
    tables = {"finetune": ft, "prunability": pr, "acceptable_deduction_summary": ad, "coherence": pd.DataFrame(),
              "coherence_summary": pd.DataFrame(columns=["comparison", "statistic", "view", "estimate"])}
    main = main_pruning(tables, settings).set_index("task")
    na = "n/a (full score undefined)"
    for order in ("task", "mlm", "random"):
        assert main.loc["stsb", f"removable at 90%, by {order}"] == na
        assert main.loc["movies", f"removable at 90%, by {order}"] == "25%"
    assert main.loc["stsb", "acceptable deduction: heads removed"] == na
    assert main.loc["movies", "acceptable deduction: heads removed"] == "25%"
    text = transfer_summary(tables, settings)
    assert f"stsb: task {na}, mlm {na}, random {na}" in text and "movies: task 25%, mlm 25%, random 25%" in text
    assert f"stsb: {na}; movies: 25% of heads" in text
    listed = nan_table(tables)
    assert list(listed["table"]) == ["finetune", "finetune", "prunability", "acceptable_deduction_summary"]
    assert listed["run"].tolist()[2:] == ["stsb task curve (application)", "stsb"]
    assert listed["value"].iloc[2] == "removable_fraction by task, mlm, random" and listed["value"].iloc[3] == "level"
    assert all("undefined" in why for why in listed["why"])


@pytest.mark.parametrize("arch", ["bert", "albert", "distilbert", "deberta-v2"])
def test_decoding_only_masked_positions_keeps_loss_and_gate_gradients(arch):
    model = tiny_model(arch, head="mlm")
    batch = tiny_batch(model, batch=3, seq=9, labels=True)
    batch["labels"][:, ::2] = IGNORE
    batch["labels"][1, -2:] = IGNORE  # padding
    n_layers, n_heads = layout(model)

    def loss_and_grad():
        g = torch.ones(n_layers, n_heads, requires_grad=True)
        with gated(model, heads=g):
            loss = model(**batch).loss
        return float(loss.detach()), torch.autograd.grad(loss, g)[0]

    full_loss, full_grad = loss_and_grad()
    with masked_positions_only(model):
        fast_loss, fast_grad = loss_and_grad()
    assert fast_loss == pytest.approx(full_loss, rel=1e-5)
    torch.testing.assert_close(fast_grad, full_grad, rtol=1e-4, atol=1e-6)
    assert "forward" not in model.__dict__ and "forward" not in model.base_model.__dict__  # restored


# ---------------------------------------------------------------------------------- config
def test_config_validation_names_the_key_and_line(tmp_path):
    with pytest.raises(HeadcountError, match=r"line 3: 'pruning.levels'.*fractions in \(0, 1\)"):
        parse_study_config("study: transfer\ntasks: [offline/movies]\npruning: {levels: [0.5, 1.5]}\n")
    (tmp_path / "other").mkdir()
    other = make_task(tmp_path / "other", n_train=8, n_dev=4)  # a valid task YAML named like a folder
    (tmp_path / "other" / "movies.yaml").write_text(other.read_text())
    with pytest.raises(HeadcountError, match="two tasks have the id 'movies'"):
        parse_study_config("study: transfer\ntasks: [offline/movies, other/movies.yaml]\n", base_dir=tmp_path)
    with pytest.raises(HeadcountError, match=r"line 2: 'tasks'.*unknown task 'glue/nope'"):
        parse_study_config("study: transfer\ntasks: [glue/nope]\n")
    with pytest.raises(HeadcountError, match="line 2: 'tasks'.*unknown task 'other/movies'"):  # a folder is no task
        parse_study_config("study: transfer\ntasks: [other/movies]\n", base_dir=tmp_path)
    (tmp_path / "glue" / "mnli").mkdir(parents=True)  # a folder named like a registered task changes nothing
    loaded = parse_study_config("study: transfer\ntasks: [glue/mnli]\nmlm: {corpus: glue/mnli}\n", base_dir=tmp_path)
    assert loaded.config.tasks == ("glue/mnli",) and loaded.config.mlm.corpus == "glue/mnli"
    with pytest.raises(HeadcountError, match="line 3: 'train'.*learning rate"):
        parse_study_config("study: transfer\ntasks: [offline/movies]\ntrain: {lr: -1}\n")
    with pytest.raises(HeadcountError, match="unknown key 'pruning.level'; did you mean 'levels'"):
        parse_study_config("study: transfer\ntasks: [offline/movies]\npruning: {level: [0.5]}\n")
    (tmp_path / "train.csv").write_text("text,label\na good film,pos\na bad film,neg\n")
    (tmp_path / "t.yaml").write_text(f"name: t\nfiles: {{train: {tmp_path / 'train.csv'}}}\ntext: text\n"
                                     "labels: [neg, pos]\n")
    loaded = parse_study_config("study: transfer\ntasks: [t.yaml, {id: b, task: offline/nyt}]\n", base_dir=tmp_path)
    assert loaded.config.tasks[0] == str(tmp_path / "t.yaml") and T.task_id(loaded.config.tasks[1]) == "b"


@pytest.mark.parametrize("name", ["transfer-offline", "transfer-roberta-glue", "transfer-albert-glue"])
def test_shipped_configs_are_valid(name):
    from pathlib import Path

    loaded = load_study_config(Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml")
    plan = Plan(T.expand(loaded.config))
    assert {"layout", "coherence"} <= set(plan.names) and len(plan) > 10


def test_a_prefix_changes_names_not_keys():
    settings = T.TransferSettings(tasks=["offline/movies", "offline/tweets"], seeds=[1, 2])
    plain, prefixed = Plan(T.transfer_jobs(settings)), Plan(T.transfer_jobs(settings, prefix="transfer/"))
    assert [j.key for j in plain] == [j.key for j in prefixed]
    assert all(n.startswith("transfer/") for n in prefixed.names)


# ---------------------------------------------------------------------------------- end to end
def _second_task(folder):
    """Label 1 iff the sentence contains "not" (another cue than has-good's)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(5)
    plain = [w for w in WORDS if w != "not"]
    for name, n in (("train.csv", 192), ("dev.csv", 64)):
        rows = ["sentence,label"]
        for i in range(n):
            words = [rng.choice(plain) for _ in range(rng.randint(4, 14))]
            if i % 2:
                words[rng.randrange(len(words))] = "not"
            rows.append(f"{' '.join(words)},{'present' if i % 2 else 'absent'}")
        (folder / name).write_text("\n".join(rows) + "\n")
    path = folder / "has-not.yaml"
    path.write_text("name: has-not\nkind: classification\nfiles: {train: train.csv, validation: dev.csv}\n"
                    "text: [sentence]\nlabel: label\nlabels: [absent, present]\nmetric: accuracy\n")
    return path


CONFIG = """\
study: transfer
name: tiny transfer
model: {model}
tasks: [{{id: good, task: good/task.yaml}}, not/has-not.yaml]
seeds: [1, 2]
train: {{lr: 0.005, batch_size: 16, epochs: 3, max_length: 32, eval_batch_size: 64, save_steps: 1000}}
head_fit: {{lr: 0.01, epochs: 2}}
mlm: {{head_steps: 40, head_max_texts: 200, eval: {{max_examples: 64, batch_size: 32, max_length: 32}}}}
scoring: {{data: {{max_examples: 60, batch_size: 16, max_length: 32}}}}
pruning: {{levels: [0.25, 0.5, 0.75], random_draws: 2}}
before_after: {{levels: [0.25, 0.5], seeds: [1], random_control: true}}
stats: {{n_boot: 60, n_permutations: 99}}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("transfer")
    model = make_checkpoint(root / "pre", seed=0)
    make_task(root / "good")
    _second_task(root / "not")
    (root / "study.yaml").write_text(CONFIG.format(model=model))
    summary = run_study(root / "study.yaml", root / "run", quiet=True)
    return root, summary


@pytest.mark.slow
def test_the_study_runs_end_to_end_with_every_table_and_figure(run):
    root, summary = run
    out = root / "run"
    assert not summary.failed and summary.report == out / "report.html"
    html = summary.report.read_text()
    for name in TABLES:
        assert (out / "results" / f"{name}.csv").is_file(), name
        assert f'id="table-{name}"' in html
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").is_file(), name
        assert f'id="figure-{name}"' in html
    coh = pd.read_csv(out / "results" / "coherence.csv")
    assert set(coh["comparison"]) == {"mlm-vs-task", "mlm-vs-task-before", "task-before-vs-after",
                                      "mlm-before-vs-after", "task-vs-task", "seed-vs-seed", "mlm-vs-mlm"}
    corr = coh[coh["statistic"].isin(["spearman", "kendall"])]
    assert corr["estimate"].between(-1, 1).all() and corr["p_value"].between(0, 1).all()
    assert corr["p_value_global"].between(0, 1).all()  # within-layer p (default) and global p, both kept
    normed = coh[coh["statistic"] == "spearman@layer-norm"]
    assert len(normed) == len(coh[coh["statistic"] == "spearman"]) and set(normed["grids"]) == {"layer-normalised"}
    assert normed["p_value"].between(0, 1).all() and normed["p_value_global"].isna().all()
    assert (coh["low"] <= coh["high"] + 1e-12).all() and coh["low"].notna().any()
    # grids of the same examples are resampled as pairs by example id, the others independently
    pairing = coh.groupby("comparison")["pairing"].agg(set)
    assert all(pairing[c] == {"ids"} for c in ("mlm-vs-task", "mlm-vs-task-before", "task-before-vs-after",
                                                "mlm-before-vs-after", "seed-vs-seed"))
    assert pairing["task-vs-task"] == pairing["mlm-vs-mlm"] == {"unpaired"}
    summary = pd.read_csv(out / "results" / "coherence_summary.csv")
    rho = summary[(summary["comparison"] == "mlm-vs-task") & (summary["statistic"] == "spearman")]
    assert rho["ci"].str.startswith("hierarchical bootstrap").all() and (rho["n"] == 2).all()
    assert (rho["low"] <= rho["estimate"]).all() and (rho["estimate"] <= rho["high"]).all()
    assert rho["p_value_global_max"].between(0, 1).all()
    pr = pd.read_csv(out / "results" / "prunability.csv")
    assert (pr["removable_fraction"] <= pr["removable_fraction_raw"]).all()
    curves = pd.read_csv(out / "results" / "curves.csv")
    assert set(curves["order"]) == {"mlm", "task", "random"} and set(curves["objective"]) == {"task", "mlm"}
    assert sorted(curves["fraction"].unique()) == [0.0, 0.25, 0.5, 0.75]
    # 8 heads (2 layers x 4): a level removes round(level x 8) of them
    assert set(curves[curves["fraction"] == 0.75]["heads_kept"]) == {2}
    ba = pd.read_csv(out / "results" / "before_after.csv")
    assert set(ba["setting"]) == {"prune (mlm) then fine-tune", "prune (random) then fine-tune",
                                  "fine-tune then prune (task)", "fine-tune then prune (mlm)"}
    # per seed: the pruned-then-fine-tuned job's own score beside the same seed's gated curve point
    per_seed = pd.read_csv(out / "results" / "before_after_seeds.csv")
    runs = RunStore(out)
    for _, r in per_seed.iterrows():
        job = runs.result(T.Names().pruned_finetune(r["task"], int(r["seed"]), "mlm", float(r["level"])))
        assert r["prune_mlm_then_finetune"] == pytest.approx(job.result["final"]["score"], nan_ok=True)
        point = curves[(curves["task"] == r["task"]) & (curves["seed"] == r["seed"]) & (curves["objective"] == "task")
                       & (curves["order"] == "mlm") & (curves["view"] == "application")
                       & np.isclose(curves["fraction"], r["level"])]["score"]
        assert r["finetune_then_prune_mlm"] == pytest.approx(float(point.iloc[0]), nan_ok=True)
    assert len(per_seed) == 2 * 2  # 2 tasks x 2 levels x 1 before/after seed
    assert "seed by seed:" in (out / "report.html").read_text(encoding="utf-8")
    ad = pd.read_csv(out / "results" / "acceptable_deduction.csv")
    assert sorted(ad["task"].unique()) == ["good", "has-not"] and ad["relative_score"].notna().all()
    ft = pd.read_csv(out / "results" / "finetune.csv")
    store = RunStore(out)
    # each row holds its fine-tuning job's own final score (whether the tiny model learns a cue in 3
    # epochs rests on a trajectory that other CPU kernels change; tests/train/test_training.py checks learning)
    own = [store.result(T.Names().finetune(t, s)).result["final"]["score"] for t, s in zip(ft["task"], ft["seed"])]
    assert len(ft) == 4 and ft["fine_tuned"].tolist() == pytest.approx(own) and ft["fine_tuned"].between(0, 1).all()
    # the head-only job trained only the classifier: its encoder equals the pre-trained one
    head = store.result("head-fit/good/seed1")
    assert head.result["frozen_encoder"] and head.result["trainable_params"] < 2000
    from safetensors.torch import load_file

    pre = load_file(str(root / "pre" / "model.safetensors"))
    fitted = load_file(str(head.path("model/model.safetensors")))
    encoder = [k for k in pre if k.startswith("encoder.")]
    assert encoder and all(torch.equal(pre[k], fitted[f"bert.{k}"]) for k in encoder)


def test_the_report_starts_with_the_main_tables_and_folds_the_raw_ones(run):
    root, _ = run
    out = root / "run"
    html = (out / "report.html").read_text()
    first = html.index("<h2>Main results</h2>")
    assert first < html.index('id="figure-heatmaps"') < html.index('id="table-finetune"')
    for name in ("main_coherence", "main_pruning", "main_before_after"):
        assert first < html.index(f'id="table-{name}"') < html.index('id="figure-heatmaps"'), name
        assert f'<details class="table" id="table-{name}"' not in html
    for name in TABLES:  # the raw tables: folded, with a link to their CSV
        assert f'<details class="table" id="table-{name}"' in html and f'href="results/{name}.csv"' in html
    coh = pd.read_csv(out / "results" / "main_coherence.csv", keep_default_na=False)
    assert "None" not in coh.to_string() and "nan" not in coh.to_string()
    row = coh[(coh["comparison"] == T.COMPARISONS["mlm-vs-task"]) & (coh["task"] == "good")].iloc[0]
    per_seed = pd.read_csv(out / "results" / "coherence.csv")
    rho = per_seed[(per_seed["comparison"] == "mlm-vs-task") & (per_seed["task"] == "good") &
                   (per_seed["view"] == "application") & (per_seed["statistic"] == "spearman")]["estimate"]
    assert row["Spearman"].startswith(f"{rho.mean():.2f} ± {rho.std(ddof=1):.2f} [")  # two seeds: mean ± std [CI]
    assert {"Spearman p within-layer (max)", "Spearman p global (max)", "Spearman, layer-normalised"} <= set(coh)
    seeds = coh[coh["comparison"] == T.COMPARISONS["seed-vs-seed"]]
    assert len(seeds) == 2 and not seeds["Spearman"].str.contains("±").any()  # one pair per task: no spread
    pruning = pd.read_csv(out / "results" / "main_pruning.csv", keep_default_na=False)
    assert list(pruning["task"]) == ["good", "has-not"] and pruning["fine-tuned"].str.contains("±").all()


def test_bootstrap_contributions_add_up_to_the_scores(run):
    root, _ = run
    store = RunStore(root / "run")
    ids = {}
    for name in ("mlm-scores/good", "task-scores/good/seed1/fine-tuned", "task-scores/has-not/seed2/fine-tuned"):
        job = store.result(name)
        rows, ids[name] = per_example_of(job)  # per-example shares (scoring batches of 16, the last one smaller)
        assert rows.shape[0] == 60 and len(ids[name]) == len(set(ids[name])) == 60
        np.testing.assert_allclose(rows.sum(0), job.load_json("scores.json")["heads"], rtol=1e-4)
    # MLM and task importance of the same 60 training examples: the same ids, in another row order
    mlm, task = ids["mlm-scores/good"], ids["task-scores/good/seed1/fine-tuned"]
    assert set(mlm) == set(task) and all(i.startswith("has-good/train/") for i in mlm)
    assert not set(mlm) & set(ids["task-scores/has-not/seed2/fine-tuned"])  # other texts never pair
    coh = pd.read_csv(root / "run" / "results" / "coherence.csv")
    boot = coh[coh["boot_estimate"].notna()]
    assert len(boot) and np.allclose(boot["boot_estimate"], boot["estimate"], atol=1e-6)


def test_example_ids_follow_the_batches_rows(run):
    from transformers import AutoTokenizer

    from headcount.data.tasks import get_task, tokenize
    from headcount.importance.pipeline import DataConfig, batches_for, example_order

    root, _ = run
    task, tok = get_task(str(root / "good" / "task.yaml")), AutoTokenizer.from_pretrained(str(root / "pre"))
    data = DataConfig(max_examples=50, batch_size=16, max_length=32, seed=3)
    full = task.load(task.train_split)
    source, index = example_order(task, tok, "task", data)
    assert source == "has-good/train" and len(set(index.tolist())) == 50
    labels = torch.cat([b["labels"] for b in batches_for(task, tok, "task", data)]).numpy()
    assert labels.tolist() == full.labels[index].tolist() and len(set(labels.tolist())) == 2  # row i is example index[i]
    _, mlm_index = example_order(task, tok, "mlm", data)
    assert sorted(mlm_index.tolist()) == sorted(index.tolist())  # the same examples ...
    lengths = torch.cat([b["attention_mask"].sum(1) for b in batches_for(task, tok, "mlm", data)]).tolist()
    texts = [(" ".join(full.texts[i]),) for i in mlm_index]
    assert lengths == tokenize(texts, tok, max_length=32).lengths.tolist()  # ... in the MLM batches' order


def test_statistics_are_reproducible_from_the_saved_scores(run, tmp_path):
    root, _ = run
    store = RunStore(root / "run")
    job = store.result("coherence")
    entry = next(e for e in store.plan["jobs"] if e["name"] == "coherence")
    inputs = {alias: store.load(key, alias) for alias, key in entry["inputs"].items()}
    again = coherence_job(job.params, inputs, tmp_path, no_progress)
    assert again["rows"] == job.result["rows"]


def test_report_sections_compose_under_a_prefix(run):
    root, _ = run
    loaded = load_study_config(root / "study.yaml")
    plan = Plan(T.transfer_jobs(loaded.config, prefix="transfer/"))
    store = RunStore(root / "run", plan=plan)  # same keys, prefixed names: the finished jobs serve
    sections = transfer_sections(store, loaded.config, prefix="transfer/")
    names = [f.name for s in sections for f in s.figures] + [t.name for s in sections for t in s.tables]
    assert names and all(n.startswith("transfer-") for n in names)


def test_the_before_after_figure_accepts_a_mean_an_ulp_outside_its_range(run):
    # three seeds with the same score: np.mean gives 0.1 + 1 ulp > max. The offline run's report
    # crashed on it in matplotlib ("'yerr' must not contain negative values").
    from headcount.experiments.studies.transfer.figures import figures

    root, _ = run
    loaded = load_study_config(root / "study.yaml")
    tables = transfer_tables(RunStore(root / "run"), loaded.config)
    ba = tables["before_after"].copy()
    ba["score"], ba["score_min"], ba["score_max"] = float(np.mean([0.1] * 3)), 0.1, 0.1
    assert (ba["score"] > ba["score_max"]).all()
    tables["before_after"] = ba
    figs = figures(tables, loaded.config, T.plan_of(loaded.config), "")
    assert "before-after" in figs


ALBERT_CONFIG = """\
study: transfer
model: {model}
tasks: [{task}]
seeds: [1]
train: {{lr: 0.005, batch_size: 16, epochs: 1, max_length: 32, save_steps: 1000}}
head_fit: {{epochs: 1}}
mlm: {{head_steps: 20, head_max_texts: 100, eval: {{max_examples: 32, max_length: 32}}}}
scoring: {{data: {{max_examples: 32, batch_size: 16, max_length: 32}}}}
pruning: {{levels: [0.25, 0.5], random_draws: 1}}
before_after: {{levels: [0.5], view: shared}}
stats: {{n_boot: 20, n_permutations: 19}}
"""


def test_a_shared_layer_model_is_reported_per_application_and_per_shared_head(tmp_path):
    from conftest import save_tiny
    from training_helpers import make_tokenizer

    tok = make_tokenizer(tmp_path / "albert")
    model = tiny_model("albert", head="base", vocab_size=len(tok), num_hidden_layers=3)  # one layer, 3 depths
    save_tiny(model, tmp_path / "albert")
    tok.save_pretrained(tmp_path / "albert")
    task = make_task(tmp_path / "good", n_train=64, n_dev=32)
    (tmp_path / "study.yaml").write_text(ALBERT_CONFIG.format(model=tmp_path / "albert", task=task))
    summary = run_study(tmp_path / "study.yaml", tmp_path / "run", quiet=True)
    assert not summary.failed and (tmp_path / "run" / "figures" / "shared-heads.png").is_file()
    store = RunStore(tmp_path / "run")
    assert store.result("layout").result["groups"] == [[0, 1, 2]]
    coh = pd.read_csv(tmp_path / "run" / "results" / "coherence.csv")
    assert set(coh["view"]) == {"application", "shared"}
    curves = pd.read_csv(tmp_path / "run" / "results" / "curves.csv")
    shared = curves[(curves["view"] == "shared") & (curves["fraction"] == 0.5)]
    assert set(shared["heads_kept"]) == {6}  # 2 of 4 shared heads, gone at all 3 depths
    mask = store.result("mask/task/mlm-0.5").load_json("mask.json")
    assert all(row == mask["heads"][0] for row in mask["heads"]) and sum(mask["heads"][0]) == 2
    pruned = store.result("prune-then-finetune/task/seed1/mlm-0.5").result
    assert pruned["n_params"] < pruned["n_params_before"]  # removed from the shared weights


def test_every_job_validates_its_params_and_refuses_unknown_ones():
    from headcount.experiments.studies.transfer import params as C
    from headcount.experiments.studies.transfer.plan import JOBS

    models = {"layout_job": C.LayoutParams, "mlm_score_job": C.MlmScoreParams, "head_fit_job": C.HeadFitParams,
              "mask_job": C.MaskParams, "curve_job": C.CurveParams, "coherence_job": C.CoherenceParams}
    settings = T.TransferSettings(tasks=["offline/movies", "offline/tweets"], seeds=[1, 2],
                                  before_after={"random_control": True})
    jobs = [j for j in Plan(T.transfer_jobs(settings)) if j.fn.startswith(JOBS + ":")]  # masks are deps only
    assert {j.fn.split(":")[1] for j in jobs} == set(models)
    for job in jobs:
        model = models[job.fn.split(":")[1]]
        model.model_validate(job.params)  # what the plan writes is what the job reads
        with pytest.raises(ValueError, match="extra|Extra"):
            model.model_validate({**job.params, "typo": 1})
    curve = next(j for j in jobs if j.name == "curve/movies/mlm")
    with pytest.raises(ValueError, match="needs model and mlm_head"):
        C.CurveParams.model_validate({k: v for k, v in curve.params.items() if k != "mlm_head"})


def test_scoring_progress_counts_what_the_scorer_counts():
    """A score job's progress total is the scorer's unit: examples for gradient scores (the rows of
    every batch, not the number of batches: "48/16" before), heads for ablation."""
    from headcount.experiments.studies.jobs import scoring_progress

    calls = []
    batches = [{"input_ids": torch.zeros(16, 5, dtype=torch.long)}] * 3  # 3 batches of 16 examples
    scoring_progress(lambda *a: calls.append(a), None, batches, "gradient")(48)
    assert calls == [(48, 48, "scoring (examples)")]
    model = tiny_model("bert")
    n_layers, n_heads = layout(model)
    scoring_progress(lambda *a: calls.append(a), model, batches, "ablation")(1)
    assert calls[-1][:2] == (1, n_layers * n_heads)
