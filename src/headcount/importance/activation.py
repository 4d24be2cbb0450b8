"""Activation-based importance (Wanda-sp, the structured baseline in FLAP, arXiv 2312.11983): a
head's score is, over the columns ``j`` it owns in the attention output projection,
``sum_j ||X_j|| * sum_i |W_ij|``, with ``X_j`` the projection's input channel j over the real
(non-padding) tokens of the calibration batches (root mean square) and ``W`` its weight; an MLP's
score is the same sum over every input channel of its output projection (its neurons).

No gradient and no loss: one forward pass per batch, hooks on the output projections' inputs. Gates
act before these hooks, so a head a mask holds at 0 scores 0 (what pruning needs). Works for every
adapter (a ``Conv1D`` output projection's weight is ``[in, out]``: its columns are summed along the
other axis). The per-channel statistic is fp64; the ranking is what matters (FLAP's own metric, the
channel variance times the squared column norm, ranks heads differently and adds bias compensation:
not implemented here).
"""

from __future__ import annotations

import torch
from torch import nn

from headcount.core.arch.base import out_dim
from headcount.core.gates import hooks, kept_heads, layout
from headcount.importance.scores import Scores


@torch.no_grad()
def activation_scores(model: nn.Module, batches, progress=None, rt=None) -> Scores:
    """Wanda-sp importance of every head ``[L, H]`` and MLP ``[L]`` (see the module docstring).

    >>> s = activation_scores(model, batches)      # doctest: +SKIP
    >>> s.heads.shape                               # doctest: +SKIP
    torch.Size([6, 12])
    """
    from headcount.runtime.device import runtime, to_device

    rt = rt if rt is not None else runtime(model)
    h = hooks(model)  # the gate hooks: they say which application runs (ALBERT) and gate first
    grid = layout(model)
    n_layers, n_heads, d = grid.n_layers, grid.n_heads, grid.head_dim
    sq_attn: list[torch.Tensor | None] = [None] * n_layers  # per application: sum of x^2 per input channel
    sq_ffn: list[torch.Tensor | None] = [None] * n_layers
    state = {"mask": None}

    def collect(store):
        def pre(module, args):
            x = args[0].double()  # [batch, seq, channels]
            m = state["mask"]
            w = m[..., None].to(x) if m is not None and m.shape == x.shape[:2] else 1.0
            s = (x.pow(2) * w).sum(dim=tuple(range(x.dim() - 1)))  # [channels]
            app = h.current
            store[app] = s if store[app] is None else store[app] + s
        return pre

    handles, seen = [], set()
    for block in h.blocks:
        if id(block.layer) in seen:
            continue
        seen.add(id(block.layer))
        handles.append(block.out_projection.register_forward_pre_hook(collect(sq_attn)))
        handles.append(block.ffn_out.register_forward_pre_hook(collect(sq_ffn)))
    was_training = model.training
    model.eval()
    n_examples = n_tokens = 0
    try:
        for done, batch in enumerate(batches, 1):
            batch = to_device({k: v for k, v in batch.items() if k != "labels"}, rt.device)
            state["mask"] = batch.get("attention_mask")
            n_examples += int(batch["input_ids"].shape[0])
            n_tokens += int(state["mask"].sum()) if state["mask"] is not None else int(batch["input_ids"].numel())
            with rt.autocast():
                model(**batch)
            if progress:
                progress(n_examples)  # examples done (ScoreContext.progress)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    heads = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    mlps = torch.zeros(n_layers, dtype=torch.float64)
    for app, block in enumerate(h.blocks):
        for store, proj, out in ((sq_attn, block.out_projection, "heads"), (sq_ffn, block.ffn_out, "mlps")):
            if store[app] is None or store[app].numel() == 0:
                continue  # nothing left to score (every head or neuron removed)
            rms = (store[app] / max(n_tokens, 1)).sqrt().cpu()  # [channels]
            col = proj.weight.detach().abs().double().sum(dim=out_dim(proj)).cpu()  # [channels]: sum_i |W_ij|
            metric = rms * col
            if out == "mlps":
                mlps[app] = metric.sum()
            else:
                kept = kept_heads(proj, n_heads)
                heads[app, kept] = metric.view(len(kept), d).sum(dim=1)
    return Scores(heads=heads.float(), mlps=mlps.float(), method="activation", n_examples=n_examples,
                  n_tokens=n_tokens, meta=rt.meta())
