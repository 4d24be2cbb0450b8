"""Decoders downstream of pruning: finetune (a classifier on a decoder, with and without a mask),
export (ONNX of a causal LM, pruned or not, and of a classifier) and explore (attention maps of
query heads, grouped by KV group), each through the CLI on a tiny random Llama (4 query heads on 2
KV heads) and a word-level tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cli_helpers import run_cli
from conftest import HEADS, LAYERS, tiny_model
from training_helpers import make_task, make_tokenizer, one_thread

from headcount.core.masks import Mask
from headcount.core.surgery import kv_summary, load_pruned

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("downstream")
    task = make_task(root / "task", n_train=32, n_dev=16)
    # a causal LM whose config has no padding id (as many decoders' configs do)
    lm = tiny_model("llama", head="lm", pad_token_id=None)
    lm.save_pretrained(root / "lm")
    make_tokenizer(root / "lm").save_pretrained(root / "lm")
    # KV group 1 of layer 0, query head 1 of layer 1 (uneven: a K/V head repeated), layer 2 without heads
    mask = Mask.for_model(lm).without_kv_groups([(0, 1)]).without_heads([(1, 1)] + [(2, h) for h in range(HEADS)])
    mask.save(root / "mask.json")
    return {"root": root, "task": task, "lm": root / "lm", "mask": root / "mask.json"}


def _finetune(capsys, world, out, *extra):
    return run_cli(capsys, "finetune", "--model", world["lm"], "--task", world["task"], "--epochs", 1,
                   "--batch-size", 8, "--max-train-examples", 32, "--max-eval-examples", 16, *extra, "--out", out)


@pytest.mark.parametrize("masked", [False, True])
def test_finetune_a_classifier_on_a_decoder(world, capsys, tmp_path, masked):
    """A new classification head on a causal LM; it reads each row's last real token, so a padded
    row scores as it does alone (the config's missing padding id is set to the tokenizer's)."""
    extra = ("--mask", world["mask"]) if masked else ()
    code, out, err = _finetune(capsys, world, tmp_path / "ft", *extra)
    assert code == 0, err
    metrics = json.loads((tmp_path / "ft" / "metrics.json").read_text())
    assert "accuracy" in json.dumps(metrics)
    model = load_pruned(tmp_path / "ft" / "model") if masked else None
    if masked:
        assert kv_summary(model) == {"kv_heads_total": 2 * LAYERS, "kv_heads_kept": 4, "kv_heads_repeated": 1}
    else:
        from headcount.core.models import load_model

        model = load_model(str(tmp_path / "ft" / "model"), head="classification")
    assert type(model).__name__.endswith("ForSequenceClassification") and model.config.pad_token_id == 0
    ids = torch.tensor([[7, 8, 9, 10, 11], [12, 13, 14, 0, 0]])
    with torch.no_grad():
        both = model(input_ids=ids, attention_mask=(ids != 0).long()).logits
        alone = model(input_ids=ids[1:, :3]).logits
    assert torch.allclose(both[1], alone[0], atol=1e-5)


def test_export_onnx_of_a_causal_lm_pruned_or_not_and_of_a_classifier(world, capsys, tmp_path):
    pytest.importorskip("onnxruntime")
    code, _, err = run_cli(capsys, "shrink", "--model", world["lm"], "--mask", world["mask"], "--out", tmp_path / "small")
    assert code == 0, err
    code, _, err = _finetune(capsys, world, tmp_path / "ft", "--mask", world["mask"])
    assert code == 0, err
    for model, name in ((world["lm"], "lm"), (tmp_path / "small", "small"), (tmp_path / "ft" / "model", "cls")):
        code, out, err = run_cli(capsys, "export", "--model", model, "--out", tmp_path / f"{name}.onnx")
        assert code == 0, err
        assert "-> logits" in out and "onnxruntime vs PyTorch: max abs diff" in out  # compared before writing
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "small.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[7, 8, 9, 10]], dtype=np.int64)
    logits = sess.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    with torch.no_grad():
        want = load_pruned(tmp_path / "small")(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert logits.shape == want.shape and np.abs(logits - want).max() < 1e-4


def test_explore_groups_query_heads_by_kv_group(world, capsys, tmp_path):
    from headcount.experiments.explorer import data as D
    from headcount.experiments.explorer.page import page_data

    code, _, err = run_cli(capsys, "shrink", "--model", world["lm"], "--mask", world["mask"], "--out", tmp_path / "small")
    assert code == 0, err
    code, out, err = run_cli(capsys, "explore", "--model", tmp_path / "small", "--task", world["task"],
                             "--mask", world["mask"], "--examples", 2, "--out", tmp_path / "e.html")
    assert code == 0, err
    html = (tmp_path / "e.html").read_text(encoding="utf-8")
    page = page_data(html)
    assert (page["layers"], page["heads"], page["kv_heads"]) == (LAYERS, HEADS, 2)
    assert any("Grouped-query attention: 2 key/value heads" in n for n in page["notes"])
    assert "kv-first" in html and "KV group" in html  # the grid and the detail panel's names
    att = page["attention"]
    lengths = [len(e["tokens"]) for e in att["examples"]]
    assert att["heads"][0][2] is None and att["heads"][2][0] is None  # removed heads have no map
    for layer, head in ((0, 0), (1, 2)):
        for dec in D.decode_attention(att["heads"][layer][head], lengths):
            assert not np.triu(dec, 1).any()  # causal: no query attends to a later token
