"""Self-attention pattern classes (Kovaleva et al. 2019) on mean attention maps.

The five classes, in this order everywhere (:data:`CLASSES`):

- ``vertical``: most attention goes to the special tokens ([CLS], [SEP]) whatever the query;
- ``diagonal``: attention to the previous / the same / the next token;
- ``vertical+diagonal``: both of the above in one head;
- ``block``: attention stays within the query's own segment (sentence), spread over it;
- ``heterogeneous``: none of these.

Three tools:

1. a transparent rule-based classifier, :func:`classify_patterns`, on features documented in
   :func:`pattern_features` and thresholds kept as named constants (``VERTICAL_MIN``, ...);
   :func:`mean_attention_maps` turns per-example maps of varying lengths into fixed-size mean
   maps with the special tokens kept as single, aligned rows/columns;
2. the small CNN of Prasanna et al. (2020), :class:`PatternCNN`, trained from user labels with
   :func:`train_pattern_cnn` and saved like a checkpoint (:func:`save_pattern_cnn`,
   :func:`load_pattern_cnn`);
3. :func:`synthetic_attention_maps`, seeded synthetic maps of every class (tests and demos).

Labelled data for the CNN (``headcount patterns train --maps maps.safetensors --labels
labels.csv``): ``maps.safetensors`` holds one float tensor ``"maps"`` of shape ``[N, S, S]``
(rows are attention distributions of query tokens, S the same for all maps, e.g. 32); the
labels are a CSV file with a ``label`` column (one row per map, in order) or a JSON list
(or ``{"labels": [...]}``), each label a class name or its index in :data:`CLASSES`.
See :func:`load_labelled_maps` / :func:`save_labelled_maps`.

Maps are ``[..., S, S]`` with rows = queries and columns = keys; each row sums to 1.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import HeadcountError
from ..io import atomic_path, atomic_write_json, atomic_write_text

__all__ = [
    "BLOCK_MIN",
    "BLOCK_MIN_ENTROPY",
    "CLASSES",
    "DIAGONAL_MIN",
    "DIAGONAL_NEIGHBOUR_OFFSETS",
    "DIAGONAL_OFFSETS",
    "MAP_SIZE",
    "VERTICAL_MIN",
    "AttentionMaps",
    "PatternCNN",
    "PatternClassification",
    "SyntheticMaps",
    "classify_patterns",
    "load_labelled_maps",
    "load_pattern_cnn",
    "mean_attention_maps",
    "pattern_distribution",
    "pattern_features",
    "predict_patterns",
    "resample_attention",
    "save_labelled_maps",
    "save_pattern_cnn",
    "synthetic_attention_maps",
    "train_pattern_cnn",
]

#: The five pattern classes of Kovaleva et al. (2019); a label's index is its class id.
CLASSES: tuple[str, ...] = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")

#: Side of the fixed-size maps that :func:`mean_attention_maps` produces and the CNN reads.
MAP_SIZE: int = 32

#: Minimum ``vertical_excess`` feature for a vertical component: the mass on special-token
#: columns above the share uniform attention would give them, as a fraction of the possible
#: excess (0 = chance, 1 = everything on specials). On a 32-cell map with 3 special tokens
#: (chance 3/32) it means at least 37% of the attention on [CLS]/[SEP]; the correction matters
#: for short inputs, where uniform attention over ``[CLS] a b [SEP]`` already puts half on specials.
VERTICAL_MIN: float = 0.3

#: Minimum ``diagonal_excess`` feature for a diagonal component: the mass on key offsets
#: -1, 0, +1 from the query beyond what the row puts, per cell, on the nearby offsets
#: :data:`DIAGONAL_NEIGHBOUR_OFFSETS`. It is about 0 for uniform attention, and also for
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


# --------------------------------------------------------------------------- features & rules


def pattern_features(maps, special_positions: Sequence[int] | None = None, segment_ids=None) -> dict[str, np.ndarray]:
    """The features the rule-based classifier reads, per map.

    For a map A (rows = queries, each renormalised to sum 1; all-zero rows are ignored):

    - ``vertical``: mean over query rows of the mass on special-token columns;
    - ``vertical_excess``: ``(vertical - chance) / (1 - chance)``, chance = the special share of
      live cells (what uniform attention would put on them); the rule reads this one;
    - ``diagonal``: mean over rows of the mass on keys at offsets :data:`DIAGONAL_OFFSETS`
      from the query, special columns excluded (so ``vertical + diagonal <= 1``);
    - ``diagonal_excess``: mean over rows of that diagonal mass minus (number of diagonal
      cells) x (mean mass of the row's cells at :data:`DIAGONAL_NEIGHBOUR_OFFSETS`, special
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
        features: feature name -> float array of the same shape (see :func:`pattern_features`).
    """

    labels: np.ndarray
    features: dict[str, np.ndarray] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Number of maps in each class, in :data:`CLASSES` order."""
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

    Rules, in order (features from :func:`pattern_features`):

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
        A :class:`PatternClassification`.

    >>> eye = np.eye(16)[None]
    >>> classify_patterns(eye, special_positions=(0, 15)).labels.tolist()
    ['diagonal']
    """
    f = pattern_features(maps, special_positions, segment_ids)
    v, d, b, h = (f[k].ravel() for k in ("vertical_excess", "diagonal_excess", "block", "entropy"))
    labels = np.array([_rule(*t) for t in zip(v.tolist(), d.tolist(), b.tolist(), h.tolist())], dtype=object)
    return PatternClassification(labels.reshape(f["vertical"].shape).astype(str), f)


def pattern_distribution(labels, mask=None) -> dict[str, float]:
    """Fraction of heads in each class, optionally among the heads a mask keeps.

    Args:
        labels: class names, any shape (e.g. ``[n_layers, n_heads]``).
        mask: optional 0/1 array of the same shape; only entries with 1 are counted.

    Returns:
        ``{class: fraction}`` in :data:`CLASSES` order (all ``nan`` when nothing is counted).

    >>> pattern_distribution([["block", "vertical"], ["vertical", "diagonal"]])["vertical"]
    0.5
    """
    lab = np.asarray(labels, dtype=str)
    if mask is not None:
        mk = np.asarray(_to_numpy(mask)) != 0
        if mk.shape != lab.shape:
            raise HeadcountError(f"mask shape {mk.shape} differs from labels shape {lab.shape}")
        lab = lab[mk]
    flat = lab.ravel().tolist()
    n = len(flat)
    return {c: (flat.count(c) / n if n else math.nan) for c in CLASSES}


# --------------------------------------------------------------------------- fixed-size maps


def _layout(length: int, specials: Sequence[int], size: int) -> tuple[tuple, np.ndarray, list[int], np.ndarray]:
    """Canonical fixed-size layout: specials get one cell, content runs share the rest equally.

    A run of n tokens in a range of m cells fills its first n cells one token per cell when
    n <= m (the other cells stay empty), and is area-downsampled onto all m cells when n > m.
    Returns (signature, overlap [size, length], special cells, segment id per cell).
    """
    is_sp = np.zeros(length, dtype=bool)
    for p in specials:
        p = int(p)
        if not -length <= p < length:
            raise HeadcountError(f"special position {p} is outside a sequence of length {length}")
        is_sp[p] = True
    pieces: list[tuple[str, int, int]] = []  # (kind, start, end)
    i = 0
    while i < length:
        if is_sp[i]:
            pieces.append(("S", i, i + 1))
            i += 1
        else:
            j = i
            while j < length and not is_sp[j]:
                j += 1
            pieces.append(("C", i, j))
            i = j
    n_sp = sum(k == "S" for k, _, _ in pieces)
    n_runs = len(pieces) - n_sp
    free = size - n_sp
    if free < n_runs:
        raise HeadcountError(f"map size {size} cannot hold {n_sp} special tokens and {n_runs} segments")
    cells = [free // n_runs + (1 if r < free % n_runs else 0) for r in range(n_runs)] if n_runs else []
    overlap = np.zeros((size, length))
    special_cells: list[int] = []
    seg = np.full(size, -1, dtype=np.int64)
    o, r = 0, 0
    for kind, s, e in pieces:
        if kind == "S":
            overlap[o, s] = 1.0
            special_cells.append(o)
            o += 1
            continue
        m, n = cells[r], e - s
        if n <= m:  # one token per cell: neighbours stay neighbours (no stretching)
            overlap[o + np.arange(n), s + np.arange(n)] = 1.0
        else:  # output cell q covers [q n/m, (q+1) n/m) of the run, token t covers [t, t+1)
            lo = np.arange(m)[:, None] * n / m
            hi = (np.arange(m)[:, None] + 1) * n / m
            t = np.arange(n)[None, :]
            overlap[o:o + m, s:e] = np.clip(np.minimum(hi, t + 1) - np.maximum(lo, t), 0, None)
        seg[o:o + m] = r
        o, r = o + m, r + 1
    signature = tuple(k for k, _, _ in pieces)
    return signature, overlap, special_cells, seg


def resample_attention(attn, special_positions: Sequence[int], size: int = MAP_SIZE):
    """Place one example's attention ``[..., L, L]`` on a fixed ``[..., size, size]`` layout.

    Each special token keeps one row and one column of its own; the runs of ordinary tokens
    between them (the segments) get equal ranges of the remaining cells, whatever their length,
    so examples with the same structure (e.g. ``[CLS] A [SEP] B [SEP]``) align cell by cell.
    A run that fits its range is copied one token per cell from the start of the range (the
    rest of the range stays empty: zero rows and columns), so neighbouring tokens stay
    neighbouring cells; a longer run is downsampled by area: a key column's mass is split over
    the cells it overlaps (rows still sum to 1) and a query cell averages the rows it overlaps.
    The main diagonal maps onto the main diagonal.

    Args:
        attn: ``[..., L, L]`` tensor or array of one example, padding already removed.
        special_positions: positions of the special tokens in that example.
        size: output side.

    Returns:
        ``(maps [..., size, size] float32 tensor, special cells tuple, segment id per cell [size]
        with -1 at specials, signature)``, the signature naming the structure (``("S", "C", "S")``).

    >>> maps, sp, seg, _ = resample_attention(torch.eye(10)[None], special_positions=(0, 9), size=6)
    >>> sp, maps.shape
    ((0, 5), torch.Size([1, 6, 6]))
    """
    a = attn.detach().to(torch.float64).cpu() if isinstance(attn, torch.Tensor) else torch.as_tensor(np.asarray(attn, dtype=np.float64))
    if a.ndim < 2 or a.shape[-1] != a.shape[-2] or a.shape[-1] < 1:
        raise HeadcountError(f"attention must be square [..., L, L], got shape {tuple(a.shape)}")
    length = int(a.shape[-1])
    signature, ov, sp_cells, seg = _layout(length, special_positions, size)
    row_sum = ov.sum(axis=1, keepdims=True)
    w_row = torch.as_tensor(np.divide(ov, row_sum, out=np.zeros_like(ov), where=row_sum > 0))  # averages rows
    w_col = torch.as_tensor(ov / ov.sum(axis=0, keepdims=True))  # [size, L] splits each key's mass
    out = torch.einsum("ql,...lk,ck->...qc", w_row, a, w_col)
    return out.to(torch.float32), tuple(sp_cells), seg, signature


@dataclass(frozen=True)
class AttentionMaps:
    """Fixed-size mean attention maps and the layout they share.

    Attributes:
        maps: ``[..., size, size]`` float32 tensor (the leading dims of the inputs, e.g. heads).
        special_positions: cells of the special tokens.
        segment_ids: ``[size]`` segment per cell (-1 at specials).
        n_examples: how many examples were averaged.
    """

    maps: torch.Tensor
    special_positions: tuple[int, ...]
    segment_ids: np.ndarray
    n_examples: int

    def classify(self) -> PatternClassification:
        """:func:`classify_patterns` with this layout."""
        return classify_patterns(self.maps, self.special_positions, self.segment_ids)


def mean_attention_maps(
    attentions: Sequence,
    special_positions: Sequence[Sequence[int]],
    size: int = MAP_SIZE,
    lengths: Sequence[int] | None = None,
) -> AttentionMaps:
    """Average attention maps of examples of different lengths on one fixed-size layout.

    Every example is placed with :func:`resample_attention`; all must share the same
    structure (the same number of segments and special tokens, e.g. all sentence pairs). Each
    row of the result is the mean over the examples that fill that row (short examples leave
    cells empty), so rows still sum to 1; rows no example fills stay zero.

    Args:
        attentions: one tensor per example, ``[..., L_i, L_i]`` (e.g. ``[heads, L, L]`` or
            ``[layers, heads, L, L]``), leading dims equal across examples.
        special_positions: per example, the positions of its special tokens ([CLS], [SEP], ...).
        size: side of the output maps (default :data:`MAP_SIZE`).
        lengths: optional true lengths; maps are cut to ``[:L, :L]`` and rows renormalised
            (for padded batches).

    Returns:
        An :class:`AttentionMaps`.

    >>> ex = [torch.softmax(torch.randn(2, n, n), -1) for n in (12, 20)]
    >>> mean_attention_maps(ex, [(0, 5, 11), (0, 9, 19)], size=16).maps.shape
    torch.Size([2, 16, 16])
    """
    if len(attentions) == 0:
        raise HeadcountError("mean_attention_maps needs at least one example")
    if len(special_positions) != len(attentions):
        raise HeadcountError(f"{len(attentions)} attention tensors but {len(special_positions)} special-position lists")
    if lengths is not None and len(lengths) != len(attentions):
        raise HeadcountError(f"{len(attentions)} attention tensors but {len(lengths)} lengths")
    total = count = None
    first = None
    for k, (attn, sp) in enumerate(zip(attentions, special_positions)):
        a = attn if isinstance(attn, torch.Tensor) else torch.as_tensor(np.asarray(attn))
        a = a.detach().to(torch.float64).cpu()
        if lengths is not None:
            n = int(lengths[k])
            a = a[..., :n, :n]
            a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
        maps, cells, seg, sig = resample_attention(a, sp, size)
        if first is None:
            first = (sig, cells, seg, maps.shape)
        elif sig != first[0] or maps.shape != first[3]:
            raise HeadcountError(
                f"example {k} has structure {'/'.join(sig)} or shape {tuple(maps.shape)}, example 0 has "
                f"{'/'.join(first[0])} {tuple(first[3])}: average examples of one structure together")
        filled = (maps.sum(-1) > 0.5).double()  # [..., size] rows this example fills
        total = maps.double() if total is None else total + maps.double()
        count = filled if count is None else count + filled
    assert first is not None and total is not None and count is not None
    mean = total / count.clamp_min(1.0).unsqueeze(-1)  # each row averaged over the examples that fill it
    return AttentionMaps(mean.float(), first[1], first[2], len(attentions))


# --------------------------------------------------------------------------- synthetic maps


@dataclass(frozen=True)
class SyntheticMaps:
    """Synthetic labelled attention maps.

    Attributes:
        maps: ``[N, size, size]`` float32 numpy array, rows sum to 1.
        labels: ``[N]`` int64 class ids (index into ``classes``).
        classes: the class names.
        special_positions: special-token cells used for every map.
        segment_ids: ``[size]`` segment per cell (-1 at specials).
    """

    maps: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    special_positions: tuple[int, ...]
    segment_ids: np.ndarray


def synthetic_attention_maps(
    n_per_class: int = 20,
    size: int = MAP_SIZE,
    seed: int = 0,
    special_positions: Sequence[int] | None = None,
) -> SyntheticMaps:
    """Seeded synthetic attention maps of each of the five classes, shuffled.

    Every row mixes a class-specific structure with random Dirichlet background attention:

    - vertical: 55-90% of each row's mass on the special tokens (a per-map preference);
    - diagonal: 55-90% on offsets -1/0/+1 (a per-map mix of the three);
    - vertical+diagonal: 35-45% vertical plus 40-50% diagonal;
    - block: 60-90% spread over the query's own segment, a little on specials;
    - heterogeneous: 30-70% on 1-4 random ordinary tokens shared by all rows, the rest peaky
      random attention.

    Args:
        n_per_class: maps per class.
        size: side of each map.
        seed: seed of the numpy generator.
        special_positions: special cells; default ``(0, size // 2, size - 1)``
            ([CLS] segment A [SEP] segment B [SEP]).

    Returns:
        A :class:`SyntheticMaps`.

    >>> s = synthetic_attention_maps(n_per_class=2, size=16, seed=0)
    >>> s.maps.shape, sorted(set(s.labels.tolist()))
    ((10, 16, 16), [0, 1, 2, 3, 4])
    """
    if n_per_class < 1:
        raise HeadcountError(f"n_per_class must be >= 1, got {n_per_class}")
    if size < 8:
        raise HeadcountError(f"synthetic maps need size >= 8, got {size}")
    rng = np.random.default_rng(seed)
    sp_pos = (0, size // 2, size - 1) if special_positions is None else tuple(int(p) % size for p in special_positions)
    sp = _specials(sp_pos, size)
    seg = _runs(sp)
    content = np.flatnonzero(~sp)
    sp_idx = np.flatnonzero(sp)
    rows = np.arange(size)

    def background(peaky: bool = False) -> np.ndarray:  # [S, S]
        conc = rng.uniform(0.05, 0.3) if peaky else rng.uniform(0.3, 2.0)
        return rng.dirichlet(np.full(size, conc), size=size)

    def vertical_part() -> np.ndarray:
        pref = rng.dirichlet(np.full(sp_idx.size, 0.7))
        v = np.zeros((size, size))
        jitter = rng.dirichlet(pref * 20 + 0.05, size=size)  # rows vary around the head's preference
        v[:, sp_idx] = jitter
        return v

    def diagonal_part() -> np.ndarray:
        mix = rng.dirichlet(np.full(len(DIAGONAL_OFFSETS), 0.5))
        d = np.zeros((size, size))
        for off, w in zip(DIAGONAL_OFFSETS, mix):
            cols = np.clip(rows + off, 0, size - 1)
            d[rows, cols] += w
        return d

    def block_part() -> np.ndarray:
        b = np.zeros((size, size))
        for i in rows:
            s = seg[i] if seg[i] >= 0 else rng.integers(0, seg.max() + 1)
            cols = np.flatnonzero(seg == s)
            b[i, cols] = rng.dirichlet(np.full(cols.size, 5.0))
        return b

    def stripes_part() -> np.ndarray:
        k = int(rng.integers(1, 5))
        cols = rng.choice(content, size=k, replace=False)
        w = rng.dirichlet(np.ones(k))
        h = np.zeros((size, size))
        h[:, cols] = w
        return h

    maps, labels = [], []
    for cls_id, name in enumerate(CLASSES):
        for _ in range(n_per_class):
            if name == "vertical":
                wv = rng.uniform(0.55, 0.9)
                m = wv * vertical_part() + (1 - wv) * background()
            elif name == "diagonal":
                wd = rng.uniform(0.55, 0.9)
                m = wd * diagonal_part() + (1 - wd) * background()
            elif name == "vertical+diagonal":
                wv, wd = rng.uniform(0.35, 0.45), rng.uniform(0.4, 0.5)
                m = wv * vertical_part() + wd * diagonal_part() + (1 - wv - wd) * background()
            elif name == "block":
                wb, wv = rng.uniform(0.6, 0.9), rng.uniform(0.0, 0.08)
                m = wb * block_part() + wv * vertical_part() + (1 - wb - wv) * background()
            else:
                ws = rng.uniform(0.3, 0.7)
                m = ws * stripes_part() + (1 - ws) * background(peaky=True)
            maps.append(m / m.sum(axis=1, keepdims=True))
            labels.append(cls_id)
    order = rng.permutation(len(maps))
    return SyntheticMaps(
        np.stack(maps)[order].astype(np.float32),
        np.asarray(labels, dtype=np.int64)[order],
        CLASSES,
        sp_pos,
        seg,
    )


# --------------------------------------------------------------------------- CNN


class PatternCNN(nn.Module):
    """Small CNN over fixed-size attention maps (Prasanna et al. 2020, after Kovaleva et al. 2019).

    Two blocks of 3x3 convolution + ReLU + 2x2 max-pooling, then a linear layer to the classes.
    Input maps are multiplied by their side S so that uniform attention reads 1.

    Args:
        size: side S of the input maps (divisible by 4).
        classes: class names, in output order.
        channels: channels of the two convolution blocks.

    >>> PatternCNN(size=16)(torch.rand(3, 16, 16)).shape
    torch.Size([3, 5])
    """

    def __init__(self, size: int = MAP_SIZE, classes: Sequence[str] = CLASSES, channels: Sequence[int] = (16, 32)):
        super().__init__()
        if size < 4 or size % 4:
            raise HeadcountError(f"PatternCNN needs a map size divisible by 4, got {size}")
        if len(channels) != 2:
            raise HeadcountError(f"PatternCNN takes two channel counts, got {list(channels)}")
        self.size = int(size)
        self.classes = tuple(classes)
        self.channels = tuple(int(c) for c in channels)
        c1, c2 = self.channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # [N, c1, S/2, S/2]
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # [N, c2, S/4, S/4]
        )
        self.head = nn.Linear(c2 * (size // 4) ** 2, len(self.classes))

    def config(self) -> dict[str, object]:
        """The constructor arguments, JSON-ready."""
        return {"size": self.size, "classes": list(self.classes), "channels": list(self.channels)}

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, n_classes]`` for maps ``[N, S, S]`` (or ``[N, 1, S, S]``)."""
        x = maps if maps.ndim == 4 else maps.unsqueeze(1)  # [N, 1, S, S]
        x = self.features(x * self.size)
        return self.head(x.flatten(1))


def _label_ids(labels, classes: Sequence[str]) -> np.ndarray:
    norm = {c.lower().replace(" ", "").replace("_", "+"): i for i, c in enumerate(classes)}
    out = []
    for k, lab in enumerate(list(labels)):
        if isinstance(lab, (int, np.integer)) and not isinstance(lab, bool):
            idx = int(lab)
        elif isinstance(lab, str) and lab.strip().lstrip("-").isdigit():
            idx = int(lab.strip())
        elif isinstance(lab, str) and lab.lower().strip().replace(" ", "").replace("_", "+") in norm:
            idx = norm[lab.lower().strip().replace(" ", "").replace("_", "+")]
        else:
            raise HeadcountError(f"label {k} ({lab!r}) is not one of {', '.join(classes)} or 0..{len(classes) - 1}")
        if not 0 <= idx < len(classes):
            raise HeadcountError(f"label {k} ({idx}) is out of range 0..{len(classes) - 1}")
        out.append(idx)
    return np.asarray(out, dtype=np.int64)


def _split(labels: np.ndarray, holdout: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stratified split: floor(holdout * n_c) examples of each class are held out."""
    train, held = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(math.floor(holdout * idx.size))
        held.extend(idx[:k].tolist())
        train.extend(idx[k:].tolist())
    return np.sort(np.asarray(train, dtype=np.int64)), np.sort(np.asarray(held, dtype=np.int64))


def _accuracy(model: PatternCNN, x: torch.Tensor, y: torch.Tensor) -> float | None:
    if len(y) == 0:
        return None
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean())


def _fit(x_tr, y_tr, size, classes, channels, seed, epochs, batch_size, lr) -> tuple[PatternCNN, float]:
    """Adam + cross-entropy; torch's global RNG is seeded inside a fork, so callers are unaffected."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = PatternCNN(size, classes, channels)
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        loss_fn = nn.CrossEntropyLoss()
        last = math.nan
        for _ in range(epochs):
            model.train()
            order = torch.randperm(len(y_tr), generator=gen)
            total, count = 0.0, 0
            for s in range(0, len(order), batch_size):
                b = order[s:s + batch_size]
                opt.zero_grad()
                loss = loss_fn(model(x_tr[b]), y_tr[b])
                loss.backward()
                opt.step()
                total += loss.item() * len(b)
                count += len(b)
            last = total / max(count, 1)
    return model, last


def train_pattern_cnn(
    maps,
    labels,
    seed: int = 0,
    epochs: int = 30,
    classes: Sequence[str] = CLASSES,
    holdout: float = 0.2,
    batch_size: int = 32,
    lr: float = 3e-3,
    channels: Sequence[int] = (16, 32),
    num_threads: int | None = 1,
) -> tuple[PatternCNN, dict[str, object]]:
    """Train a :class:`PatternCNN` on labelled maps; deterministic for a seed (on CPU).

    A stratified ``holdout`` fraction of each class is kept out of training and reported.

    Args:
        maps: ``[N, S, S]`` array or tensor (S divisible by 4; rows need not sum to 1 but
            should for consistency with :func:`mean_attention_maps`).
        labels: ``[N]`` class names or ids (see :data:`CLASSES`).
        seed: seeds initialisation, the split and the batch order.
        epochs: passes over the training part.
        classes: class names (default the five Kovaleva classes).
        holdout: fraction of each class held out, in [0, 0.9].
        batch_size: mini-batch size.
        lr: Adam learning rate.
        channels: convolution channels.
        num_threads: torch intra-op threads while training (restored afterwards); the CNN is
            tiny, and one thread is fastest, especially on a busy machine. ``None``: leave as is.

    Returns:
        ``(model, metrics)`` with metrics ``{"train_accuracy", "heldout_accuracy" (None without a
        held-out part), "n_train", "n_heldout", "epochs", "seed", "final_loss", "classes",
        "confusion" (held-out, rows = true class)}``; the model is in eval mode.

    >>> s = synthetic_attention_maps(n_per_class=4, size=16, seed=0)
    >>> model, metrics = train_pattern_cnn(s.maps, s.labels, seed=0, epochs=1)
    >>> metrics["n_train"] + metrics["n_heldout"]
    20
    """
    x_all = torch.as_tensor(_to_numpy(maps), dtype=torch.float32)
    size = _check_square(x_all.numpy())
    if x_all.ndim != 3:
        raise HeadcountError(f"maps must be [N, S, S], got shape {tuple(x_all.shape)}")
    if not torch.isfinite(x_all).all():
        raise HeadcountError("maps contain NaN or infinite values")
    y_np = _label_ids(labels, classes)
    if y_np.shape[0] != x_all.shape[0]:
        raise HeadcountError(f"{x_all.shape[0]} maps but {y_np.shape[0]} labels")
    if x_all.shape[0] < 2:
        raise HeadcountError("need at least 2 labelled maps to train")
    if epochs < 1:
        raise HeadcountError(f"epochs must be >= 1, got {epochs}")
    if not 0 <= holdout <= 0.9:
        raise HeadcountError(f"holdout must be in [0, 0.9], got {holdout}")
    if batch_size < 1:
        raise HeadcountError(f"batch_size must be >= 1, got {batch_size}")
    rng = np.random.default_rng(seed)
    tr, he = _split(y_np, holdout, rng)
    y_all = torch.as_tensor(y_np)
    x_tr, y_tr, x_he, y_he = x_all[tr], y_all[tr], x_all[he], y_all[he]
    threads_before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    try:
        model, last = _fit(x_tr, y_tr, size, classes, channels, seed, epochs, batch_size, lr)
    finally:
        torch.set_num_threads(threads_before)
    model.eval()
    confusion = np.zeros((len(classes), len(classes)), dtype=np.int64)
    if len(he):
        with torch.no_grad():
            pred = model(x_he).argmax(-1).numpy()
        np.add.at(confusion, (y_he.numpy(), pred), 1)
    metrics = {
        "train_accuracy": _accuracy(model, x_tr, y_tr),
        "heldout_accuracy": _accuracy(model, x_he, y_he),
        "n_train": int(len(tr)),
        "n_heldout": int(len(he)),
        "epochs": int(epochs),
        "seed": int(seed),
        "final_loss": float(last),
        "classes": list(classes),
        "confusion": confusion.tolist(),
    }
    return model, metrics


def predict_patterns(model: PatternCNN, maps, return_probs: bool = False):
    """Class names (and optionally probabilities) the CNN gives maps ``[..., S, S]``.

    Args:
        model: a trained :class:`PatternCNN`.
        maps: ``[..., S, S]`` with S = ``model.size``.
        return_probs: also return the softmax ``[..., n_classes]``.

    Returns:
        A str array shaped like the leading dims, or ``(labels, probs)``.

    >>> m = PatternCNN(size=16)
    >>> predict_patterns(m, torch.rand(2, 3, 16, 16)).shape
    (2, 3)
    """
    x = torch.as_tensor(_to_numpy(maps), dtype=torch.float32)
    size = _check_square(x.numpy())
    if size != model.size:
        raise HeadcountError(f"the CNN reads {model.size} x {model.size} maps, got {size} x {size}")
    lead = x.shape[:-2]
    model.eval()
    with torch.no_grad():
        probs = torch.softmax(model(x.reshape(-1, size, size)), -1).numpy()
    names = np.asarray(model.classes)[probs.argmax(-1)].reshape(lead)
    return (names, probs.reshape(*lead, -1)) if return_probs else names


_CNN_FORMAT = "headcount-pattern-cnn"


def save_pattern_cnn(model: PatternCNN, directory) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``directory`` (atomically, each file).

    Args:
        model: a :class:`PatternCNN`.
        directory: created if missing.

    Returns:
        The directory.

    >>> import tempfile
    >>> d = save_pattern_cnn(PatternCNN(size=16), tempfile.mkdtemp())
    >>> sorted(p.name for p in d.iterdir())
    ['config.json', 'model.safetensors']
    """
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(d / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": _CNN_FORMAT})
    atomic_write_json(d / "config.json", {"format": _CNN_FORMAT, "version": 1, **model.config()})
    return d


def load_pattern_cnn(directory) -> PatternCNN:
    """Load a CNN written by :func:`save_pattern_cnn` (eval mode).

    Args:
        directory: holds ``config.json`` and ``model.safetensors``.

    Returns:
        The :class:`PatternCNN`.

    >>> import tempfile
    >>> load_pattern_cnn(save_pattern_cnn(PatternCNN(size=16), tempfile.mkdtemp())).size
    16
    """
    from safetensors.torch import load_file

    d = Path(directory)
    cfg_path, weights = d / "config.json", d / "model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise HeadcountError(f"{d} is not a pattern CNN directory (needs config.json and model.safetensors)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise HeadcountError(f"cannot read {cfg_path}: {e}") from None
    if not isinstance(cfg, dict) or cfg.get("format") != _CNN_FORMAT:
        raise HeadcountError(f"{cfg_path} is not a pattern CNN config (format != {_CNN_FORMAT!r})")
    try:
        model = PatternCNN(int(cfg["size"]), list(cfg["classes"]), list(cfg["channels"]))
        model.load_state_dict(load_file(str(weights)))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise HeadcountError(f"cannot load the pattern CNN in {d}: {str(e).splitlines()[0]}") from None
    return model.eval()


# --------------------------------------------------------------------------- labelled data files


def _read_labels(path: Path) -> list:
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv"):
        raise HeadcountError(f"labels must be a .csv (with a 'label' column) or a .json list, got {path.name}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise HeadcountError(f"cannot read labels {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise HeadcountError(f"labels file {path} is not UTF-8 text") from None
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise HeadcountError(f"{path} is not valid JSON: {e.msg} (line {e.lineno})") from None
        if isinstance(data, dict):
            data = data.get("labels")
        if not isinstance(data, list):
            raise HeadcountError(f"{path} must hold a list of labels or {{\"labels\": [...]}}")
        return data
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or "label" not in [f.strip() for f in reader.fieldnames]:
        raise HeadcountError(f"{path} needs a 'label' column (one row per map, in order)")
    key = next(f for f in reader.fieldnames if f.strip() == "label")
    return [(row.get(key) or "").strip() for row in reader
            if any((v or "").strip() for v in row.values() if isinstance(v, str))]


def load_labelled_maps(maps_path, labels_path, classes: Sequence[str] = CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """Read user-labelled maps: ``maps.safetensors`` (tensor ``"maps"`` [N, S, S]) and CSV/JSON labels.

    Args:
        maps_path: a .safetensors file with a float tensor named ``maps``, shape ``[N, S, S]``.
        labels_path: a .csv with a ``label`` column, or a .json list (or ``{"labels": [...]}``);
            labels are class names or ids, one per map, in order.
        classes: class names the labels refer to.

    Returns:
        ``(maps float32 [N, S, S], labels int64 [N])``.

    Raises:
        HeadcountError: missing files, a wrong format or shape, unknown labels, counts that differ.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); s = synthetic_attention_maps(1, size=16)
    >>> _ = save_labelled_maps(s.maps, s.labels, os.path.join(d, "m.safetensors"), os.path.join(d, "l.csv"))
    >>> load_labelled_maps(os.path.join(d, "m.safetensors"), os.path.join(d, "l.csv"))[0].shape
    (5, 16, 16)
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    mp, lp = Path(maps_path), Path(labels_path)
    if not mp.is_file():
        raise HeadcountError(f"maps file not found: {mp}")
    if not lp.is_file():
        raise HeadcountError(f"labels file not found: {lp}")
    if mp.suffix.lower() != ".safetensors":
        raise HeadcountError(f"maps must be a .safetensors file with a tensor 'maps' [N, S, S], got {mp.name}")
    try:
        tensors = load_file(str(mp))
    except (SafetensorError, OSError, ValueError) as e:
        raise HeadcountError(f"cannot read {mp}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if "maps" not in tensors:
        raise HeadcountError(f"{mp} has no tensor named 'maps' (found: {', '.join(sorted(tensors)) or 'none'})")
    maps = np.asarray(tensors["maps"], dtype=np.float32)
    if maps.ndim != 3 or maps.shape[1] != maps.shape[2]:
        raise HeadcountError(f"'maps' in {mp} must be [N, S, S], got shape {tuple(maps.shape)}")
    if not np.all(np.isfinite(maps)) or np.any(maps < 0):
        raise HeadcountError(f"'maps' in {mp} must be finite and non-negative")
    labels = _label_ids(_read_labels(lp), classes)
    if labels.shape[0] != maps.shape[0]:
        raise HeadcountError(f"{mp.name} has {maps.shape[0]} maps but {lp.name} has {labels.shape[0]} labels")
    return maps, labels


def save_labelled_maps(maps, labels, maps_path, labels_path, classes: Sequence[str] = CLASSES) -> tuple[Path, Path]:
    """Write maps and labels in the format :func:`load_labelled_maps` reads (atomically).

    Args:
        maps: ``[N, S, S]``.
        labels: ``[N]`` class names or ids.
        maps_path: destination .safetensors.
        labels_path: destination .csv (columns ``index,label``) or .json (a list of names).
        classes: class names.

    Returns:
        The two paths.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); s = synthetic_attention_maps(1, size=16)
    >>> [p.name for p in save_labelled_maps(s.maps, s.labels, os.path.join(d, "m.safetensors"), os.path.join(d, "l.json"))]
    ['m.safetensors', 'l.json']
    """
    from safetensors.numpy import save_file

    m = np.ascontiguousarray(_to_numpy(maps), dtype=np.float32)
    ids = _label_ids(labels, classes)
    if m.ndim != 3 or m.shape[0] != ids.shape[0]:
        raise HeadcountError(f"need maps [N, S, S] and N labels, got {tuple(m.shape)} and {ids.shape[0]}")
    mp, lp = Path(maps_path), Path(labels_path)
    mp.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(mp) as tmp:
        save_file({"maps": m}, str(tmp))
    names = [classes[i] for i in ids.tolist()]
    if lp.suffix.lower() == ".json":
        atomic_write_json(lp, names)
    elif lp.suffix.lower() == ".csv":
        atomic_write_text(lp, "index,label\n" + "".join(f"{i},{n}\n" for i, n in enumerate(names)))
    else:
        raise HeadcountError(f"labels file must end in .csv or .json, got {lp.name}")
    return mp, lp
