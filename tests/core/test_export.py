"""`headcount export`: pruned and unpruned tiny models as ONNX files (onnxruntime == PyTorch at two
shapes, task head included) and as plain transformers checkpoints where a plain config can
describe them; bad input: one `error:` line, exit 2, nothing written.

Every architecture of the conftest table exports to ONNX; none can describe removed heads with a
plain config (each derives the head size from hidden / heads), all can describe uniformly
removed feed-forward neurons.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
import transformers
from cli_helpers import run_cli
from conftest import ARCH_IDS, NUM_LABELS, VOCAB, save_tiny, tiny_model

from headcount.core.gates import layout
from headcount.core.surgery import (
    load_pruned,
    prune_heads,
    prune_mlps,
    prune_neurons,
    save_pruned,
)
from headcount.runtime.errors import HeadcountError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from headcount.core import export as ex  # noqa: E402  (after the skip: needs the export extra)

TOL = 1e-4


def assert_one_error_line(code, err, *needles):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], err


def eager(model):
    model.set_attn_implementation("eager")
    return model


def pruned_unevenly(arch: str, head: str = "classification"):
    """Heads removed in the first and last layer (unevenly), neurons in the first, the MLP of layer 1."""
    model = eager(tiny_model(arch, head=head))
    n_layers, n_heads = layout(model)
    prune_neurons(model, {0: range(10)})
    prune_mlps(model, [1])
    prune_heads(model, {0: [1], n_layers - 1: [0, 2]})
    return model


def ort_session(data: bytes):
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def ort_run(session, inputs: dict) -> np.ndarray:
    wanted = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v.numpy() for k, v in inputs.items() if k in wanted})[0]


# -- ONNX, every architecture -----------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCH_IDS)
def test_onnx_matches_pytorch_for_pruned_and_unpruned_models(arch):
    for model in (eager(tiny_model(arch)), pruned_unevenly(arch)):
        data, rows = ex.export_onnx(model, tolerance=TOL)
        assert [(r["batch"], r["sequence"]) for r in rows] == list(ex.CHECK_SHAPES)
        assert all(r["max_abs_diff"] <= TOL for r in rows), rows
        # a third shape, checked here independently of export's own check: the axes are dynamic
        inputs = ex.random_inputs(model, 5, 13, seed=7)
        got = ort_run(ort_session(data), inputs)
        with torch.no_grad():
            want = model(**inputs).logits.numpy()
        assert got.shape == (5, NUM_LABELS)  # the task head is in the graph
        assert np.abs(got - want).max() <= TOL


def test_export_leaves_a_model_with_dropout_in_eval_mode():
    """The traced wrapper is a new module (training mode): the exporter must not switch the
    model's dropout on (the tiny table's dropout is 0, which would hide it)."""
    model = eager(tiny_model("bert", hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3))
    data, rows = ex.export_onnx(model)
    assert not any(m.training for m in model.modules())
    assert max(r["max_abs_diff"] for r in rows) <= TOL


def test_a_pruned_model_is_smaller_and_differs_from_the_unpruned_one():
    full, pruned = eager(tiny_model("bert")), pruned_unevenly("bert")
    a, _ = ex.export_onnx(full)
    b, _ = ex.export_onnx(pruned)
    assert len(b) < len(a)
    inputs = ex.random_inputs(full, 2, 8)
    assert np.abs(ort_run(ort_session(a), inputs) - ort_run(ort_session(b), inputs)).max() > 1e-3


@pytest.mark.parametrize("head, name, rank", [("mlm", "logits", 3), ("base", "last_hidden_state", 3)])
def test_mlm_head_and_bare_encoder_outputs(head, name, rank):
    model = pruned_unevenly("bert", head=head)
    data, rows = ex.export_onnx(model)
    session = ort_session(data)
    assert [o.name for o in session.get_outputs()] == [name]
    out = ort_run(session, ex.random_inputs(model, 3, 6))
    assert out.ndim == rank and out.shape[:2] == (3, 6)
    if head == "mlm":
        assert out.shape[2] == VOCAB


def test_inputs_follow_the_model():
    assert ex.input_names(tiny_model("bert")) == ["input_ids", "attention_mask", "token_type_ids"]
    assert ex.input_names(tiny_model("distilbert")) == ["input_ids", "attention_mask"]  # no token types


def test_a_model_with_every_head_removed_exports_without_the_mask():
    """ALBERT's one shared layer with no head: the graph no longer reads attention_mask."""
    model = eager(tiny_model("albert"))
    prune_heads(model, {0: range(4)})
    data, rows = ex.export_onnx(model)
    assert "attention_mask" not in {i.name for i in ort_session(data).get_inputs()}
    assert max(r["max_abs_diff"] for r in rows) <= TOL


def test_gates_left_on_shared_layers_are_in_the_onnx_graph():
    """ALBERT with groups, a head masked at one depth of a shared layer only: shrink keeps it as a
    persistent gate, the export traces it in; a plain config cannot describe it."""
    from headcount.core.masks import Mask
    from headcount.core.surgery import shrink

    model = eager(tiny_model("albert-groups"))
    n_layers, n_heads = layout(model)
    heads, mlps = torch.ones(n_layers, n_heads), torch.ones(n_layers)
    heads[0, 1] = 0
    mlps[1] = 0
    shrink(model, Mask(heads=heads, mlps=mlps))
    assert model.config.headcount_pruning["gates"]
    data, rows = ex.export_onnx(model)
    assert max(r["max_abs_diff"] for r in rows) <= TOL
    ungated = eager(tiny_model("albert-groups"))
    inputs = ex.random_inputs(model, 2, 8)
    with torch.no_grad():
        assert np.abs(ort_run(ort_session(data), inputs) - ungated(**inputs).logits.numpy()).max() > 1e-3
    with pytest.raises(HeadcountError, match="gates"):
        ex.native_config(model)


def test_tolerance_and_opset_are_checked():
    model = eager(tiny_model("bert"))
    with pytest.raises(HeadcountError, match="differ by"):
        ex.export_onnx(model, tolerance=1e-30)
    with pytest.raises(HeadcountError, match="opset"):
        ex.export_onnx(model, opset=11)
    data, _ = ex.export_onnx(model, opset=18)
    assert max(o.version for o in onnx.load_from_string(data).opset_import if o.domain in ("", "ai.onnx")) == 18


# -- plain transformers checkpoints ---------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCH_IDS)
def test_uniform_neuron_pruning_loads_with_plain_from_pretrained(arch, tmp_path):
    model = eager(tiny_model(arch))
    n_layers, _ = layout(model)
    prune_neurons(model, {i: range(3, 12) for i in range(n_layers)})  # 9 of 37 in every layer
    _, diff = ex.export_hf(model, tmp_path / "plain")
    assert diff <= TOL
    plain = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "plain").eval()
    assert "headcount_pruning" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    inputs = ex.random_inputs(model, 2, 9)
    with torch.no_grad():
        assert torch.allclose(plain(**inputs).logits, model(**inputs).logits, atol=TOL)
    assert sum(p.numel() for p in plain.parameters()) < sum(p.numel() for p in tiny_model(arch).parameters())


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_removed_heads_cannot_be_a_plain_checkpoint(arch, tmp_path):
    model = eager(tiny_model(arch))
    n_layers, _ = layout(model)
    prune_heads(model, {i: [1, 2] for i in range(n_layers)})  # the same 2 of 4 in every layer
    with pytest.raises(HeadcountError, match="head size"):
        ex.export_hf(model, tmp_path / "plain")
    assert not (tmp_path / "plain").exists()


def test_what_a_plain_config_cannot_describe_is_named():
    model = tiny_model("bert")
    prune_neurons(model, {0: range(5)})
    with pytest.raises(HeadcountError, match="different numbers of feed-forward neurons"):
        ex.native_config(model)
    model = tiny_model("bert")
    prune_mlps(model, [1])
    with pytest.raises(HeadcountError, match="whole MLPs"):
        ex.native_config(model)
    model = tiny_model("bert")
    prune_heads(model, {0: [1]})
    with pytest.raises(HeadcountError, match="different numbers of heads"):
        ex.native_config(model)
    assert ex.native_config(tiny_model("bert")).num_attention_heads == 4  # unpruned: the config itself


# -- the command line -------------------------------------------------------------------------
@pytest.fixture
def pruned_dir(tmp_path):
    return save_pruned(pruned_unevenly("bert"), tmp_path / "pruned")


def test_cli_onnx_end_to_end(capsys, tmp_path, pruned_dir):
    out = tmp_path / "x" / "model.onnx"
    code, stdout, err = run_cli(capsys, "export", "--model", pruned_dir, "--out", out)
    assert code == 0, err
    assert "max abs diff" in stdout and "pruned" in stdout
    reference = load_pruned(pruned_dir)
    inputs = ex.random_inputs(reference, 4, 11, seed=3)
    with torch.no_grad():
        want = reference(**inputs).logits.numpy()
    assert np.abs(ort_run(ort_session(out.read_bytes()), inputs) - want).max() <= TOL
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx"]  # no lock or temp file left
    # the same export again: replaced; another model: refused unless --force
    assert run_cli(capsys, "export", "--model", pruned_dir, "--out", out)[0] == 0
    other = save_tiny(tiny_model("bert", seed=1), tmp_path / "other")
    before = out.read_bytes()
    code, _, err = run_cli(capsys, "export", "--model", other, "--out", out)
    assert_one_error_line(code, err, "--force")
    assert out.read_bytes() == before
    code, stdout, err = run_cli(capsys, "export", "--model", other, "--out", out, "--force")
    assert code == 0 and "--force" in stdout and "unpruned" in stdout
    assert out.read_bytes() != before


def test_cli_hf_end_to_end(capsys, tmp_path):
    model = tiny_model("bert")
    prune_neurons(model, {i: range(20) for i in range(3)})
    src = save_pruned(model, tmp_path / "pruned")
    with pytest.raises(Exception):  # the point of the command: plain from_pretrained refuses headcount's checkpoint
        transformers.AutoModelForSequenceClassification.from_pretrained(src)
    code, stdout, err = run_cli(capsys, "export", "--model", src, "--format", "hf", "--out", tmp_path / "plain")
    assert code == 0, err
    plain = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "plain").eval()
    assert plain.config.intermediate_size == 37 - 20
    inputs = ex.random_inputs(plain, 2, 5)
    with torch.no_grad():
        assert torch.allclose(plain(**inputs).logits, load_pruned(src)(**inputs).logits, atol=TOL)


def test_cli_bad_input(capsys, tmp_path, pruned_dir):
    out = tmp_path / "m.onnx"
    cases = [
        (["--model", tmp_path / "missing", "--out", out], "not found"),
        (["--model", pruned_dir, "--out", out, "--format", "tflite"], "unknown --format"),
        (["--model", pruned_dir, "--out", out, "--opset", "9"], "--opset"),
        (["--model", pruned_dir, "--out", out, "--opset", "x"], "opset"),
        (["--model", pruned_dir, "--out", out, "--tolerance", "0"], "--tolerance"),
        (["--model", pruned_dir, "--out", tmp_path], "is a directory"),
        (["--model", pruned_dir, "--format", "hf", "--out", tmp_path / "plain"], "cannot describe"),
    ]
    for argv, needle in cases:
        code, _, err = run_cli(capsys, "export", *argv)
        assert_one_error_line(code, err, needle)
    assert not out.exists() and not (tmp_path / "plain").exists()
    mine = tmp_path / "mine.onnx"
    mine.write_text("my notes")
    for extra in ([], ["--force"]):  # never overwritten, not even with --force
        code, _, err = run_cli(capsys, "export", "--model", pruned_dir, "--out", mine, *extra)
        assert_one_error_line(code, err, "not written by")
    assert mine.read_text() == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.onnx", "pruned"]


def test_cli_onnx_lock(capsys, tmp_path, pruned_dir):
    """A second export of the same file while one runs is refused; a lock that is a link is not followed."""
    import fcntl
    import os

    out = tmp_path / "m.onnx"
    lock = tmp_path / ".headcount.lock.m.onnx"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        code, _, err = run_cli(capsys, "export", "--model", pruned_dir, "--out", out)
        assert_one_error_line(code, err, "another headcount process")
    finally:
        os.close(fd)
    assert not out.exists()
    lock.unlink()
    target = tmp_path / "target.txt"
    target.write_text("keep")
    lock.symlink_to(target)
    code, _, err = run_cli(capsys, "export", "--model", pruned_dir, "--out", out)
    assert_one_error_line(code, err, "lock")
    assert target.read_text() == "keep" and not out.exists()


def test_cli_without_the_extra(capsys, tmp_path, pruned_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails as if not installed
    code, _, err = run_cli(capsys, "export", "--model", pruned_dir, "--out", tmp_path / "m.onnx")
    assert_one_error_line(code, err)
    assert err.strip() == "error: headcount export needs onnx and onnxruntime: pip install 'headcount[export]'"
