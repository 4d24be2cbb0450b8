"""The public API as a user's script calls it: `make typecheck` runs mypy on this file (and on
api.py), so a change to a public signature that breaks such calls fails CI. Never executed."""

from __future__ import annotations

import torch

import headcount as hc


def usage(batches: list[dict[str, torch.Tensor]]) -> float:
    model = hc.load_model("offline", head="classification", num_labels=2)
    tok = hc.load_tokenizer("offline")
    task = hc.get_task("offline/movies")
    data = task.load("train", max_examples=64)
    assert hc.encode(data, tok, max_length=64) is not None
    scores: hc.Scores = hc.score(model, batches, method="gradient", normalize="layer+global", accumulate="cumulative")
    heads: torch.Tensor = scores.heads
    n_layers, n_heads = hc.layout(model)
    mask = hc.Mask.full(n_layers, n_heads).without_heads([(0, 3)])
    with hc.gated(model, heads=mask.heads, mlps=mask.mlps):
        pass
    small = hc.shrink(model, mask)
    hc.save_pruned(small, "pruned/", tokenizer=tok)
    again = hc.load_pruned("pruned/")
    metrics: dict = hc.finetune("offline", "offline/movies", seed=1, out_dir="runs/ft")
    return float(heads.sum()) + hc.count_parameters(again) + len(metrics)
