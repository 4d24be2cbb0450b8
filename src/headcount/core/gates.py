"""Head and MLP gates installed by hooks (transformers 5 has no ``head_mask``).

Gate semantics (docs/design.md):
- head gate ``g[l, h]`` multiplies head h's context vector before the attention output
  projection of application l (the projection's bias stays);
- MLP gate ``m[l]`` multiplies the feed-forward block's contribution to the residual stream
  (bias included) before the residual add and LayerNorm: ``ffn_out``'s output, or the norm
  after it where the adapter declares one (``Block.mlp_output``: "sandwich" norms, whose
  scale invariance would make a gate in front of them ungradable);
- attention gate ``a[l]`` scales the attention block's contribution beyond what it is with every
  head removed (``Block.attention_output``: the out projection, or the norm after it), so
  ``a = 0`` equals every head of application l removed. Without a norm after the block it is
  every head gate times ``a``; after one, it is the one gate whose gradient measures removing
  the whole layer (the heads' gradients there sum to ~0 by the norm's scale invariance).

Gates are indexed by *application* (``[n_layers, n_heads]`` with n_layers = applications):
ALBERT's shared layer gets one gate row per depth. A layer pre-hook tells the gates which
application runs, so a shared module is gated differently at each depth.

Several gate sets may be active at once (a fixed 0/1 mask and scoring gates that require
grad); their product is applied.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from headcount.core.arch import Layout, get_adapter
from headcount.runtime.errors import HeadcountError

_ATTR = "_headcount_hooks"


@dataclass(eq=False)  # identity: a gate set is removed by handle
class GateValues:
    """One set of gate values.

    Attributes:
        heads: ``[n_layers, n_heads]``, or per token ``[batch, seq, n_layers, n_heads]``; None = no head gates.
        mlps: ``[n_layers]``, or per token ``[batch, seq, n_layers]``; None = no MLP gates.
        attention: ``[n_layers]`` (or per token) whole-attention-block gates; None = none.
    """

    heads: torch.Tensor | None = None
    mlps: torch.Tensor | None = None
    attention: torch.Tensor | None = None


def kept_heads(out_projection: nn.Module, n_heads: int) -> list[int]:
    """Original indices of the heads still present behind ``out_projection``."""
    kept = getattr(out_projection, "headcount_kept_heads", None)
    return list(range(n_heads)) if kept is None else kept


def kept_kv_heads(out_projection: nn.Module, n_kv: int) -> list[int]:
    """Original key/value head of each KV slot of a decoder layer, repeats included (surgery
    repeats a K/V head when a group keeps more query heads than another; see
    ``headcount.core.arch.base.kv_plan``)."""
    kept = getattr(out_projection, "headcount_kv_heads", None)
    return list(range(n_kv)) if kept is None else kept


class _Hooks:
    """The hooks of one model; installed once, idle while no gate set is active."""

    def __init__(self, model: nn.Module):
        adapter = get_adapter(model)
        self.blocks = adapter.blocks(model)
        self.n_heads = adapter.num_heads(model.config)
        self.head_dim = adapter.head_dim(model.config)
        self.active: list[GateValues] = []
        self.current = 0
        # Keyed by the modules themselves, not id(): a deep copy of the model remaps them.
        self._apps_of: dict[nn.Module, list[int]] = {}
        self._block_of: dict[nn.Module, object] = {}  # attention gate point -> its Block
        self._calls: dict[nn.Module, int] = {}
        for app, block in enumerate(self.blocks):
            self._apps_of.setdefault(block.layer, []).append(app)
        self.handles = [adapter.encoder(model).register_forward_pre_hook(self._reset)]
        seen: set[int] = set()
        for block in self.blocks:
            if id(block.layer) in seen:  # a shared layer: one set of hooks serves every depth
                continue
            seen.add(id(block.layer))
            self.handles.append(block.layer.register_forward_pre_hook(self._enter_layer))
            self.handles.append(block.out_projection.register_forward_pre_hook(self._gate_heads))
            self.handles.append(block.mlp_gate_point().register_forward_hook(self._gate_mlp))
            self._block_of[block.attention_gate_point()] = block
            self.handles.append(block.attention_gate_point().register_forward_hook(self._gate_attention))

    # -- which application is running ---------------------------------------------------
    def _reset(self, module, args):
        self._calls.clear()

    def _enter_layer(self, module, args):
        apps = self._apps_of[module]
        n = self._calls.get(module, 0)
        self._calls[module] = n + 1
        self.current = apps[n % len(apps)]

    # -- the gates ------------------------------------------------------------------------
    def _head_gate(self, app: int) -> torch.Tensor | None:
        gate = None
        for values in self.active:
            if values.heads is None:
                continue
            g = values.heads[app] if values.heads.dim() == 2 else values.heads[:, :, app]  # [H] or [B, S, H]
            gate = g if gate is None else gate * g
        return gate

    def _gate_heads(self, module, args):
        if not self.active:
            return None
        gate = self._head_gate(self.current)
        if gate is None:
            return None
        x = args[0]  # [batch, seq, kept_heads * head_dim]
        kept = kept_heads(module, self.n_heads)
        if len(kept) != gate.shape[-1]:
            gate = gate[..., kept]
        gate = gate.to(device=x.device, dtype=x.dtype)  # a mask made on the CPU gates a model on a GPU
        y = x.view(*x.shape[:-1], len(kept), self.head_dim) * gate.unsqueeze(-1)  # [batch, seq, head, head_dim]
        return (y.view(x.shape),) + tuple(args[1:])

    def _layer_gate(self, field: str) -> torch.Tensor | None:
        """The product of the active ``field`` gates ([n_layers] or [batch, seq, n_layers]) for
        the running application: a scalar, or ``[batch, seq, 1]`` per token."""
        gate = None
        for values in self.active:
            v = getattr(values, field)
            if v is not None:
                m = v[self.current] if v.dim() == 1 else v[..., self.current, None]
                gate = m if gate is None else gate * m
        return gate

    def _gate_mlp(self, module, args, output):
        if not self.active:
            return None
        gate = self._layer_gate("mlps")
        if gate is None:
            return None
        return output * gate.to(device=output.device, dtype=output.dtype)

    def _gate_attention(self, module, args, output):
        if not self.active:
            return None
        gate = self._layer_gate("attention")
        if gate is None:
            return None
        gate = gate.to(device=output.device, dtype=output.dtype)
        bias = getattr(self._block_of[module].out_projection, "bias", None)
        if bias is None:  # no head left: the out projection gives zeros, a norm of zeros is zeros
            return output * gate
        # no head left: the out projection gives its bias (and the norm after it, the bias's norm);
        # forward, not __call__: no hook of ours runs on it
        removed = bias if module is self._block_of[module].out_projection else module.forward(bias)
        removed = removed.to(dtype=output.dtype)
        return removed + (output - removed) * gate

    def remove(self):
        for handle in self.handles:
            handle.remove()


def hooks(model: nn.Module) -> _Hooks:
    """The model's gate hooks, installed on first use."""
    h = model.__dict__.get(_ATTR)
    if h is None:
        h = _Hooks(model)
        model.__dict__[_ATTR] = h
    return h


def uninstall(model: nn.Module) -> None:
    """Remove every gate hook from ``model`` (surgery calls it when it replaces modules)."""
    h = model.__dict__.pop(_ATTR, None)
    if h is not None:
        h.remove()


def _check(model: nn.Module, values: GateValues) -> GateValues:
    n_layers, n_heads = layout(model)
    if values.heads is not None:
        shape = tuple(values.heads.shape)
        if shape[-2:] != (n_layers, n_heads):
            raise HeadcountError(f"head gates have shape {list(shape)}, this model needs [..., {n_layers}, {n_heads}]")
    for name, v in (("MLP", values.mlps), ("attention", values.attention)):
        if v is not None and tuple(v.shape)[-1:] != (n_layers,):
            raise HeadcountError(f"{name} gates have shape {list(v.shape)}, this model needs [..., {n_layers}]")
    return values


@contextmanager
def gated(model: nn.Module, heads: torch.Tensor | None = None, mlps: torch.Tensor | None = None,
          attention: torch.Tensor | None = None):
    """Apply gates inside a ``with`` block.

    Args:
        model: any model with a registered adapter.
        heads: ``[n_layers, n_heads]`` (or ``[batch, seq, n_layers, n_heads]`` per token).
        mlps: ``[n_layers]`` (or ``[batch, seq, n_layers]``).
        attention: ``[n_layers]`` (or per token): whole attention blocks (0 = every head removed).

    >>> g = torch.ones(6, 12, requires_grad=True)
    >>> with gated(model, heads=g):            # doctest: +SKIP
    ...     model(**batch).loss.backward()      # g.grad: [6, 12]
    """
    values = _check(model, GateValues(heads, mlps, attention))
    h = hooks(model)
    h.active.append(values)
    try:
        yield values
    finally:
        h.active.remove(values)


def set_gates(model: nn.Module, heads: torch.Tensor | None = None, mlps: torch.Tensor | None = None,
              attention: torch.Tensor | None = None) -> GateValues:
    """Install persistent gates (a mask kept until [`clear_gates`][headcount.core.gates.clear_gates]); returns the handle."""
    values = _check(model, GateValues(heads, mlps, attention))
    hooks(model).active.append(values)
    return values


def clear_gates(model: nn.Module, values: GateValues | None = None) -> None:
    """Remove one persistent gate set, or all of them."""
    h = model.__dict__.get(_ATTR)
    if h is None:
        return
    if values is None:
        h.active.clear()
    else:
        h.active.remove(values)


def layout(model: nn.Module) -> Layout:
    """The gate grid of ``model``: a frozen [`Layout`][headcount.core.arch.Layout] that unpacks as
    ``(n_layers, n_heads)`` (applications x heads per application). Installs no hooks.
    """
    return get_adapter(model).layout(model)


def shared_groups(model: nn.Module) -> list[list[int]]:
    """Applications grouped by the physical layer they run (ALBERT: one group of 12)."""
    return [list(g) for g in layout(model).groups]


def clone_model(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with its own gate hooks (persistent gates copied too)."""
    h = model.__dict__.get(_ATTR)
    active = list(h.active) if h is not None else []
    uninstall(model)
    try:
        twin = copy.deepcopy(model)
    finally:
        if active:
            hooks(model).active.extend(active)
    if active:
        hooks(twin).active.extend(GateValues(v.heads, v.mlps, v.attention) for v in active)
    return twin
