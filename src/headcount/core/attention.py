"""Per-head attention probabilities on demand, whatever attention implementation the model runs.

Fused kernels (sdpa, flash) never materialise the probabilities, so [`attention_maps`][headcount.core.attention.attention_maps]
switches the model to the eager implementation for one forward pass and restores the one it
had afterwards. The probabilities are read from the output of each application's attention
module (``Block.attention`` returns ``(output, weights)``), so every application gets its own
entry: ALBERT's shared layer gives one map per depth, and the gates that are active (masks,
scoring gates) are applied as usual.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from headcount.core.gates import hooks, kept_heads
from headcount.runtime.errors import HeadcountError

EAGER = "eager"


def attention_maps(model: nn.Module, *, device=None, precision=None, **batch) -> list[torch.Tensor]:
    """Attention probabilities of every head that is still present, one tensor per application.

    Runs one forward pass in the caller's grad mode and train/eval mode (use ``model.eval()``
    and ``torch.no_grad()`` for analysis: in train mode the maps carry attention dropout).

    Args:
        model: any model with a registered adapter (pruned or not, gated or not), loaded with
            any attention implementation; it is back on that implementation afterwards.
        device: where the model runs ([`headcount.runtime.device.place`][headcount.runtime.device.place]: None = ``$HEADCOUNT_DEVICE``,
            else where the model is); the inputs follow it.
        precision: ``auto`` | ``fp32`` | ``bf16`` ([`headcount.runtime.device.resolve_precision`][headcount.runtime.device.resolve_precision]);
            under bf16 autocast the probabilities are computed in bf16 and returned as fp32.
        **batch: the model's inputs (``input_ids``, ``attention_mask``, ...).

    Returns:
        ``maps[l]``: ``[batch, kept_heads, seq_q, seq_k]`` for application ``l``, heads in the
        order of their original indices ([`headcount.core.gates.kept_heads`][headcount.core.gates.kept_heads]); rows sum to 1
        over the keys the attention mask lets through. A layer with no head left gives
        ``[batch, 0, seq, seq]``. The maps are on the device the inputs came on (a CPU batch
        gets CPU maps from a model on a GPU).

    >>> maps = attention_maps(model, **batch)          # doctest: +SKIP
    >>> maps[0].shape                                   # doctest: +SKIP
    torch.Size([8, 12, 128, 128])
    """
    from headcount.runtime.device import autocast, place, resolve_precision, to_device

    n_apps = len(hooks(model).blocks)
    home = next((v.device for v in batch.values() if torch.is_tensor(v)), None)  # where the maps go back
    dev = place(model, device)
    prec = resolve_precision(precision, dev)
    batch = to_device(batch, dev)
    maps: list[torch.Tensor | None] = [None] * n_apps
    headless: set[int] = set()  # applications whose layer has no head left (no probabilities)

    def tap(app, weights):
        if weights is None:
            headless.add(app)
        else:
            maps[app] = weights  # [batch, kept_heads, seq_q, seq_k]

    with attention_taps(model, tap), autocast(dev, prec):
        model(**batch, output_attentions=True)
    for app in headless:
        ids = next(v for k, v in batch.items() if k in ("input_ids", "inputs_embeds"))
        maps[app] = torch.zeros(ids.shape[0], 0, ids.shape[1], ids.shape[1], device=dev)
    missing = [i for i, m in enumerate(maps) if m is None]
    if missing:
        raise HeadcountError(f"no attention probabilities were recorded for layers {missing}")
    if prec == "bf16":
        maps = [m.float() for m in maps]  # type: ignore[union-attr]
    if home is not None and home != dev:
        maps = [m.to(home) for m in maps]  # type: ignore[union-attr]
    return maps  # type: ignore[return-value]


@contextmanager
def attention_taps(model: nn.Module, tap):
    """Eager attention inside the block, and ``tap(application, weights)`` with each attention
    module's probabilities ``[batch, kept_heads, q, k]`` as it runs (None where a layer has no head
    left); the implementation the model had is restored afterwards. Nothing is retained: a caller
    that needs only a part of each map (the retrieval score: the last query's argmax) keeps only that.

    >>> with attention_taps(model, lambda app, w: print(app, w.shape)):   # doctest: +SKIP
    ...     model(**batch)
    0 torch.Size([8, 12, 128, 128])
    """
    h = hooks(model)

    def capture(module, args, kwargs, output):
        app = h.current
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None and kept_heads(h.blocks[app].out_projection, h.n_heads):
            raise HeadcountError(f"the attention module of layer {app} returned no attention probabilities")
        tap(app, weights)

    handles, seen = [], set()
    for block in h.blocks:
        if id(block.attention) not in seen:  # a shared module: one hook serves every depth
            seen.add(id(block.attention))
            handles.append(block.attention.register_forward_hook(capture, with_kwargs=True))
    previous = getattr(model.config, "_attn_implementation", None)
    switched = previous not in (None, EAGER)
    try:
        if switched:
            model.set_attn_implementation(EAGER)
        yield
    finally:
        for handle in handles:
            handle.remove()
        if switched:
            model.set_attn_implementation(previous)
