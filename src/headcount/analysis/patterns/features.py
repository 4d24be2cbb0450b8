"""Pattern features and the rule-based classifier (Kovaleva et al. 2019 classes).

[`CLASSES`][headcount.analysis.patterns.features.CLASSES] and the thresholds of the rules are named constants here; every other module of
[`headcount.analysis.patterns`][headcount.analysis.patterns] reads them from this one.
Maps are ``[..., S, S]`` with rows = queries and columns = keys; each row sums to 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from headcount.runtime.errors import HeadcountError

#: The five pattern classes of Kovaleva et al. (2019); a label's index is its class id.
CLASSES: tuple[str, ...] = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")

#: Side of the fixed-size maps that ``mean_attention_maps`` produces and the CNN reads.
MAP_SIZE: int = 32

#: Minimum ``vertical_excess`` feature for a vertical component: the mass on special-token
#: columns above the share uniform attention would give them, as a fraction of the possible
#: excess (0 = chance, 1 = everything on specials). On a 32-cell map with 3 special tokens
#: (chance 3/32) it means at least 37% of the attention on [CLS]/[SEP]; the correction matters
#: for short inputs, where uniform attention over ``[CLS] a b [SEP]`` already puts half on specials.
VERTICAL_MIN: float = 0.3

#: Minimum ``diagonal_excess`` feature for a diagonal component: the mass on key offsets
#: -1, 0, +1 from the query beyond what the row puts, per cell, on the nearby offsets
#: [`DIAGONAL_NEIGHBOUR_OFFSETS`][headcount.analysis.patterns.features.DIAGONAL_NEIGHBOUR_OFFSETS]. It is about 0 for uniform attention, and also for
#: uniform attention over a short segment, whose raw diagonal mass is high (3/8 for 8 tokens).
DIAGONAL_MIN: float = 0.3

#: Minimum ``block`` feature: how much more of the remaining attention (off the special columns
#: and the diagonal band) stays inside the query's own segment than a uniform spread would keep,
#: as a fraction of the possible excess: 0 = chance, 1 = everything in-segment.
BLOCK_MIN: float = 0.5

#: Minimum normalised row entropy (0 = one token, 1 = uniform) for ``block``: a block head
#: spreads its attention over the segment; a head that picks single tokens is heterogeneous.
BLOCK_MIN_ENTROPY: float = 0.4

#: Key offsets (key - query) that count as the diagonal: previous token, itself, next token.
DIAGONAL_OFFSETS: tuple[int, ...] = (-1, 0, 1)

#: Nearby key offsets whose per-cell mass is the local baseline subtracted from the diagonal.
DIAGONAL_NEIGHBOUR_OFFSETS: tuple[int, ...] = (-3, -2, 2, 3)


def _to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _check_square(m: np.ndarray, what: str = "maps") -> int:
    if m.ndim < 2 or m.shape[-1] != m.shape[-2]:
        raise HeadcountError(f"{what} must be square [..., S, S], got shape {tuple(m.shape)}")
    if m.shape[-1] < 2:
        raise HeadcountError(f"{what} must be at least 2 x 2, got shape {tuple(m.shape)}")
    return int(m.shape[-1])


def _specials(special_positions, size: int) -> np.ndarray:
    sp = (0, size - 1) if special_positions is None else tuple(int(p) for p in special_positions)
    arr = np.zeros(size, dtype=bool)
    for p in sp:
        if not -size <= p < size:
            raise HeadcountError(f"special position {p} is outside a map of size {size}")
        arr[p] = True
    return arr


def _runs(is_special: np.ndarray) -> np.ndarray:
    """Segment id per position: content runs between special tokens numbered 0, 1, ...; specials -1."""
    seg = np.full(is_special.shape, -1, dtype=np.int64)
    run, in_run = -1, False
    for i, s in enumerate(is_special):
        if s:
            in_run = False
        else:
            if not in_run:
                run, in_run = run + 1, True
            seg[i] = run
    return seg


def pattern_features(maps, special_positions: Sequence[int] | None = None, segment_ids=None) -> dict[str, np.ndarray]:
    """The features the rule-based classifier reads, per map.

    For a map A (rows = queries, each renormalised to sum 1; all-zero rows are ignored):

    - ``vertical``: mean over query rows of the mass on special-token columns;
    - ``vertical_excess``: ``(vertical - chance) / (1 - chance)``, chance = the special share of
      live cells (what uniform attention would put on them); the rule reads this one;
    - ``diagonal``: mean over rows of the mass on keys at offsets [`DIAGONAL_OFFSETS`][headcount.analysis.patterns.features.DIAGONAL_OFFSETS]
      from the query, special columns excluded (so ``vertical + diagonal <= 1``);
    - ``diagonal_excess``: mean over rows of that diagonal mass minus (number of diagonal
      cells) x (mean mass of the row's cells at [`DIAGONAL_NEIGHBOUR_OFFSETS`][headcount.analysis.patterns.features.DIAGONAL_NEIGHBOUR_OFFSETS], special
      columns excluded): the diagonal beyond a locally flat spread; the rule reads this one;
    - ``residual``: ``1 - vertical - diagonal``, the attention neither feature explains;
    - ``block``: on content rows and the residual cells (not special, not on the diagonal
      band), ``(within - expected) / (1 - expected)`` where ``within`` is the share of residual
      mass in the query's own segment and ``expected`` the share a uniform spread over those
      cells would give; ``nan`` with fewer than two segments or no residual mass;
    - ``entropy``: mean row entropy divided by log(number of live cells), in [0, 1].

    Only live cells (with mass in their row or column; the empty cells of fixed-size maps of
    short inputs are not) count for the chance levels of the ``*_excess`` features, ``block`` and
    ``entropy``.

    Args:
        maps: ``[..., S, S]`` numpy array or tensor.
        special_positions: key positions of special tokens ([CLS], [SEP], ...); default
            ``(0, S - 1)``. Negative indices count from the end.
        segment_ids: ``[S]`` ints (e.g. token_type_ids); default: the runs of ordinary tokens
            between special tokens are the segments. Special positions never count as content.

    Returns:
        ``{"vertical", "vertical_excess", "diagonal", "diagonal_excess", "residual", "block",
        "entropy"}``, each shaped ``maps.shape[:-2]``.

    >>> f = pattern_features(np.full((1, 8, 8), 1 / 8), special_positions=(0, 4, 7))
    >>> round(float(f["vertical"][0]), 3), round(float(f["block"][0]), 3)
    (0.375, 0.0)
    """
    m = _to_numpy(maps)
    size = _check_square(m)
    lead = m.shape[:-2]
    m = m.reshape(-1, size, size)
    if not np.all(np.isfinite(m)) or np.any(m < 0):
        raise HeadcountError("attention maps must be finite and non-negative")
    sp = _specials(special_positions, size)
    if segment_ids is None:
        seg = _runs(sp)
    else:
        seg = np.asarray(_to_numpy(segment_ids), dtype=np.int64).reshape(-1)
        if seg.shape != (size,):
            raise HeadcountError(f"segment_ids must have {size} entries, got {seg.size}")
        seg = np.where(sp, -1, seg)
    row_sum = m.sum(axis=-1, keepdims=True)  # [n, S, 1]
    valid = row_sum[..., 0] > 0  # [n, S] rows that carry attention
    a = np.divide(m, row_sum, out=np.zeros_like(m), where=row_sum > 0)
    n_rows = np.maximum(valid.sum(axis=-1), 1)

    # live cells: a row or a column with mass. The empty cells that fixed-size maps of short
    # inputs leave have neither; they are not part of the "uniform spread" chance levels use.
    live = valid | (a.sum(axis=1) > 0)  # [n, S]
    i = np.arange(size)[:, None]
    j = np.arange(size)[None, :]
    band = np.isin(j - i, DIAGONAL_OFFSETS) & ~sp[None, :]  # [S, S]
    vertical = a[:, :, sp].sum(axis=-1).sum(axis=-1) / n_rows
    band_mass = (a * band).sum(axis=-1)  # [n, S]
    diagonal = band_mass.sum(axis=-1) / n_rows
    n_band = (band[None] & live[:, None, :]).sum(axis=-1)  # [n, S]
    near = np.isin(j - i, DIAGONAL_NEIGHBOUR_OFFSETS)[None] & ~sp[None, None, :] & live[:, None, :]  # [n, S, S]
    n_near = near.sum(axis=-1)  # [n, S]
    near_rate = np.divide((a * near).sum(axis=-1), n_near, out=np.zeros(band_mass.shape), where=n_near > 0)
    excess = (band_mass - n_band * near_rate) * valid
    diagonal_excess = excess.sum(axis=-1) / n_rows

    content_row = (seg >= 0)[:, None]
    # residual cells [n, S, S]: content query rows, live ordinary keys, off the diagonal band
    allowed = (~sp[None, :] & content_row & ~np.isin(j - i, DIAGONAL_OFFSETS))[None] & live[:, None, :]
    same = allowed & (seg[:, None] == seg[None, :])[None]
    n_allowed = allowed.sum(axis=-1)  # [n, S]
    e_row = np.divide(same.sum(axis=-1), n_allowed, out=np.zeros(n_allowed.shape), where=n_allowed > 0)
    resid = (a * allowed).sum(axis=-1)  # [n, S]
    inside = (a * same).sum(axis=-1)
    tot = resid.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        within = inside.sum(axis=-1) / tot
        expected = (resid * e_row).sum(axis=-1) / tot
        block = (within - expected) / (1.0 - expected)
    n_segments = np.array([len(set(seg[(seg >= 0) & lv].tolist())) for lv in live])
    block = np.where((tot > 1e-9) & (expected < 1 - 1e-9) & (n_segments >= 2), block, math.nan)

    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)
    n_live = live.sum(axis=-1)
    log_live = np.log(np.maximum(n_live, 2))
    chance_v = (live & sp[None, :]).sum(axis=-1) / np.maximum(n_live, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        vertical_excess = np.where(chance_v < 1, (vertical - chance_v) / (1 - chance_v), 0.0)
    entropy = (-plogp.sum(axis=-1) * valid).sum(axis=-1) / n_rows / log_live

    feats = {
        "vertical": vertical,
        "vertical_excess": vertical_excess,
        "diagonal": diagonal,
        "diagonal_excess": diagonal_excess,
        "residual": np.clip(1.0 - vertical - diagonal, 0.0, 1.0),
        "block": block,
        "entropy": entropy,
    }
    return {k: v.reshape(lead) for k, v in feats.items()}


def _rule(v: float, d: float, b: float, h: float) -> str:
    vert, diag = v >= VERTICAL_MIN, d >= DIAGONAL_MIN
    if vert and diag:
        return "vertical+diagonal"
    if vert:
        return "vertical"
    if diag:
        return "diagonal"
    if math.isfinite(b) and b >= BLOCK_MIN and h >= BLOCK_MIN_ENTROPY:
        return "block"
    return "heterogeneous"


@dataclass(frozen=True)
class PatternClassification:
    """Pattern class per map with the features behind it.

    Attributes:
        labels: str array shaped like the maps' leading dims (e.g. ``[n_layers, n_heads]``).
        features: feature name -> float array of the same shape (see [`pattern_features`][headcount.analysis.patterns.features.pattern_features]).
    """

    labels: np.ndarray
    features: dict[str, np.ndarray] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Number of maps in each class, in [`CLASSES`][headcount.analysis.patterns.features.CLASSES] order."""
        flat = self.labels.ravel().tolist()
        return {c: flat.count(c) for c in CLASSES}

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: labels and features as nested lists (NaN as ``None``)."""

        def clean(x):
            return [clean(v) for v in x] if isinstance(x, list) else (None if isinstance(x, float) and math.isnan(x) else x)

        return {"labels": self.labels.tolist(), "features": {k: clean(v.tolist()) for k, v in self.features.items()},
                "counts": self.counts()}


def classify_patterns(maps, special_positions: Sequence[int] | None = None, segment_ids=None) -> PatternClassification:
    """Rule-based pattern class of each (mean) attention map.

    Rules, in order (features from [`pattern_features`][headcount.analysis.patterns.features.pattern_features]):

    1. ``vertical_excess >= VERTICAL_MIN`` and ``diagonal_excess >= DIAGONAL_MIN`` ->
       ``vertical+diagonal``;
    2. ``vertical_excess >= VERTICAL_MIN`` -> ``vertical``;
    3. ``diagonal_excess >= DIAGONAL_MIN`` -> ``diagonal``;
    4. ``block >= BLOCK_MIN`` and ``entropy >= BLOCK_MIN_ENTROPY`` -> ``block`` (needs two or
       more segments, e.g. sentence pairs);
    5. otherwise ``heterogeneous``.

    Args:
        maps: ``[..., S, S]``, e.g. ``[n_heads, S, S]`` or ``[n_layers, n_heads, S, S]``.
        special_positions: special-token key positions; default ``(0, S - 1)``.
        segment_ids: optional ``[S]`` segment per position (default: runs between specials).

    Returns:
        A [`PatternClassification`][headcount.analysis.patterns.features.PatternClassification].

    >>> eye = np.eye(16)[None]
    >>> classify_patterns(eye, special_positions=(0, 15)).labels.tolist()
    ['diagonal']
    """
    f = pattern_features(maps, special_positions, segment_ids)
    v, d, b, h = (f[k].ravel() for k in ("vertical_excess", "diagonal_excess", "block", "entropy"))
    labels = np.array([_rule(*t) for t in zip(v.tolist(), d.tolist(), b.tolist(), h.tolist())], dtype=object)
    return PatternClassification(labels.reshape(f["vertical"].shape).astype(str), f)


def pattern_distribution(labels, mask=None) -> dict[str, float]:
    """Fraction of maps in each class, optionally among the heads a mask keeps.

    Counted over every entry of ``labels``: per-head labels ``[n_layers, n_heads]`` give shares
    of heads (the rule classifier on mean maps); per-example labels ``[n_examples, n_layers,
    n_heads]`` give shares over examples x heads, as Prasanna et al. count the CNN's classes.

    Args:
        labels: class names, any shape (e.g. ``[n_layers, n_heads]`` or ``[n_examples, n_layers, n_heads]``).
        mask: optional 0/1 array shaped like ``labels`` or like its trailing dims (a head mask
            ``[n_layers, n_heads]`` is applied to every example); only entries with 1 are counted.

    Returns:
        ``{class: fraction}`` in [`CLASSES`][headcount.analysis.patterns.features.CLASSES] order (all ``nan`` when nothing is counted).

    >>> pattern_distribution([["block", "vertical"], ["vertical", "diagonal"]])["vertical"]
    0.5
    >>> per_example = [[["block", "vertical"]], [["block", "block"]]]  # [examples=2, layers=1, heads=2]
    >>> pattern_distribution(per_example, mask=[[1, 0]])["block"]
    1.0
    """
    lab = np.asarray(labels, dtype=str)
    if mask is not None:
        mk = np.asarray(_to_numpy(mask)) != 0
        if mk.shape != lab.shape[lab.ndim - mk.ndim:] or mk.ndim > lab.ndim:
            raise HeadcountError(f"mask shape {mk.shape} differs from labels shape {lab.shape} (or its trailing dims)")
        lab = lab[np.broadcast_to(mk, lab.shape)]
    flat = lab.ravel().tolist()
    n = len(flat)
    return {c: (flat.count(c) / n if n else math.nan) for c in CLASSES}
