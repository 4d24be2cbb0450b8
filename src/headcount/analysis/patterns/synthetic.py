"""Seeded synthetic attention maps of every pattern class (tests, demos, trying the CNN)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from headcount.analysis.patterns.features import CLASSES, DIAGONAL_OFFSETS, MAP_SIZE, _runs, _specials
from headcount.runtime.bounds import Bound
from headcount.runtime.errors import HeadcountError

#: synthetic maps per class
MAPS_PER_CLASS = Bound(1, 10**5, integer=True)


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
        A [`SyntheticMaps`][headcount.analysis.patterns.synthetic.SyntheticMaps].

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
