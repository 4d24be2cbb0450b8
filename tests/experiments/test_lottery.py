"""The lottery study (headcount.experiments.studies.lottery): config, jobs, subnetwork rules, end to end.

The maths (controls, stability statistics, pattern rules) is tested in test_stats.py and
test_patterns.py; here: that the study wires it as Prasanna et al. do, that every subnetwork
has the right size, and that a study on a tiny model runs to a report with the main table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from training_helpers import make_checkpoint, make_task, one_thread

from headcount.analysis import (
    draw_controls,
    random_control,
    super_controls,
    super_survivors,
)
from headcount.analysis.patterns import (
    CLASSES,
    save_labelled_maps,
    synthetic_attention_maps,
)
from headcount.core.masks import Mask
from headcount.experiments import run_study
from headcount.experiments.runner import (
    JobResult,
    RunStore,
    get_study_type,
    no_progress,
    parse_study_config,
)
from headcount.experiments.studies.lottery import (
    EXPERIMENTS,
    SUPER_EXPERIMENTS,
    LotterySettings,
    MagnitudeSettings,
    TrainSettings,
    control_rng,
    lottery_jobs,
    lottery_metric,
    retrain_job,
    subnetwork_job,
    super_random_rng,
)
from headcount.experiments.studies.lottery.published import PRASANNA_2020, published
from headcount.experiments.studies.lottery.tables import paper_table
from headcount.runtime.errors import HeadcountError
from headcount.train import TrainConfig
from headcount.train.magnitude_search import MagnitudeConfig

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

TASK2 = """name: has-good-2
kind: classification
files: {train: ../task/train.csv, validation: ../task/dev.csv}
text: [sentence]
label: label
labels: [negative, positive]
metric: accuracy
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny pre-trained checkpoint and two local tasks (the second reads the first one's files)."""
    root = tmp_path_factory.mktemp("lottery")
    pre = make_checkpoint(root / "pre")
    task1 = make_task(root / "task")
    (root / "task2").mkdir()
    (root / "task2" / "task.yaml").write_text(TASK2)
    return {"root": root, "pre": str(pre), "tasks": [str(task1), str(root / "task2" / "task.yaml")]}


def _settings(world, **over) -> LotterySettings:
    base = dict(model=world["pre"], tasks=world["tasks"], seeds=[1, 2])
    return LotterySettings(**{**base, **over})


# -- config ----------------------------------------------------------------------------------------
def test_config_validates_and_resolves_relative_paths(world):
    text = "study: lottery\nmodel: pre\ntasks: [task/task.yaml]\nseeds: [1, 2]\nrandom: bernoulli\n"
    loaded = parse_study_config(text, base_dir=world["root"])
    assert loaded.config.model == str((world["root"] / "pre").resolve())
    assert loaded.config.tasks == [str((world["root"] / "task" / "task.yaml").resolve())]
    assert loaded.config.random == "bernoulli" and loaded.config.pruning.schedule == "prasanna"
    assert get_study_type("lottery").config_model is type(loaded.config)
    bad = {
        "seeds: [1, 1]": "distinct",
        "random: gaussian": "'random'",
        "pruning: {thresold: 0.9}": "did you mean 'threshold'",
        "train: {max_length: 4}": "max length",
        "tasks: [no/such-task]": "tasks",
    }
    for line, expected in bad.items():
        key = line.split(":")[0]
        lines = [x for x in text.splitlines() if not x.startswith(key + ":")] + [line]
        with pytest.raises(HeadcountError, match=expected):
            parse_study_config("\n".join(lines) + "\n", base_dir=world["root"])


def test_jobs_compose_under_a_prefix_with_the_same_keys(world):
    s = _settings(world)
    plain, prefixed = lottery_jobs(s), lottery_jobs(s, prefix="demo/lottery/")
    assert all(j.name.startswith("demo/lottery/") for j in prefixed)
    assert {j.key for j in plain} == {j.key for j in prefixed}  # names are not part of keys
    names = {j.name: j for j in plain}
    full = names["finetune/has-good/seed1"]
    assert full.fn == "headcount.experiments.studies.jobs:finetune_job" and set(full.params) == {"model", "task", "seed", "train"}
    # retraining starts from the pre-trained weights: the model is a parameter, not the full run
    for kind in ("good", "random", "bad"):
        retrain = names[f"retrain/{kind}/has-good/seed2"]
        assert retrain.params["model"] == world["pre"] and "model" not in retrain.inputs
    good_pruned = names["good-pruned/has-good/seed1"]
    assert good_pruned.inputs["model"].key == full.key  # no retraining: the fine-tuned weights
    assert good_pruned.inputs["mask"].name == "prune/has-good/seed1"
    # magnitude: the paper's procedure by default; the procedure is in every magnitude job's params
    good = names["magnitude/good/has-good/seed1"]
    assert good.params["magnitude"]["procedure"] == "prasanna" and good.inputs["full"].key == full.key
    assert names["magnitude/bad/has-good/seed1"].inputs["match"].key == good.key
    imp = {j.name: j for j in lottery_jobs(_settings(world, magnitude={"procedure": "imp"}))}
    assert imp["magnitude/good/has-good/seed1"].params["magnitude"]["procedure"] == "imp"
    assert imp["magnitude/good/has-good/seed1"].key != good.key
    assert imp["finetune/has-good/seed1"].key == full.key
    off = lottery_jobs(_settings(world, magnitude={"enabled": False}, patterns={"enabled": False},
                                 super_survivors={"enabled": False}, tasks=world["tasks"][:1]))
    assert not any(j.kind in ("lottery.magnitude", "lottery.patterns", "lottery.stability", "lottery.overlap")
                   for j in off)


# -- subnetworks -----------------------------------------------------------------------------------
def _good(tmp_path: Path, heads, mlps, name="good") -> JobResult:
    d = tmp_path / name
    d.mkdir()
    Mask(np.asarray(heads, dtype=float), np.asarray(mlps, dtype=float)).save(d / "mask.json")
    return JobResult(name, "prune", name, {}, {}, d)


def _draw(tmp_path, good, kind, seed, mode="uniform") -> Mask:
    out = tmp_path / f"{kind}-{mode}-{seed}"
    out.mkdir()
    subnetwork_job({"kind": kind, "seed": seed, "mode": mode}, {"good": good}, out, no_progress)
    return Mask.load(out / "mask.json")


def test_random_and_bad_subnetworks_match_the_good_size(tmp_path):
    rng = np.random.default_rng(0)
    small = _good(tmp_path, (rng.random((6, 12)) < 0.3).astype(int), [1, 0, 0, 1, 0, 0], "small")  # keeps < half
    large = _good(tmp_path, (rng.random((6, 12)) < 0.8).astype(int), [1, 1, 1, 1, 0, 1], "large")  # keeps > half
    for good in (small, large):
        g = Mask.load(good.path("mask.json"))
        draws = good.dir / "draws"
        draws.mkdir()
        for kind in ("random", "bad"):
            for seed in (1, 2):
                m = _draw(draws, good, kind, seed)
                assert m.n_heads_kept == g.n_heads_kept and m.n_mlps_kept == g.n_mlps_kept
        # Prasanna's bad rule: drawn from the pruned components, topped up with good ones when short
        bad = _draw(draws, good, "bad", 7)
        for part in ("heads", "mlps"):
            b, k = getattr(bad, part).numpy().ravel(), getattr(g, part).numpy().ravel()
            if k.sum() <= (1 - k).sum():
                assert not (b * k).any()  # nothing from the good set
            else:
                assert b[k == 0].all()  # every pruned component, then good ones
        # the wiring: exactly analysis.draw_controls with the seed's generator
        expected = draw_controls({"heads": g.heads.numpy(), "mlps": g.mlps.numpy()}, "bad", seed=control_rng(7, "bad"))
        assert np.array_equal(bad.heads.numpy(), expected["heads"]) and np.array_equal(bad.mlps.numpy(), expected["mlps"])


def test_bernoulli_random_is_the_papers_draw(tmp_path):
    heads = np.zeros((6, 12), dtype=int)
    heads.ravel()[:30] = 1  # 30 of 72 kept
    good = _good(tmp_path, heads, [1, 1, 0, 0, 0, 0])
    sizes = []
    for seed in range(40):
        m = _draw(tmp_path, good, "random", seed, mode="bernoulli")
        rng = control_rng(seed, "random")
        assert np.array_equal(m.heads.numpy(), random_control(heads, rng, "bernoulli"))
        assert np.array_equal(m.mlps.numpy(), random_control(np.array([1, 1, 0, 0, 0, 0]), rng, "bernoulli"))
        sizes.append(m.n_heads_kept)
    assert len(set(sizes)) > 1  # the size matches only on average
    assert abs(np.mean(sizes) - 30) < 4


def test_super_survivors_are_kept_by_every_seed(tmp_path):
    rng = np.random.default_rng(1)
    heads = (rng.random((3, 4, 4)) < 0.7).astype(int)
    mlps = np.array([[1, 1, 0, 1], [1, 0, 0, 1], [1, 1, 1, 1]])
    inputs = {f"s{i}": _good(tmp_path, heads[i], mlps[i], f"g{i}") for i in range(3)}
    (tmp_path / "sup").mkdir()
    r = subnetwork_job({"kind": "super"}, inputs, tmp_path / "sup", no_progress)
    m = Mask.load(tmp_path / "sup" / "mask.json")
    assert np.array_equal(m.heads.numpy(), super_survivors(heads)) and m.mlps.tolist() == [1, 0, 0, 1]
    assert r["heads_kept"] == int(heads.min(0).sum())
    with pytest.raises(HeadcountError, match="unknown subnetwork kind"):
        subnetwork_job({"kind": "worst"}, inputs, tmp_path, no_progress)


# -- end to end ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(world):
    """Two tasks x two seeds on the tiny model, with magnitude, super-survivors, patterns and the CNN."""
    root = world["root"]
    syn = synthetic_attention_maps(n_per_class=6, size=16, seed=0)
    save_labelled_maps(syn.maps, syn.labels, root / "labelled" / "maps.safetensors", root / "labelled" / "labels.csv")
    (root / "study.yaml").write_text("""
study: lottery
name: tiny lottery
model: pre
tasks: [task/task.yaml, task2/task.yaml]
seeds: [1, 2]
random: uniform       # exact sizes, checked below (the default, bernoulli, matches only on average)
train: {lr: 0.01, batch_size: 16, epochs: 2, max_length: 32, save_steps: 1000}
pruning: {step: 0.25}
magnitude: {rounds: 2, rate: 0.3, threshold: 0.5}
patterns: {max_examples: 16, size: 16, cnn: {maps: labelled/maps.safetensors, labels: labelled/labels.csv, epochs: 2}}
""")
    summary = run_study(root / "study.yaml", root / "run", quiet=True)
    return summary, RunStore(root / "run")


@pytest.mark.slow
def test_study_runs_to_a_report_with_the_main_table(run):
    summary, store = run
    assert summary.report is not None and summary.report.is_file() and not summary.failed
    results = summary.run_dir / "results"
    main = pd.read_csv(results / "lottery_main.csv")
    tasks = ["has-good", "has-good-2"]
    for experiment, pruning in EXPERIMENTS:
        for task in tasks:
            row = main[(main["experiment"] == experiment) & (main["task"] == task)]
            assert len(row) == 1, (experiment, task)
            assert row["n"].item() == 2 and row["pruning"].item() == pruning
            assert np.isfinite(row["mean"].item()) and np.isfinite(row["std"].item())
            assert 0.0 <= row["mean"].item() <= 1.0
    wide = pd.read_csv(results / "lottery_main_wide.csv")
    assert list(wide["experiment"]) == [e for e, _ in EXPERIMENTS] and list(wide.columns[1:]) == tasks
    assert all("±" in str(cell) for cell in wide[tasks].to_numpy().ravel())
    sup = pd.read_csv(results / "lottery_super_survivors_tidy.csv")
    assert sorted(set(sup["experiment"])) == sorted(SUPER_EXPERIMENTS) and (sup["n"] == 2).all()
    html = summary.report.read_text()
    # the explorer page beside the report, from saved results only, linked from its top
    explore = summary.run_dir / "explore.html"
    assert explore.is_file() and 'href="explore.html"' in html
    from headcount.experiments.explorer.page import page_data

    page = page_data(explore.read_text(encoding="utf-8"))
    assert page["layers"] == 2 and page["heads"] == 4 and not page.get("attention")
    names = [q["name"] for q in page["quantities"]]
    # every task's good mask of every seed is shown (the pruning runs' results, not just any quantity)
    good = {n for n in names if n.startswith("good mask (iterative pruning), ")}
    assert good == {f"good mask (iterative pruning), {t}, seed {s}" for t in tasks for s in (1, 2)}, names
    for name in ("lottery_main_wide", "lottery_scores", "lottery_survivors", "lottery_overlap", "lottery_pattern_mix",
                 "lottery_pattern_grid", "lottery_stability", "lottery_paper_structured", "lottery_paper_magnitude"):
        assert name in html
    # the paper's tables first (open), then figures; raw tables folded, each with a link to its CSV
    assert html.index("table-lottery_paper_structured") < html.index("figure-lottery_scores")
    assert '<details class="table" id="table-lottery_seeds">' in html and 'href="results/lottery_seeds.csv"' in html
    assert ">None<" not in html and ">nan<" not in html
    paper = pd.read_csv(results / "lottery_paper_structured.csv", dtype=str, keep_default_na=False)
    assert list(paper["task"]) == tasks and list(paper.columns[3:]) == ["full", "good, not retrained", "good", "random",
                                                                      "bad", "good heads"]  # no paper columns: no GLUE
    for task in tasks:
        row = main[(main["task"] == task) & (main["experiment"] == "random retrained")]
        cell = paper.loc[paper["task"] == task, "random"].item()
        assert cell == f"{row['mean'].item():.2f} ± {row['std'].item():.2f}"
    # the full row is the mean of the fine-tuning jobs' own scores (whether the tiny task is learnt in 2
    # epochs rests on a trajectory that other CPU kernels change; tests/train/test_training.py checks learning)
    for task in tasks:
        own = [store.result(f"finetune/{task}/seed{s}").result["final"]["score"] for s in (1, 2)]
        full = main[(main["experiment"] == "full") & (main["task"] == task)]["mean"].item()
        assert full == pytest.approx(np.mean(own)) and 0 <= full <= 1


def test_the_report_lists_nan_runs_and_controls_drawn_empty(run, world):
    from headcount.experiments.studies.lottery.tables import nan_table, seed_scores, summarize

    summary, store = run
    settings = parse_study_config((world["root"] / "study.yaml").read_text(), base_dir=world["root"]).config
    empty = [e["name"] for e in store.plan["jobs"]
             if e["name"].startswith("subnetwork/") and store.result(e["name"]).result.get("empty")]
    for name in empty:  # flagged, and truly empty
        assert store.result(name).result["heads_kept"] == store.result(name).result["mlps_kept"] == 0
    scores = seed_scores(store, settings)
    first = scores.index[(scores["experiment"] == "full") & (scores["task"] == "has-good")][0]
    scores.loc[first, "score"] = float("nan")  # as if the metric had come out NaN for one seed
    table = nan_table(store, settings, scores)
    assert table.iloc[0][["experiment", "task", "what"]].tolist() == ["full", "has-good", "NaN score"]
    assert "undefined" in table.iloc[0]["why"] and (table["what"] == "drawn empty").sum() == len(empty)
    paper = paper_table(summarize(scores), {"full": "full"})
    assert paper.loc[paper["task"] == "has-good", "full"].item().endswith("(n=1 of 2)")
    html = summary.report.read_text()
    assert ("lottery_nan_runs" in html) == bool(empty)


def test_every_subnetwork_has_the_right_size(run):
    _, store = run
    for task in ("has-good", "has-good-2"):
        goods = []
        for seed in (1, 2):
            tag = f"seed{seed}"
            good = Mask.from_dict(store.result(f"prune/{task}/{tag}").result["mask"])
            goods.append(good)
            retrained = {k: store.result(f"retrain/{k}/{task}/{tag}").result for k in ("good", "random", "bad")}
            assert retrained["good"]["mask"]["heads"] == good.to_dict()["heads"]
            for k, r in retrained.items():
                assert (r["mask"]["heads_kept"], r["mask"]["mlps_kept"]) == (good.n_heads_kept, good.n_mlps_kept), k
                assert r["model"] == str(Path(store.result(f"retrain/{k}/{task}/{tag}").params["model"]))
                assert r["head"] == "new"  # from the pre-trained encoder, not the fine-tuned model
            evaluated = store.result(f"good-pruned/{task}/{tag}").result
            assert (evaluated["heads_kept"], evaluated["mlps_kept"]) == (good.n_heads_kept, good.n_mlps_kept)
            mags = {k: store.result(f"magnitude/{k}/{task}/{tag}").result for k in ("good", "random", "bad")}
            assert mags["good"]["pruned"] > 0
            assert {(m["pruned"], m["total"]) for m in mags.values()} == {(mags["good"]["pruned"], mags["good"]["total"])}
            assert [m["control"] for m in mags.values()] == ["good", "random", "bad"]
        sup = Mask.load(store.result(f"subnetwork/super/{task}").path("mask.json"))
        assert np.array_equal(sup.heads.numpy(), super_survivors(np.stack([g.heads.numpy() for g in goods])))
        for k in ("super-random", "super-bad"):
            for seed in (1, 2):  # the random (middling) control is drawn again for each retraining seed
                name = f"subnetwork/{k}/{task}" + (f"/seed{seed}" if k == "super-random" else "")
                m = Mask.load(store.result(name).path("mask.json"))
                assert (m.n_heads_kept, m.n_mlps_kept) == (sup.n_heads_kept, sup.n_mlps_kept)
                r = store.result(f"retrain/{k}/{task}/seed{seed}").result
                assert r["mask"]["heads"] == m.to_dict()["heads"]


def test_stability_overlap_and_patterns_are_saved(run):
    summary, store = run
    stab = store.result("stability/has-good").result
    assert stab["heads"]["n_seeds"] == 2 and stab["heads"]["n_components"] == 8
    assert set(stab["heads"]) >= {"krippendorff_alpha", "cochran_q", "cochran_p", "mean_pairwise_jaccard"}
    assert np.asarray(stab["head_survival"]).shape == (2, 4)
    ov = store.result("overlap").result
    assert ov["tasks"] == ["has-good", "has-good-2"] and np.asarray(ov["heads_jaccard"], dtype=float).shape == (2, 2)
    pt = store.result("patterns/has-good/seed1").result
    assert np.asarray(pt["labels"]).shape == (2, 4) and set(np.ravel(pt["labels"])) <= set(CLASSES)
    assert pt["n_examples"] > 0 and "cnn_labels" not in pt  # the CNN reads per-example maps, not the mean maps
    ids = np.asarray(pt["cnn_example_ids"])  # [examples, layers, heads]: one CNN class per example and head
    assert ids.shape == (pt["cnn_n_examples"], 2, 4) and pt["cnn_n_examples"] >= pt["n_examples"]
    assert pt["cnn_classes"] == list(CLASSES) and sum(pt["cnn_counts"].values()) == ids.size
    assert pt["cnn_architecture"] == "prasanna" and pt["cnn_size"] == 32 and pt["cnn_n_cropped"] == 0
    assert pt["structure"] == "S/C/S"
    dist = pd.read_csv(summary.run_dir / "results" / "lottery_patterns.csv")
    assert set(dist["group"]) >= {"full model", "good subnetwork"} and set(dist["classifier"]) == {"rules", "cnn"}
    sums = dist[dist["classifier"] == "rules"].groupby(["task", "group"])["mean"].sum()
    assert np.allclose(sums, 1.0)
    assert np.allclose(dist[dist["classifier"] == "cnn"].groupby(["task", "group"])["mean"].sum(), 1.0)
    views = dist.groupby("classifier")["counted_over"].unique()
    assert list(views["rules"]) == ["heads"] and list(views["cnn"]) == ["examples x heads"]
    full = dist[(dist["classifier"] == "cnn") & (dist["group"] == "full model") & (dist["task"] == "has-good")]
    per_seed = [store.result(f"patterns/has-good/seed{k}").result for k in (1, 2)]  # shares = counts / (examples x heads)
    expected = {c: np.mean([r["cnn_counts"][c] / np.size(r["cnn_example_ids"]) for r in per_seed]) for c in CLASSES}
    assert dict(zip(full["pattern"].astype(str), full["mean"])) == pytest.approx(expected) and (full["n"] == 2).all()
    heads = pd.read_csv(summary.run_dir / "results" / "lottery_pattern_heads.csv")
    shares = heads[[f"cnn_share_{c}" for c in CLASSES]].to_numpy()
    assert np.allclose(shares.sum(1), 1.0) and set(heads["pattern_cnn_commonest"]) <= set(CLASSES)
    assert json.loads((summary.run_dir / "plan.json").read_text())["jobs"]  # the plan names every job


# -- job parameters, settings, report tables -------------------------------------------------------
def test_job_params_are_validated_into_their_models(tmp_path):
    good = _good(tmp_path, np.ones((2, 4)), [1, 0])
    with pytest.raises(HeadcountError, match="needs a mode"):
        subnetwork_job({"kind": "random", "seed": 1}, {"good": good}, tmp_path, no_progress)
    with pytest.raises(HeadcountError, match="needs a seed"):
        subnetwork_job({"kind": "bad"}, {"good": good}, tmp_path, no_progress)
    with pytest.raises(HeadcountError, match=r"RetrainParams params: 'train.epocs'|unknown key 'train.epocs'"):
        retrain_job({"model": "offline", "task": "offline/movies", "seed": 1, "train": {"epocs": 1},
                     "mask_mode": "prune", "keep_model": False}, {}, tmp_path, no_progress)
    assert not (tmp_path / "model").exists()  # refused before any work


def test_train_and_magnitude_settings_are_the_library_configs_fields():
    from headcount.experiments.studies.lottery.config import MagnitudeParams

    train, mag = TrainSettings(), MagnitudeSettings()
    assert all(getattr(train, k) == getattr(TrainConfig(), k) for k in TrainSettings.model_fields)
    assert train.config() == TrainConfig(**train.model_dump())
    assert mag.config("bad") == MagnitudeConfig(**mag.model_dump(exclude={"enabled"}), control="bad")
    assert mag.procedure == MagnitudeConfig().procedure == "prasanna"  # the study's default: the paper's
    with pytest.raises(ValueError, match="rate"):
        MagnitudeSettings(rate=1.5)  # MagnitudeConfig's own check
    with pytest.raises(ValueError, match="procedure"):
        MagnitudeSettings(procedure="lth")
    # a job's params validate into the same settings, with the same defaults (no earlier versions' meanings)
    params = {"model": "m", "task": "t", "seed": 1, "train": {}, "magnitude": {"rounds": 3}, "control": "good",
              "keep_models": False}
    assert MagnitudeParams.model_validate(params).magnitude.config().procedure == "prasanna"


def test_no_passing_magnitude_mask_is_a_flagged_nan_row_and_its_controls_are_skipped(world, tmp_path, monkeypatch):
    import headcount.train.magnitude_prune as ms
    from headcount.experiments.studies.lottery import magnitude_job
    from headcount.experiments.studies.lottery.report import no_passing_sentence
    from headcount.experiments.studies.lottery.tables import nan_table, seed_scores
    from headcount.train import finetune

    train = {"lr": 0.01, "batch_size": 16, "epochs": 1, "max_length": 32, "max_train_examples": 64,
             "max_eval_examples": 32, "save_steps": 1000}
    full_dir = tmp_path / "full"
    metrics = finetune(world["pre"], world["tasks"][0], seed=1, config=TrainSettings(**train).config(),
                       out_dir=full_dir)
    full = JobResult("full", "finetune", "finetune/has-good/seed1", {}, metrics, full_dir)
    base = {"model": world["pre"], "task": world["tasks"][0], "seed": 1, "train": train,
            "magnitude": {"procedure": "prasanna", "threshold": 0.9}, "keep_models": False}
    # the dev metric: 0.8 for the full model, 0.0 once anything is pruned, so step 1 fails (by construction)
    calls = []
    monkeypatch.setattr(ms, "_dev_evaluator", lambda *a: lambda model: calls.append(1) or (0.8 if len(calls) == 1 else 0.0))
    results = {"finetune/has-good/seed1": full}
    good_dir = tmp_path / "good"
    good_dir.mkdir()
    good = magnitude_job({**base, "control": "good"}, {"full": full}, good_dir, no_progress)
    assert good["no_passing_mask"] and good["metric"] is None and good["sparsity"] is None
    assert not (good_dir / "retrain").exists() and not (good_dir / "weight_mask.safetensors").exists()
    results["magnitude/good/has-good/seed1"] = JobResult("magnitude/good/has-good/seed1", "lottery.magnitude", "g", {},
                                                         good, good_dir)
    for kind in ("random", "bad"):
        d = tmp_path / kind
        d.mkdir()
        r = magnitude_job({**base, "control": kind}, {"match": results["magnitude/good/has-good/seed1"]}, d,
                          no_progress)
        assert r["skipped"] and r["no_passing_mask"] and r["metric"] is None
        assert not list(d.glob("round_*")) and not (d / "full").exists()  # nothing trained
        results[f"magnitude/{kind}/has-good/seed1"] = JobResult(kind, "lottery.magnitude", kind, {}, r, d)

    class Store:  # the finished jobs, as a run's store shows them
        def has(self, name):
            return name in results

        def result(self, name):
            return results[name]

    settings = _settings(world, tasks=world["tasks"][:1], seeds=[1], magnitude={"threshold": 0.9})
    scores = seed_scores(Store(), settings)
    mag = scores[scores["pruning"] == "magnitude"].set_index("experiment")
    assert mag["score"].isna().all() and mag.loc["magnitude good retrained", "flag"] == "no_passing_mask"
    assert (mag.loc[["magnitude random retrained", "magnitude bad retrained"], "flag"]
            == "skipped: no_passing_mask").all()
    assert scores.loc[scores["experiment"] == "full", "flag"].item() == ""
    table = nan_table(Store(), settings, scores).set_index("experiment")
    assert "no_passing_mask" in table.loc["magnitude good retrained", "why"]
    assert "skipped" in table.loc["magnitude bad retrained", "why"]
    assert "No pruning step passed for has-good seed 1 (no_passing_mask)" in no_passing_sentence(scores)
    assert no_passing_sentence(scores[scores["flag"] == ""]) == ""


def test_paper_table_sets_the_runs_numbers_beside_the_published_ones():
    summary = pd.DataFrame({
        "experiment": ["full", "good pruned", "full", "good pruned"],
        "task": ["glue/sst2", "glue/sst2", "offline/movies", "offline/movies"],
        "metric": ["accuracy"] * 4, "mean": [0.91, 0.85, 0.8, math.nan], "std": [0.01, 0.02, math.nan, math.nan],
        "n": [3, 3, 1, 0], "heads_kept": [math.nan, 70.5, math.nan, math.nan]})
    t = paper_table(summary, {"full": "full", "good pruned": "good, not retrained"}, heads=True)
    sst2, movies = t.iloc[0].to_dict(), t.iloc[1].to_dict()
    assert sst2["full"] == "0.91 ± 0.01" and sst2["full, paper"] == "0.93" == f"{PRASANNA_2020['full'][5]:.2f}"
    assert sst2["good heads"] == "70.5" and sst2["good heads, paper"] == "67"
    assert movies["full"] == "0.80" and movies["full, paper"] == "" and movies["good, not retrained"] == ""
    assert movies["seeds"] == "0-1" and published("full", "offline/movies") is None


# -- super-survivor controls: the reference's rule by default, the earlier one as an option ---------
def test_super_control_jobs_read_every_seeds_good_mask(world):
    s = _settings(world, seeds=[1, 2, 3], super_survivors={"random_draws": "per-task"})
    names = {j.name: j for j in lottery_jobs(s)}
    prunes = {names[f"prune/has-good/seed{seed}"].key for seed in (1, 2, 3)}
    sup = names["subnetwork/super/has-good"]
    for kind in ("random", "bad"):
        job = names[f"subnetwork/super-{kind}/has-good"]
        assert {d.key for d in job.inputs.values()} == prunes and len(job.inputs) == 3  # every seed's good mask
        assert job.params["controls"] == "reference" and job.params["kind"] == kind
        assert names[f"retrain/super-{kind}/has-good/seed1"].inputs["mask"].key == job.key
    # the default draws the middlings again for every retraining seed (the reference's seed loop);
    # the bad control, resized once in the reference, stays one job per task
    per_seed = {j.name: j for j in lottery_jobs(_settings(world, seeds=[1, 2, 3]))}
    assert "subnetwork/super-random/has-good" not in per_seed
    for seed in (1, 2, 3):
        job = per_seed[f"subnetwork/super-random/has-good/seed{seed}"]
        assert job.params == {**names["subnetwork/super-random/has-good"].params, "draw": seed}
        assert {d.key for d in job.inputs.values()} == prunes
        assert per_seed[f"retrain/super-random/has-good/seed{seed}"].inputs["mask"].key == job.key
        assert per_seed[f"retrain/super-bad/has-good/seed{seed}"].key == names[f"retrain/super-bad/has-good/seed{seed}"].key
    # as-good-mask: the controls of the super mask alone, with the params (and keys) of before
    old = {j.name: j for j in lottery_jobs(_settings(world, seeds=[1, 2, 3], super_survivors={"controls": "as-good-mask"}))}
    for kind in ("random", "bad"):
        job = old[f"subnetwork/super-{kind}/has-good"]
        assert {k: d.key for k, d in job.inputs.items()} == {"good": sup.key}
        assert job.params == {"kind": kind, "seed": 0, **({"mode": "uniform"} if kind == "random" else {})}
    changed = {n for n in names if names[n].key != old[n].key}
    assert changed == {f"{what}/super-{kind}/{t}" for what in ("subnetwork",) for kind in ("random", "bad")
                       for t in ("has-good", "has-good-2")} | {
        f"retrain/super-{kind}/{t}/seed{seed}" for kind in ("random", "bad") for t in ("has-good", "has-good-2")
        for seed in (1, 2, 3)}
    with pytest.raises(HeadcountError, match="controls"):
        parse_study_config("study: lottery\nmodel: pre\ntasks: [task/task.yaml]\nseeds: [1, 2]\n"
                           "super_survivors: {controls: matched}\n", base_dir=world["root"])


def test_reference_super_control_jobs_draw_the_reference_controls(tmp_path):
    rng = np.random.default_rng(5)
    heads = (rng.random((3, 4, 4)) < 0.6).astype(int)
    mlps = np.array([[1, 1, 0, 0], [1, 0, 0, 1], [1, 1, 0, 0]])
    inputs = {f"s{i}": _good(tmp_path, heads[i], mlps[i], f"g{i}") for i in range(3)}
    drawn = {}
    for kind in ("random", "bad"):
        (tmp_path / kind).mkdir()
        params = {"kind": kind, "seed": 4, "controls": "reference", **({"mode": "uniform"} if kind == "random" else {})}
        r = subnetwork_job(params, inputs, tmp_path / kind, no_progress)
        drawn[kind] = m = Mask.load(tmp_path / kind / "mask.json")
        assert (r["heads_kept"], r["mlps_kept"]) == (int(heads.min(0).sum()), 1)  # the super-survivors' sizes
        assert m.meta["controls"] == "reference" and m.meta["n_masks"] == 3
    parts = {"heads": heads, "mlps": mlps}
    bad = super_controls(parts, "bad", seed=control_rng(4, "bad"))
    assert np.array_equal(drawn["bad"].heads.numpy(), bad["heads"]) and drawn["bad"].mlps.tolist() == bad["mlps"].tolist()
    rnd = super_controls(parts, "random", seed=control_rng(4, "random"), bad_seed=control_rng(4, "bad"))
    assert np.array_equal(drawn["random"].heads.numpy(), rnd["heads"])
    # the middlings are drawn around the bad job's own mask: never in it, nor super-survivors, when enough
    sup = heads.min(0)
    mid = (1 - sup) * (1 - drawn["bad"].heads.numpy())
    assert mid.sum() >= sup.sum() and not (drawn["random"].heads.numpy() * (1 - mid)).any()
    with pytest.raises(HeadcountError, match="'reference' is for random"):
        subnetwork_job({"kind": "random", "seed": 1, "mode": "bernoulli", "controls": "reference"}, inputs, tmp_path,
                       no_progress)


# -- the reference's seed loop of compute_super_masks.py, transcribed (random.sample -> a sampler) --
def _ref_bad_to_size(bad, good, sample):
    bad = bad.copy()
    if good.sum() > bad.sum():
        selection = np.argwhere((good == 0) & (bad == 0)).tolist()
        if len(selection) < good.sum() - bad.sum():
            selection = np.argwhere(bad == 0).tolist()
        for idx in sample(selection, int(good.sum() - bad.sum())):
            bad[tuple(idx)] = 1
    elif good.sum() < bad.sum():
        for idx in sample(np.argwhere(bad == 1).tolist(), int(bad.sum() - good.sum())):
            bad[tuple(idx)] = 0
    return bad


def _ref_middlings(bad, good, sample):
    mid = np.ones_like(good)
    mid[good == 1] = 0
    mid[bad == 1] = 0
    if mid.sum() >= good.sum():
        for idx in sample(np.argwhere(mid == 1).tolist(), int(mid.sum() - good.sum())):
            mid[tuple(idx)] = 0
    else:
        for idx in sample(np.argwhere(mid == 0).tolist(), int(good.sum() - mid.sum())):
            mid[tuple(idx)] = 1
    return mid


def _ref_seed_loop(heads, mlps, seeds, bad_sample, middling_sample):
    """compute_super_masks.py's ``for seed in together_head_data[task]`` loop: the bad masks are
    resized in every iteration (a no-op once they have the super-survivors' size), the middlings
    drawn again in every iteration. ``bad_sample``: the sampler of the bad draws;
    ``middling_sample(seed)``: that seed's sampler (the reference has one stream for both)."""
    sup_h, sup_m = heads.min(0).astype(float), mlps.min(0).astype(float)
    bad_h, bad_m = (1 - heads).min(0).astype(float), (1 - mlps).min(0).astype(float)
    out = {}
    for seed in seeds:
        bad_h = _ref_bad_to_size(bad_h, sup_h, bad_sample)
        bad_m = _ref_bad_to_size(bad_m, sup_m, bad_sample)
        sample = middling_sample(seed)
        out[seed] = {"bad": (bad_h, bad_m), "random": (_ref_middlings(bad_h, sup_h, sample),
                                                      _ref_middlings(bad_m, sup_m, sample))}
    return out


def _sampler(rng):
    """random.sample(population, k) drawn as headcount draws: a numpy Generator, no draw for k = 0."""
    def sample(population, k):
        return [] if k == 0 else [population[i] for i in rng.choice(len(population), size=k, replace=False)]
    return sample


def test_super_random_control_is_drawn_again_for_every_seed_as_the_reference_loop(tmp_path):
    rng = np.random.default_rng(8)
    heads = (rng.random((3, 6, 6)) < 0.55).astype(int)  # many middlings: the draws can differ
    mlps = np.array([[1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 1, 1]])
    inputs = {f"s{i}": _good(tmp_path, heads[i], mlps[i], f"g{i}") for i in range(3)}
    seeds, draw_seed = (1337, 42, 86), 4
    ref = _ref_seed_loop(heads, mlps, seeds, _sampler(control_rng(draw_seed, "bad")),
                         lambda seed: _sampler(super_random_rng(draw_seed, seed)))
    got = {}
    for seed in seeds:
        out = tmp_path / f"mid{seed}"
        out.mkdir()
        subnetwork_job({"kind": "random", "seed": draw_seed, "mode": "uniform", "controls": "reference", "draw": seed},
                       inputs, out, no_progress)
        got[seed] = Mask.load(out / "mask.json")
        assert np.array_equal(got[seed].heads.numpy(), ref[seed]["random"][0])
        assert np.array_equal(got[seed].mlps.numpy(), ref[seed]["random"][1])
        assert got[seed].meta["draw"] == seed
    bad = tmp_path / "bad"
    bad.mkdir()
    subnetwork_job({"kind": "bad", "seed": draw_seed, "controls": "reference"}, inputs, bad, no_progress)
    for seed in seeds:  # the reference's bad control: resized on the first seed, the same for every seed
        assert np.array_equal(Mask.load(bad / "mask.json").heads.numpy(), ref[seed]["bad"][0])
    assert len({tuple(g.heads.numpy().ravel()) for g in got.values()}) == 3  # three different draws
    # per-task (the option): one draw, the same for every seed, as before
    once = tmp_path / "once"
    once.mkdir()
    subnetwork_job({"kind": "random", "seed": draw_seed, "mode": "uniform", "controls": "reference"}, inputs, once,
                   no_progress)
    parts = {"heads": heads, "mlps": mlps}
    assert np.array_equal(Mask.load(once / "mask.json").heads.numpy(),
                          super_controls(parts, "random", seed=control_rng(draw_seed, "random"),
                                         bad_seed=control_rng(draw_seed, "bad"))["heads"])


# -- the metric: the reference's choice per task, the task's declared one as the option -----------
#: find_head_mlp_masks.py:535-548 and find_global_weight_mask.py:323-338 (args.metric_name), by GLUE task
REFERENCE_METRIC_NAME = {"cola": "mcc", "mnli": "acc", "mrpc": "acc", "sst-2": "acc", "sts-b": "corr",
                         "qqp": "acc", "qnli": "acc", "rte": "acc", "wnli": "acc"}
#: what the reference's names are in headcount (corr: the mean of Pearson and Spearman)
HEADCOUNT_NAME = {"acc": "accuracy", "mcc": "mcc", "corr": "pearson_spearman"}


def test_lottery_metric_is_the_references_choice_and_the_task_metric_is_the_option(world):
    for task, ref in REFERENCE_METRIC_NAME.items():
        name = "glue/" + task.replace("-", "")
        assert lottery_metric(name) == HEADCOUNT_NAME[ref], task
    assert lottery_metric("glue/mrpc", "task") == lottery_metric("glue/qqp", "task") == "f1"
    assert lottery_metric("glue/cola", "task") == "mcc"
    mrpc = {j.name: j for j in lottery_jobs(LotterySettings(tasks=["glue/mrpc"], seeds=[1]))}
    scored = [n for n, j in mrpc.items() if j.kind in ("finetune", "prune", "evaluate", "lottery.retrain",
                                                       "lottery.magnitude")]
    assert len(scored) >= 10 and all(mrpc[n].params["metric"] == "accuracy" for n in scored)
    f1 = {j.name: j for j in lottery_jobs(LotterySettings(tasks=["glue/mrpc"], seeds=[1], metric="task"))}
    assert all("metric" not in f1[n].params for n in scored)
    # a task scored by its own metric keeps every job key (offline runs are unchanged)
    plain = {j.key for j in lottery_jobs(_settings(world))}
    assert plain == {j.key for j in lottery_jobs(_settings(world, metric="task"))}
    with pytest.raises(HeadcountError, match="metric"):
        parse_study_config("study: lottery\nmodel: pre\ntasks: [task/task.yaml]\nseeds: [1]\nmetric: f1\n",
                           base_dir=world["root"])


def test_a_jobs_metric_scores_the_task_by_it():
    from headcount.experiments.studies.jobs import job_task

    assert job_task({"task": "glue/qqp", "metric": "accuracy"}).metric == "accuracy"
    assert job_task({"task": "glue/qqp"}).metric == "f1"
    assert job_task({"task": "glue/qqp", "metric": "accuracy"}).name == "glue/qqp"
