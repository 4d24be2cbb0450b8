"""Iterative pruning to a threshold: scores -> masks, until the metric falls below
``threshold`` x the unpruned metric; the last mask at or above it is returned.

Schedules (both anchors):

- ``heads`` (run_bertology): remove ``step`` of the heads per step, recompute importance, repeat.
- ``prasanna`` (Prasanna et al. 2020, ``mask_heads_mlps`` in their code): a joint phase removing
  ``step`` of the heads plus one MLP per step, ending when the metric falls below the threshold
  or no MLP (or no head) is left; then a heads-only phase with half the head step from the last
  passing masks; then an MLP-only phase, one MLP per step.

Which importance a step uses follows the reference, which scores a mask in the same pass that
evaluates it: a step uses the importance of the mask it starts from, except the first step of
a phase that follows a failed step, which uses the importance computed on the failed step's
masks (no fresh scoring; the reference's heads-only phase ranks heads by the failed joint step's
importance, its MLP-only phase MLPs by the failed heads-only step's). Each trace row says
``importance``: ``fresh`` (computed on the masks the step starts from) or ``reused`` (computed
on other masks: the failed step's; the unpruned model's with ``one_shot``). Scoring the failed
step's masks is the one extra scoring pass a phase change costs (the reference scores every
mask it evaluates). Remaining differences from
the reference: ties are broken by position (its ``sort`` is not stable); the heads-only step is
``max(1, n // 2)`` where the reference's ``n // 2`` is 0 for n = 1 (its heads-only phase then
does nothing); when its joint phase ends because no head is left, its MLP-only phase starts
from the MLP mask one step before the last passing one (a bookkeeping slip), here from the last
passing one; and a physically shrunk working copy (``shrink``) scores heads already cut out as
0 where the reference's gate gradient at 0 still counts in the layer-wise L2 norm (use
``shrink=False`` for the reference's normalisation).

The returned mask's metadata ``removed_at_step`` says which accepted step removed each head
(``heads``: ``[n_layers, n_heads]``) and MLP (``mlps``: ``[n_layers]``); 0 = kept (or removed
before ``start``). The explorer shows it; ``mask.json`` carries it.

``step_of="total"`` makes a step a fraction of all heads, as both anchors do
(int(0.1 x 144) = 14 for BERT-base); ``"remaining"`` a fraction of the heads still kept.
Importance is recomputed at every step, or once (``one_shot``, Michel et al.).

The loop only orchestrates: scoring, selection ([`select_lowest`][headcount.importance.pruning.select_lowest], a pure function) and
evaluation are passed in, so every piece is tested on its own.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from headcount.core.masks import Mask
from headcount.importance.scores import kv_pool
from headcount.runtime.errors import HeadcountError

SCHEDULES = ("heads", "prasanna")


@dataclass(frozen=True)
class PruneConfig:
    """Settings of [`iterative_prune`][headcount.importance.pruning.iterative_prune].

    Attributes:
        threshold: stop when metric < threshold x unpruned metric; in (0, 1].
        step: fraction of heads removed per step (at least one head).
        step_of: ``"remaining"`` or ``"total"`` (the anchors' choice).
        schedule: ``"heads"`` or ``"prasanna"`` (joint heads+MLPs, then heads, then MLPs).
        one_shot: score once on the unpruned model instead of at every step.
        max_steps: optional cap on evaluated steps.
        shrink: physically shrink a working copy between steps (faster than masking alone).
        unit: ``heads`` (query heads) or ``kv-groups`` (decoders with grouped-query attention: whole
            key/value groups go, ranked by [`kv_pool`][headcount.importance.scores.kv_pool] ``sum``; ``step`` is then a fraction of
            the groups, and what is removed shrinks the KV cache).
    """

    threshold: float = 0.9
    step: float = 0.1
    step_of: str = "remaining"
    schedule: str = "heads"
    one_shot: bool = False
    max_steps: int | None = None
    shrink: bool = True
    unit: str = "heads"

    def __post_init__(self):
        if not 0 < self.threshold <= 1:
            raise HeadcountError(f"--threshold must be in (0, 1], got {self.threshold}")
        if not 0 < self.step < 1:
            raise HeadcountError(f"--step must be in (0, 1), got {self.step}")
        if self.step_of not in ("remaining", "total"):
            raise HeadcountError(f"step_of must be 'remaining' or 'total', got {self.step_of!r}")
        if self.schedule not in SCHEDULES:
            raise HeadcountError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        check_unit(self.unit)


#: the units heads are scored and pruned in: query heads, or whole key/value groups (decoders with GQA)
UNITS = ("heads", "kv-groups")


def check_unit(unit: str) -> str:
    if unit not in UNITS:
        raise HeadcountError(f"unknown unit {unit!r}; choose one of {', '.join(UNITS)}")
    return unit


def _kv_heads(model, config: "PruneConfig") -> int | None:
    """Key/value heads per layer when pruning whole groups; refuses models without GQA."""
    if config.unit != "kv-groups":
        return None
    from headcount.core.arch import require_kv_groups

    return require_kv_groups(model).n_kv_heads


@dataclass
class PruneResult:
    """The final mask, the unpruned metric, one trace row per evaluated step, and where it ran
    (``meta``: ``device``, ``precision``, ... as ``headcount.runtime.device.Runtime.meta``)."""

    mask: Mask
    full_metric: float
    trace: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def trace_csv(self) -> str:
        """The trace as CSV; ``device``, ``precision`` and ``accumulate`` columns when ``meta`` names them."""
        out = io.StringIO()
        cols = ["step", "phase", "heads_kept", "mlps_kept", "metric", "loss", "accepted", "importance", "seconds"]
        extra = {k: self.meta[k] for k in ("device", "precision", "accumulate") if k in self.meta}
        w = csv.DictWriter(out, fieldnames=cols + list(extra), extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for row in self.trace:
            w.writerow({**row, **extra})
        return out.getvalue()


def select_lowest(scores: torch.Tensor, keep: torch.Tensor, n: int) -> torch.Tensor:
    """Remove the ``n`` lowest-scored kept entries; a pure function on tensors.

    Args:
        scores: any shape; NaN scores count as lowest (they are removed first).
        keep: same shape, 1 = kept, 0 = already removed.
        n: how many to remove (capped at the number kept).

    Returns:
        The new keep tensor (ties broken by position, so the result is deterministic).

    >>> select_lowest(torch.tensor([3., 1., 2.]), torch.ones(3), 1).tolist()
    [1.0, 0.0, 1.0]
    """
    keep = keep.clone().float()
    flat_s, flat_k = scores.flatten().float(), keep.view(-1)
    candidates = torch.nonzero(flat_k > 0).flatten()
    n = min(int(n), int(candidates.numel()))
    if n <= 0:
        return keep
    vals = torch.nan_to_num(flat_s[candidates], nan=float("-inf"))
    order = torch.argsort(vals, stable=True)
    flat_k[candidates[order[:n]]] = 0
    return keep


def _n_heads(config: PruneConfig, mask: Mask, total: int, half: bool = False) -> int:
    return _n_units(config, mask.n_heads_kept, total, half)


def _n_units(config: PruneConfig, kept: int, total: int, half: bool = False) -> int:
    base = total if config.step_of == "total" else kept
    n = max(1, int(config.step * base))
    return max(1, n // 2) if half else n


def iterative_prune(
    model,
    score_fn: Callable,
    eval_fn: Callable,
    config: PruneConfig = PruneConfig(),
    start: Mask | None = None,
    progress: Callable | None = None,
) -> PruneResult:
    """Prune heads (and MLPs) until the metric drops below ``threshold`` x the unpruned metric.

    Args:
        model: the model (not modified: a working copy is shrunk when ``config.shrink``).
        score_fn: ``(model, mask) -> Scores``: importance under ``mask`` (``prune_model`` takes
            the gate gradient at the mask's values, as the references do).
        eval_fn: ``(model, mask) -> (metric, loss)``; higher metric is better.
        config: [`PruneConfig`][headcount.importance.pruning.PruneConfig].
        start: initial mask (default: everything kept).
        progress: ``(row: dict) -> None`` called after each evaluated step.

    Returns:
        [`PruneResult`][headcount.importance.pruning.PruneResult] with the last mask at or above the threshold.

    >>> result = iterative_prune(model, score_fn, eval_fn, PruneConfig(threshold=0.9))  # doctest: +SKIP
    """
    from headcount.core.gates import clone_model, layout
    from headcount.core.surgery import prune_heads, prune_mlps, removable

    n_layers, n_heads = layout(model)
    n_kv = _kv_heads(model, config)  # None: query heads are the unit
    grid = layout(model)
    mask = start or Mask.full(n_layers, n_heads).with_kv_heads(
        grid.n_kv_heads if grid.n_kv_heads is not None and grid.n_kv_heads < n_heads else None)
    if n_kv is not None and mask.n_kv_heads is None:
        mask = mask.with_kv_heads(n_kv)
    working = clone_model(model) if config.shrink else model
    t0 = time.perf_counter()
    full_metric, full_loss = eval_fn(working, mask)
    target = config.threshold * full_metric
    trace = [dict(step=0, phase="full", heads_kept=mask.n_heads_kept, mlps_kept=mask.n_mlps_kept,
                  metric=full_metric, loss=full_loss, accepted=True, seconds=round(time.perf_counter() - t0, 3))]
    if progress:
        progress(trace[-1])
    if config.schedule == "prasanna":
        # (phase, removes heads, half the head step, MLPs removed per step)
        phases = [("joint", True, False, 1), ("heads", True, True, 0), ("mlps", False, False, 1)]
    else:
        phases = [("heads", True, False, 0)]
    scores, scored_for, carried = None, None, False  # the latest importance and the mask it was computed on
    step = 0
    # the accepted step that removed each head [n_layers, n_heads] and MLP [n_layers]; 0: not removed here
    removed_heads = torch.zeros(n_layers, n_heads, dtype=torch.long)
    removed_mlps = torch.zeros(n_layers, dtype=torch.long)
    for i, (phase, prune_heads_now, half, mlps_per_step) in enumerate(phases):
        while config.max_steps is None or step < config.max_steps:
            if scores is None or not (config.one_shot or carried or scored_for == mask):
                scores, scored_for = score_fn(working, mask), mask
            # fresh: computed on the masks this step starts from; reused: on other masks (a failed
            # step's, or the unpruned model's with one_shot)
            importance = "fresh" if scored_for == mask else "reused"
            heads = mask.heads
            if prune_heads_now and n_kv is None:
                heads = select_lowest(scores.heads, mask.heads, _n_heads(config, mask, n_layers * n_heads, half))
            elif prune_heads_now:  # whole KV groups: ranked by their heads' summed scores, removed whole
                kept = mask.kv_groups
                n = _n_units(config, int(kept.sum()), n_layers * n_kv, half)
                groups = select_lowest(kv_pool(scores, n_kv, "sum"), kept, n)
                heads = mask.heads * groups.repeat_interleave(n_heads // n_kv, dim=1)
            mlps = select_lowest(scores.mlps, mask.mlps, mlps_per_step) if mlps_per_step else mask.mlps
            candidate = Mask(heads, mlps, dict(mask.meta), mask.n_kv_heads)
            if (prune_heads_now and torch.equal(heads, mask.heads)) or (mlps_per_step and torch.equal(mlps, mask.mlps)):
                break  # nothing left to remove in this phase (the joint phase needs a head and an MLP)
            step += 1
            carried = False  # a failed step's importance serves the first step evaluated after it
            metric, loss = eval_fn(working, candidate)
            accepted = metric >= target
            trace.append(dict(step=step, phase=phase, heads_kept=candidate.n_heads_kept,
                              mlps_kept=candidate.n_mlps_kept, metric=metric, loss=loss,
                              accepted=accepted, importance=importance, seconds=round(time.perf_counter() - t0, 3)))
            if progress:
                progress(trace[-1])
            if not accepted:
                if i + 1 < len(phases) and not config.one_shot:
                    # the reference scores each candidate while evaluating it: the next phase starts
                    # from the failed step's importance, not from a fresh scoring of the passing mask
                    scores, scored_for, carried = score_fn(working, candidate), candidate, True
                break
            removed_heads[(mask.heads > 0) & (candidate.heads == 0)] = step
            removed_mlps[(mask.mlps > 0) & (candidate.mlps == 0)] = step
            mask = candidate
            if config.shrink:  # what is gone for good is cut out of the working copy
                h, m, _ = removable(working, mask)
                prune_mlps(working, m)
                prune_heads(working, h)
    meta = {"threshold": config.threshold, "full_metric": full_metric, "metric": _last_accepted(trace),
            "schedule": config.schedule, "step": config.step, "step_of": config.step_of, "one_shot": config.one_shot,
            **({"unit": config.unit} if n_kv is not None else {}),
            "removed_at_step": {"heads": removed_heads.tolist(), "mlps": removed_mlps.tolist()}}
    return PruneResult(mask=mask.with_meta(**meta), full_metric=full_metric, trace=trace)


def _last_accepted(trace: list[dict]) -> float:
    return [r["metric"] for r in trace if r["accepted"]][-1]
