"""Agreement of head/MLP subnetworks: across the seeds of one task, and across tasks.

Pure functions on 0/1 mask arrays (the maths of the lottery study's ``stability`` and
``overlap`` jobs); the statistics themselves are those of :mod:`headcount.analysis.stats`.
"""

from __future__ import annotations

import math

import numpy as np

from .stats import jaccard, mask_stability, pairwise_jaccard, super_survivors

__all__ = ["cross_task_overlap", "seed_stability"]


def _nanmean(values) -> float:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def seed_stability(heads, mlps) -> dict[str, object]:
    """Stability of one task's good masks across seeds, for heads, MLPs and both.

    Args:
        heads: ``[n_seeds, n_layers, n_heads]`` 0/1.
        mlps: ``[n_seeds, n_layers]`` 0/1.

    Returns:
        ``{"heads", "mlps", "all"}``: :func:`~headcount.analysis.stats.mask_stability` of the
        heads, the MLPs and both together; ``"heads_pairwise_jaccard"`` ``[n_seeds, n_seeds]``;
        ``"head_survival"`` ``[n_layers, n_heads]`` and ``"mlp_survival"`` ``[n_layers]`` (the
        fraction of seeds that keep each); ``"super_heads"`` / ``"super_mlps"`` (kept by every
        seed). Arrays are numpy; NaN where a statistic is undefined.

    >>> r = seed_stability([[[1, 0]], [[1, 1]]], [[1], [0]])
    >>> r["head_survival"].tolist(), r["super_heads"].tolist(), r["mlps"]["kept_per_seed"]
    ([[1.0, 0.5]], [[1, 0]], [1, 0])
    """
    heads, mlps = np.asarray(heads), np.asarray(mlps)
    both = np.concatenate([heads.reshape(len(heads), -1), mlps], axis=1)
    return {
        "heads": mask_stability(heads),
        "mlps": mask_stability(mlps),
        "all": mask_stability(both),
        "heads_pairwise_jaccard": pairwise_jaccard(heads),
        "head_survival": heads.mean(axis=0),
        "mlp_survival": mlps.mean(axis=0),
        "super_heads": super_survivors(heads),
        "super_mlps": super_survivors(mlps),
    }


def cross_task_overlap(heads, mlps) -> dict[str, np.ndarray]:
    """Overlap of good subnetworks across tasks (Prasanna et al.'s cross-task comparison).

    Cell ``[a, b]`` is the mean Jaccard index of the kept components of task ``a``'s and task
    ``b``'s masks over all seed pairs (on the diagonal: pairs of different seeds of one task;
    NaN with a single seed); ``super_heads_jaccard`` compares the tasks' super-survivor heads.

    Args:
        heads: ``[n_tasks, n_seeds, n_layers, n_heads]`` 0/1.
        mlps: ``[n_tasks, n_seeds, n_layers]`` 0/1.

    Returns:
        ``{"heads_jaccard", "mlps_jaccard", "super_heads_jaccard"}``, each ``[n_tasks, n_tasks]``.

    >>> h = [[[[1, 1, 0, 0]], [[1, 1, 0, 0]]], [[[0, 1, 1, 0]], [[0, 1, 1, 0]]]]
    >>> cross_task_overlap(h, [[[1], [1]], [[1], [0]]])["heads_jaccard"].round(3).tolist()
    [[1.0, 0.333], [0.333, 1.0]]
    """
    heads, mlps = np.asarray(heads), np.asarray(mlps)
    n, n_seeds = heads.shape[:2]
    out = {k: np.full((n, n), math.nan) for k in ("heads_jaccard", "mlps_jaccard", "super_heads_jaccard")}
    supers = [super_survivors(heads[i]) for i in range(n)]
    for a in range(n):
        for b in range(n):
            pairs = [(s, t) for s in range(n_seeds) for t in range(n_seeds) if a != b or s != t]
            if not pairs:
                continue
            out["heads_jaccard"][a, b] = _nanmean([jaccard(heads[a, s], heads[b, t]) for s, t in pairs])
            out["mlps_jaccard"][a, b] = _nanmean([jaccard(mlps[a, s], mlps[b, t]) for s, t in pairs])
            out["super_heads_jaccard"][a, b] = jaccard(supers[a], supers[b])
    return out
