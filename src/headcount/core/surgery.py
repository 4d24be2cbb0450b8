"""Physical removal of heads, feed-forward neurons and whole MLP blocks; pruned checkpoints.

Surgery edits the linears *in place* (same module objects, smaller weights), so hooks stay
valid and gates keep working on a shrunk model: each out-projection remembers the original
indices of the heads it still has (``headcount_kept_heads``), each feed-forward input
projection those of its neurons (``headcount_kept_neurons``).

What was removed is recorded in ``model.config.headcount_pruning``; ``save_pretrained`` writes
it into ``config.json`` and [`load_pruned`][headcount.core.surgery.load_pruned] replays it before loading the weights.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from headcount.core.arch import get_adapter, grouped_rows
from headcount.core.arch.base import kv_plan, out_dim
from headcount.core.gates import kept_heads, kept_kv_heads, layout, set_gates, shared_groups
from headcount.core.masks import Mask
from headcount.runtime.atomic import atomic_dir, atomic_write_json
from headcount.runtime.errors import HeadcountError

RECORD = "headcount_pruning"


# -- in-place linear edits ------------------------------------------------------------------
@torch.no_grad()
def _keep_rows(linear: nn.Module, idx: torch.Tensor) -> None:
    """Keep output units ``idx`` (repeats allowed): weight rows of a Linear ``[out, in]``,
    weight columns of a Conv1D ``[in, out]``."""
    dim = out_dim(linear)
    linear.weight = nn.Parameter(linear.weight.index_select(dim, idx.to(linear.weight.device)).clone())
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.index_select(0, idx.to(linear.bias.device)).clone())
    if dim:
        linear.nf = int(idx.numel())
    else:
        linear.out_features = int(idx.numel())


@torch.no_grad()
def _keep_cols(linear: nn.Module, idx: torch.Tensor) -> None:
    """Keep input units ``idx``: weight columns of a Linear, weight rows of a Conv1D."""
    dim = 1 - out_dim(linear)
    linear.weight = nn.Parameter(linear.weight.index_select(dim, idx.to(linear.weight.device)).clone())
    if dim:
        linear.in_features = int(idx.numel())
    else:
        linear.nx = int(idx.numel())
        if not linear.nx:  # a Conv1D cannot multiply a [n, 0] input: it yields its bias instead
            linear.forward = types.MethodType(_no_inputs_forward, linear)


def _no_inputs_forward(self, x):
    """Forward of a Conv1D with no input left: ``x @ W + b`` with W ``[0, nf]`` is ``b``."""
    y = x.new_zeros(*x.shape[:-1], self.nf)
    return y if self.bias is None else y + self.bias


@torch.no_grad()
def _keep_param(module: nn.Module, name: str, idx: torch.Tensor) -> None:
    """Keep entries ``idx`` along dim 0 of a per-head tensor (q/k norm weights, sinks)."""
    param = getattr(module, name)
    setattr(module, name, nn.Parameter(param.index_select(0, idx.to(param.device)).clone(),
                                       requires_grad=param.requires_grad))


def _no_heads_forward(self, hidden_states, *args, **kwargs):
    """Replaces an attention module's forward once it has no head left."""
    return self.headcount_adapter.attention_without_heads(self, hidden_states, *args, **kwargs)


def kept_neurons(ffn_in: nn.Linear, size: int) -> list[int]:
    kept = getattr(ffn_in, "headcount_kept_neurons", None)
    return list(range(size)) if kept is None else kept


def _physical(model) -> dict[int, list[int]]:
    """Applications grouped by physical layer: ``{first_app: [apps sharing its modules]}``."""
    return {apps[0]: apps for apps in shared_groups(model)}


# -- removal ---------------------------------------------------------------------------------
def prune_heads(model: nn.Module, heads: Mapping[int, Iterable[int]]) -> nn.Module:
    """Remove heads physically: ``{application: [original head ids]}``.

    A head removed from a shared layer (ALBERT) is removed from every depth that runs it.
    Any number of heads may go, all of a layer included.

    >>> prune_heads(model, {0: [1, 2], 5: range(12)})   # doctest: +SKIP
    """
    adapter = get_adapter(model)
    blocks = adapter.blocks(model)
    grid = adapter.layout(model)
    n_heads, d = grid.n_heads, grid.head_dim
    for first, apps in _physical(model).items():
        remove = set()
        for app in apps:
            remove |= {int(x) for x in heads.get(app, ())}
        if not remove:
            continue
        if any(not 0 <= x < n_heads for x in remove):
            raise HeadcountError(f"head index out of range 0..{n_heads - 1} in layer {first}")
        block = blocks[first]
        kept = kept_heads(block.out_projection, n_heads)
        positions = [i for i, head in enumerate(kept) if head not in remove]
        if len(positions) == len(kept):
            continue
        if grid.n_kv_heads is None:
            # a fused projection holds its heads in several parts ([chunks, kept, d] rows)
            for proj, rows in block.head_rows(positions, len(kept), d):
                _keep_rows(proj, rows)
            adapter.set_num_heads(block.attention, len(positions), d)
        else:
            _prune_kv(adapter, block, grid, kept, positions)
        _keep_cols(block.out_projection, grouped_rows(positions, d, len(kept)))
        block.out_projection.headcount_kept_heads = [kept[i] for i in positions]
        if not positions:
            block.attention.headcount_adapter = adapter
            block.attention.forward = types.MethodType(_no_heads_forward, block.attention)
    _record(model)
    return model


def _prune_kv(adapter, block, grid, kept: list[int], positions: list[int]) -> None:
    """A decoder layer: keep the query heads at ``positions`` (of ``kept``) and the key/value
    slots they read (``kv_plan``: whole groups go, uneven cuts repeat K/V heads)."""
    slots = kept_kv_heads(block.out_projection, grid.n_kv_heads)  # original KV head of each slot now
    plan = kv_plan([kept[i] for i in positions], grid.group_size)
    kv_pos = [slots.index(g) for g in plan]  # copies of one K/V head are equal: take the first
    for proj, rows in block.unit_rows(positions, len(kept), kv_pos, len(slots), grid.head_dim):
        _keep_rows(proj, rows)
    for module, name, unit in block.per_head:
        _keep_param(module, name, torch.tensor(positions if unit == "q" else kv_pos, dtype=torch.long))
    block.out_projection.headcount_kv_heads = plan
    adapter.set_heads(block.attention, len(positions), len(plan), grid.head_dim)


def prune_neurons(model: nn.Module, neurons: Mapping[int, Iterable[int]]) -> nn.Module:
    """Remove feed-forward neurons physically: ``{application: [original neuron ids]}``."""
    adapter = get_adapter(model)
    size = adapter.intermediate_size(model.config)
    blocks = adapter.blocks(model)
    for first, apps in _physical(model).items():
        remove = set()
        for app in apps:
            remove |= {int(x) for x in neurons.get(app, ())}
        if not remove:
            continue
        block = blocks[first]
        kept = kept_neurons(block.ffn_in, size)
        positions = [i for i, n in enumerate(kept) if n not in remove]
        if len(positions) == len(kept):
            continue
        # a gated (GLU) input projection holds each neuron once per part ([chunks, kept] rows)
        _keep_rows(block.ffn_in, block.ffn_in_rows(positions, len(kept)))
        for extra in block.ffn_in_extra:  # a gated MLP's separate gate projection: rows = neurons
            _keep_rows(extra, grouped_rows(positions, 1, len(kept)))
        _keep_cols(block.ffn_out, grouped_rows(positions, 1, len(kept)))
        block.ffn_in.headcount_kept_neurons = [kept[i] for i in positions]
    _record(model)
    return model


def prune_mlps(model: nn.Module, layers: Iterable[int]) -> nn.Module:
    """Remove whole feed-forward blocks: every neuron and the output bias (gate m = 0)."""
    adapter = get_adapter(model)
    size = adapter.intermediate_size(model.config)
    layers = sorted({int(x) for x in layers})
    prune_neurons(model, {app: range(size) for app in layers})
    blocks = adapter.blocks(model)
    for app in layers:
        out = blocks[app].ffn_out
        if out.bias is not None:
            out.bias = None
    _record(model)
    return model


def _record(model: nn.Module) -> dict:
    """Write what is removed, read off the modules, into ``model.config``."""
    adapter = get_adapter(model)
    grid = layout(model)
    n_layers, n_heads = grid
    size = adapter.intermediate_size(model.config)
    old = getattr(model.config, RECORD, None) or {}
    rec = {"removed_heads": [], "removed_neurons": [], "removed_mlps": [], "gates": old.get("gates")}
    if grid.n_kv_heads is not None:
        # decoders: the original KV head of each key/value slot per layer (repeats = the KV cost
        # of uneven cuts); informative only, replay derives it from removed_heads again
        rec["kv_heads"] = [kept_kv_heads(b.out_projection, grid.n_kv_heads) for b in adapter.blocks(model)]
    for app, block in enumerate(adapter.blocks(model)):
        kept = set(kept_heads(block.out_projection, n_heads))
        rec["removed_heads"].append([x for x in range(n_heads) if x not in kept])
        kept_n = kept_neurons(block.ffn_in, size)
        if block.ffn_out.bias is None and not kept_n:
            rec["removed_mlps"].append(app)
            rec["removed_neurons"].append([])
        else:
            keep = set(kept_n)
            rec["removed_neurons"].append([x for x in range(size) if x not in keep])
    setattr(model.config, RECORD, rec)
    return rec


def pruning_record(model: nn.Module) -> dict | None:
    """What surgery removed from ``model`` (None for an unpruned model)."""
    return getattr(model.config, RECORD, None)


def replay(model: nn.Module, record: Mapping) -> nn.Module:
    """Apply a recorded pruning to a freshly built model of the original shape."""
    prune_neurons(model, dict(enumerate(record.get("removed_neurons", []))))
    prune_mlps(model, record.get("removed_mlps", []))
    prune_heads(model, dict(enumerate(record.get("removed_heads", []))))
    if record.get("gates"):
        mask = Mask.from_dict(record["gates"])
        set_gates(model, heads=mask.heads, mlps=mask.mlps)
        getattr(model.config, RECORD)["gates"] = record["gates"]
    return model


def removable(model: nn.Module, mask: Mask) -> tuple[dict[int, list[int]], list[int], bool]:
    """What of ``mask`` surgery can remove: ``(heads {first_app: [ids]}, mlps [first_app], residual)``.

    A head (an MLP) of a physical layer is removable when the mask removes it at every
    application of that layer; ``residual`` says whether something is masked at some depths
    only (possible for shared layers), which only gates can express.
    """
    mask.check_model(model)
    heads, mlps, residual = {}, [], False
    for first, apps in _physical(model).items():
        off = mask.heads[apps] == 0  # [len(apps), n_heads]
        heads[first] = [int(i) for i in torch.nonzero(off.all(dim=0)).flatten()]
        residual |= bool((off.any(dim=0) & ~off.all(dim=0)).any())  # off at some depths only
        mlp_off = mask.mlps[apps] == 0
        if bool(mlp_off.all()):
            mlps.append(first)
        elif bool(mlp_off.any()):
            residual = True
    return heads, mlps, residual


def shrink(model: nn.Module, mask: Mask, residual_gates: bool = True) -> nn.Module:
    """Physically remove what ``mask`` removes (in place) and return the model.

    Heads and MLPs that are 0 at every application of a physical layer are removed; where a
    shared layer is masked at some depths only (ALBERT per-application masks), the rest stays
    as persistent gates (unless ``residual_gates=False``), recorded so that
    [`load_pruned`][headcount.core.surgery.load_pruned] restores them.

    >>> shrink(model, Mask.load("mask.json"))       # doctest: +SKIP
    """
    heads, mlps, residual = removable(model, mask)
    prune_mlps(model, mlps)
    prune_heads(model, heads)
    if residual and residual_gates:
        set_gates(model, heads=mask.heads, mlps=mask.mlps)
        getattr(model.config, RECORD)["gates"] = {"heads": mask.heads.int().tolist(), "mlps": mask.mlps.int().tolist()}
    return model


def kv_summary(model: nn.Module) -> dict:
    """Decoders: the key/value cache per token, in KV heads summed over layers, before and after
    surgery, and how many of the kept slots are repeated K/V heads (the cost of uneven cuts).
    Empty for encoders.

    >>> kv_summary(shrink(model, mask))    # doctest: +SKIP
    {'kv_heads_total': 6, 'kv_heads_kept': 5, 'kv_heads_repeated': 1}
    """
    grid = layout(model)
    if grid.n_kv_heads is None:
        return {}
    slots = [kept_kv_heads(b.out_projection, grid.n_kv_heads) for b in get_adapter(model).blocks(model)]
    return {"kv_heads_total": grid.n_layers * grid.n_kv_heads, "kv_heads_kept": sum(map(len, slots)),
            "kv_heads_repeated": sum(len(s) - len(set(s)) for s in slots)}


def count_parameters(model: nn.Module) -> int:
    """Parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters())


# -- checkpoints ------------------------------------------------------------------------------
def save_tokenizer(tokenizer, directory) -> None:
    """``tokenizer.save_pretrained(directory)``, without the state of its last call.

    A fast tokenizer keeps the padding and truncation of its last call in its backend, and
    ``save_pretrained`` writes them into ``tokenizer.json``: two identical runs would write
    different files. A copy with both cleared is saved (what every call without padding or
    truncation sets), so the file is the same whatever the tokenizer did; the caller's tokenizer
    is left as it is.

    >>> save_tokenizer(load_tokenizer("offline"), "model/")   # doctest: +SKIP
    """
    import copy

    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is not None and (backend.padding is not None or backend.truncation is not None):
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.backend_tokenizer.no_padding()
        tokenizer.backend_tokenizer.no_truncation()
    tokenizer.save_pretrained(directory)


def save_pruned(model: nn.Module, out_dir, tokenizer=None, extra: dict | None = None, owned=None) -> Path:
    """Write a pruned checkpoint: config (with the pruning record), safetensors weights,
    tokenizer, and ``headcount.json`` (a human-readable summary). Atomic: the directory appears
    complete or not at all; an existing one is replaced only as ``atomic_dir``
    allows (``owned``: its test of the files there).

    >>> save_pruned(shrink(model, mask), "pruned/")     # doctest: +SKIP
    """
    out_dir = Path(out_dir)
    _record(model)
    n_layers, n_heads = layout(model)
    rec = pruning_record(model)
    with atomic_dir(out_dir, owned=owned) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            save_tokenizer(tokenizer, tmp)
        summary = {
            "format": "headcount-pruned/1",
            "heads_kept": n_layers * n_heads - sum(len(x) for x in rec["removed_heads"]),
            "heads_total": n_layers * n_heads,
            "mlps_kept": n_layers - len(rec["removed_mlps"]),
            "parameters": count_parameters(model),
            **kv_summary(model),
            **(extra or {}),
        }
        atomic_write_json(tmp / "headcount.json", summary)
    return out_dir


def _load_state(path: Path) -> dict:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state = {}
        for f in files:
            state.update(load_file(str(path / f)))
        return state
    single = path / "model.safetensors"
    if not single.is_file():
        raise HeadcountError(f"no model.safetensors in {path}")
    return load_file(str(single))


def is_pruned_checkpoint(path) -> bool:
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        return bool(json.loads(cfg.read_text(encoding="utf-8")).get(RECORD))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def _align_to(model: nn.Module, state: dict) -> dict:
    """Map checkpoint keys onto ``model``'s layout when one has a task head and the other not.

    A task model keeps the encoder under ``base_model_prefix`` (``<prefix>.encoder...``), a bare
    encoder does not; transformers' ``from_pretrained`` bridges the two, ``load_state_dict``
    does not.
    """
    prefix = getattr(model, "base_model_prefix", "") or ""
    if not prefix:
        return state
    dot = prefix + "."
    model_has = any(k.startswith(dot) for k in model.state_dict())
    state_has = any(k.startswith(dot) for k in state)
    if state_has and not model_has:  # bare encoder from a task checkpoint: drop the task head
        return {k[len(dot):]: v for k, v in state.items() if k.startswith(dot)}
    if model_has and not state_has:  # task model from a bare-encoder checkpoint
        return {dot + k: v for k, v in state.items()}
    return state


def _renamed(model: nn.Module, state: dict) -> dict:
    """Undo the key renames ``save_pretrained`` applies for legacy checkpoint names (transformers
    5 saves GPT-NeoX's ``lm_head`` as ``embed_out``): keys the model has stay as they are."""
    own = set(model.state_dict())
    if all(k in own for k in state):
        return state
    try:  # transformers' own renaming table; absent in other versions: keys stay as saved
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, rename_source_key
        renamings = [t for t in get_model_conversion_mapping(model) if isinstance(t, WeightRenaming)]
    except (ImportError, AttributeError, TypeError):
        return state
    return {k if k in own else rename_source_key(k, renamings, [])[0]: v for k, v in state.items()}


def load_pruned(path, model_class=None, **config_kwargs) -> nn.Module:
    """Load a checkpoint written by [`save_pruned`][headcount.core.surgery.save_pruned]; outputs equal the saved model's.

    Args:
        path: the checkpoint directory.
        model_class: a transformers model class; default: the one named in ``config.json``.
            Another head than the saved one works like ``from_pretrained``: a bare encoder
            drops the saved task head, a task head the checkpoint lacks starts from random
            weights (the encoder's weights must all be there).
        config_kwargs: set on the config before the model is built (``num_labels=3`` for a
            new classification head).

    >>> model = load_pruned("pruned/")     # doctest: +SKIP
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise HeadcountError(f"not a checkpoint directory (no config.json): {path}")
    config = transformers.AutoConfig.from_pretrained(str(path))
    record = getattr(config, RECORD, None) or {}
    names = getattr(config, "architectures", None) or []
    if model_class is None:
        if not names or not hasattr(transformers, names[0]):
            raise HeadcountError(f"{path}/config.json names no known model class (architectures: {names})")
        model_class = getattr(transformers, names[0])
    for key, value in config_kwargs.items():
        setattr(config, key, value)
    setattr(config, RECORD, None)
    model = model_class(config)
    replay(model, record)
    state = _align_to(model, _renamed(model, _load_state(path)))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # size mismatches
        raise HeadcountError(f"checkpoint {path} does not match its pruning record ({str(e).splitlines()[-1].strip()})") from None
    tied = set(getattr(model, "all_tied_weights_keys", None) or {}) | set(getattr(model, "_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied]
    if model_class.__name__ not in names:
        # Another head: like from_pretrained, a module the checkpoint has no weight of at all
        # (the new task head, a pooler the saved head did not use) starts from random weights,
        # and weights of modules this model lacks (the saved head) are dropped. A module with
        # only some of its weights saved, and any tensor of the encoder body, is an error.
        adapter = get_adapter(model)
        saved_modules = {k.rsplit(".", 1)[0] for k in state}
        own_modules = {name for name, _ in model.named_modules()}
        missing = [k for k in missing if k.rsplit(".", 1)[0] in saved_modules or adapter.is_body_tensor(model, k)]
        unexpected = [k for k in unexpected if k.rsplit(".", 1)[0] in own_modules or adapter.is_body_tensor(model, k)]
    if missing or unexpected:
        raise HeadcountError(
            f"checkpoint {path} does not match its pruning record (missing {missing[:3]}, unexpected {list(unexpected)[:3]})"
        )
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.eval()
