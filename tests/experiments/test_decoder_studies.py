"""Studies on a tiny random decoder (a Llama causal LM, 4 query heads on 2 KV heads): the lottery
study pruning query heads or whole KV groups (its controls drawn in whole groups too), and the
transfer study with the decoder's own next-token loss (``objectives: [lm]``) in MLM's place, whose
report names that objective (LM, never MLM)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import HEADS, LAYERS, tiny_model
from training_helpers import make_task, make_tokenizer, one_thread

from headcount.core.masks import Mask
from headcount.experiments import run_study
from headcount.experiments.runner import RunStore
from headcount.experiments.runner.config import load_study_config
from headcount.experiments.studies.lottery.report import lottery_glance

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

LOTTERY = """study: lottery
name: tiny decoder lottery
model: pre
tasks: [task/task.yaml]
seeds: [1]
random: uniform
train: {{lr: 0.01, batch_size: 16, epochs: 2, max_length: 32, save_steps: 1000}}
pruning: {{step: 0.25, threshold: 0.99, unit: {unit}}}
magnitude: {{enabled: false}}
super_survivors: {{retrain: false}}
patterns: {{max_examples: 8, size: 16}}
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoder-studies")
    tiny_model("llama", head="lm", pad_token_id=None).save_pretrained(root / "pre")
    make_tokenizer(root / "pre").save_pretrained(root / "pre")
    make_task(root / "task", n_train=192, n_dev=32)
    return root


@pytest.mark.parametrize("unit", ["heads", "kv-groups"])
def test_lottery_on_a_decoder_prunes_query_heads_or_kv_groups(world, unit):
    (world / f"lottery-{unit}.yaml").write_text(LOTTERY.format(unit=unit))
    run_study(world / f"lottery-{unit}.yaml", world / f"run-{unit}", quiet=True)
    store = RunStore(world / f"run-{unit}")
    jobs = {j["name"]: j for j in store.plan["jobs"]}
    masks = {name: Mask.load(store.job_dir(j["key"]) / "mask.json") for name, j in jobs.items()
             if (store.job_dir(j["key"]) / "mask.json").is_file()}
    good = next(m for n, m in masks.items() if "prune" in n)
    controls = [m for n, m in masks.items() if "random" in n or "bad" in n]
    assert controls and good.heads.shape == (LAYERS, HEADS) and good.n_heads_kept > 0
    for m in controls:
        assert m.n_heads_kept == good.n_heads_kept  # uniform draws: the good size
    if unit == "kv-groups":
        assert good.meta["unit"] == "kv-groups"
        for m in (good, *controls):
            groups = m.heads.view(LAYERS, 2, HEADS // 2).sum(-1).numpy()
            assert np.isin(groups, (0, HEADS // 2)).all()  # whole KV groups only
    kept = next(r for r in lottery_glance(store, load_study_config(world / f"lottery-{unit}.yaml").config)
                if r["quantity"] == "heads the good subnetwork keeps")["this run"]
    assert kept.startswith(f"{good.n_heads_kept:.1f} of {LAYERS * HEADS}")
    if unit == "kv-groups":  # the glance names both units: query heads and the whole groups they make
        assert kept.endswith(f"query heads ({good.n_heads_kept / (HEADS // 2):.1f} of {LAYERS * 2} KV groups)")


TRANSFER = """study: transfer
name: tiny decoder transfer
model: pre
tasks: [{id: good, task: task/task.yaml}]
seeds: [1]
objectives: [lm]
train: {lr: 0.01, batch_size: 16, epochs: 1, max_length: 32, eval_batch_size: 64, save_steps: 1000}
head_fit: {lr: 0.01, epochs: 1}
mlm: {eval: {max_examples: 32, batch_size: 16, max_length: 32}}
scoring: {data: {max_examples: 32, batch_size: 16, max_length: 32}}
pruning: {levels: [0.5], random_draws: 1}
before_after: {levels: [0.5], seeds: [1], random_control: false}
stats: {n_boot: 10, n_permutations: 9}
"""


@pytest.fixture(scope="module")
def transfer_run(world):
    """The tiny decoder transfer study, run once for the module: its store and run summary."""
    (world / "transfer.yaml").write_text(TRANSFER)
    summary = run_study(world / "transfer.yaml", world / "run-transfer", quiet=True)
    return RunStore(world / "run-transfer"), summary


def test_transfer_on_a_decoder_with_the_lm_objective(transfer_run):
    import json

    store, _ = transfer_run
    jobs = {j["name"]: j for j in store.plan["jobs"]}
    pre = next(j for n, j in jobs.items() if n.startswith("mlm-scores/") and "fine-tuned" not in n)
    after = next(j for n, j in jobs.items() if n.startswith("mlm-scores/") and "fine-tuned" in n)
    for job in (pre, after):
        scores = json.loads((store.job_dir(job["key"]) / "scores.json").read_text())
        assert scores["objective"] == "lm" and np.isfinite(np.asarray(scores["heads"])).all()
        assert np.asarray(scores["heads"]).shape == (LAYERS, HEADS)
    curve = next(j for n, j in jobs.items() if n.startswith("curve/") and n.endswith("/mlm"))
    assert curve["params"]["objective"] == "lm"
    import pandas as pd

    from headcount.data.evaluation import LM_METRIC

    rows = pd.read_csv(store.job_dir(curve["key"]) / "curve.csv")
    # the full model's row and at least one removal level, every row an LM accuracy
    assert len(rows) > 1 and (rows["fraction"] > 0).any()
    assert set(rows["objective"]) == {"lm"} and set(rows["metric"]) == {LM_METRIC}
    assert rows["score"].between(0, 1).all()


def _words(content) -> tuple[str, list[str]]:
    """A report's prose (summary, caveats, section texts, captions, table headers and cells) and the
    texts drawn in its figures (titles, axis labels, tick labels, legends)."""
    from matplotlib.text import Text

    prose = [content.summary, *content.caveats]
    for s in content.sections:
        prose += [s.title, s.text, *(f.caption for f in s.figures), *(t.caption for t in s.tables)]
    for t in content.tables():
        prose += [str(c) for c in t.data.columns] + [str(v) for v in t.data.to_numpy().ravel()]
    drawn = [x.get_text() for f in content.figures() for x in f.source.findobj(Text) if x.get_text()]
    return "\n".join(prose), drawn


def test_a_decoder_transfer_report_names_its_lm_objective_never_mlm(transfer_run):
    """The report (HTML, terminal summary, figures) of an ``objectives: [lm]`` run says LM (next-token),
    never MLM, and has no fitted-head caveat; the plan's keys keep their mlm names. The same saved
    results reported as an encoder's (``objectives: [mlm]``) say MLM, with the head caveat."""
    import io
    import json
    import re

    import pandas as pd
    from rich.console import Console

    from headcount.experiments.report import print_summary
    from headcount.experiments.runner.config import parse_study_config
    from headcount.experiments.studies.transfer import COMPARISONS
    from headcount.experiments.studies.transfer.report import report

    store, summary = transfer_run
    out = store.root
    # the page's text: its figures are embedded as base64 PNG, whose letters may spell anything
    html = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", summary.report.read_text(encoding="utf-8"))
    record = json.loads((out / "results" / "summary.json").read_text(encoding="utf-8"))
    terminal = io.StringIO()
    assert print_summary(out, console=Console(file=terminal, width=100, color_system=None))
    config = parse_study_config(store.config_text, where="study.yaml", base_dir=out.parent).config
    content = report(store, config)
    prose, drawn = _words(content)
    for where, text in (("html", html), ("summary.json", json.dumps(record, ensure_ascii=False)),
                        ("terminal", terminal.getvalue()), ("report", prose), ("figures", "\n".join(drawn))):
        assert "MLM" not in text, where
        assert not any(w in text.lower() for w in ("masked lm", "masked-lm", "masked-token")), where
    # its own words: the next-token LM, its LM head, and no caveat box (no head was fitted)
    assert record["summary"].startswith("Next-token LM of the pre-trained model: ") and "†" not in record["summary"]
    assert "LM vs task (fine-tuned): Spearman" in record["summary"] and record["caveats"] == [] == content.caveats
    assert 'id="caveats"' not in html and "†" not in html
    main = pd.read_csv(out / "results" / "main_coherence.csv")
    assert "LM (pre-trained) vs task (fine-tuned)" in set(main["comparison"])
    assert {"removable at 90%, by lm", "acceptable deduction: LM loss +", "head only (frozen model)"} <= set(
        pd.read_csv(out / "results" / "main_pruning.csv").columns)
    captions = {f.name: f.caption for f in content.figures()}
    assert "heads removed by LM importance" in captions["prunability"]
    assert {"good: next-token LM (pre-trained)", "LM (good texts), pre-trained", "LM importance (percentile)",
            "by lm"} <= set(drawn)
    assert set(pd.read_csv(out / "results" / "before_after.csv")["setting"]) == {
        "prune (lm) then fine-tune", "fine-tune then prune (task)", "fine-tune then prune (lm)"}
    # labels only: the plan's keys (job names, comparisons, score kinds, orders) keep their mlm names
    assert any(j["name"].startswith("mlm-scores/") for j in store.plan["jobs"])
    assert set(pd.read_csv(out / "results" / "coherence.csv")["comparison"]) >= {"mlm-vs-task", "mlm-before-vs-after"}
    assert "mlm-pre-trained" in set(pd.read_csv(out / "results" / "head_scores.csv")["kind"])
    assert "mlm" in set(pd.read_csv(out / "results" / "curves.csv")["order"])

    # the same results under an encoder's objective: MLM everywhere, with the MLM head's caveat
    encoder = report(store, config.model_copy(update={"objectives": ("mlm",)}))
    prose, drawn = _words(encoder)
    assert encoder.summary.startswith("Masked LM of the pre-trained model†: ")
    assert "MLM vs task (fine-tuned)†: Spearman" in encoder.summary
    assert encoder.caveats and encoder.caveats[0].startswith("† the checkpoint's own MLM head, masked-token accuracy")
    assert COMPARISONS["mlm-vs-task"] in prose and "prune (mlm) then fine-tune" in prose
    assert {"MLM (good texts), pre-trained", "MLM importance (percentile)", "by mlm"} <= set(drawn)
    assert "next-token" not in prose.lower() and not any("next-token" in d for d in drawn)
