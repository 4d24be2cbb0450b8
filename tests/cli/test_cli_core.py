"""`headcount info` / `headcount shrink` end to end, and bad input: one `error:` line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from headcount.core.gates import gated
from headcount.core.masks import Mask
from headcount.core.models import load_model
from headcount.core.surgery import count_parameters, load_pruned

from cli_helpers import assert_one_error_line, run_cli, write_mask
from conftest import outputs, save_tiny, tiny_batch, tiny_model


HEADCOUNT = Path(sys.executable).parent / "headcount"


@pytest.fixture
def tiny_dir(tmp_path) -> Path:
    """A saved tiny BERT classifier (3 layers x 4 heads)."""
    return save_tiny(tiny_model("bert"), tmp_path / "bert")


@pytest.fixture
def bloom_dir(tmp_path) -> Path:
    """A saved tiny BLOOM: a model type no adapter serves (GPT-2 has one since the decoder adapters)."""
    cfg = transformers.BloomConfig(hidden_size=16, n_layer=1, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    return save_tiny(transformers.BloomForCausalLM(cfg), tmp_path / "bloom")


# --- bad input ---------------------------------------------------------------------------------------
def test_unknown_architecture(capsys, bloom_dir, tmp_path):
    code, _, err = run_cli(capsys, "info", "--model", str(bloom_dir))
    assert_one_error_line(code, err)
    assert "'bloom' is not supported" in err and "bert" in err  # names the supported types
    mask = write_mask(tmp_path / "m.json", [[1, 1]], [1])
    code, _, err = run_cli(capsys, "shrink", "--model", str(bloom_dir), "--mask", str(mask), "--out", str(tmp_path / "o"))
    assert_one_error_line(code, err)
    assert not (tmp_path / "o").exists()


def test_mask_of_wrong_shape(capsys, tiny_dir, tmp_path):
    mask = write_mask(tmp_path / "m.json", [[1, 1, 1, 1]] * 2, [1, 1])
    code, _, err = run_cli(capsys, "shrink", "--model", str(tiny_dir), "--mask", str(mask), "--out", str(tmp_path / "o"))
    assert_one_error_line(code, err)
    assert "2 layers x 4 heads" in err and "3 x 4" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("content", ["{not json", "", "\x00\xff"])
def test_mask_file_not_json(capsys, tiny_dir, tmp_path, content):
    mask = tmp_path / "m.json"
    mask.write_text(content, encoding="latin-1")
    code, _, err = run_cli(capsys, "shrink", "--model", str(tiny_dir), "--mask", str(mask), "--out", str(tmp_path / "o"))
    assert_one_error_line(code, err)
    assert "not JSON" in err


@pytest.mark.parametrize("mask", [{"mlps": [1, 1, 1]}, {"heads": "all"}, {"heads": [[1, 2, 1, 1]] * 3}, [1, 0]])
def test_mask_file_with_bad_content(capsys, tiny_dir, tmp_path, mask):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(mask))
    code, _, err = run_cli(capsys, "shrink", "--model", str(tiny_dir), "--mask", str(path), "--out", str(tmp_path / "o"))
    assert_one_error_line(code, err)


def test_missing_checkpoint_directory(capsys, tmp_path):
    missing = tmp_path / "no-such-model"
    code, _, err = run_cli(capsys, "info", "--model", str(missing))
    assert_one_error_line(code, err)
    assert "not found" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(capsys, "info", "--model", str(tmp_path / "empty"))
    assert_one_error_line(code, err)
    assert "no config.json" in err


def test_missing_mask_file(capsys, tiny_dir, tmp_path):
    code, _, err = run_cli(capsys, "shrink", "--model", str(tiny_dir), "--mask", str(tmp_path / "nope.json"),
                           "--out", str(tmp_path / "o"))
    assert_one_error_line(code, err)
    assert "mask file not found" in err


def test_console_script_bad_input(bloom_dir):
    """The installed `headcount` script itself: exit 2, one line, no traceback."""
    proc = subprocess.run([str(HEADCOUNT), "info", "--model", str(bloom_dir)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: model type 'bloom' is not supported"), proc.stderr


# --- shrink -> info -> load_pruned ------------------------------------------------------------------------
def test_shrink_then_info_and_reload(capsys, tiny_dir, tmp_path):
    model = load_model(str(tiny_dir), head="classification")
    batch = tiny_batch(model)
    heads = [[1, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]
    mlps = [1, 0, 1]
    mask = write_mask(tmp_path / "mask.json", heads, mlps)
    with gated(model, heads=torch.tensor(heads, dtype=torch.float32), mlps=torch.tensor(mlps, dtype=torch.float32)):
        expected = outputs(model, batch)

    out = tmp_path / "pruned"
    code, stdout, err = run_cli(capsys, "shrink", "--model", str(tiny_dir), "--mask", str(mask), "--out", str(out))
    assert code == 0, err
    assert "7/12 heads" in stdout

    pruned = load_pruned(out)
    assert_close = torch.testing.assert_close
    assert_close(outputs(pruned, batch), expected, atol=1e-5, rtol=0)
    assert_close(outputs(load_model(str(out), head="classification"), batch), expected, atol=1e-5, rtol=0)
    summary = json.loads((out / "headcount.json").read_text())
    assert summary["parameters"] == count_parameters(pruned)
    assert summary["parameters_before"] == count_parameters(model)

    code, stdout, err = run_cli(capsys, "info", "--model", str(out))
    assert code == 0, err
    info = dict(line.strip().split(": ", 1) for line in stdout.splitlines() if ": " in line)
    assert info["heads kept"] == "7/12"
    assert info["MLPs kept"] == "2/3"
    assert info["layers"] == "3"
    assert info["parameters"] == (f"{count_parameters(pruned):,} with the task head "
                                  f"(encoder alone: {count_parameters(pruned.base_model):,})")


def test_shrink_keeps_a_masked_lm_head_and_albert_residual_gates(capsys, tmp_path):
    model = tiny_model("albert", head="mlm")
    src = save_tiny(model, tmp_path / "albert")
    batch = tiny_batch(model)
    mask = Mask.full(4, 4).without_heads([(d, 3) for d in range(4)] + [(1, 0)]).without_mlps([2])
    mask.save(tmp_path / "mask.json")
    with gated(model, heads=mask.heads, mlps=mask.mlps):
        expected = outputs(model, batch)  # [batch, seq, vocab]: the LM head is kept
    out = tmp_path / "pruned"
    code, _, err = run_cli(capsys, "shrink", "--model", str(src), "--mask", str(tmp_path / "mask.json"),
                           "--out", str(out))
    assert code == 0, err
    pruned = load_pruned(out)
    assert type(pruned) is type(model)
    torch.testing.assert_close(outputs(pruned, batch), expected, atol=1e-5, rtol=0)
    code, stdout, err = run_cli(capsys, "info", "--model", str(out))
    assert code == 0, err
    assert "residual gates: yes" in stdout
    assert "shared layers: yes: 1 physical layer(s) for 4 applications" in stdout
    assert "heads kept: 12/16" in stdout  # head 3 is gone from the shared layer, at every depth
