"""Decoders: query heads and key/value (KV) groups; gates, surgery and reloads agree exactly.

Every test runs once per decoder row of the architecture table in conftest.py (``decoder``
fixture): tiny random causal LMs, grouped-query attention (4 query heads reading 2 KV heads) where
the family has it, multi-head attention otherwise (GPT-2, GPT-NeoX). The masks mix the two levels:
a whole KV group, an uneven query-head cut (K/V heads repeated, the cost reported), an even one
(one query head per group), and a layer with no head left.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    ARCHS,
    DECODER_IDS,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    LAYERS,
    clone,
    outputs,
    tiny_batch,
    tiny_model,
)

from headcount.core.arch import get_adapter
from headcount.core.gates import gated, kept_heads, kept_kv_heads, layout
from headcount.core.masks import Mask
from headcount.core.arch.base import out_dim
from headcount.core.surgery import count_parameters, kv_summary, load_pruned, prune_neurons, save_pruned, shrink
from headcount.runtime.errors import HeadcountError

ATOL = 1e-5
VISIBLE = 1e-2  # removing heads of a tiny decoder moves its logits by ~1


def gqa(arch: str) -> bool:
    return ARCHS[arch].kv_heads < HEADS


def mixed_mask(model) -> Mask:
    """Layer 0: KV group 1 whole (query heads 2, 3); layer 1: query head 1 alone (uneven: group 0
    keeps 1 head, group 1 keeps 2 -> K/V head 1 is stored twice); layer 2: heads 0 and 3 (one per
    group: even, nothing repeated)."""
    return Mask.for_model(model).without_heads([(0, 2), (0, 3), (1, 1), (2, 0), (2, 3)])


#: the expected key/value slots (original KV head of each) of the mixed mask, per layer
MIXED_SLOTS_GQA = [[0], [0, 1, 1], [0, 1]]
MIXED_SLOTS_MHA = [[0, 1], [0, 2, 3], [1, 2]]


def attn_implementations(arch: str) -> list[str]:
    """Gemma2 has no sdpa path in transformers 5.24 (its soft-capping needs eager)."""
    return ["eager"] if arch == "gemma2" else ["eager", "sdpa"]


def test_layout_has_the_kv_level(decoder):
    model = tiny_model(decoder, head="lm")
    grid = layout(model)
    assert (grid.n_layers, grid.n_heads, grid.head_dim) == (LAYERS, HEADS, HEAD_DIM)
    assert grid.n_kv_heads == ARCHS[decoder].kv_heads
    assert grid.group_size == HEADS // ARCHS[decoder].kv_heads


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_gate_equals_surgery_equals_reload_on_a_mixed_mask(decoder, impl, tmp_path):
    if impl not in attn_implementations(decoder):
        pytest.skip(f"{decoder} has no {impl} attention in transformers")
    model = tiny_model(decoder, head="lm", attn_implementation=impl)
    batch = tiny_batch(model)
    mask = mixed_mask(model)
    full = outputs(model, batch)
    with gated(model, heads=mask.heads):
        gate = outputs(model, batch)
    before = count_parameters(model)
    small = shrink(clone(model), mask)
    cut = outputs(small, batch)
    assert (gate - full).abs().max() > VISIBLE
    assert (gate - cut).abs().max() <= ATOL
    slots = [kept_kv_heads(b.out_projection, layout(model).n_kv_heads) for b in get_adapter(small).blocks(small)]
    assert slots == (MIXED_SLOTS_GQA if gqa(decoder) else MIXED_SLOTS_MHA)
    # the KV cost is reported: slots kept over the model's, and how many are repeats
    kv = kv_summary(small)
    assert kv == {"kv_heads_total": LAYERS * ARCHS[decoder].kv_heads, "kv_heads_kept": sum(map(len, slots)),
                  "kv_heads_repeated": 1 if gqa(decoder) else 0}
    assert count_parameters(small) < before
    save_pruned(small, tmp_path / "p")
    again = load_pruned(tmp_path / "p")
    assert (outputs(again, batch) - cut).abs().max() <= ATOL
    assert again.config.headcount_pruning["kv_heads"] == slots


def test_whole_kv_group_removes_its_key_value_rows(decoder):
    """A whole KV group takes its K/V rows with it (the only removal that shrinks the KV cache);
    query heads inside kept groups take only their query rows and output columns."""
    model = tiny_model(decoder, head="lm")
    size = HEADS // ARCHS[decoder].kv_heads
    bias = ARCHS[decoder].bias
    q_head = HEAD_DIM * HIDDEN + HEAD_DIM * HIDDEN  # query rows + output-projection columns
    kv_head = 2 * HEAD_DIM * HIDDEN  # key rows + value rows
    before = count_parameters(model)
    group = shrink(clone(model), Mask.for_model(model).without_heads([(0, h) for h in range(size)]))
    # biases: q/k/v rows carry one each where the family has them (counted from the module)
    block = get_adapter(model).blocks(model)[0]
    has_bias = [p.bias is not None for p in block.head_projections]
    q_bias = HEAD_DIM if has_bias[0] and bias else 0
    kv_bias = 2 * HEAD_DIM if has_bias[-1] and bias else 0
    # per-head norm weights [heads, head_dim] (Cohere): head_dim per query head, per KV head
    norms = sum(HEAD_DIM * (size if unit == "q" else 1) for _, _, unit in block.per_head)
    assert before - count_parameters(group) == size * (q_head + q_bias) + kv_head + kv_bias + norms
    assert bool(block.per_head) == (decoder == "cohere")
    assert kv_summary(group)["kv_heads_kept"] == LAYERS * ARCHS[decoder].kv_heads - 1


def test_pruning_twice_equals_pruning_once(decoder):
    """Surgery on a shrunk model uses original head ids and finds repeated K/V heads again."""
    model = tiny_model(decoder, head="lm")
    batch = tiny_batch(model)
    once = shrink(clone(model), Mask.for_model(model).without_heads([(1, 1), (1, 2)]))
    twice = shrink(clone(model), Mask.for_model(model).without_heads([(1, 1)]))
    twice = shrink(twice, Mask.for_model(model).without_heads([(1, 2)]))
    assert (outputs(once, batch) - outputs(twice, batch)).abs().max() <= ATOL
    blocks = get_adapter(twice).blocks(twice)
    assert kept_heads(blocks[1].out_projection, HEADS) == [0, 3]


def test_gates_on_a_shrunk_decoder_use_original_head_ids(decoder):
    model = tiny_model(decoder, head="lm")
    batch = tiny_batch(model)
    small = shrink(clone(model), mixed_mask(model))
    both = mixed_mask(model).without_heads([(1, 3)])
    with gated(model, heads=both.heads):
        want = outputs(model, batch)
    with gated(small, heads=both.heads):
        got = outputs(small, batch)
    assert (want - got).abs().max() <= ATOL


def test_a_layer_without_heads_and_an_empty_model(decoder):
    model = tiny_model(decoder, head="lm")
    batch = tiny_batch(model)
    for mask in (Mask.for_model(model).without_heads([(1, h) for h in range(HEADS)]),
                 Mask.for_model(model).without_heads([(x, h) for x in range(LAYERS) for h in range(HEADS)])):
        with gated(model, heads=mask.heads):
            want = outputs(model, batch)
        assert (want - outputs(shrink(clone(model), mask), batch)).abs().max() <= ATOL


def test_mlp_and_neuron_surgery_on_decoders(decoder):
    model = tiny_model(decoder, head="lm")
    batch = tiny_batch(model)
    mask = Mask.for_model(model).without_mlps([1])
    with gated(model, mlps=mask.mlps):
        want = outputs(model, batch)
    assert (want - outputs(model, batch)).abs().max() > VISIBLE
    assert (want - outputs(shrink(clone(model), mask), batch)).abs().max() <= ATOL


def test_neuron_surgery_on_gated_mlps_is_exact(decoder, tmp_path):
    """Removing feed-forward neurons of a gated MLP (gate_proj, up_proj, down_proj; Phi-3's fused
    gate_up_proj) equals zeroing their down_proj columns, and survives a reload."""
    model = tiny_model(decoder, head="lm")
    batch = tiny_batch(model)
    size = get_adapter(model).intermediate_size(model.config)
    remove = {0: [1, 3, 5], 1: list(range(0, size, 2)), 2: [size - 1]}
    ref = clone(model)
    with torch.no_grad():
        for app, ids in remove.items():
            out = get_adapter(ref).blocks(ref)[app].ffn_out
            if type(out).__name__ == "Conv1D":
                out.weight[ids, :] = 0
            else:
                out.weight[:, ids] = 0
    want = outputs(ref, batch)
    assert (want - outputs(model, batch)).abs().max() > VISIBLE
    pruned = prune_neurons(clone(model), remove)
    block = get_adapter(pruned).blocks(pruned)[1]
    for proj in (block.ffn_in, *block.ffn_in_extra):  # every input projection lost the rows
        assert proj.weight.shape[out_dim(proj)] == (size - len(remove[1])) * (2 if proj is block.ffn_in
                                                                              and ARCHS[decoder].ffn_in_chunks == 2 else 1)
    assert (want - outputs(pruned, batch)).abs().max() <= ATOL
    assert (want - outputs(load_pruned(save_pruned(pruned, tmp_path / "p")), batch)).abs().max() <= ATOL


@pytest.mark.parametrize("arch", [a for a in DECODER_IDS if a != "cohere"])
def test_sequence_classification_on_decoders(arch):
    """A decoder with a classification head (it reads the last non-padding token); Cohere has none."""
    model = tiny_model(arch, head="classification")
    batch = tiny_batch(model)
    mask = mixed_mask(model)
    with gated(model, heads=mask.heads):
        want = outputs(model, batch)
    assert (want - outputs(shrink(clone(model), mask), batch)).abs().max() <= ATOL


# --- the mask's two levels -------------------------------------------------------------------
def test_mask_states_kv_groups_for_gqa_decoders_only():
    llama = tiny_model("llama", head="lm")
    mask = mixed_mask(llama)
    d = mask.to_dict()
    assert d["kv_groups"] == [[1, 0], [1, 1], [1, 1]] and d["n_kv_groups_kept"] == 5
    assert Mask.from_dict(d) == mask and Mask.from_dict(d).n_kv_heads == 2
    # no grouped-query attention, or an encoder: the format is the encoders' (no kv_groups)
    assert "kv_groups" not in mixed_mask(tiny_model("gpt2", head="lm")).to_dict()
    enc = Mask.for_model(tiny_model("bert")).without_heads([(0, 1)])
    assert set(enc.to_dict()) == {"heads", "mlps", "n_heads_kept", "n_mlps_kept"}


def test_a_mask_given_as_kv_groups():
    model = tiny_model("qwen3", head="lm")
    only = Mask.from_dict({"kv_groups": [[1, 0], [1, 1], [0, 0]], "n_heads": HEADS})
    assert only.check_model(model).heads.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    both = Mask.from_dict({"heads": [[1, 0, 1, 1]] * 3, "kv_groups": [[1, 0], [1, 1], [1, 1]]})
    assert both.heads[0].tolist() == [1, 0, 0, 0] and both.kv_groups.tolist() == [[1, 0], [1, 1], [1, 1]]
    assert Mask.for_model(model).without_kv_groups([(2, 0)]).heads[2].tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("arch, doc, message", [
    ("gpt2", {"kv_groups": [[1, 0, 1, 1]] * 3, "n_heads": 4}, "no grouped-query attention"),
    ("bert", {"kv_groups": [[1, 0]] * 3, "n_heads": 4}, "encoder"),
    ("llama", {"kv_groups": [[1, 0, 1, 1]] * 3, "n_heads": 4}, "4 key/value groups per layer, the model has 2"),
    ("llama", {"heads": [[1] * 4] * 2}, "mask is for 2 layers x 4 heads"),
    ("llama", {"heads": [[1] * 3] * 3, "kv_groups": [[1, 1]] * 3}, "does not fit heads"),
    ("llama", {"kv_groups": [[1, 1]] * 3}, "needs 'n_heads'"),
    ("llama", {"kv_groups": [[1, 1]] * 3, "n_heads": 3}, "do not split"),
])
def test_masks_that_do_not_fit_are_refused(arch, doc, message):
    model = tiny_model(arch, head="lm" if ARCHS[arch].decoder else "classification")
    with pytest.raises(HeadcountError, match=message):
        Mask.from_dict(doc).check_model(model)


def test_refused_and_unknown_decoder_types():
    import transformers

    olmo = transformers.AutoModelForCausalLM.from_config(transformers.Olmo2Config(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37))
    with pytest.raises(HeadcountError, match="model type 'olmo2' is not supported: its q/k norm"):
        layout(olmo)
    with pytest.raises(HeadcountError, match="model type 'bloom' is not supported; supported types: .*llama"):
        layout(transformers.AutoModelForCausalLM.from_config(transformers.BloomConfig(
            vocab_size=99, hidden_size=32, n_layer=1, n_head=4)))
