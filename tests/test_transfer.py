"""The transfer study (headcount.studies.transfer): statistics, masks, MLM forward, and a whole
study on a tiny checkpoint with two local tasks, run with the local executor."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as sps

from conftest import tiny_batch, tiny_model
from headcount.errors import HeadcountError
from headcount.evaluation import IGNORE, masked_positions_only
from headcount.gates import gated, layout
from headcount.runner import Plan, RunStore, load_study_config, no_progress, parse_study_config, run_study
from headcount.studies import transfer as T
from training_helpers import WORDS, make_checkpoint, make_task, one_thread

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

TABLES = ["finetune", "mlm", "coherence_summary", "coherence", "layer_mass", "head_scores", "prunability", "curves",
          "before_after", "acceptable_deduction_summary", "acceptable_deduction"]
FIGURES = ["heatmaps", "scatter", "correlation-matrix", "layer-mass", "prunability", "before-after",
           "acceptable-deduction"]


# ---------------------------------------------------------------------------------- statistics
def test_a_permutation_of_the_mlm_scores_gives_the_expected_correlation():
    rng = np.random.default_rng(3)
    mlm = rng.gamma(2.0, size=(6, 12))
    task = mlm.ravel()[rng.permutation(72)].reshape(6, 12)  # the same values, heads reassigned
    c = T.coherence(mlm, task, n_boot=0, n_permutations=999, seed=0)
    assert c["spearman"]["estimate"] == pytest.approx(sps.spearmanr(mlm.ravel(), task.ravel())[0])
    assert c["kendall"]["estimate"] == pytest.approx(sps.kendalltau(mlm.ravel(), task.ravel())[0])
    assert c["spearman"]["p_value"] > 0.01  # unrelated placement: no evidence of association
    top = lambda g, k: set(np.argsort(-g.ravel())[:k])  # noqa: E731
    for f, k in ((0.1, 7), (0.25, 18), (0.5, 36)):
        a, b = top(mlm, k), top(task, k)
        assert c[f"jaccard@{f:g}"]["estimate"] == pytest.approx(len(a & b) / len(a | b))
        assert c[f"jaccard@{f:g}"]["chance"] == pytest.approx(f / (2 - f))
    same = T.coherence(mlm, np.exp(mlm), n_boot=0, n_permutations=999)  # a monotone map: same ranks
    assert same["spearman"]["estimate"] == pytest.approx(1.0) and same["kendall"]["estimate"] == pytest.approx(1.0)
    assert same["jaccard@0.25"]["estimate"] == 1.0 and same["spearman"]["p_value"] == pytest.approx(0.001)
    flipped = T.coherence(mlm, -mlm, n_boot=0, n_permutations=0)
    assert flipped["spearman"]["estimate"] == pytest.approx(-1.0) and flipped["spearman"]["p_value"] is None
    # per layer: one layer holds a permutation of the layer mass of the other grid
    mass = T.coherence([[3.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [3.0, 1.0]], n_boot=0, n_permutations=0)
    assert mass["layer_mass_l1"]["estimate"] == pytest.approx(2 * (4 / 6 - 2 / 6))


def test_bootstrap_and_permutation_are_seeded_and_reproducible():
    rng = np.random.default_rng(0)
    a = rng.random((40, 3, 4))
    b = a + 0.3 * rng.random((40, 3, 4))
    kw = dict(n_boot=200, n_permutations=199, paired=True)
    one = T.coherence(a.sum(0), b.sum(0), (a, b), seed=5, **kw)
    two = T.coherence(a.sum(0), b.sum(0), (a, b), seed=5, **kw)
    other = T.coherence(a.sum(0), b.sum(0), (a, b), seed=6, **kw)
    assert one == two
    assert one != other
    s = one["spearman"]
    assert s["low"] <= s["boot_estimate"] <= s["high"] and s["low"] > 0
    assert 0 < s["p_value"] <= 1


def test_views_and_removal_masks():
    grid = np.array([[1.0, 5.0, 2.0], [4.0, 0.5, 3.0], [2.0, 2.0, 9.0], [1.0, 1.0, 1.0]])
    groups = [[0, 2], [1, 3]]  # two shared layers, each run at two depths
    assert T.shared_view(grid, groups).tolist() == [[3.0, 7.0, 11.0], [5.0, 1.5, 4.0]]
    masks = [T.removal_mask(grid, f, normalize="none") for f in (0.25, 0.5, 0.75)]
    assert [m.n_heads_kept for m in masks] == [9, 6, 3]
    for small, big in zip(masks, masks[1:]):  # nested: what goes at a level stays gone later
        assert bool((big.heads <= small.heads).all())
    shared = T.removal_mask(grid, 1 / 3, view="shared", groups=groups, normalize="none")
    # the two least important shared heads: group 1 head 1 (1.5), then group 0 head 0 (3.0)
    assert shared.heads[[1, 3], 1].tolist() == [0.0, 0.0] and shared.heads[[0, 2], 0].tolist() == [0.0, 0.0]
    assert shared.n_heads_kept == 8
    with pytest.raises(HeadcountError):
        T.view_of(grid, "shared")


def test_acceptable_deduction_takes_the_largest_acceptable_loss():
    rows = [{"level": 0.2, "mlm_loss_increase": 0.2, "mlm_accuracy_drop": 0.02, "relative_score": 0.97},
            {"level": 0.4, "mlm_loss_increase": 0.9, "mlm_accuracy_drop": 0.10, "relative_score": 0.85},
            {"level": 0.6, "mlm_loss_increase": 0.7, "mlm_accuracy_drop": 0.08, "relative_score": 0.91}]
    assert T.acceptable_deduction(rows, threshold=0.9)["level"] == 0.6
    assert T.acceptable_deduction(rows, threshold=0.99)["level"] is None


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
    with pytest.raises(HeadcountError, match="two tasks have the id 'movies'"):
        parse_study_config("study: transfer\ntasks: [offline/movies, other/movies]\n")
    with pytest.raises(HeadcountError, match="line 3: 'train'.*learning rate"):
        parse_study_config("study: transfer\ntasks: [offline/movies]\ntrain: {lr: -1}\n")
    with pytest.raises(HeadcountError, match="unknown key 'pruning.level'; did you mean 'levels'"):
        parse_study_config("study: transfer\ntasks: [offline/movies]\npruning: {level: [0.5]}\n")
    (tmp_path / "t.yaml").write_text("name: t\n")
    loaded = parse_study_config("study: transfer\ntasks: [t.yaml, {id: b, task: offline/nyt}]\n", base_dir=tmp_path)
    assert loaded.config.tasks[0] == str(tmp_path / "t.yaml") and T.task_id(loaded.config.tasks[1]) == "b"


@pytest.mark.parametrize("name", ["transfer-offline", "transfer-roberta-glue", "transfer-albert-glue"])
def test_shipped_configs_are_valid(name):
    from pathlib import Path

    loaded = load_study_config(Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml")
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
train: {{lr: 0.005, batch_size: 16, epochs: 6, max_length: 32, eval_batch_size: 64, save_steps: 1000}}
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
    assert (coh["low"] <= coh["high"] + 1e-12).all() and coh["low"].notna().any()
    curves = pd.read_csv(out / "results" / "curves.csv")
    assert set(curves["order"]) == {"mlm", "task", "random"} and set(curves["objective"]) == {"task", "mlm"}
    assert sorted(curves["fraction"].unique()) == [0.0, 0.25, 0.5, 0.75]
    # 8 heads (2 layers x 4): a level removes round(level x 8) of them
    assert set(curves[curves["fraction"] == 0.75]["heads_kept"]) == {2}
    ba = pd.read_csv(out / "results" / "before_after.csv")
    assert set(ba["setting"]) == {"prune (mlm) then fine-tune", "prune (random) then fine-tune",
                                  "fine-tune then prune (task)", "fine-tune then prune (mlm)"}
    ad = pd.read_csv(out / "results" / "acceptable_deduction.csv")
    assert sorted(ad["task"].unique()) == ["good", "has-not"] and ad["relative_score"].notna().all()
    ft = pd.read_csv(out / "results" / "finetune.csv")
    assert (ft["fine_tuned"] > 0.8).all()  # both cues are learnable by the tiny model
    # the head-only job trained only the classifier: its encoder equals the pre-trained one
    store = RunStore(out)
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
    seeds = coh[coh["comparison"] == T.COMPARISONS["seed-vs-seed"]]
    assert len(seeds) == 2 and not seeds["Spearman"].str.contains("±").any()  # one pair per task: no spread
    pruning = pd.read_csv(out / "results" / "main_pruning.csv", keep_default_na=False)
    assert list(pruning["task"]) == ["good", "has-not"] and pruning["fine-tuned"].str.contains("±").all()


def test_bootstrap_contributions_add_up_to_the_scores(run):
    root, _ = run
    store = RunStore(root / "run")
    for name in ("mlm-scores/good", "task-scores/has-not/seed2/fine-tuned"):
        job = store.result(name)
        rows = T._load_per_example(job)  # per-example shares (scoring batches of 16, the last one smaller)
        assert rows.shape[0] == 60
        np.testing.assert_allclose(rows.sum(0), job.load_json("scores.json")["heads"], rtol=1e-4)
    coh = pd.read_csv(root / "run" / "results" / "coherence.csv")
    boot = coh[coh["boot_estimate"].notna()]
    assert len(boot) and np.allclose(boot["boot_estimate"], boot["estimate"], atol=1e-6)


def test_statistics_are_reproducible_from_the_saved_scores(run, tmp_path):
    root, _ = run
    store = RunStore(root / "run")
    job = store.result("coherence")
    entry = next(e for e in store.plan["jobs"] if e["name"] == "coherence")
    inputs = {alias: store.load(key, alias) for alias, key in entry["inputs"].items()}
    again = T.coherence_job(job.params, inputs, tmp_path, no_progress)
    assert again["rows"] == job.result["rows"]


def test_report_sections_compose_under_a_prefix(run):
    root, _ = run
    loaded = load_study_config(root / "study.yaml")
    plan = Plan(T.transfer_jobs(loaded.config, prefix="transfer/"))
    store = RunStore(root / "run", plan=plan)  # same keys, prefixed names: the finished jobs serve
    sections = T.transfer_sections(store, loaded.config, prefix="transfer/")
    names = [f.name for s in sections for f in s.figures] + [t.name for s in sections for t in s.tables]
    assert names and all(n.startswith("transfer-") for n in names)


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


def test_docstring_examples_run():
    import doctest
    import importlib

    attempted = 0
    for name in ("", ".config", ".plan", ".jobs", ".tables", ".figures", ".report"):
        module = importlib.import_module(f"headcount.studies.transfer{name}")
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, name
        attempted += result.attempted
    for name in ("headcount.analysis.coherence", "headcount.analysis.removal"):
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, name
    assert attempted > 0


def test_every_job_validates_its_params_and_refuses_unknown_ones():
    from headcount.studies.transfer import config as C
    from headcount.studies.transfer.plan import JOBS

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
