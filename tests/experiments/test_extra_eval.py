"""MNLI's mismatched dev set, evaluated by both studies from the same models as the matched one.

``glue/mnli`` declares ``{"mm": "validation_mismatched"}`` as an extra evaluation split; the
lottery and transfer plans then add one evaluation job per final model on it (the same model
directory, the same mask, the same dev subset settings), and the tables report it as the task
``glue/mnli-mm`` (lottery) or the ``fine_tuned_mm`` column (transfer) beside the matched number.
Tiny local GLUE folder (the GLUE download's layout), tiny random model; nothing touches the network.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from glue_helpers import download_lines, splits_of
from training_helpers import WORDS, make_checkpoint, make_task, one_thread

from headcount.data.evaluation import evaluate_batches
from headcount.data.tasks import get_task
from headcount.experiments.runner import Plan, RunStore
from headcount.experiments.studies.lottery import LotterySettings, lottery_jobs
from headcount.experiments.studies.transfer import TransferSettings
from headcount.experiments.studies.transfer.plan import transfer_jobs
from headcount.importance.pipeline import DataConfig, batches_for, load_for, metric_for

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

#: rows per split of the tiny MNLI (matched and mismatched dev sets of different sizes)
SIZES = {"train": 48, "validation_matched": 16, "validation_mismatched": 12}


def _rows(split: str, n: int) -> list:
    """(premise, hypothesis), label: entailment iff the hypothesis has "good", contradiction iff "bad"."""
    rng = random.Random(len(split))
    plain = [w for w in WORDS if w not in ("good", "bad")]
    rows = []
    for i in range(n):
        hyp = [rng.choice(plain) for _ in range(rng.randint(3, 8))]
        label = i % 3
        if label != 1:
            hyp[rng.randrange(len(hyp))] = "good" if label == 0 else "bad"
        rows.append(((" ".join(rng.choice(plain) for _ in range(6)), " ".join(hyp)), label))
    return rows


def write_mnli(root, splits=tuple(SIZES)):
    """``root/MNLI/{train,dev_matched,dev_mismatched}.tsv`` as the GLUE download has them."""
    d = root / "MNLI"
    d.mkdir(parents=True, exist_ok=True)
    for split in splits:
        lines = download_lines("mnli", split, _rows(split, SIZES[split]))
        (d / f"{splits_of('mnli')[split]}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture
def glue_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HEADCOUNT_GLUE_DIR", str(write_mnli(tmp_path / "glue")))
    return tmp_path


# -------------------------------------------------------------------------------------- the task
def test_mnli_declares_its_mismatched_dev_set_where_the_source_has_it(tmp_path, monkeypatch):
    monkeypatch.delenv("HEADCOUNT_GLUE_DIR", raising=False)
    assert get_task("glue/mnli").extra_eval_splits == {"mm": "validation_mismatched"}  # the hub: every split
    assert get_task("glue/mnli-mm").extra_eval_splits == {}  # evaluates there already
    assert get_task("glue/sst2").extra_eval_splits == {} and get_task("offline/movies").extra_eval_splits == {}
    full = write_mnli(tmp_path / "a") / "MNLI"
    assert get_task("glue/mnli", data_dir=full).extra_eval_splits == {"mm": "validation_mismatched"}
    matched_only = write_mnli(tmp_path / "b", splits=("train", "validation_matched")) / "MNLI"
    assert get_task("glue/mnli", data_dir=matched_only).extra_eval_splits == {}  # nothing to evaluate on


# -------------------------------------------------------------------------------------- the plans
def _by_name(jobs) -> dict:
    return {j.name: j for j in Plan(jobs)}


def test_lottery_plan_evaluates_every_final_model_on_the_mismatched_set(glue_dir):
    s = LotterySettings(model=str(make_checkpoint(glue_dir / "pre")), tasks=["glue/mnli"], seeds=[1],
                        magnitude={"enabled": False}, patterns={"enabled": False})
    jobs = _by_name(lottery_jobs(s))
    extra = {n: j for n, j in jobs.items() if n.endswith("/eval-mm")}
    models = ["finetune/glue/mnli/seed1", "good-pruned/glue/mnli/seed1",
              *[f"retrain/{k}/glue/mnli/seed1" for k in ("good", "random", "bad", "super", "super-random", "super-bad")]]
    assert sorted(extra) == sorted(f"{m}/eval-mm" for m in models)
    for m in models:
        job, same = extra[f"{m}/eval-mm"], jobs[m]
        assert job.kind == "evaluate" and job.params["split"] == "validation_mismatched" and job.uses_model
        if m.startswith("good-pruned"):  # the matched evaluation's model and mask, on the other dev set
            assert {a: d.key for a, d in job.deps} == {a: d.key for a, d in same.deps}
            assert job.params == {**same.params, "split": "validation_mismatched"}
        else:  # the fine-tuned / retrained checkpoint itself
            assert job.inputs["model"].key == same.key and "mask" not in job.inputs
            assert job.params["data"] == jobs["good-pruned/glue/mnli/seed1"].params["data"]
        if m.startswith("retrain"):
            assert same.params["keep_model"] is True  # evaluated again: its checkpoint is kept


def test_tasks_without_extra_splits_keep_their_jobs_and_keys(glue_dir):
    pre = str(make_checkpoint(glue_dir / "pre"))
    other = str(make_task(glue_dir / "task"))
    off = {"magnitude": {"enabled": False}, "patterns": {"enabled": False}}
    alone = _by_name(lottery_jobs(LotterySettings(model=pre, tasks=[other], seeds=[1], **off)))
    both = _by_name(lottery_jobs(LotterySettings(model=pre, tasks=[other, "glue/mnli"], seeds=[1], **off)))
    assert not any("/eval-" in n for n in alone)
    assert all(j.params.get("keep_model", False) is False for j in alone.values())
    for name, job in alone.items():  # adding MNLI changes nothing of the other task's jobs
        assert both[name].key == job.key, name
    ts = TransferSettings(model=pre, tasks=[other], seeds=[1])
    assert not any("/eval-" in j.name for j in Plan(transfer_jobs(ts)))


def test_transfer_plan_evaluates_fine_tuned_and_pruned_then_fine_tuned_models(glue_dir):
    s = TransferSettings(model=str(make_checkpoint(glue_dir / "pre")), tasks=["glue/mnli"], seeds=[1, 2],
                         before_after={"levels": [0.5], "seeds": [1], "random_control": True})
    jobs = _by_name(transfer_jobs(s))
    extra = {n[: -len("/eval-mm")]: j for n, j in jobs.items() if n.endswith("/eval-mm")}
    assert sorted(extra) == sorted(["finetune/mnli/seed1", "finetune/mnli/seed2",
                                    "prune-then-finetune/mnli/seed1/mlm-0.5", "prune-then-finetune/mnli/seed1/random-0.5"])
    curve = jobs["curve/mnli/seed1"]
    for name, job in extra.items():
        assert job.inputs["model"].key == jobs[name].key and job.params["split"] == "validation_mismatched"
        assert job.params["data"] == curve.params["eval"]  # the dev subset the matched numbers use


# -------------------------------------------------------------------------------------- end to end
LOTTERY = """\
study: lottery
model: {model}
tasks: [glue/mnli]
seeds: [1]
train: {{lr: 0.01, batch_size: 16, epochs: 2, max_length: 32, save_steps: 1000}}
pruning: {{step: 0.5}}
magnitude: {{enabled: false}}
patterns: {{enabled: false}}
super_survivors: {{enabled: false}}
"""


def test_lottery_study_reports_matched_and_mismatched_from_the_same_models(glue_dir):
    from headcount.experiments import run_study

    (glue_dir / "study.yaml").write_text(LOTTERY.format(model=make_checkpoint(glue_dir / "pre")))
    summary = run_study(glue_dir / "study.yaml", glue_dir / "run", quiet=True)
    assert not summary.failed
    store = RunStore(glue_dir / "run")
    # the extra evaluation of the fine-tuned model is that checkpoint on the mismatched dev set
    full = store.result("finetune/glue/mnli/seed1")
    mm = store.result("finetune/glue/mnli/seed1/eval-mm")
    assert mm.params["split"] == "validation_mismatched"
    task = get_task("glue/mnli")
    data = DataConfig(**mm.params["data"])
    model, tok, _ = load_for(str(full.path("model")), task, "task", seed=data.seed)
    by_split = {split: evaluate_batches(model, batches_for(task, tok, "task", data, split=split), metric_for(task, "task"))
                for split in ("validation_matched", "validation_mismatched")}
    assert mm.result["score"] == pytest.approx(by_split["validation_mismatched"]["score"])
    assert mm.result["loss"] == pytest.approx(by_split["validation_mismatched"]["loss"], rel=1e-5)
    assert mm.result["loss"] != pytest.approx(by_split["validation_matched"]["loss"], rel=1e-5)
    assert full.result["final"]["score"] == pytest.approx(by_split["validation_matched"]["score"])  # the matched one
    # retrained checkpoints are kept for it; the good pruned one is evaluated with its mask
    assert (store.result("retrain/good/glue/mnli/seed1").dir / "model").is_dir()
    assert store.result("good-pruned/glue/mnli/seed1/eval-mm").result["heads_kept"] == \
        store.result("good-pruned/glue/mnli/seed1").result["heads_kept"]
    # the tables: glue/mnli-mm beside glue/mnli, every experiment with a number; no published one for it
    results = summary.run_dir / "results"
    main = pd.read_csv(results / "lottery_main.csv")
    for exp in ("full", "good pruned", "good retrained", "random retrained", "bad retrained"):
        for t in ("glue/mnli", "glue/mnli-mm"):
            row = main[(main["experiment"] == exp) & (main["task"] == t)]
            assert len(row) == 1 and np.isfinite(row["mean"].item()), (exp, t)
    row = main[(main["experiment"] == "full") & (main["task"] == "glue/mnli-mm")]
    assert row["mean"].item() == pytest.approx(mm.result["score"])
    wide = pd.read_csv(results / "lottery_main_wide.csv")
    assert list(wide.columns[1:]) == ["glue/mnli", "glue/mnli-mm"]
    paper = pd.read_csv(results / "lottery_paper_structured.csv", dtype=str, keep_default_na=False).set_index("task")
    assert list(paper.index) == ["glue/mnli", "glue/mnli-mm"]
    assert paper.loc["glue/mnli", "full, paper"] == "0.84" and paper.loc["glue/mnli-mm", "full, paper"] == ""
    assert paper.loc["glue/mnli-mm", "full"] != ""


TRANSFER = """\
study: transfer
model: {model}
tasks: [glue/mnli]
seeds: [1]
train: {{lr: 0.01, batch_size: 16, epochs: 1, max_length: 32, save_steps: 1000}}
head_fit: {{lr: 0.01, epochs: 1}}
mlm: {{head_steps: 5, head_max_texts: 50, eval: {{max_examples: 16, batch_size: 16, max_length: 32}}}}
scoring: {{data: {{max_examples: 16, batch_size: 16, max_length: 32}}}}
pruning: {{levels: [0.5], random_draws: 1}}
before_after: {{levels: [0.5], seeds: [1], random_control: false}}
stats: {{n_boot: 10, n_permutations: 9}}
"""


def test_transfer_study_reports_matched_and_mismatched_from_the_same_models(glue_dir):
    from headcount.experiments import run_study

    (glue_dir / "study.yaml").write_text(TRANSFER.format(model=make_checkpoint(glue_dir / "pre")))
    summary = run_study(glue_dir / "study.yaml", glue_dir / "run", quiet=True)
    assert not summary.failed
    store = RunStore(glue_dir / "run")
    results = summary.run_dir / "results"
    ft = pd.read_csv(results / "finetune.csv")
    mm = store.result("finetune/mnli/seed1/eval-mm")
    assert mm.params["split"] == "validation_mismatched"
    assert ft["fine_tuned_mm"].item() == pytest.approx(mm.result["score"])
    assert ft["fine_tuned"].item() == pytest.approx(store.result("finetune/mnli/seed1").result["final"]["score"])
    ba = pd.read_csv(results / "before_after.csv").set_index("setting")
    pruned_mm = store.result("prune-then-finetune/mnli/seed1/mlm-0.5/eval-mm").result["score"]
    assert ba.loc["prune (mlm) then fine-tune (mm)", "score"] == pytest.approx(pruned_mm)
    assert ba.loc["prune (mlm) then fine-tune (mm)", "full"] == pytest.approx(mm.result["score"])
    main = pd.read_csv(results / "main_pruning.csv", dtype=str, keep_default_na=False)
    assert main["fine-tuned (mm)"].item() == f"{mm.result['score']:.2f}"  # one seed: the mean alone
    assert main["fine-tuned"].item() == f"{ft['fine_tuned'].item():.2f}"
