"""``headcount export --format gguf`` (``headcount.core.export_gguf``): a pruned decoder as a GGUF
file, re-read with ``gguf.GGUFReader`` and headcount's own GGUF loader, and run by llama.cpp's
``llama-simple`` (built by ``make llama-cpp``; those tests are skipped without it) with the same
greedy tokens as headcount.

The cuts, on a tiny random Llama (3 layers x 4 query heads on 2 KV heads, head size 8):
(U) KV group 1 removed in every layer (``llama``, scalar counts); (N) KV group 1 removed in layer 1,
every head of layer 2, and the MLPs of layers 0 and 2 (``deci``, per-layer counts); (N0) every
head of layer 0 and the MLP of layer 1 (layer 0 written with one zero head).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_error_line, run_cli
from conftest import tiny_model

import headcount as hc
from headcount.core.export_gguf import GGUF_MARKER, export_gguf, gguf_plan, read_plan
from headcount.core.gates import layout
from headcount.core.masks import Mask
from headcount.core.surgery import save_pruned, shrink
from headcount.runtime.errors import HeadcountError

gguf = pytest.importorskip("gguf")

#: per cut: (heads removed [(layer, head)], MLPs removed)
CUTS = {
    "U": ([(layer, h) for layer in range(3) for h in (2, 3)], []),
    "N": ([(1, 2), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)], [0, 2]),
    "N0": ([(0, h) for h in range(4)], [1]),
}
#: the per-layer counts each cut's file states: (arch, n_head, n_head_kv, n_ff)
STATED = {
    "U": ("llama", [2, 2, 2], [1, 1, 1], [37, 37, 37]),
    "N": ("deci", [4, 2, 0], [2, 1, 0], [1, 37, 1]),
    "N0": ("deci", [1, 4, 4], [1, 2, 2], [37, 1, 37]),
}
PROMPTS = ["Hello my name is", "The cat sat on", "A quiet river"]
N_PREDICT = 16


def byte_tokenizer():
    """A byte-level BPE tokenizer (GPT-2's pre-tokenizer) of 3 special tokens, a space and the
    letters and a few marks, and one merge: each token's text is one character but ``Ġt``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = ["Ġ", *"abcdefghijklmnopqrstuvwxyz", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ", *".,!?'", "Ġt"]
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", *chars])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def tiny_lm(seed: int = 0):
    """A tiny random Llama without biases (the GGUF layout has none), vocabulary = the tokenizer's."""
    return tiny_model("llama", head="lm", seed=seed, attention_bias=False, mlp_bias=False,
                      vocab_size=len(byte_tokenizer()))


def pruned(cut: str, seed: int = 0):
    model = tiny_lm(seed)
    heads, mlps = CUTS[cut]
    mask = Mask.full(*layout(model)).without_heads(heads)
    return shrink(model, mask.without_mlps(mlps) if mlps else mask)


def export(model, path: Path, gguf_type: str = "f32"):
    return export_gguf(model, path, gguf_type, tokenizer=byte_tokenizer())


#: the smallest top-1 minus top-2 logit the tiny models' greedy paths must keep (measured 2.7e-3
#: to 2.1e-2, logits of scale ~1.5): well above what llama-simple's f16 KV cache moves them by
#: (its rounding is ~5e-4 of the K/V values), so a matching text is the layout's doing, not luck
MIN_MARGIN = 1e-3


@torch.no_grad()
def greedy(model, ids: list[int], n: int, eos: int) -> tuple[list[int], float]:
    """headcount's greedy continuation (full recompute each step), ending before ``eos``, and
    its smallest margin (top-1 minus top-2 logit)."""
    out, margin = list(ids), float("inf")
    for _ in range(n):
        logits = model(torch.tensor([out])).logits[0, -1]
        top = logits.topk(2).values
        margin = min(margin, float(top[0] - top[1]))
        nxt = int(logits.argmax())
        if nxt == eos:
            break
        out.append(nxt)
    return out[len(ids):], margin


# -- the file, without llama.cpp -----------------------------------------------------------------
@pytest.mark.parametrize("cut", sorted(CUTS))
def test_file_states_the_pruned_counts_and_shapes(cut, tmp_path):
    model = pruned(cut)
    plan, check = export(model, tmp_path / "m.gguf")
    arch, n_head, n_kv, n_ff = STATED[cut]
    assert read_plan(tmp_path / "m.gguf") == {"arch": arch, "n_head": n_head, "n_head_kv": n_kv, "n_ff": n_ff}
    assert check["max_abs_diff"] <= 1e-6  # f32: the file read back is the model
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    shapes = {t.name: [int(x) for x in t.shape] for t in reader.tensors}  # innermost first
    for i in range(3):
        if n_head[i] == 0:  # attention-free: no attention tensor, norm included
            assert not any(k.startswith(f"blk.{i}.attn") for k in shapes)
        else:
            assert shapes[f"blk.{i}.attn_q.weight"] == [32, 8 * n_head[i]]
            assert shapes[f"blk.{i}.attn_k.weight"] == [32, 8 * n_kv[i]]
            assert shapes[f"blk.{i}.attn_output.weight"] == [8 * n_head[i], 32]
        assert shapes[f"blk.{i}.ffn_down.weight"] == [n_ff[i], 32]
    placeholders = [i for i in range(3) if i in CUTS[cut][1]]
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    for i in placeholders:  # a removed MLP: width 1 of zeros (n_ff 0 would skip the whole layer)
        assert not tensors[f"blk.{i}.ffn_down.weight"].any()
    assert reader.fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == model.config.vocab_size


def test_uniform_cut_reads_back_through_headcounts_gguf_loader(tmp_path, monkeypatch):
    """(U) is written as ``llama``, which transformers' GGUF reader knows: ``load_model`` of the
    file gives the pruned model's logits (q/k un-permuted by transformers, head size from the
    rope dimension)."""
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    model = pruned("U")
    export(model, tmp_path / "u.gguf")
    back = hc.load_model(str(tmp_path / "u.gguf"))
    ids = torch.tensor([[3, 9, 14, 20, 5, 31, 60], [4, 4, 50, 7, 8, 9, 10]])
    with torch.no_grad():
        want, got = model(ids).logits, back(ids).logits
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-5


def test_per_layer_cut_is_not_read_by_transformers(tmp_path, monkeypatch):
    """(N) is written as ``deci``, an architecture transformers' GGUF reader does not have:
    headcount's loader refuses it in one line (llama.cpp runs it: the tests below)."""
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    export(pruned("N"), tmp_path / "n.gguf")
    with pytest.raises(HeadcountError) as e:
        hc.load_model(str(tmp_path / "n.gguf"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("gguf_type, q_type", [("f16", "F16"), ("bf16", "BF16"), ("q8_0", "Q8_0")])
def test_types(gguf_type, q_type, tmp_path):
    model = pruned("N")
    _, check = export(model, tmp_path / "m.gguf", gguf_type)
    assert check["max_abs_diff"] <= 1e-5  # the file is the model with its weights rounded so
    assert 0 < check["type_diff"] < 0.1 * check["scale"]  # ... and the rounding moves the logits
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    assert types["blk.0.attn_q.weight"] == q_type
    assert types["blk.0.attn_norm.weight"] == "F32"
    # 37 neurons: not a multiple of q8_0's 32-value blocks, stored f16 (the converter's fallback)
    assert types["blk.1.ffn_down.weight"] == ("F16" if gguf_type == "q8_0" else q_type)


def test_refusals_are_one_line():
    with pytest.raises(HeadcountError, match="encoder") as e:
        gguf_plan(tiny_model("bert", head="mlm"))
    assert "\n" not in str(e.value)
    with pytest.raises(HeadcountError, match="GGUF layout") as e:
        gguf_plan(tiny_model("qwen2", head="lm"))
    assert "\n" not in str(e.value)
    with pytest.raises(HeadcountError, match="bias") as e:
        gguf_plan(tiny_model("llama", head="lm"))  # the table's Llama has attention and MLP biases
    assert "\n" not in str(e.value)


def test_command_writes_a_sealed_file_and_refuses_a_bad_type(tmp_path, capsys):
    ckpt = save_pruned(pruned("N"), tmp_path / "pruned", tokenizer=byte_tokenizer())
    out = tmp_path / "m.gguf"
    code, stdout, err = run_cli(capsys, "export", "--model", ckpt, "--format", "gguf", "--out", out)
    assert code == 0, err
    assert "GGUF (deci, f32)" in stdout and "read back vs PyTorch" in stdout
    marker = json.loads(gguf.GGUFReader(str(out)).fields[GGUF_MARKER].contents())
    assert marker["command"] == "export" and "0" * 64 not in marker["seal"]
    code, _, err = run_cli(capsys, "export", "--model", ckpt, "--format", "gguf", "--out", out)
    assert code == 0, err  # the same export again replaces its own file
    code, _, err = run_cli(capsys, "export", "--model", ckpt, "--format", "gguf", "--gguf-type", "q4", "--out", out)
    assert_one_error_line(code, err)
    code, _, err = run_cli(capsys, "export", "--model", ckpt, "--format", "gguf", "--gguf-type", "f16", "--out", out)
    assert_one_error_line(code, err)  # another type is another export: --force needed


# -- llama.cpp ------------------------------------------------------------------------------------
def llama_simple() -> Path:
    """The binary ``make llama-cpp`` built (named in its ``llama-simple.ok``, written last)."""
    root = Path(os.environ.get("HEADCOUNT_LLAMACPP") or Path.home() / ".cache" / "headcount-llamacpp")
    ok = root / "llama-simple.ok"
    binary = Path(ok.read_text().strip()) if ok.is_file() else None
    if binary is None or not os.access(binary, os.X_OK):
        pytest.skip(f"no llama-simple build in {root}: run `make llama-cpp` (builds llama.cpp from the "
                    "llama-cpp-python sdist, about 15 minutes on 2 cores)")
    return binary


def run_llama_simple(binary: Path, model: Path, prompt: str, n: int) -> str:
    """llama-simple's output text: the prompt's tokens, then the greedy continuation (to EOS or ``n``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(binary), "-m", str(model), "-n", str(n), prompt], capture_output=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode("utf-8", errors="replace").removesuffix("\n")


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_llama_simple_greedy_tokens_equal_headcounts(cut, tmp_path):
    """llama-simple (f32 weights, its default f16 KV cache) continues each prompt with the tokens
    headcount's pruned model picks. The tiny model's smallest greedy margin (top-1 minus top-2
    logit) is checked to be far above the f16 cache's rounding (:data:`MIN_MARGIN`), so an equal text is what an exact
    layout gives, not luck: written without the q/k permutation, all 3 prompts differ in each cut."""
    binary = llama_simple()
    model, tok = pruned(cut), byte_tokenizer()
    path = tmp_path / f"{cut}.gguf"
    export(model, path)
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        new, margin = greedy(model, ids, N_PREDICT, tok.eos_token_id)
        assert margin > MIN_MARGIN, (cut, prompt, margin)  # the test's own precondition
        want = tok.decode(ids + new, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert run_llama_simple(binary, path, prompt, N_PREDICT) == want, (cut, prompt)
