"""Magnitude pruning's weight-mask primitives (global L1, unstructured, ``torch.nn.utils.prune``).

Which weights compete (``variant``), named relative to the bare encoder
(``adapter.base(model)``), so a mask fits the base model and any task model built on it:

- ``"prasanna"`` (Prasanna et al. 2020): per block, the per-head projections (query, key,
  value, ...) weights and biases, the attention output projection weight and bias, the
  feed-forward input weight and bias, the feed-forward output weight;
- ``"chen"`` (Chen et al. 2020): the same linears' weights only, plus the pooler's dense weight
  when the model has a pooler.

Which weights go (``control``): ``"good"`` the smallest magnitudes; ``"bad"`` the largest;
``"random"`` uniformly at random. All three prune exactly the same number of weights.

A weight mask is ``{name: bool tensor}`` with True = kept (as in ``mask.json``, 1 = kept); it
is applied with ``torch.nn.utils.prune.custom_from_mask`` (a forward pre-hook computes
``weight = weight_orig * weight_mask``), so it stays applied while training; or, for an
evaluation without training, zeroed in place and restored ([`masked_weights`][headcount.importance.magnitude.masked_weights]).
File: ``weight_mask.safetensors`` (the bool tensors, sparsity and provenance in the header).

The procedures that decide how far to prune (the paper's search without retraining, IMP) are in
[`headcount.train.magnitude_search`][headcount.train.magnitude_search]; their names stay importable from here.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.utils import prune

from headcount.core.arch import get_adapter
from headcount.runtime.atomic import atomic_path
from headcount.runtime.errors import HeadcountError

VARIANTS = ("prasanna", "chen")
CONTROLS = ("good", "random", "bad")

WeightMask = dict  # {name relative to the base model: bool tensor, True = kept}


# -- which weights -------------------------------------------------------------------------------
def _pooler_linear(base: nn.Module) -> nn.Linear | None:
    """The pooler's dense layer, found generically: ``base.pooler`` is a Linear or has one as ``dense``."""
    pooler = getattr(base, "pooler", None)
    if isinstance(pooler, nn.Linear):
        return pooler
    dense = getattr(pooler, "dense", None) if isinstance(pooler, nn.Module) else None
    return dense if isinstance(dense, nn.Linear) else None


def weight_targets(model: nn.Module, variant: str = "prasanna") -> dict[str, tuple[nn.Module, str]]:
    """The parameters magnitude pruning ranks: ``{name: (module, "weight" | "bias")}``.

    Names are relative to the bare encoder (``adapter.base(model)``), in block order; a shared
    layer (ALBERT) appears once.

    >>> sorted(weight_targets(model, "chen"))[:1]          # doctest: +SKIP
    ['encoder.layer.0.attention.output.dense.weight']
    """
    if variant not in VARIANTS:
        raise HeadcountError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    adapter = get_adapter(model)
    base = adapter.base(model)
    names = {id(m): n for n, m in base.named_modules()}
    with_bias = variant == "prasanna"
    chosen: list[tuple[nn.Module, str]] = []
    for block in adapter.blocks(model):
        for lin in block.head_projections:
            chosen.append((lin, "weight"))
            if with_bias:
                chosen.append((lin, "bias"))
        for lin, bias in ((block.out_projection, True), (block.ffn_in, True), (block.ffn_out, False)):
            chosen.append((lin, "weight"))
            if with_bias and bias:
                chosen.append((lin, "bias"))
    if variant == "chen":
        pooler = _pooler_linear(base)
        if pooler is not None:
            chosen.append((pooler, "weight"))
    targets: dict[str, tuple[nn.Module, str]] = {}
    for module, attr in chosen:
        if id(module) not in names:
            raise HeadcountError("a prunable layer is not inside the base model (adapter problem)")
        if _param(module, attr) is None:
            continue  # no bias, or removed by surgery
        targets.setdefault(f"{names[id(module)]}.{attr}" if names[id(module)] else attr, (module, attr))
    return targets


def _param(module: nn.Module, attr: str) -> torch.Tensor | None:
    """The trainable tensor behind ``attr`` (``attr_orig`` when a prune hook is installed)."""
    p = getattr(module, attr + "_orig", None)
    return p if p is not None else getattr(module, attr, None)


# -- masks ---------------------------------------------------------------------------------------------
class _LargestL1(prune.BasePruningMethod):
    """Prune the ``amount`` entries of LARGEST magnitude (the "bad" control)."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount: int | float):
        self.amount = amount

    def compute_mask(self, t, default_mask):
        n = int(self.amount) if isinstance(self.amount, int) else int(round(self.amount * t.nelement()))
        if not 0 <= n <= t.nelement():
            raise HeadcountError(f"cannot prune {n} of {t.nelement()} weights")
        mask = default_mask.clone(memory_format=torch.contiguous_format)
        if n:
            top = torch.topk(torch.abs(t).view(-1), k=n, largest=True)
            mask.view(-1)[top.indices] = 0
        return mask


_METHODS = {"good": prune.L1Unstructured, "random": prune.RandomUnstructured, "bad": _LargestL1}


def check_sparsity(sparsity: float, what: str = "sparsity") -> float:
    """Raise a one-line error unless ``0 <= sparsity < 1``.

    >>> check_sparsity(0.5)
    0.5
    """
    try:
        s = float(sparsity)
    except (TypeError, ValueError):
        raise HeadcountError(f"{what} must be a number in [0, 1), got {sparsity!r}") from None
    if not 0.0 <= s < 1.0:
        raise HeadcountError(f"{what} must be in [0, 1), got {sparsity}")
    return s


def magnitude_mask(model: nn.Module, sparsity: float, *, variant: str = "prasanna", control: str = "good",
                   current: WeightMask | None = None, seed: int = 0) -> WeightMask:
    """A global unstructured weight mask at exactly ``round(sparsity * total)`` pruned weights.

    Ranks the current weights of ``model`` (fine-tuned, usually) over all [`weight_targets`][headcount.importance.magnitude.weight_targets]
    at once with ``torch.nn.utils.prune.global_unstructured``. Weights pruned in ``current`` (or by
    hooks already on ``model``) stay pruned; the new ones are chosen among the rest. ``model``
    itself is not changed.

    Args:
        model: the model whose magnitudes rank the weights.
        sparsity: the fraction of target weights pruned in the result, in [0, 1).
        variant: ``"prasanna"`` or ``"chen"`` (see [`weight_targets`][headcount.importance.magnitude.weight_targets]).
        control: ``"good"`` (smallest first), ``"bad"`` (largest first), ``"random"``.
        current: a mask the result must contain (IMP's previous round).
        seed: the random control's seed.

    Returns:
        ``{name: bool tensor}`` (True = kept) on the CPU.

    >>> m = magnitude_mask(model, 0.5, control="bad")        # doctest: +SKIP
    >>> mask_sparsity(m)["sparsity"]                         # doctest: +SKIP
    0.5
    """
    sparsity = check_sparsity(sparsity)
    if control not in CONTROLS:
        raise HeadcountError(f"unknown control {control!r}; choose one of {', '.join(CONTROLS)}")
    targets = weight_targets(model, variant)
    if current is not None:
        _check_names(current, targets)
    holders, pairs = {}, []
    for name, (module, attr) in targets.items():
        h = nn.Module()  # a stand-in holding the tensor (shared storage): model stays untouched
        h.register_parameter("w", nn.Parameter(_param(module, attr).detach(), requires_grad=False))
        keep = torch.ones_like(h.w, dtype=torch.bool)
        hook_mask = getattr(module, attr + "_mask", None)
        if hook_mask is not None:
            keep &= hook_mask.detach().bool()
        if current is not None:
            keep &= current[name].to(keep.device).bool()
        if not bool(keep.all()):
            prune.custom_from_mask(h, "w", keep)
        holders[name] = h
        pairs.append((h, "w"))
    total = sum(h.w.numel() for h in holders.values())
    already = sum(int((~_keep(h)).sum()) for h in holders.values())
    wanted = int(round(sparsity * total))
    if wanted < already:
        raise HeadcountError(f"sparsity {sparsity} is below the current mask's {already / total:.4f}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        prune.global_unstructured(pairs, pruning_method=_METHODS[control], amount=wanted - already)
    return {name: _keep(h).cpu() for name, h in holders.items()}


def _keep(holder: nn.Module) -> torch.Tensor:
    m = getattr(holder, "w_mask", None)
    return torch.ones_like(holder.w, dtype=torch.bool) if m is None else m.bool()


def _check_names(mask: WeightMask, targets: dict) -> None:
    missing = [n for n in targets if n not in mask]
    extra = [n for n in mask if n not in targets]
    if extra or missing:
        which = f"{extra[0]!r} is not a prunable weight of this model" if extra else f"it lacks {missing[0]!r}"
        raise HeadcountError(f"the weight mask does not fit this model: {which}")
    for name, (module, attr) in targets.items():
        shape = tuple(_param(module, attr).shape)
        if tuple(mask[name].shape) != shape:
            raise HeadcountError(
                f"the weight mask is for another model shape: {name} is {list(mask[name].shape)}, the model has {list(shape)}"
            )


def _all_named(model: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """Every variant's targets (a mask names a subset of them)."""
    out = {}
    for v in VARIANTS:
        out.update(weight_targets(model, v))
    return out


def apply_weight_mask(model: nn.Module, mask: WeightMask) -> nn.Module:
    """Install ``mask`` on ``model`` with ``torch.nn.utils.prune.custom_from_mask`` (in place).

    The hooks keep the pruned weights at zero during training (their gradient is zero too).
    A second mask on the same weights multiplies with the first.

    Raises:
        HeadcountError: a name the model lacks, or a shape that differs (another model shape).

    >>> apply_weight_mask(model, load_weight_mask("runs/mag/weight_mask.safetensors"))   # doctest: +SKIP
    """
    targets = _fitting(model, mask)
    for name, keep in mask.items():
        module, attr = targets[name]
        prune.custom_from_mask(module, attr, keep.to(device=_param(module, attr).device, dtype=torch.bool))
    return model


def _fitting(model: nn.Module, mask: WeightMask) -> dict[str, tuple[nn.Module, str]]:
    """[`_all_named`][headcount.importance.magnitude._all_named] of ``model``, once every name and shape of ``mask`` is checked against it."""
    targets = _all_named(model)
    for name, keep in mask.items():
        if name not in targets:
            raise HeadcountError(f"the weight mask does not fit this model: {name!r} is not a prunable weight of it")
        module, attr = targets[name]
        p = _param(module, attr)
        if tuple(keep.shape) != tuple(p.shape):
            raise HeadcountError(
                f"the weight mask is for another model shape: {name} is {list(keep.shape)}, the model has {list(p.shape)}"
            )
    return targets


@contextmanager
def masked_weights(model: nn.Module, mask: WeightMask) -> Iterator[nn.Module]:
    """Zero the pruned weights of ``mask`` in place for the block, then restore them exactly.

    For evaluating a mask on trained weights without training (no hooks: the forward pass is the
    plain model's). Only the tensors the mask prunes from are copied (to restore them).

    >>> with masked_weights(model, mask):                   # doctest: +SKIP
    ...     score = evaluate(model, dev)["score"]
    """
    targets = _fitting(model, mask)
    saved: dict[str, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for name, keep in mask.items():
                if bool(keep.all()):
                    continue
                p = _param(*targets[name])
                saved[name] = p.detach().clone()
                p.mul_(keep.to(device=p.device, dtype=p.dtype))
        yield model
    finally:
        with torch.no_grad():
            for name, w in saved.items():
                _param(*targets[name]).copy_(w)


def remove_weight_mask(model: nn.Module) -> nn.Module:
    """Make installed masks permanent (``prune.remove``): pruned weights become plain zeros.

    >>> remove_weight_mask(apply_weight_mask(model, mask)).save_pretrained("pruned/")   # doctest: +SKIP
    """
    for module in model.modules():
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(module, hook._tensor_name)
    return model


def weight_mask_of(model: nn.Module) -> WeightMask:
    """The masks installed on ``model`` (``{name: bool}``; empty when none).

    >>> weight_mask_of(apply_weight_mask(model, mask)).keys() == mask.keys()     # doctest: +SKIP
    True
    """
    targets = _all_named(model)
    return {n: getattr(m, a + "_mask").detach().bool().cpu() for n, (m, a) in targets.items()
            if getattr(m, a + "_mask", None) is not None}


def mask_sparsity(mask: WeightMask) -> dict:
    """Exact counts: ``{"pruned": int, "total": int, "sparsity": pruned / total}``.

    >>> mask_sparsity({"w": torch.tensor([True, False, False, True])})
    {'pruned': 2, 'total': 4, 'sparsity': 0.5}
    """
    total = sum(int(m.numel()) for m in mask.values())
    pruned = sum(int((~m.bool()).sum()) for m in mask.values())
    return {"pruned": pruned, "total": total, "sparsity": pruned / total if total else 0.0}


def model_sparsity(model: nn.Module, variant: str = "prasanna") -> dict:
    """Exact zeros among ``model``'s target weights (as the forward pass sees them).

    >>> model_sparsity(load_model("runs/mag/round_03/model"))["sparsity"]      # doctest: +SKIP
    0.271
    """
    targets = weight_targets(model, variant)
    total = pruned = 0
    for module, attr in targets.values():
        w = getattr(module, attr)
        total += w.numel()
        pruned += int((w == 0).sum())
    return {"pruned": pruned, "total": total, "sparsity": pruned / total if total else 0.0}


def save_weight_mask(mask: WeightMask, path, meta: dict | None = None) -> Path:
    """Write ``mask`` as ``safetensors`` (bool tensors; ``meta`` in the header), atomically.

    >>> save_weight_mask(mask, "weight_mask.safetensors", meta={"control": "good"})   # doctest: +SKIP
    """
    path = Path(path)
    tensors = {k: v.detach().bool().contiguous().cpu() for k, v in mask.items()}
    header = {k: json.dumps(v) for k, v in {**mask_sparsity(mask), **(meta or {})}.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=header)
        _sort_metadata(tmp)
    return path


def _sort_metadata(path: Path) -> None:
    """Rewrite a safetensors header with its metadata keys sorted, in place and at its length.

    safetensors keeps the metadata in a hash map, so each process writes its keys in another
    order: identical masks gave files with different bytes (and SHA-256s in the folder's record).
    The header is re-serialised compactly as safetensors writes it and padded with spaces to its
    old size, so the data offsets stay; a header that would not fit is left as written.
    """
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
        header = json.loads(raw, object_pairs_hook=dict)
        if isinstance(header.get("__metadata__"), dict):
            header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) <= n:
            f.seek(8)
            f.write(text + b" " * (n - len(text)))


def load_weight_mask(path) -> WeightMask:
    """Read a ``weight_mask.safetensors`` (a folder holding one works too).

    >>> mask = load_weight_mask("runs/mag")                  # doctest: +SKIP
    """
    path = Path(path)
    if path.is_dir():
        path = path / "weight_mask.safetensors"
    if not path.is_file():
        raise HeadcountError(f"weight mask not found: {path}")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise HeadcountError(f"{path} is not a weight mask: {e}") from None
    if not tensors or any(t.dtype != torch.bool for t in tensors.values()):
        raise HeadcountError(f"{path} is not a weight mask (expected bool tensors)")
    return tensors


def weight_mask_meta(path) -> dict:
    """The metadata stored with a weight mask (sparsity, variant, control, ...).

    >>> weight_mask_meta("runs/mag")["control"]              # doctest: +SKIP
    'good'
    """
    path = Path(path)
    if path.is_dir():
        path = path / "weight_mask.safetensors"
    with safe_open(str(path), framework="pt") as f:
        return {k: json.loads(v) for k, v in (f.metadata() or {}).items()}


__all__ = ["VARIANTS", "CONTROLS", "weight_targets", "magnitude_mask", "apply_weight_mask", "masked_weights",
           "remove_weight_mask", "weight_mask_of", "mask_sparsity", "model_sparsity", "save_weight_mask",
           "load_weight_mask", "weight_mask_meta", "check_sparsity"]
