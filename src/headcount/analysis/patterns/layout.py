"""Fixed-size attention maps: one example's map on a canonical layout, means over examples.

Special tokens keep one cell each; the runs of ordinary tokens between them share the rest, so
examples of the same structure (e.g. ``[CLS] A [SEP] B [SEP]``) align cell by cell.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from headcount.analysis.patterns.features import MAP_SIZE, PatternClassification, classify_patterns
from headcount.runtime.errors import HeadcountError


def center_pad(maps, size: int):
    """Per-example maps ``[..., L, L]`` on a ``[..., size, size]`` canvas, as Prasanna et al.'s ``pad_image``.

    A map longer than ``size`` is first cut to its top-left ``size`` x ``size`` corner (its first
    ``size`` tokens: [CLS] and the start of the text); a shorter one is centred with zeros around
    it, ``(size - L) // 2`` rows/columns before and the rest after. Rows are not renormalised.

    Args:
        maps: numpy array or tensor ``[..., L, L]`` (a tensor stays on its device).
        size: output side (>= 1).

    Returns:
        The same kind as the input, ``[..., size, size]`` (numpy: float32).

    >>> center_pad(np.ones((2, 2)), 5).astype(int).tolist()[1]
    [0, 1, 1, 0, 0]
    """
    if size < 1:
        raise HeadcountError(f"center_pad needs a size >= 1, got {size}")
    if maps.ndim < 2 or maps.shape[-1] != maps.shape[-2]:
        raise HeadcountError(f"maps must be square [..., L, L], got shape {tuple(maps.shape)}")
    x = maps[..., :size, :size]
    n = int(x.shape[-1])
    before = (size - n) // 2
    after = size - n - before
    if isinstance(x, torch.Tensor):
        return torch.nn.functional.pad(x, (before, after, before, after)) if size != n else x
    x = np.asarray(x, dtype=np.float32)
    widths = [(0, 0)] * (x.ndim - 2) + [(before, after), (before, after)]
    return np.pad(x, widths) if size != n else x


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
        """[`classify_patterns`][headcount.analysis.patterns.features.classify_patterns] with this layout."""
        return classify_patterns(self.maps, self.special_positions, self.segment_ids)


def mean_attention_maps(
    attentions: Sequence,
    special_positions: Sequence[Sequence[int]],
    size: int = MAP_SIZE,
    lengths: Sequence[int] | None = None,
) -> AttentionMaps:
    """Average attention maps of examples of different lengths on one fixed-size layout.

    Every example is placed with [`resample_attention`][headcount.analysis.patterns.layout.resample_attention]; all must share the same
    structure (the same number of segments and special tokens, e.g. all sentence pairs). Each
    row of the result is the mean over the examples that fill that row (short examples leave
    cells empty), so rows still sum to 1; rows no example fills stay zero.

    Args:
        attentions: one tensor per example, ``[..., L_i, L_i]`` (e.g. ``[heads, L, L]`` or
            ``[layers, heads, L, L]``), leading dims equal across examples.
        special_positions: per example, the positions of its special tokens ([CLS], [SEP], ...).
        size: side of the output maps (default [`MAP_SIZE`][headcount.analysis.patterns.layout.MAP_SIZE]).
        lengths: optional true lengths; maps are cut to ``[:L, :L]`` and rows renormalised
            (for padded batches).

    Returns:
        An [`AttentionMaps`][headcount.analysis.patterns.layout.AttentionMaps].

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


@dataclass(frozen=True)
class StructureMeans:
    """Mean maps of the examples of the commonest structure ([`commonest_structure_maps`][headcount.analysis.patterns.layout.commonest_structure_maps]).

    Attributes:
        maps: the [`AttentionMaps`][headcount.analysis.patterns.layout.AttentionMaps] of those examples.
        structure: the structure's signature, e.g. ``("S", "C", "S")`` for ``[CLS] text [SEP]``.
        n_other: examples of other structures (left out of the mean).
    """

    maps: AttentionMaps
    structure: tuple[str, ...]
    n_other: int


def commonest_structure_maps(examples: Iterable[tuple[torch.Tensor, Sequence[int]]], size: int = MAP_SIZE) -> StructureMeans:
    """Per-head mean maps over the examples of the most common structure.

    Examples of different structures (a single sentence, a sentence pair) cannot be averaged
    cell by cell, so each example is placed on the fixed layout of its own structure
    ([`resample_attention`][headcount.analysis.patterns.layout.resample_attention]), and the structure with the most examples (ties: the larger
    signature) is averaged with [`mean_attention_maps`][headcount.analysis.patterns.layout.mean_attention_maps]. A fixed-size map laid out again
    on the same layout is unchanged, so that mean equals the mean of the raw maps. Examples
    whose structure the map size cannot hold are skipped.

    Args:
        examples: ``(attention [..., L, L], special positions)`` per example, padding removed
            (e.g. ``[layers, heads, L, L]``); rows are renormalised to sum to 1.
        size: side of the fixed-size maps.

    Returns:
        A [`StructureMeans`][headcount.analysis.patterns.layout.StructureMeans].

    Raises:
        HeadcountError: no example fits a ``size`` x ``size`` map.

    >>> ex = [(torch.softmax(torch.randn(2, n, n), -1), (0, n - 1)) for n in (6, 9)]
    >>> ex.append((torch.softmax(torch.randn(2, 7, 7), -1), (0, 3, 6)))
    >>> r = commonest_structure_maps(ex, size=16)
    >>> r.structure, r.n_other, r.maps.n_examples, tuple(r.maps.maps.shape)
    (('S', 'C', 'S'), 1, 2, (2, 16, 16))
    """
    by_structure: dict[tuple, list] = {}
    cells_of: dict[tuple, tuple] = {}
    n_seen = 0
    for attn, specials in examples:
        a = attn / attn.sum(-1, keepdim=True).clamp_min(1e-12)
        try:
            maps, cells, _, sig = resample_attention(a, specials, size)
        except HeadcountError:
            continue  # a structure the map size cannot hold
        by_structure.setdefault(sig, []).append(maps)
        cells_of[sig] = cells
        n_seen += 1
    if not by_structure:
        raise HeadcountError(f"no example fits a {size} x {size} map")
    sig = max(by_structure, key=lambda s: (len(by_structure[s]), s))
    chosen = by_structure[sig]
    mean = mean_attention_maps(chosen, [cells_of[sig]] * len(chosen), size=size)
    return StructureMeans(mean, sig, n_seen - len(chosen))
