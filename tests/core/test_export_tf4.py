"""`headcount export --format hf` writes checkpoints that transformers 4.x runs as 5.x does.

transformers 5 keeps the rope settings only in ``rope_parameters`` and names its tokenizer class
``TokenizersBackend``; 4.x reads neither, and loads such a checkpoint with its default rope theta
(10,000) and no error: wrong answers. The export adds the keys 4.x reads
(``headcount.core.export_compat``).

The 4.57 tests run transformers 4.57 in a subprocess, from its own folder (``make tf4``) ahead of
the venv on PYTHONPATH: torch, numpy and safetensors come from the venv. They compare the
4.57-loaded checkpoint with headcount's pruned model (logits, greedy tokens, token ids), and check
that the same checkpoint without the added keys does disagree (the comparison can fail).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import HEADS, LAYERS, clone, tiny_model
from niah_helpers import SENTENCES, niah_tokenizer

from headcount.core import export_compat
from headcount.core.export import export_hf
from headcount.core.gates import layout
from headcount.core.masks import Mask
from headcount.core.surgery import shrink

#: where ``make tf4`` installs transformers 4.57 (the Makefile's HEADCOUNT_TF4 default)
TF4 = Path(os.environ.get("HEADCOUNT_TF4") or Path.home() / ".cache" / "headcount-tf4")
#: max |logits 4.57 - logits headcount| / max |logits headcount|
RTOL = 1e-4
NEW_TOKENS = 8
ROPE_THETA = 1e5  # not 4.x's default (1e4): a config 4.x misreads is caught
#: the exported cases: table row, config arguments (rope settings 4.x reads under other names)
CASES = {
    "llama": ("llama", dict(rope_theta=ROPE_THETA)),
    "llama-linear": ("llama", dict(rope_theta=ROPE_THETA, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2": ("qwen2", dict(rope_theta=ROPE_THETA)),
    # rope nested by layer type: global theta for full attention, a local one for sliding layers
    "gemma3": ("gemma3", dict(rope_theta=ROPE_THETA, rope_local_base_freq=5e3)),
}

#: run by transformers 4.57: argv = job file (torch.save'd {case: {dir, batch, prompts}}), result file
CHILD = r"""
import sys, torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
jobs = torch.load(sys.argv[1], weights_only=True)
out = {"version": transformers.__version__}
for name, job in jobs.items():
    model = AutoModelForCausalLM.from_pretrained(job["dir"], attn_implementation="eager").eval()
    row = {}
    with torch.no_grad():
        row["logits"] = model(**job["batch"]).logits
        row["greedy"] = [model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=job["new"],
                                        min_new_tokens=job["new"], do_sample=False, pad_token_id=0)
                         for p in job["prompts"]]
    if job["texts"]:
        tok = AutoTokenizer.from_pretrained(job["dir"])
        row["tokenizer"] = type(tok).__name__
        row["ids"] = [torch.tensor(tok(t)["input_ids"]) for t in job["texts"]]
    out[name] = row
torch.save(out, sys.argv[2])
"""


def kv_group_cut(model):
    """KV group 1 removed in every layer (its query heads with it): 2 query heads on 1 KV head."""
    size = layout(model).group_size
    return shrink(clone(model), Mask.for_model(model).without_heads(
        [(x, h) for x in range(LAYERS) for h in range(HEADS - size, HEADS)]))


def greedy(model, prompt: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                              min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``{case: (pruned model, export dir, tokenizer, texts)}``, plus ``llama-old``: the llama
    export without the added config keys (what headcount wrote before)."""
    root = tmp_path_factory.mktemp("tf4")
    tok = niah_tokenizer()
    out = {}
    for name, (arch, kwargs) in CASES.items():
        model = tiny_model(arch, head="lm", attn_implementation="eager", vocab_size=len(tok), **kwargs)
        small = kv_group_cut(model)
        export_hf(small, root / name, tokenizer=tok)
        out[name] = (small, root / name, tok)
    old = root / "llama-old"
    shutil.copytree(root / "llama", old)
    export_compat.drop_legacy_keys(old, export_compat.legacy_config_keys(out["llama"][0].config))
    out["llama-old"] = (out["llama"][0], old, tok)
    return out


def prompts(tok) -> list[torch.Tensor]:
    return [torch.tensor([tok(t)["input_ids"][:10]]) for t in SENTENCES[:3]]


def batch(tok) -> dict:
    """Three sentences, right-padded to the longest (at most 24 tokens)."""
    return dict(tok(list(SENTENCES[3:6]), padding=True, truncation=True, max_length=24, return_tensors="pt"))


@pytest.fixture(scope="module")
def tf4_results(exported, tmp_path_factory):
    """What transformers 4.57 computes for every export (one subprocess for all)."""
    if not TF4.is_dir():
        pytest.skip(f"transformers 4.57 is not installed in {TF4}: run `make tf4`")
    root = tmp_path_factory.mktemp("tf4-run")
    jobs = {name: {"dir": str(d), "batch": batch(tok), "prompts": prompts(tok), "new": NEW_TOKENS,
                   "texts": [] if name == "llama-old" else list(SENTENCES[:3])}
            for name, (_, d, tok) in exported.items()}
    torch.save(jobs, root / "jobs.pt")
    env = {**os.environ, "PYTHONPATH": str(TF4), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(root / "jobs.pt"), str(root / "out.pt")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = torch.load(root / "out.pt", weights_only=True)
    assert result["version"].startswith("4.57."), result["version"]  # 4.57 shadowed the venv's 5.x
    return result


def relative(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> float:
    """max |got - want| over the unpadded positions, over max |want| there."""
    keep = mask.bool()
    return float((got[keep] - want[keep]).abs().max() / want[keep].abs().max())


@pytest.mark.parametrize("name", list(CASES))
def test_transformers_4_57_runs_the_export_as_headcount_does(name, exported, tf4_results):
    small, _, tok = exported[name]
    row, b = tf4_results[name], batch(tok)
    assert relative(row["logits"], logits(small, b), b["attention_mask"]) <= RTOL
    for prompt, got in zip(prompts(tok), row["greedy"]):
        assert torch.equal(got, greedy(small, prompt))
    assert row["tokenizer"] == "PreTrainedTokenizerFast"  # the class 4.57 knows (5.x wrote TokenizersBackend)
    assert [ids.tolist() for ids in row["ids"]] == [tok(t)["input_ids"] for t in SENTENCES[:3]]


def test_without_the_added_keys_transformers_4_57_answers_wrong(exported, tf4_results):
    """The old export (rope settings in rope_parameters only): 4.57 takes its default theta."""
    small, _, tok = exported["llama-old"]
    b = batch(tok)
    assert relative(tf4_results["llama-old"]["logits"], logits(small, b), b["attention_mask"]) > 10 * RTOL


# -- what transformers 5 sees (no 4.57 needed) ------------------------------------------------
def test_the_config_carries_both_layouts_and_5x_reads_it_back(exported, tmp_path):
    for name, (arch, kwargs) in CASES.items():
        small, d, tok = exported[name]
        data = json.loads((d / "config.json").read_text())
        assert data["rope_parameters"] == small.config.rope_parameters  # 5.x's layout, as it was
        assert data["rope_theta"] == ROPE_THETA
        assert transformers.AutoConfig.from_pretrained(d).rope_parameters == small.config.rope_parameters
        tok_config = json.loads((d / "tokenizer_config.json").read_text())
        assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
        # 5.x picks the same class as from the name it wrote (its own choice: for a qwen2 config
        # it takes Qwen2Tokenizer whatever the file names), with the same ids
        orig = tmp_path / name
        shutil.copytree(d, orig)
        (orig / "tokenizer_config.json").write_text(json.dumps({**tok_config, "tokenizer_class": "TokenizersBackend"}))
        renamed, written = (transformers.AutoTokenizer.from_pretrained(x) for x in (d, orig))
        assert type(renamed) is type(written)
        assert [renamed(t)["input_ids"] for t in SENTENCES[:3]] == [written(t)["input_ids"] for t in SENTENCES[:3]]
    assert json.loads((exported["llama-linear"][1] / "config.json").read_text())["rope_scaling"] == {
        "rope_type": "linear", "factor": 2.0}
    assert "rope_scaling" not in json.loads((exported["llama"][1] / "config.json").read_text())
    assert json.loads((exported["gemma3"][1] / "config.json").read_text())["rope_local_base_freq"] == 5e3


def test_keys_5x_would_read_differently_are_not_written(tmp_path, monkeypatch):
    """A legacy key that would change what 5.x loads is dropped again (with a warning)."""
    model = kv_group_cut(tiny_model("llama", head="lm", rope_theta=ROPE_THETA))
    monkeypatch.setattr(export_compat, "legacy_config_keys",
                        lambda config: {"rope_theta": ROPE_THETA, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    with pytest.warns(UserWarning, match="no transformers 4.x rope keys"):
        _, diff = export_hf(model, tmp_path / "plain")
    data = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert "rope_scaling" not in data and "rope_theta" not in data
    assert diff <= 1e-5
