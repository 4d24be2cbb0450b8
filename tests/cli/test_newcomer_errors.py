"""Errors that name the fix (issue 34, item 2), on tiny checkpoints:

- a task YAML with only a train split: ``data show`` and ``prune`` end in one line that says how to
  declare a validation split (``score``, on train, works); with ``holdout:`` both run;
- ``export --mask``: shrinks first (the ONNX file runs like ``shrink`` then ``export``);
- ``export --format hf`` of a model no plain config describes: the same line says to export ONNX;
- ``explore --model M --text T``: the attention on the texts, no task needed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_error_line, run_cli, write_mask
from training_helpers import make_checkpoint, one_thread

from headcount.core.models import load_model, load_tokenizer

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

#: the prune budget of these tests: two steps of a quarter of the heads, a few examples
PRUNE = ["--max-examples", "16", "--max-eval-examples", "8", "--batch-size", "8", "--max-length", "32",
         "--step", "0.25", "--method", "magnitude"]


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    root = tmp_path_factory.mktemp("newcomer")
    clf = make_checkpoint(root / "clf", head="classification", initializer_range=0.3)  # heads that matter
    folder = root / "data"
    folder.mkdir()
    rows = ["sentence,label"] + [f"the movie was {'good' if i % 2 else 'long'} {i},{'positive' if i % 2 else 'negative'}"
                                 for i in range(40)]
    (folder / "reviews.csv").write_text("\n".join(rows) + "\n")
    base = "name: reviews\nfiles: {train: reviews.csv}\ntext: [sentence]\nlabel: label\n"
    (folder / "train-only.yaml").write_text(base)
    (folder / "held.yaml").write_text(base + "holdout: {fraction: 0.2, seed: 0}\n")
    mask = write_mask(root / "mask.json", [[1, 0, 1, 1], [1, 1, 0, 0]], [1, 1])
    no_mlp = write_mask(root / "no-mlp.json", [[1, 1, 1, 1], [1, 1, 1, 1]], [1, 0])
    return {"root": root, "clf": str(clf), "train_only": str(folder / "train-only.yaml"),
            "held": str(folder / "held.yaml"), "mask": str(mask), "no_mlp": str(no_mlp)}


# -- a task with only a train split ---------------------------------------------------------------
@pytest.mark.parametrize("command", ["data show", "prune"])
def test_a_missing_validation_split_says_how_to_declare_one(w, tmp_path, capsys, command):
    args = (["data", "show", w["train_only"]] if command == "data show" else
            ["prune", "--model", w["clf"], "--task", w["train_only"], "--out", tmp_path / "o", *PRUNE])
    code, _, err = run_cli(capsys, *args)
    assert_one_error_line(code, err)
    assert "task reviews has no split 'validation' (the split it is evaluated on); splits: train; declare it in" in err
    assert "`files: {train: reviews.csv, validation: FILE}`" in err and "`holdout: {fraction: 0.2, seed: 0}`" in err
    assert not (tmp_path / "o").exists()


def test_score_works_on_train_and_holdout_makes_data_show_and_prune_work(w, tmp_path, capsys):
    code, _, err = run_cli(capsys, "score", "--model", w["clf"], "--task", w["train_only"], "--method", "magnitude",
                           "--out", tmp_path / "s")
    assert code == 0, err
    code, out, err = run_cli(capsys, "data", "show", w["held"])
    assert code == 0, err
    assert "  train: 32 examples" in out and "  validation: 8 examples" in out
    code, out, err = run_cli(capsys, "prune", "--model", w["clf"], "--task", w["held"], "--out", tmp_path / "p", *PRUNE)
    assert code == 0, err
    assert json.loads((tmp_path / "p" / "mask.json").read_text())["task"] == "reviews"


# -- export --mask, and hf refusals that point to ONNX -------------------------------------------
def _onnx_logits(path, tokenizer, texts) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    enc = tokenizer(texts, padding=True, return_tensors="np")
    return session.run(None, {i.name: enc[i.name].astype(np.int64) for i in session.get_inputs()})[0]


def test_export_mask_shrinks_first_as_shrink_then_export_does(w, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    code, out, err = run_cli(capsys, "export", "--model", w["clf"], "--mask", w["mask"], "--out", tmp_path / "a.onnx")
    assert code == 0, err
    assert "pruned: 3 heads" in out
    assert run_cli(capsys, "shrink", "--model", w["clf"], "--mask", w["mask"], "--out", tmp_path / "small")[0] == 0
    assert run_cli(capsys, "export", "--model", tmp_path / "small", "--out", tmp_path / "b.onnx")[0] == 0
    tokenizer = load_tokenizer(w["clf"])
    texts = ["the movie was good", "a long and slow film that was not really good at all"]
    one_step, two_steps = (_onnx_logits(tmp_path / f, tokenizer, texts) for f in ("a.onnx", "b.onnx"))
    np.testing.assert_allclose(one_step, two_steps, atol=1e-6, rtol=0)
    assert run_cli(capsys, "export", "--model", w["clf"], "--out", tmp_path / "full.onnx")[0] == 0
    full = _onnx_logits(tmp_path / "full.onnx", tokenizer, texts)
    assert np.abs(full - one_step).max() > 1e-2  # the mask did remove something
    # the mask is part of the run's identity: another mask does not replace the file without --force
    before = (tmp_path / "a.onnx").read_bytes()
    code, _, err = run_cli(capsys, "export", "--model", w["clf"], "--mask", w["no_mlp"], "--out", tmp_path / "a.onnx")
    assert_one_error_line(code, err)
    assert "--force" in err and (tmp_path / "a.onnx").read_bytes() == before


def test_export_bad_mask_is_one_line_and_writes_nothing(w, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    wrong = write_mask(tmp_path / "wrong.json", [[1, 1, 1], [1, 1, 1]], [1, 1])  # 3 heads a layer, the model has 4
    for mask in (bad, wrong, tmp_path / "missing.json"):
        code, _, err = run_cli(capsys, "export", "--model", w["clf"], "--mask", mask, "--out", tmp_path / "m.onnx")
        assert_one_error_line(code, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "wrong.json"]


@pytest.mark.parametrize("mask, needle", [("no_mlp", "whole MLPs are removed"), ("mask", "different numbers of heads")])
def test_hf_refusal_suggests_onnx_in_the_same_line(w, tmp_path, capsys, mask, needle):
    code, _, err = run_cli(capsys, "export", "--model", w["clf"], "--mask", w[mask], "--format", "hf",
                           "--out", tmp_path / "plain")
    assert_one_error_line(code, err)
    assert needle in err
    assert (f"export it as ONNX instead, which runs any pruned model without headcount: headcount export "
            f"--model {w['clf']} --mask {w[mask]} --out {tmp_path / 'plain.onnx'}") in err
    assert not (tmp_path / "plain").exists()


# -- explore --text without a task ----------------------------------------------------------------
def test_explore_text_alone_shows_the_attention_on_the_texts(w, tmp_path, capsys):
    from headcount.core.attention import attention_maps
    from headcount.experiments.explorer import data as D
    from headcount.experiments.explorer.page import page_data

    texts = ["the movie was good", "a long film"]
    out = tmp_path / "e.html"
    code, stdout, err = run_cli(capsys, "explore", "--model", w["clf"], "--text", texts[0], "--text", texts[1],
                                "--out", out)
    assert code == 0, err
    assert "attention of clf on 2 of your texts" in stdout
    html = out.read_text()
    page = page_data(html)
    assert page["title"].endswith("on your texts") and page["source"]["task"] is None
    assert "on your texts (no task)" in html and "None" not in html.split("<script")[0]
    assert [q["name"] for q in page["quantities"]] == ["attention entropy (nats, mean over queries and examples)"]
    tok, model = load_tokenizer(w["clf"]), load_model(w["clf"]).eval()
    att = page["attention"]
    assert [e["tokens"] for e in att["examples"]] == [tok.convert_ids_to_tokens(tok(t)["input_ids"]) for t in texts]
    lengths = [len(e["tokens"]) for e in att["examples"]]
    decoded = D.decode_attention(att["heads"][1][2], lengths)
    for t, dec in zip(texts, decoded):
        with torch.no_grad():
            real = attention_maps(model, **tok(t, return_tensors="pt"))[1][0, 2].numpy()
        top = real.argmax(-1)
        assert np.allclose(dec[np.arange(len(top)), top], np.rint(real.max(-1) * 255) / 255, atol=1.01 / 255)
    # neither --task nor --text: one line naming both
    code, _, err = run_cli(capsys, "explore", "--model", w["clf"], "--out", tmp_path / "f.html")
    assert_one_error_line(code, err)
    assert "--task" in err and "--text" in err
