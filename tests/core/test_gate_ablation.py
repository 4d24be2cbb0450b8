"""Gradient scores rank heads and MLPs as removing them does, for every adapter in the table.

The ``gradient`` scorer (Michel et al.: ``|dL/dg|`` at g = 1) is a first-order estimate of the loss
change when a unit is removed, which ``ablation`` measures exactly (gate 0, one unit at a time).
It estimates that only where the gate sits where removal acts. Gemma 2/3 normalise each block's
output before the residual add ("sandwich" norms); an RMSNorm is scale-invariant, so a gate on
``down_proj``'s output had a gradient of ~0 whatever the MLP did, and ranked MLPs at random. The
gates that scale a whole block now go after such a norm (the adapter declares it:
``Block.mlp_output`` / ``attention_output``); head gates stay at the out projection's input.

A fair first-order check: every norm weight drawn away from 1 (0.5 to 2.0); 12 layers (12 MLPs to
rank); each unit's removal a small change of the residual stream, so that the loss is close to
linear in it: encoders' weights drawn with 0.02 (BERT's own initialisation); decoders' with 0.1
and their token embeddings scaled by 64, so that the residual stream outweighs each block's
output (a block behind a post-norm adds O(norm weight) per dimension whatever its weights).
Under a post-norm one more size matters: removing one of n heads changes the normalised output
by about 1/n of itself, a change the first-order term misses in proportion. Measured on Gemma 2/3
(4 seeds, Spearman of |gradient| with |removal|): 4 heads per layer 0.63-0.80 at any embedding
scale (64 to 1,024: the norm's curvature, not the residual's size), 8 heads 0.80-0.89, 16 heads
0.95-0.96; every family without a post-norm is 0.99-1.00 at 4. So layers with a norm after the
attention are checked with 16 heads (Gemma 2 9B and Gemma 3 27B have 16 and 32), the others with
the table's 4, all against the same threshold.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import ARCHS, HEADS, outputs, tiny_batch, tiny_model
from scipy.stats import spearmanr

from headcount.core.gates import gated, hooks, layout
from headcount.core.surgery import prune_heads
from headcount.importance.scoring import ablation_scores, gradient_scores

SPEARMAN = 0.8
FAIR_LAYERS = 12
ENCODER_INIT = 0.02
DECODER_INIT = 0.1
EMBEDDING_SCALE = 64.0
POST_NORM_HEADS = 16  # query heads per layer behind a post-attention norm (see the module docstring)
ATOL = 1e-5


def post_norm(model) -> bool:
    """Whether the adapter declares a norm after the attention block (read off the blocks)."""
    return getattr(hooks(model).blocks[0], "attention_output", None) is not None


def fair_model(arch: str, heads: int | None = None, seed: int = 0, **overrides):
    """A tiny model of table row ``arch`` where removing one unit is a small change (see above),
    and a fixed batch with labels for it."""
    row = ARCHS[arch]
    kw = dict(num_hidden_layers=FAIR_LAYERS, initializer_range=DECODER_INIT if row.decoder else ENCODER_INIT)
    if "layer_types" in row.kwargs:  # local and global layers alternate, as in the table's row
        kw["layer_types"] = (["sliding_attention", "full_attention"] * FAIR_LAYERS)[:FAIR_LAYERS]
    if heads is not None:
        kw["num_attention_heads"] = heads
    model = tiny_model(arch, head="lm" if row.decoder else "classification", seed=seed, **{**kw, **overrides})
    if heads is None and post_norm(model):
        return fair_model(arch, POST_NORM_HEADS, seed, **overrides)
    g = torch.Generator().manual_seed(seed + 1)
    n_norms = 0
    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if "norm" in type(module).__name__.lower() and isinstance(weight, torch.nn.Parameter):
                weight.copy_(0.5 + 1.5 * torch.rand(weight.shape, generator=g))
                n_norms += 1
        if row.decoder:
            model.get_input_embeddings().weight.mul_(EMBEDDING_SCALE)
    assert n_norms >= len(layout(model).groups)  # every physical layer has norms: all drawn away from 1
    batch = tiny_batch(model, batch=4, seq=12, seed=seed, labels=True)
    if row.decoder:  # next-token loss on the real tokens
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return model, batch


def signed_gradients(model, batch, **more) -> tuple[torch.Tensor, ...]:
    """``dL/dg`` of the batch's mean loss at g = 1: heads ``[L, H]``, MLPs ``[L]``, and those of the
    gates named in ``more`` (``attention=True``: ``[L]``)."""
    n_layers, n_heads = layout(model)
    gates = {"heads": torch.ones(n_layers, n_heads, requires_grad=True), "mlps": torch.ones(n_layers, requires_grad=True)}
    gates.update({name: torch.ones(n_layers, requires_grad=True) for name in more})
    with gated(model, **gates):
        loss = model(**batch).loss
    return torch.autograd.grad(loss, list(gates.values()))


def rho(score: torch.Tensor, removal: torch.Tensor) -> float:
    """Spearman of a score with the size of the loss change its removal makes."""
    return float(spearmanr(score.flatten().numpy(), removal.flatten().abs().numpy())[0])


def agree_in_sign(estimate: torch.Tensor, exact: torch.Tensor) -> float:
    """Share of the units whose removal moves the loss most (the top half by |change|) where the
    first-order estimate ``-dL/dg`` has the sign of the exact change."""
    estimate, exact = estimate.flatten(), exact.flatten()
    top = exact.abs() >= exact.abs().median()
    return float((torch.sign(estimate[top]) == torch.sign(exact[top])).float().mean())


@pytest.mark.parametrize("arch", list(ARCHS))
def test_gradient_ranks_heads_and_mlps_as_removal_does(arch):
    model, batch = fair_model(arch)
    grad = gradient_scores(model, [batch])  # the scorer: |dL/dg| of the batch's mean loss
    exact = ablation_scores(model, [batch])  # L(g = 0 for that unit alone) - L
    dh, dm = signed_gradients(model, batch)
    assert torch.allclose(grad.heads, dh.abs(), rtol=1e-4, atol=1e-6)
    assert torch.allclose(grad.mlps, dm.abs(), rtol=1e-4, atol=1e-6)
    measured = {"mlps": rho(grad.mlps, exact.mlps), "heads": rho(grad.heads, exact.heads),
                "mlp signs": agree_in_sign(-dm, exact.mlps), "head signs": agree_in_sign(-dh, exact.heads)}
    assert measured["mlps"] >= SPEARMAN, measured
    assert measured["heads"] >= SPEARMAN, measured
    assert measured["mlp signs"] >= SPEARMAN and measured["head signs"] >= SPEARMAN, measured


@pytest.mark.parametrize("arch", list(ARCHS))
def test_attention_gate_is_every_head_removed(arch):
    """The attention gate scales a whole attention block: 0 equals every head of the layer gated
    off and the pruned layer (the table's sizes, norms away from 1), also per token; and its
    gradient ranks the layers as removing their attention does (the fair sizes)."""
    model = tiny_model(arch, head="lm" if ARCHS[arch].decoder else "classification")
    with torch.no_grad():
        for module in model.modules():
            if "norm" in type(module).__name__.lower() and isinstance(getattr(module, "weight", None), torch.nn.Parameter):
                module.weight.uniform_(0.5, 2.0)
    inputs = tiny_batch(model)
    n_layers, n_heads = layout(model)
    layer = n_layers - 1  # one application (of ALBERT's shared layer: that depth only)
    heads = torch.ones(n_layers, n_heads)
    heads[layer] = 0
    attention = torch.ones(n_layers)
    attention[layer] = 0
    with torch.no_grad():
        base = outputs(model, inputs)
        with gated(model, heads=heads):
            want = outputs(model, inputs)
        with gated(model, attention=attention):
            got = outputs(model, inputs)
        with gated(model, attention=attention.expand(*inputs["input_ids"].shape, n_layers)):  # per token [B, S, L]
            got_per_token = outputs(model, inputs)
    assert (want - base).abs().max() > 1e-3  # removing the layer's heads changes something
    assert (got - want).abs().max() <= ATOL
    assert (got_per_token - want).abs().max() <= ATOL
    if not layout(model).shared:
        pruned = prune_heads(copy.deepcopy(model), {layer: range(n_heads)})
        assert (outputs(pruned, inputs) - got).abs().max() <= ATOL

    model, batch = fair_model(arch)
    n_layers, n_heads = layout(model)
    _, _, da = signed_gradients(model, batch, attention=True)
    with torch.no_grad():
        loss = model(**batch).loss
        removal = []
        for app in range(n_layers):
            off = torch.ones(n_layers, n_heads)
            off[app] = 0
            with gated(model, heads=off):
                removal.append(float(model(**batch).loss - loss))
    assert rho(da.abs(), torch.tensor(removal)) >= SPEARMAN


def test_a_post_norm_makes_a_gate_before_it_blind():
    """Why the gates moved: behind Gemma 3's post-feedforward norm a gate on ``down_proj``'s output
    has a gradient of ~0 while removing the MLP moves the loss (the scale invariance of an
    RMSNorm), and with one KV head per layer the query heads' gradients sum to ~0 per layer; the
    gates after the norms see what removal does."""
    model, batch = fair_model("gemma3", heads=HEADS, num_key_value_heads=1)
    n_layers, _ = layout(model)
    block = hooks(model).blocks[0]
    assert block.mlp_output is not None and block.mlp_gate_point() is block.mlp_output

    before = torch.ones(n_layers, requires_grad=True)  # a gate on down_proj's output, by hand
    calls = []

    def scale(module, args, output):
        calls.append(len(calls))
        return output * before[len(calls) - 1]

    handles = [b.ffn_out.register_forward_hook(scale) for b in hooks(model).blocks]
    try:
        (blind,) = torch.autograd.grad(model(**batch).loss, [before])
    finally:
        for h in handles:
            h.remove()
    dh, dm, da = signed_gradients(model, batch, attention=True)
    exact = ablation_scores(model, [batch])
    assert exact.mlps.abs().min() > 100 * blind.abs().max()  # removal matters, the gate before the norm is blind
    assert rho(dm.abs(), exact.mlps) >= SPEARMAN
    # one KV group per layer: its query heads' gradients cancel, the attention gate's do not
    assert (dh.sum(dim=1).abs() <= 1e-3 * dh.abs().sum(dim=1)).all()
    assert (da.abs() > 10 * dh.sum(dim=1).abs()).all()
