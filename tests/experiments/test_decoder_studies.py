"""Studies on a tiny random decoder (a Llama causal LM, 4 query heads on 2 KV heads): the lottery
study pruning query heads or whole KV groups (its controls drawn in whole groups too), and the
transfer study with the decoder's own next-token loss (``objectives: [lm]``) in MLM's place."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import HEADS, LAYERS, tiny_model
from training_helpers import make_task, make_tokenizer, one_thread

from headcount.core.masks import Mask
from headcount.experiments import run_study
from headcount.experiments.runner import RunStore

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


def test_transfer_on_a_decoder_with_the_lm_objective(world):
    import json

    (world / "transfer.yaml").write_text(TRANSFER)
    run_study(world / "transfer.yaml", world / "run-transfer", quiet=True)
    store = RunStore(world / "run-transfer")
    jobs = {j["name"]: j for j in store.plan["jobs"]}
    pre = next(j for n, j in jobs.items() if n.startswith("mlm-scores/") and "fine-tuned" not in n)
    after = next(j for n, j in jobs.items() if n.startswith("mlm-scores/") and "fine-tuned" in n)
    for job in (pre, after):
        scores = json.loads((store.job_dir(job["key"]) / "scores.json").read_text())
        assert scores["objective"] == "lm" and np.isfinite(np.asarray(scores["heads"])).all()
        assert np.asarray(scores["heads"]).shape == (LAYERS, HEADS)
    curve = next(j for n, j in jobs.items() if n.startswith("curve/") and n.endswith("/mlm"))
    assert curve["params"]["objective"] == "lm"
    text = (store.job_dir(curve["key"]) / "curve.csv").read_text()
    assert "lm_accuracy" in text or len(text.splitlines()) > 2
