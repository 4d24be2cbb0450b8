"""Studies on a tiny random decoder (a Llama causal LM, 4 query heads on 2 KV heads): the lottery
study pruning whole KV groups (its random and bad controls drawn in whole groups too)."""

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
