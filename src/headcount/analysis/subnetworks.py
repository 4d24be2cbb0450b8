"""Subnetworks: the controls a good subnetwork is compared with, and agreement across seeds and tasks.

Pure functions on 0/1 mask arrays: super-survivors, random and bad controls matched to a good
mask, the reference's super-survivor controls ([`super_controls`][headcount.analysis.subnetworks.super_controls], as the authors'
``compute_super_masks.py``), and the maths of the lottery study's ``stability`` and ``overlap``
jobs (the statistics themselves are in [`agreement`][headcount.analysis.agreement]).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import numpy as np

from headcount.analysis.agreement import mask_stability, pairwise_jaccard
from headcount.analysis.correlation import jaccard
from headcount.analysis.helpers import Seed, _mask01, _np, _rng
from headcount.runtime.errors import HeadcountError

__all__ = ["always_pruned", "bad_control", "draw_controls", "random_control", "super_bad_control", "super_controls", "super_random_control", "super_survivors", "cross_task_overlap", "seed_stability"]


# --------------------------------------------------------------------------- subnetworks


def super_survivors(masks) -> np.ndarray:
    """Components kept in every seed (logical AND over the seed axis).

    Args:
        masks: ``[n_seeds, ...]`` 0/1.

    Returns:
        int64 0/1 array shaped like one mask.

    >>> super_survivors([[[1, 1], [0, 1]], [[1, 0], [0, 1]]]).tolist()
    [[1, 0], [0, 1]]
    """
    m = _mask01(masks)
    if m.ndim < 1 or m.shape[0] < 1:
        raise HeadcountError("super_survivors needs at least one mask")
    return m.min(axis=0).astype(np.int64)


def random_control(
    good,
    seed: Seed = 0,
    mode: Literal["uniform", "bernoulli"] = "uniform",
) -> np.ndarray:
    """A random subnetwork matched to a good mask.

    ``"uniform"`` (default): exactly as many components as ``good`` keeps, chosen uniformly
    among all components. ``"bernoulli"`` (Prasanna et al.): each component kept independently
    with p = kept fraction of ``good``, so the size matches only on average.

    Args:
        good: 0/1 mask, any shape (apply separately to heads and MLPs).
        seed: int or ``numpy.random.Generator``.
        mode: ``"uniform"`` or ``"bernoulli"``.

    Returns:
        int64 0/1 mask shaped like ``good``.

    >>> int(random_control([[1, 1, 0], [0, 0, 1]], seed=3).sum())
    3
    """
    g = _mask01(good, "good")
    rng = _rng(seed)
    n, k = g.size, int(g.sum())
    out = np.zeros(n, dtype=np.int64)
    if mode == "uniform":
        out[rng.choice(n, size=k, replace=False)] = 1
    elif mode == "bernoulli":
        p = k / n if n else 0.0
        out[:] = (rng.random(n) < p).astype(np.int64)
    else:
        raise HeadcountError(f"unknown random mode {mode!r}; use 'uniform' or 'bernoulli'")
    return out.reshape(g.shape)


def bad_control(good, seed: Seed = 0) -> np.ndarray:
    """A "bad" subnetwork of the same size as ``good`` (Prasanna et al.'s rule).

    Components are drawn uniformly from those ``good`` pruned; when ``good`` keeps more
    components than it pruned, all pruned ones are taken and the rest is topped up with
    randomly chosen kept ones.

    Args:
        good: 0/1 mask, any shape (apply separately to heads and MLPs).
        seed: int or ``numpy.random.Generator``.

    Returns:
        int64 0/1 mask shaped like ``good`` with ``good.sum()`` ones.

    >>> c = bad_control([1, 1, 0, 0, 0], seed=0)
    >>> int(c.sum()), int(c[0] + c[1])
    (2, 0)
    """
    g = _mask01(good, "good").ravel()
    rng = _rng(seed)
    kept, pruned = np.flatnonzero(g == 1), np.flatnonzero(g == 0)
    k = kept.size
    out = np.zeros(g.size, dtype=np.int64)
    if k <= pruned.size:
        out[rng.choice(pruned, size=k, replace=False)] = 1
    else:
        out[pruned] = 1
        out[rng.choice(kept, size=k - pruned.size, replace=False)] = 1
    return out.reshape(_np(good).shape)


def draw_controls(
    good: Mapping[str, object],
    kind: Literal["random", "bad"],
    seed: Seed = 0,
    mode: Literal["uniform", "bernoulli"] = "uniform",
) -> dict[str, np.ndarray]:
    """Controls for a mask with several parts (e.g. ``{"heads": ..., "mlps": ...}``), matched per part.

    One generator is seeded once and used for the parts in the mapping's order, so the result
    is deterministic for a seed and the parts are independent draws.

    Args:
        good: part name -> 0/1 mask.
        kind: ``"random"`` (see [`random_control`][headcount.analysis.subnetworks.random_control]) or ``"bad"`` (see [`bad_control`][headcount.analysis.subnetworks.bad_control]).
        seed: int or ``numpy.random.Generator``.
        mode: random mode, ``"uniform"`` or ``"bernoulli"`` (ignored for ``"bad"``).

    Returns:
        part name -> int64 0/1 mask.

    >>> c = draw_controls({"heads": [[1, 0], [1, 1]], "mlps": [1, 0]}, "bad", seed=0)
    >>> c["mlps"].tolist()
    [0, 1]
    """
    rng = _rng(seed)
    if kind == "random":
        return {name: random_control(m, rng, mode) for name, m in good.items()}
    if kind == "bad":
        return {name: bad_control(m, rng) for name, m in good.items()}
    raise HeadcountError(f"unknown control kind {kind!r}; use 'random' or 'bad'")


# Super-survivor controls as the reference draws them (Prasanna et al.'s code,
# sai-prasanna/bert-experiments, src/compute_super_masks.py: ``sample_bad_to_similar_size`` and
# ``sample_random_middlings``), transcribed rule for rule. The reference samples with Python's
# ``random.sample`` on the row-major list of candidate indices; here a numpy Generator's
# ``choice(candidates, k, replace=False)`` on the same (flattened, row-major) candidates, and no
# draw at all where the reference samples 0 items (as ``random.sample(x, 0)`` uses no randomness).


def _sample(rng: np.random.Generator, candidates: np.ndarray, k: int) -> np.ndarray:
    """``k`` of the flat indices ``candidates`` without replacement (no draw for k = 0)."""
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    return rng.choice(candidates, size=k, replace=False)


def _seed_masks(masks, name: str = "masks") -> np.ndarray:
    m = _mask01(masks, name)
    if m.ndim < 1 or m.shape[0] < 1:
        raise HeadcountError(f"{name} must be [n_seeds, ...] with at least one seed")
    return m


def always_pruned(masks) -> np.ndarray:
    """Components pruned in every seed (the complement's logical AND over the seed axis).

    Args:
        masks: ``[n_seeds, ...]`` 0/1 good masks.

    Returns:
        int64 0/1 array shaped like one mask.

    >>> always_pruned([[1, 0, 0], [1, 1, 0]]).tolist()
    [0, 0, 1]
    """
    return (1 - _seed_masks(masks)).min(axis=0).astype(np.int64)


def super_bad_control(good, pruned, seed: Seed = 0) -> np.ndarray:
    """The reference's super-survivor "bad" control: ``pruned`` resized to ``good``'s size.

    Transcribes ``sample_bad_to_similar_size(bad=pruned, good=good)``: when ``good`` keeps more
    components than ``pruned`` holds, the missing ones are drawn uniformly from the components in
    neither mask (the "middlings"), or, when those are too few, uniformly from *every* component
    outside ``pruned`` (super-survivors included, middlings not preferred); when ``pruned`` holds
    more, randomly chosen ones are dropped; of equal size, it is ``pruned`` itself (no draw).

    Args:
        good: 0/1 mask (the super-survivors), any shape (apply separately to heads and MLPs).
        pruned: 0/1 mask of the same shape (the components pruned in every seed).
        seed: int or ``numpy.random.Generator``.

    Returns:
        int64 0/1 mask shaped like ``good`` with ``good.sum()`` ones.

    >>> super_bad_control([1, 1, 0, 0, 0], [0, 0, 0, 1, 1], seed=0).tolist()
    [0, 0, 0, 1, 1]
    """
    g, b = _mask01(good, "good"), _mask01(pruned, "pruned")
    if g.shape != b.shape:
        raise HeadcountError(f"good and pruned differ in shape: {g.shape} vs {b.shape}")
    rng = _rng(seed)
    g, out = g.ravel(), b.ravel().copy()
    total_good, total_bad = int(g.sum()), int(out.sum())
    if total_good > total_bad:
        to_add = total_good - total_bad
        selection = np.flatnonzero((g == 0) & (out == 0))
        if selection.size < to_add:
            selection = np.flatnonzero(out == 0)
        out[_sample(rng, selection, to_add)] = 1
    elif total_good < total_bad:
        out[_sample(rng, np.flatnonzero(out == 1), total_bad - total_good)] = 0
    return out.reshape(b.shape)


def super_random_control(good, bad, seed: Seed = 0) -> np.ndarray:
    """The reference's super-survivor "random" control: middlings resized to ``good``'s size.

    Transcribes ``sample_random_middlings(bad, good)``: the middlings are the components in
    neither ``good`` nor ``bad``; when there are at least as many as ``good`` keeps, randomly
    chosen ones are dropped down to its size; when too few, all are kept and the missing ones are
    drawn uniformly from the components that are *not* middlings (those of ``good`` or ``bad``).
    In the reference, ``bad`` is the resized bad control ([`super_bad_control`][headcount.analysis.subnetworks.super_bad_control]), not the
    always-pruned set: always-pruned components it left out are middlings, middlings it took are not.

    Args:
        good: 0/1 mask (the super-survivors), any shape (apply separately to heads and MLPs).
        bad: 0/1 mask of the same shape (the super-survivors' bad control).
        seed: int or ``numpy.random.Generator``.

    Returns:
        int64 0/1 mask shaped like ``good`` with ``good.sum()`` ones.

    >>> super_random_control([1, 0, 0, 0], [0, 0, 0, 1], seed=0).sum().item()
    1
    """
    g, b = _mask01(good, "good"), _mask01(bad, "bad")
    if g.shape != b.shape:
        raise HeadcountError(f"good and bad differ in shape: {g.shape} vs {b.shape}")
    rng = _rng(seed)
    g = g.ravel()
    mid = np.ones_like(g)
    mid[g == 1] = 0
    mid[b.ravel() == 1] = 0
    n_mid, n_good = int(mid.sum()), int(g.sum())
    if n_mid >= n_good:
        mid[_sample(rng, np.flatnonzero(mid == 1), n_mid - n_good)] = 0
    else:
        mid[_sample(rng, np.flatnonzero(mid == 0), n_good - n_mid)] = 1
    return mid.reshape(b.shape)


def super_controls(
    masks: Mapping[str, object],
    kind: Literal["random", "bad"],
    seed: Seed = 0,
    bad_seed: Seed | None = None,
) -> dict[str, np.ndarray]:
    """Controls of the super-survivors of good masks over seeds, as the reference draws them.

    Per part (e.g. ``{"heads": [n_seeds, n_layers, n_heads], "mlps": [n_seeds, n_layers]}``),
    with ``good`` = [`super_survivors`][headcount.analysis.subnetworks.super_survivors] and ``pruned`` = [`always_pruned`][headcount.analysis.subnetworks.always_pruned] of its masks:
    ``"bad"`` is [`super_bad_control`][headcount.analysis.subnetworks.super_bad_control] (``pruned`` resized to ``good``'s size), ``"random"``
    is [`super_random_control`][headcount.analysis.subnetworks.super_random_control] around that bad control (middlings resized). Both have
    exactly as many components as ``good`` per part.

    One generator per draw, used for the parts in the mapping's order, as the reference's single
    stream: bad heads, bad MLPs, then (random) middling heads, middling MLPs. ``"random"`` first
    draws the bad control it is built around: from ``bad_seed`` when given (pass the bad
    control's own seed to rebuild exactly that control), else from ``seed``'s generator before
    the middlings (the reference's order of calls).

    Args:
        masks: part name -> ``[n_seeds, ...]`` 0/1 good masks.
        kind: ``"random"`` or ``"bad"``.
        seed: int or ``numpy.random.Generator`` of this draw.
        bad_seed: int or ``numpy.random.Generator`` of the bad control a random one is built
            around (``"random"`` only; default: ``seed``'s generator).

    Returns:
        part name -> int64 0/1 mask shaped like one of its masks.

    >>> m = {"heads": [[[1, 1], [0, 0]], [[1, 0], [0, 0]]], "mlps": [[1, 0, 0], [1, 1, 0]]}
    >>> super_controls(m, "bad", seed=0)["mlps"].tolist()
    [0, 0, 1]
    """
    if kind not in ("random", "bad"):
        raise HeadcountError(f"unknown control kind {kind!r}; use 'random' or 'bad'")
    rng = _rng(seed)
    parts = {name: _seed_masks(m, f"masks[{name!r}]") for name, m in masks.items()}
    good = {name: super_survivors(m) for name, m in parts.items()}
    brng = rng if bad_seed is None or kind == "bad" else _rng(bad_seed)
    bad = {name: super_bad_control(good[name], always_pruned(m), brng) for name, m in parts.items()}
    if kind == "bad":
        return bad
    return {name: super_random_control(good[name], bad[name], rng) for name in parts}



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
        ``{"heads", "mlps", "all"}``: [`mask_stability`][headcount.analysis.agreement.mask_stability] of the
        heads, the MLPs and both together; ``"heads_pairwise_jaccard"`` ``[n_seeds, n_seeds]``;
        ``"head_survival"`` ``[n_layers, n_heads]`` and ``"mlp_survival"`` ``[n_layers]`` (the
        fraction of seeds that keep each); ``"super_heads"`` / ``"super_mlps"`` (kept by every
        seed). Arrays are numpy; NaN where a statistic is undefined.

    >>> r = seed_stability([[[1, 0]], [[1, 1]]], [[1], [0]])
    >>> mlps = r["mlps"]
    >>> r["head_survival"].tolist(), r["super_heads"].tolist(), mlps.get("kept_per_seed")
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
