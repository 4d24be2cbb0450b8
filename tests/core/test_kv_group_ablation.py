"""``--unit kv-groups`` ranks key/value groups as removing them does.

A KV group's removal is its query heads' contexts zeroed together. With one KV head per layer
the group is the whole attention block. Behind a norm after the attention block (Gemma 2/3's
``post_attention_layernorm``) the layer's head gradients sum to ~0 (the RMSNorm's scale
invariance), so a score built from them says nothing about removing all of them; the gradient
scorer then also records the attention gate's gradient (``Scores.attention [L]``, after the
norm: gate 0 = the group removed) and ``kv_pool`` (``sum``) uses it when n_kv == 1.

With 2 KV heads behind such a norm no first-order gate score ranks the groups (measured, fair
models of tests/core/test_gate_ablation.py, 4 seeds): the summed |head gradients| give Spearman
-0.22 to 0.35 with exact group removal; the gradient of one gate on each group (the sum of its
heads' signed gradients) 0.57-0.89, but it is the same magnitude for both groups of a layer
(their gradients sum to ~0), so it ranks layers, not the groups inside one. That case is
documented (docs/importance.md), not asserted. A llama-style model (no post-norm) is the control:
summed |head gradients| 0.61-0.78, the group gate 0.996-0.999.
"""

from __future__ import annotations

import torch
from test_gate_ablation import SPEARMAN, fair_model, rho, signed_gradients

from headcount.core.gates import gated, layout
from headcount.importance.scores import Scores, kv_pool
from headcount.importance.scoring import gradient_scores


def group_removal(model, batch, n_kv: int) -> torch.Tensor:
    """``[L, n_kv]``: the exact loss change when each KV group's query heads alone are gated off."""
    n_layers, n_heads = layout(model)
    per = n_heads // n_kv
    out = torch.zeros(n_layers, n_kv)
    with torch.no_grad():
        base = float(model(**batch).loss)
        for layer in range(n_layers):
            for group in range(n_kv):
                g = torch.ones(n_layers, n_heads)
                g[layer, group * per:(group + 1) * per] = 0
                with gated(model, heads=g):
                    out[layer, group] = float(model(**batch).loss) - base
    return out


def test_one_kv_head_behind_a_post_norm_is_scored_by_the_attention_gate():
    model, batch = fair_model("gemma3", heads=4, num_key_value_heads=1)
    s = gradient_scores(model, [batch])
    exact = group_removal(model, batch, 1)
    _, _, da = signed_gradients(model, batch, attention=True)
    assert s.attention is not None and s.attention.shape == (layout(model).n_layers,)
    assert torch.allclose(s.attention, da.abs(), rtol=1e-4, atol=1e-7)  # |sum of batch gradients|
    groups = kv_pool(s, 1, "sum")
    assert torch.equal(groups[:, 0], s.attention)
    assert rho(groups, exact) >= SPEARMAN  # measured 0.94-0.96 over 4 seeds
    # the heads' |gradients| summed: what kv-groups used before; they do not measure the group
    assert rho(kv_pool(s.heads, 1, "sum"), exact) < SPEARMAN
    # what `score --unit kv-groups` writes to scores.json is that score too
    from headcount.cli.api import _kv_group_meta

    written = _kv_group_meta(model, s, "kv-groups")["kv_groups"]
    assert torch.allclose(torch.tensor(written)[:, 0], s.attention)


def test_the_attention_importance_round_trips_and_old_files_still_load(tmp_path):
    model, batch = fair_model("gemma3", heads=4, num_key_value_heads=1)
    s = gradient_scores(model, [batch])
    again = Scores.load(s.save(tmp_path / "scores.json"))
    assert torch.equal(again.attention, s.attention) and "attention" not in again.meta
    d = s.to_dict()
    del d["attention"]
    assert Scores.from_dict(d).attention is None  # a file without it
    n = s.normalized("layer+global").attention
    assert float(n.min()) == 0.0 and float(n.max()) == 1.0  # min-max, as the MLPs


def test_two_kv_heads_behind_a_post_norm_and_a_llama_control():
    """With n_kv = 2 the attention importance is not used (a group is half a layer), and in a
    llama-style model (no norm after the attention) the summed head scores rank the groups as
    removal does (the first-order estimate is sound there)."""
    model, batch = fair_model("gemma3", heads=4, num_key_value_heads=2)
    s = gradient_scores(model, [batch])
    assert s.attention is not None
    assert torch.equal(kv_pool(s, 2, "sum"), kv_pool(s.heads, 2, "sum"))
    exact = group_removal(model, batch, 2)
    dh, _ = signed_gradients(model, batch)
    gate = dh.reshape(dh.shape[0], 2, -1).sum(-1).abs()  # one gate per group: its heads' signed sum
    # behind the norm the two groups' gate gradients cancel: the same magnitude in every layer
    assert torch.allclose(gate[:, 0], gate[:, 1], rtol=1e-3, atol=1e-7)

    model, batch = fair_model("llama", num_key_value_heads=2)
    s = gradient_scores(model, [batch])
    assert s.attention is None and "attention" not in s.to_dict()  # no post-norm: nothing new
    exact = group_removal(model, batch, 2)
    dh, _ = signed_gradients(model, batch)
    gate = dh.reshape(dh.shape[0], 2, -1).sum(-1).abs()
    assert rho(gate, exact) >= 0.95  # measured 0.996-0.999: the group gate's gradient
    assert rho(kv_pool(s.heads, 2, "sum"), exact) >= 0.5  # summed |head gradients|: 0.61-0.78
