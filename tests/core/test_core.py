"""Gates and surgery agree exactly, for every architecture adapter.

Every test runs once per row of the architecture table in conftest.py (``arch`` fixture) on
tiny random models. The gate semantics under test (docs/design.md): a head gate multiplies the
head's context vector before the output projection (bias stays); an MLP gate multiplies the
feed-forward output (bias included) before the residual add and LayerNorm.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import (
    ARCHS,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    clone,
    outputs,
    save_tiny,
    tiny_batch,
    tiny_model,
)

from headcount.core.gates import (
    clear_gates,
    gated,
    hooks,
    kept_heads,
    layout,
    set_gates,
    shared_groups,
)
from headcount.core.masks import Mask
from headcount.core.models import load_model
from headcount.core.surgery import (
    count_parameters,
    load_pruned,
    prune_heads,
    prune_mlps,
    prune_neurons,
    pruning_record,
    save_pruned,
    shrink,
)
from headcount.runtime.errors import HeadcountError

ATOL = 1e-5
VISIBLE = 1e-3  # a gate that removes something must move the outputs at least this much


# --- expected sizes, by hand from the tiny shapes ----------------------------------------------
def params_per_head(arch: str) -> int:
    """Each head-grouped part of a per-head projection loses head_dim rows (+ bias); the output
    projection head_dim columns. (A fused q/k/v projection is 3 parts.)"""
    bias = HEAD_DIM if ARCHS[arch].bias else 0
    return ARCHS[arch].head_projections * (HEAD_DIM * HIDDEN + bias) + HEAD_DIM * HIDDEN


def params_per_neuron(arch: str) -> int:
    """A feed-forward neuron: one row (+ bias) of each part of the input projection (a gated
    GLU block has 2: input and gate), one column of the output one."""
    return ARCHS[arch].ffn_in_chunks * (HIDDEN + int(ARCHS[arch].bias)) + HIDDEN


def params_per_mlp(arch: str) -> int:
    """A whole feed-forward block: every neuron and the output projection's bias."""
    return INTERMEDIATE * params_per_neuron(arch) + (HIDDEN if ARCHS[arch].bias else 0)


# --- helpers --------------------------------------------------------------------------------------
def physical(model, removed: dict[int, list[int]]) -> dict[int, set[int]]:
    """``{application: heads}`` widened to every application that shares a physical layer."""
    out: dict[int, set[int]] = {}
    for group in shared_groups(model):
        union = set().union(*(set(removed.get(app, ())) for app in group))
        for app in group:
            out[app] = union
    return out


def head_gates(model, removed: dict[int, set[int] | list[int]]) -> torch.Tensor:
    n_layers, n_heads = layout(model)
    g = torch.ones(n_layers, n_heads)
    for app, heads in removed.items():
        g[app, list(heads)] = 0
    return g


def mlp_gates(model, removed) -> torch.Tensor:
    g = torch.ones(layout(model)[0])
    g[list(removed)] = 0
    return g


def n_physical_heads(removed_physical: dict[int, set[int]], model) -> int:
    return sum(len(removed_physical[group[0]]) for group in shared_groups(model))


def assert_close(a, b, atol=ATOL):
    assert a.shape == b.shape
    diff = (a - b).abs().max().item()
    assert diff <= atol, f"max |diff| = {diff:.3g} > {atol}"


def assert_differs(a, b):
    diff = (a - b).abs().max().item()
    assert diff > VISIBLE, f"gating changed the outputs by only {diff:.3g}"


# --- the architecture table itself ----------------------------------------------------------------
def test_layout_matches_table(arch):
    model = tiny_model(arch)
    n_layers, n_heads = layout(model)
    cfg = model.config
    depth = getattr(cfg, "num_hidden_layers", None) or cfg.n_layers
    assert n_heads == HEADS
    assert n_layers == depth * getattr(cfg, "inner_group_num", 1)
    groups = shared_groups(model)
    assert all(len(g) == ARCHS[arch].apps_per_layer for g in groups)
    assert sorted(a for g in groups for a in g) == list(range(n_layers))


# --- heads: gating == surgery ---------------------------------------------------------------------
def test_head_gating_equals_pruning(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    pruned = clone(model)
    n_layers, _ = layout(model)
    removed = {0: [1], n_layers - 1: [0, 2]}
    wide = physical(model, removed)

    base = outputs(model, batch)
    with gated(model, heads=head_gates(model, wide)):
        masked = outputs(model, batch)
    assert_differs(base, masked)

    before = count_parameters(pruned)
    prune_heads(pruned, removed)
    assert_close(outputs(pruned, batch), masked)
    assert before - count_parameters(pruned) == n_physical_heads(wide, model) * params_per_head(arch)
    # the pruned model's projections are smaller and know which heads they hold
    block = hooks(pruned).blocks[n_layers - 1]
    assert kept_heads(block.out_projection, HEADS) == [h for h in range(HEADS) if h not in wide[n_layers - 1]]
    assert block.out_projection.in_features == HEAD_DIM * (HEADS - len(wide[n_layers - 1]))
    for proj, parts in block.head_parts():
        assert proj.out_features == parts * HEAD_DIM * (HEADS - len(wide[n_layers - 1]))
    assert sum(parts for _, parts in block.head_parts()) == ARCHS[arch].head_projections


def test_pruning_twice_uses_original_head_ids(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    pruned = clone(model)
    prune_heads(pruned, {0: [0]})
    prune_heads(pruned, {0: [2]})  # original id 2, now at position 1
    with gated(model, heads=head_gates(model, physical(model, {0: [0, 2]}))):
        expected = outputs(model, batch)
    assert_close(outputs(pruned, batch), expected)
    assert pruning_record(pruned)["removed_heads"][0] == [0, 2]


def test_mlp_gating_equals_pruning(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    pruned = clone(model)
    group = next(g for g in shared_groups(model) if 1 in g)

    base = outputs(model, batch)
    with gated(model, mlps=mlp_gates(model, group)):
        masked = outputs(model, batch)
    assert_differs(base, masked)

    before = count_parameters(pruned)
    prune_mlps(pruned, [1])
    assert_close(outputs(pruned, batch), masked)
    assert before - count_parameters(pruned) == params_per_mlp(arch)
    assert pruning_record(pruned)["removed_mlps"] == sorted(group)


def test_neuron_pruning_equals_zeroing_their_contribution(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    n_layers, _ = layout(model)
    removed = {0: [0, 5, INTERMEDIATE - 1], n_layers - 1: [1]}
    groups = shared_groups(model)
    wide = {}
    for g in groups:
        union = sorted(set().union(*(set(removed.get(a, ())) for a in g)))
        if union:
            wide[g[0]] = union

    zeroed = clone(model)
    blocks = hooks(zeroed).blocks
    with torch.no_grad():
        for first, neurons in wide.items():
            blocks[first].ffn_out.weight[:, neurons] = 0  # the neurons' outputs no longer reach the residual
    expected = outputs(zeroed, batch)
    assert_differs(outputs(model, batch), expected)

    before = count_parameters(model)
    prune_neurons(model, removed)
    assert_close(outputs(model, batch), expected)
    assert before - count_parameters(model) == sum(map(len, wide.values())) * params_per_neuron(arch)
    block = hooks(model).blocks[0]
    assert block.ffn_in_chunks == ARCHS[arch].ffn_in_chunks
    assert block.ffn_in.out_features == block.ffn_in_chunks * (INTERMEDIATE - len(wide[groups[0][0]]))


# --- the extremes -------------------------------------------------------------------------------------
def test_no_heads_one_head_no_mlps(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    pruned = clone(model)
    n_layers, n_heads = layout(model)
    removed = {0: list(range(n_heads)), 1: list(range(1, n_heads))}  # layer 0: none left; layer 1: one left
    wide = physical(model, removed)
    all_mlps = list(range(n_layers))

    with gated(model, heads=head_gates(model, wide), mlps=mlp_gates(model, all_mlps)):
        masked = outputs(model, batch)
    assert torch.isfinite(masked).all()

    before = count_parameters(pruned)
    prune_heads(pruned, removed)
    prune_mlps(pruned, all_mlps)
    out = outputs(pruned, batch)
    assert_close(out, masked)
    n_physical = len(shared_groups(model))
    expected_drop = n_physical_heads(wide, model) * params_per_head(arch) + n_physical * params_per_mlp(arch)
    assert before - count_parameters(pruned) == expected_drop
    blocks = hooks(pruned).blocks
    assert blocks[0].out_projection.in_features == 0
    assert all(b.ffn_in.out_features == 0 and b.ffn_out.bias is None for b in blocks)
    rec = pruning_record(pruned)
    assert rec["removed_heads"][0] == list(range(n_heads))
    assert rec["removed_mlps"] == all_mlps


def test_every_head_of_every_layer_removed(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    n_layers, n_heads = layout(model)
    everything = {app: list(range(n_heads)) for app in range(n_layers)}
    with gated(model, heads=torch.zeros(n_layers, n_heads)):
        masked = outputs(model, batch)
    prune_heads(model, everything)
    assert_close(outputs(model, batch), masked)
    # gates still work on a model without heads (they have nothing left to gate)
    with gated(model, heads=torch.zeros(n_layers, n_heads), mlps=torch.ones(n_layers)):
        assert_close(outputs(model, batch), masked)


# --- checkpoints ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("head", ["classification", "mlm"])
def test_save_load_pruned(arch, head, tmp_path):
    model = tiny_model(arch, head=head)
    batch = tiny_batch(model)
    n_layers, n_heads = layout(model)
    prune_heads(model, {0: list(range(n_heads)), 1: [1, 3], n_layers - 1: [2]})
    prune_mlps(model, [n_layers - 1])
    prune_neurons(model, {0: [2, 4]})
    expected = outputs(model, batch)
    n_params = count_parameters(model)

    save_pruned(model, tmp_path / "pruned")
    summary = json.loads((tmp_path / "pruned" / "headcount.json").read_text())
    assert summary["parameters"] == n_params
    assert summary["heads_total"] == n_layers * n_heads
    assert summary["heads_kept"] == n_layers * n_heads - sum(map(len, pruning_record(model)["removed_heads"]))

    for loaded in (load_pruned(tmp_path / "pruned"), load_model(str(tmp_path / "pruned"), head=head)):
        assert type(loaded) is type(model)
        assert count_parameters(loaded) == n_params
        assert_close(outputs(loaded, batch), expected, atol=0)
        assert pruning_record(loaded)["removed_heads"] == pruning_record(model)["removed_heads"]


def test_load_pruned_with_another_head(arch, tmp_path):
    """A pruned task checkpoint loads as a bare encoder (what ``headcount info`` does), and a
    pruned bare encoder loads with a new task head (fine-tuning a pruned pre-trained model)."""
    model = tiny_model(arch, head="classification")
    batch = tiny_batch(model)
    prune_heads(model, {0: [1]})
    prune_mlps(model, [0])
    with torch.no_grad():
        expected = model.base_model(**batch).last_hidden_state
    save_pruned(model, tmp_path / "task")
    base = load_model(str(tmp_path / "task"), head="base")
    loaded = base.state_dict()
    for name, tensor in model.base_model.state_dict().items():  # (a bare encoder may add a pooler)
        assert torch.equal(loaded[name], tensor), name
    assert_close(outputs(base, batch), expected, atol=0)

    save_pruned(base, tmp_path / "base")
    task = load_model(str(tmp_path / "base"), head="classification", num_labels=5)
    assert task.config.num_labels == 5
    assert outputs(task, batch).shape == (2, 5)
    with torch.no_grad():
        assert_close(task.base_model(**batch).last_hidden_state, expected, atol=0)
    assert pruning_record(task)["removed_heads"] == pruning_record(model)["removed_heads"]


def test_unpruned_checkpoint_loads_plainly(arch, tmp_path):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    save_tiny(model, tmp_path / "plain")
    loaded = load_model(str(tmp_path / "plain"), head="classification")
    assert pruning_record(loaded) is None
    assert_close(outputs(loaded, batch), outputs(model, batch), atol=0)


# --- shrink (mask -> surgery) ------------------------------------------------------------------------------
def test_shrink_equals_gating_with_the_mask(arch, tmp_path):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    n_layers, n_heads = layout(model)
    removed = physical(model, {0: [0, 3], n_layers - 1: [1]})
    mlps = next(g for g in shared_groups(model) if n_layers - 1 in g)
    mask = Mask(head_gates(model, removed), mlp_gates(model, mlps))
    with gated(model, heads=mask.heads, mlps=mask.mlps):
        expected = outputs(model, batch)
    before = count_parameters(model)
    shrink(model, mask)
    assert_close(outputs(model, batch), expected)
    assert before - count_parameters(model) == (n_physical_heads(removed, model) * params_per_head(arch)
                                               + params_per_mlp(arch))
    assert pruning_record(model)["gates"] is None  # nothing left over to gate
    save_pruned(model, tmp_path / "m")
    assert_close(outputs(load_pruned(tmp_path / "m"), batch), expected)


def test_mask_of_wrong_shape_is_refused(arch):
    model = tiny_model(arch)
    n_layers, n_heads = layout(model)
    with pytest.raises(HeadcountError, match="mask is for"):
        shrink(model, Mask.full(n_layers + 1, n_heads))
    with pytest.raises(HeadcountError, match="head gates have shape"):
        with gated(model, heads=torch.ones(n_layers, n_heads + 1)):
            pass
    with pytest.raises(HeadcountError, match="MLP gates have shape"):
        set_gates(model, mlps=torch.ones(n_layers + 2))
    assert hooks(model).active == []


# --- gates: context manager, persistent, per token, gradients -----------------------------------------------
def test_gate_context_manager_and_persistent_gates(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    n_layers, n_heads = layout(model)
    base = outputs(model, batch)
    a = head_gates(model, {0: [1]})
    b = head_gates(model, {n_layers - 1: [2]})
    m = mlp_gates(model, [0])

    with gated(model, heads=a, mlps=m):
        in_context = outputs(model, batch)
    assert_differs(base, in_context)
    assert_close(outputs(model, batch), base, atol=0)  # leaving the block removes the gates

    handle = set_gates(model, heads=a, mlps=m)
    assert_close(outputs(model, batch), in_context, atol=0)
    assert_close(outputs(model, batch), in_context, atol=0)  # persists across calls
    with gated(model, heads=b):  # several gate sets multiply
        stacked = outputs(model, batch)
    with gated(model, heads=a * b):
        pass
    clear_gates(model, handle)
    assert_close(outputs(model, batch), base, atol=0)
    with gated(model, heads=a * b, mlps=m):
        assert_close(outputs(model, batch), stacked)

    set_gates(model, heads=a)
    set_gates(model, mlps=m)
    assert_close(outputs(model, batch), in_context, atol=0)
    clear_gates(model)
    assert_close(outputs(model, batch), base, atol=0)


def test_gates_are_per_application(arch):
    """Gating (application d, head h) changes that application's output and nothing before it."""
    model = tiny_model(arch, head="base")
    batch = tiny_batch(model)
    n_layers, n_heads = layout(model)
    d = n_layers // 2
    with torch.no_grad():
        base = model(**batch, output_hidden_states=True).hidden_states
        with gated(model, heads=head_gates(model, {d: [2]})):
            masked = model(**batch, output_hidden_states=True).hidden_states
    assert len(base) == n_layers + 1  # embeddings + one entry per application
    for i in range(d + 1):  # the embeddings and applications 0..d-1
        assert_close(masked[i], base[i], atol=0)
    assert_differs(masked[d + 1], base[d + 1])
    assert_differs(masked[-1], base[-1])


def test_per_token_gates(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    n_layers, n_heads = layout(model)
    bsz, seq = batch["input_ids"].shape
    g = head_gates(model, {0: [1], n_layers - 1: [0, 3]})
    m = mlp_gates(model, [1])
    with gated(model, heads=g, mlps=m):
        expected = outputs(model, batch)
    with gated(model, heads=g.expand(bsz, seq, n_layers, n_heads), mlps=m.expand(bsz, seq, n_layers)):
        assert_close(outputs(model, batch), expected)

    # gates that differ by example: example 0 gated, example 1 not
    per_example = torch.ones(bsz, seq, n_layers, n_heads)
    per_example[0] = g
    base = outputs(model, batch)
    with gated(model, heads=g):
        heads_only = outputs(model, batch)
    with gated(model, heads=per_example):
        mixed = outputs(model, batch)
    assert_close(mixed[0], heads_only[0])
    assert_close(mixed[1], base[1])
    assert_differs(mixed[0], base[0])


def test_gate_gradients(arch):
    model = tiny_model(arch).double()
    batch = tiny_batch(model, labels=True)
    n_layers, n_heads = layout(model)
    heads = torch.ones(n_layers, n_heads, dtype=torch.float64, requires_grad=True)
    mlps = torch.ones(n_layers, dtype=torch.float64, requires_grad=True)
    with gated(model, heads=heads, mlps=mlps):
        model(**batch).loss.backward()
    assert heads.grad.shape == (n_layers, n_heads)
    assert mlps.grad.shape == (n_layers,)
    assert torch.isfinite(heads.grad).all() and (heads.grad != 0).all()
    assert torch.isfinite(mlps.grad).all() and (mlps.grad != 0).all()

    # the gradient is the derivative wrt a multiplier of the head's context vector (checked on
    # a fixed projection of the float64 logits: some models compute the loss in float32)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    w = torch.randn(outputs(model, inputs).shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def objective(g):
        with gated(model, heads=g):
            return (model(**inputs).logits * w).sum()

    g = torch.ones(n_layers, n_heads, dtype=torch.float64, requires_grad=True)
    objective(g).backward()
    eps = 1e-4
    rel = 1e-3 if ARCHS[arch].float32_inside else 1e-5  # float32 steps inside a float64 model
    for l, h in [(0, 0), (n_layers - 1, n_heads - 1)]:
        plus, minus = torch.ones(n_layers, n_heads, dtype=torch.float64), torch.ones(n_layers, n_heads, dtype=torch.float64)
        plus[l, h], minus[l, h] = 1 + eps, 1 - eps
        with torch.no_grad():
            numeric = (objective(plus) - objective(minus)).item() / (2 * eps)
        assert numeric == pytest.approx(g.grad[l, h].item(), rel=rel, abs=1e-8)

    # per-token gates get per-token gradients
    bsz, seq = batch["input_ids"].shape
    tok = torch.ones(bsz, seq, n_layers, n_heads, dtype=torch.float64, requires_grad=True)
    with gated(model, heads=tok):
        model(**batch).loss.backward()
    assert tok.grad.shape == (bsz, seq, n_layers, n_heads)
    assert torch.allclose(tok.grad.sum(dim=(0, 1)), heads.grad)


def test_gates_on_a_pruned_model_use_original_head_ids(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    n_layers, _ = layout(model)
    pruned = clone(model)
    first = physical(model, {0: [1]})
    prune_heads(pruned, {0: [1]})
    extra = head_gates(model, {n_layers - 1: [3], 0: [2]})
    with gated(model, heads=head_gates(model, first) * extra):
        expected = outputs(model, batch)
    with gated(pruned, heads=extra):
        assert_close(outputs(pruned, batch), expected)


# --- ALBERT: per application vs per shared head -------------------------------------------------------------
SHARED = [a for a in ARCHS if ARCHS[a].apps_per_layer > 1]


@pytest.mark.parametrize("arch", SHARED)
def test_shared_head_removal_equals_gating_every_depth(arch):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    pruned = clone(model)
    group = shared_groups(model)[0]
    d, h = group[1], 2
    prune_heads(pruned, {d: [h]})  # removes head 2 of the shared layer from every depth
    out = outputs(pruned, batch)
    with gated(model, heads=head_gates(model, {app: [h] for app in group})):
        assert_close(out, outputs(model, batch))
    with gated(model, heads=head_gates(model, {d: [h]})):  # one depth only is something else
        assert_differs(out, outputs(model, batch))
    assert pruning_record(pruned)["removed_heads"] == [[h] if app in group else [] for app in range(layout(model)[0])]


@pytest.mark.parametrize("arch", SHARED)
def test_shrink_per_application_mask_keeps_residual_gates(arch, tmp_path):
    model = tiny_model(arch, head="mlm")
    batch = tiny_batch(model)
    n_layers, n_heads = layout(model)
    group = shared_groups(model)[0]
    heads = head_gates(model, {app: [3] for app in group})  # head 3 off at every depth: removable
    heads[group[1], 0] = 0  # head 0 off at one depth only: stays, gated
    mlps = torch.ones(n_layers)
    mlps[group[-1]] = 0  # MLP off at one depth only: stays, gated
    mask = Mask(heads, mlps)
    with gated(model, heads=mask.heads, mlps=mask.mlps):
        expected = outputs(model, batch)

    before = count_parameters(model)
    shrink(model, mask)
    assert before - count_parameters(model) == params_per_head(arch)
    assert_close(outputs(model, batch), expected)
    rec = pruning_record(model)
    assert rec["gates"]["heads"] == mask.heads.int().tolist()
    assert rec["gates"]["mlps"] == mask.mlps.int().tolist()

    save_pruned(model, tmp_path / "m")
    for loaded in (load_pruned(tmp_path / "m"), load_model(str(tmp_path / "m"), head="mlm")):
        assert count_parameters(loaded) == count_parameters(model)
        assert_close(outputs(loaded, batch), expected)
        assert pruning_record(loaded)["gates"] == rec["gates"]


@pytest.mark.parametrize("arch", SHARED)
def test_shared_heads_mask(arch, tmp_path):
    model = tiny_model(arch)
    batch = tiny_batch(model)
    n_layers, n_heads = layout(model)
    path = tmp_path / "mask.json"
    path.write_text(json.dumps({"shared_heads": [1, 0, 1, 1], "mlps": [1] * n_layers}))
    mask = Mask.load(path)
    assert mask.heads.tolist() == [[1, 0, 1, 1]] * n_layers
    with gated(model, heads=mask.heads):
        expected = outputs(model, batch)
    shrink(model, mask)
    assert_close(outputs(model, batch), expected)
    assert all(len(kept_heads(b.out_projection, n_heads)) == n_heads - 1 for b in hooks(model).blocks)


# --- Mask value object -----------------------------------------------------------------------------------------
def test_mask_json_round_trip(tmp_path):
    mask = Mask.full(3, 4, source="test").without_heads([(0, 1), (2, 3)]).without_mlps([1])
    mask.save(tmp_path / "mask.json")
    d = json.loads((tmp_path / "mask.json").read_text())
    assert d["heads"] == [[1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert d["mlps"] == [1, 0, 1]
    assert d["source"] == "test"
    loaded = Mask.load(tmp_path / "mask.json")
    assert loaded == mask and loaded.meta == {"source": "test"}
    assert (loaded.n_heads_kept, loaded.n_mlps_kept) == (10, 2)
    with pytest.raises(HeadcountError):
        Mask(torch.full((3, 4), 0.5), torch.ones(3))
    with pytest.raises(HeadcountError):
        Mask.from_dict({"heads": [[1, 1], [1]]})


# --- layout: sizes without hooks ----------------------------------------------------------------------------
def test_layout_is_frozen_and_installs_no_hooks(arch):
    import dataclasses

    from headcount.core.arch import Layout

    model = tiny_model(arch)
    grid = layout(model)
    assert "_headcount_hooks" not in model.__dict__  # answered from the config and the module tree
    assert isinstance(grid, Layout) and tuple(grid) == (grid.n_layers, grid.n_heads) == (grid[0], grid[1])
    assert grid.n_heads == HEADS and grid.head_dim == HEAD_DIM
    assert sorted(a for g in grid.groups for a in g) == list(range(grid.n_layers))
    assert grid.shared == (ARCHS[arch].apps_per_layer > 1) and len(grid.groups) == grid.n_layers // ARCHS[arch].apps_per_layer
    with pytest.raises(dataclasses.FrozenInstanceError):
        grid.n_heads = 1
    prune_heads(model, {0: [0]})  # surgery removes heads but never renumbers the grid
    assert layout(model) == grid and "_headcount_hooks" not in model.__dict__
