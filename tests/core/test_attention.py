"""Per-head attention probabilities on demand (headcount.core.attention), for every adapter."""

from __future__ import annotations

import pytest
import torch
from conftest import HEADS, clone, tiny_batch, tiny_model

from headcount.core.attention import attention_maps
from headcount.core.gates import gated, layout, shared_groups
from headcount.core.surgery import prune_heads


def maps_of(model, batch):
    with torch.no_grad():
        return attention_maps(model, **batch)


def test_maps_are_probabilities_per_application(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    bsz, seq = batch["input_ids"].shape
    n_layers, n_heads = layout(model)
    maps = maps_of(model, batch)
    assert len(maps) == n_layers
    real = batch["attention_mask"].bool()
    # a real query never attends to a padded key (what padded queries do differs by model)
    padded_key_of_real_query = real[:, None, :, None] & ~real[:, None, None, :]  # [batch, 1, seq_q, seq_k]
    for m in maps:
        assert m.shape == (bsz, n_heads, seq, seq)
        assert torch.allclose(m.sum(-1), torch.ones(bsz, n_heads, seq), atol=1e-5)
        assert m.masked_select(padded_key_of_real_query).abs().max() < 1e-6
    # every application has its own maps, shared layers included
    for a, b in zip(maps, maps[1:]):
        assert (a - b).abs().max() > 1e-3


def test_maps_of_pruned_model_are_the_kept_heads(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    n_layers, n_heads = layout(model)
    pruned = clone(model)
    prune_heads(pruned, {0: list(range(n_heads)), n_layers - 1: [1, 2]})
    removed = {}
    for group in shared_groups(model):  # a shared layer loses the heads at every depth
        union = set().union(*({0: set(range(n_heads)), n_layers - 1: {1, 2}}.get(a, set()) for a in group))
        removed.update({a: union for a in group})
    g = torch.ones(n_layers, n_heads)
    for app, heads in removed.items():
        g[app, sorted(heads)] = 0
    with gated(model, heads=g):  # same hidden states as the pruned model
        expected = maps_of(model, batch)
    got = maps_of(pruned, batch)
    bsz, seq = batch["input_ids"].shape
    for app in range(n_layers):
        kept = [h for h in range(n_heads) if h not in removed.get(app, set())]
        assert got[app].shape == (bsz, len(kept), seq, seq)
        assert torch.allclose(got[app], expected[app][:, kept], atol=1e-5)
    assert got[0].shape == (bsz, 0, seq, seq)


def test_maps_under_sdpa_equal_eager_and_sdpa_is_restored(arch):
    probe = tiny_model(arch)
    if not getattr(probe, "_supports_sdpa", False):
        pytest.skip(f"{type(probe).__name__} has no sdpa implementation")
    sdpa = tiny_model(arch, attn_implementation="sdpa")
    eager = tiny_model(arch, attn_implementation="eager")
    batch = tiny_batch(sdpa)
    assert sdpa.config._attn_implementation == "sdpa"
    got, expected = maps_of(sdpa, batch), maps_of(eager, batch)
    assert len(got) == len(expected) == layout(sdpa)[0]
    for a, b in zip(got, expected):
        assert a.shape[1] == HEADS
        assert torch.allclose(a, b, atol=1e-6)
    assert sdpa.config._attn_implementation == "sdpa"
    assert eager.config._attn_implementation == "eager"
    with torch.no_grad():  # and it still runs, on sdpa, with the same outputs as eager
        assert torch.allclose(sdpa(**batch).logits, eager(**batch).logits, atol=1e-5)


def test_implementation_is_restored_after_an_error():
    model = tiny_model("bert", attn_implementation="sdpa")
    with pytest.raises(Exception):
        attention_maps(model, input_ids=torch.full((1, 3), 10_000))  # out of the vocabulary
    assert model.config._attn_implementation == "sdpa"
    # and no capture hook is left behind: a later call records exactly one map per layer
    batch = tiny_batch(model)
    assert len(maps_of(model, batch)) == layout(model)[0]
