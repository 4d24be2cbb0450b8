"""The page model of the explorer: one JSON-able dict that [`page`][headcount.experiments.explorer.page] renders.

Layout of the dict (``FORMAT`` 1)::

    {"format": 1, "title": str, "source": {...}, "notes": [str],
     "layers": L, "heads": H,
     "quantities": [{"name", "key", "kind", "heads": [L][H], "mlps": [L] | null, "ranks": [L][H] | null,
                     "mlp_ranks": [L] | null, "categories": [str] | null, "group": str | null,
                     "seed": int | null, "n": int | null}],
     "details": [L][H][n_quantities] -> [value text, rank text | null],
     "mlp_details": [L][n_quantities] -> [value text, rank text | null] | null,
     "attention": null | {"label", "k", "min_weight", "examples": [{"tokens": [str]}],
                          "heads": [L][H] -> base64 | null}}

``name`` says what a quantity is (method, objective, task, seed: ``task gradient importance
(fine-tuned), tweets, seed 1``); ``key`` is where it comes from (the job name or the file), and
the seed groups are read from it.

Quantity kinds: ``score`` (an importance grid), ``mean`` (of a score grid over seeds), ``mask``
(1 kept, 0 removed), ``survival`` (kept by k of ``n`` masks), ``level`` (the smallest pruning
level that removed the head; null: none did), ``step`` (the iterative pruning step that removed
the head; null: kept), ``pattern`` (an index into ``categories``).
Values that are not finite are null.

Attention ([`encode_attention`][headcount.experiments.explorer.data.encode_attention]): per head, one byte string over the examples; for each
example of ``n`` tokens: ``n`` counts (one per query row), then for each row ``count`` pairs
``(key index, round(weight x 255))``, the row's largest weights, largest first: at most ``k``,
and only those of at least ``min_weight`` (the largest is always kept). [`decode_attention`][headcount.experiments.explorer.data.decode_attention]
reads it back (the page's script does the same).
"""

from __future__ import annotations

import base64
import math
import re
from collections import defaultdict

import numpy as np

from headcount.runtime.bounds import Bound
from headcount.runtime.errors import HeadcountError

FORMAT = 1
DEFAULT_EXAMPLES = 8
MAX_EXAMPLES = 16
#: tokens per example at most (a key index is one byte)
MAX_TOKENS = 128
#: the most weights kept per query row, and the least weight kept (beside the row's largest)
TOP_K = 8
MIN_WEIGHT = 0.01
#: raw bytes of attention a page holds at most (base64 makes them 4/3 as many): k shrinks to fit
BUDGET_BYTES = 3_400_000
#: ``--examples``: how many dev examples the attention panel shows
EXAMPLES_SHOWN = Bound(1, MAX_EXAMPLES, integer=True)

KINDS = ("score", "mean", "mask", "survival", "level", "step", "pattern")
NUMERIC = ("score", "mean", "survival", "level", "step")
_SEED = re.compile(r"(^|/)seed(\d+)(?=/|$)")
_SEED_TEXT = re.compile(r", seed \d+(?=,|$)")


def new_page(n_layers: int, n_heads: int, title: str, source: dict) -> dict:
    """An empty page model for a ``n_layers`` x ``n_heads`` grid."""
    return {"format": FORMAT, "title": title, "source": source, "notes": [], "layers": int(n_layers),
            "heads": int(n_heads), "quantities": [], "attention": None}


def seed_group(name: str) -> tuple[str | None, int | None]:
    """``(group, seed)`` of a job name with a ``seed<k>`` part; ``(None, None)`` without one.

    >>> seed_group("task-scores/movies/seed2/fine-tuned")
    ('task-scores/movies/seed*/fine-tuned', 2)
    >>> seed_group("mlm-scores/movies")
    (None, None)
    """
    m = _SEED.search(name)
    if m is None:
        return None, None
    return name[:m.start(2) - 4] + "seed*" + name[m.end(2):], int(m.group(2))


def _clean(value):
    if value is None:
        return None
    value = float(value)
    return float(f"{value:.6g}") if math.isfinite(value) else None


def _count(value):
    return int(value) if math.isfinite(value) else None


def _grid(values, n_layers: int, n_heads: int | None, what: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise HeadcountError(f"{what}: not a grid of numbers") from None
    want = (n_layers, n_heads) if n_heads is not None else (n_layers,)
    if arr.shape != want:
        have = " x ".join(map(str, arr.shape)) or "a single value"
        shape = f"{n_layers} layers x {n_heads} heads" if n_heads is not None else f"{n_layers} layers"
        raise HeadcountError(f"{what} is for {have}, the model has {shape}")
    return arr


def ranks(values: np.ndarray) -> np.ndarray:
    """Rank of every finite value, 1 = the largest (ties: by position); NaN where not finite.

    >>> ranks(np.array([[0.1, 0.5], [float("nan"), 0.3]])).tolist()
    [[3.0, 1.0], [nan, 2.0]]
    """
    flat = np.asarray(values, dtype=np.float64).ravel()
    out = np.full(flat.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(flat))
    order = finite[np.argsort(-flat[finite], kind="stable")]
    out[order] = np.arange(1, order.size + 1)
    return out.reshape(np.shape(values))


def add_quantity(page: dict, name: str, heads, mlps=None, *, kind: str, categories=None, n: int | None = None,
                 key: str | None = None) -> dict:
    """Add a quantity (a [layers, heads] grid and an optional [layers] MLP column) to ``page``.

    ``key``: the job name (or file) it comes from, and its seed group is read from
    ([`seed_group`][headcount.experiments.explorer.data.seed_group]; default ``name``). A name already on the page gets `` [key]``.

    Raises:
        HeadcountError: a grid that does not fit the page's layers x heads (the message names ``name``).
    """
    if kind not in KINDS:
        raise HeadcountError(f"unknown quantity kind {kind!r}")
    L, H = page["layers"], page["heads"]
    grid = _grid(heads, L, H, name)
    column = None if mlps is None else _grid(mlps, L, None, f"{name} (MLPs)")
    key = key or name
    if any(q["name"] == name for q in page["quantities"]):
        name = f"{name} [{key}]"
    group, seed = seed_group(key)
    clean = _count if kind in ("mask", "survival", "pattern") else _clean
    q = {"name": name, "key": key, "kind": kind, "heads": [[clean(v) for v in row] for row in grid],
         "mlps": None if column is None else [clean(v) for v in column],
         "ranks": None, "mlp_ranks": None, "categories": list(categories) if categories is not None else None,
         "group": group, "seed": seed, "n": n}
    if kind in ("score", "mean"):
        q["ranks"] = [[None if math.isnan(r) else int(r) for r in row] for row in ranks(grid)]
        if column is not None:
            q["mlp_ranks"] = [None if math.isnan(r) else int(r) for r in ranks(column)]
    page["quantities"].append(q)
    return q


def add_seed_summaries(page: dict) -> None:
    """For each group of score grids over two or more seeds, their mean; for each group of masks
    over two or more seeds, survival (kept by k of n). Members are grouped by their keys' seed
    group ([`seed_group`][headcount.experiments.explorer.data.seed_group]: job names that differ only in ``seed<k>``); the summary is named
    after its members' name without the seed (``, seed 1``), or after the group of keys.

    >>> page = new_page(1, 2, "t", {})
    >>> for k in (1, 2):
    ...     _ = add_quantity(page, f"task importance, tweets, seed {k}", [[k, 0]], kind="score", key=f"s/seed{k}")
    >>> add_seed_summaries(page); page["quantities"][-1]["name"]
    'mean of 2 seeds: task importance, tweets'
    """
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for q in page["quantities"]:
        if q["group"] is not None and q["kind"] in ("score", "mask"):
            groups[q["kind"], q["group"]].append(q)
    for (kind, group), members in groups.items():
        if len(members) < 2:
            continue
        heads = np.array([[[np.nan if v is None else v for v in row] for row in q["heads"]] for q in members])
        mlps = None
        if all(q["mlps"] is not None for q in members):
            mlps = np.array([[np.nan if v is None else v for v in q["mlps"]] for q in members])
        n = len(members)
        label = _SEED_TEXT.sub("", members[0]["name"])
        label = label if label != members[0]["name"] and all(_SEED_TEXT.sub("", q["name"]) == label
                                                             for q in members) else group
        if kind == "score":
            add_quantity(page, f"mean of {n} seeds: {label}", _mean(heads), None if mlps is None else _mean(mlps),
                         kind="mean", n=n)
        else:
            add_quantity(page, f"kept by k of {n} seeds: {label}", heads.sum(0),
                         None if mlps is None else mlps.sum(0), kind="survival", n=n)


def _mean(stack: np.ndarray) -> np.ndarray:
    """Mean over the first axis of the finite values; NaN where there is none."""
    finite = np.isfinite(stack)
    count = finite.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, np.where(finite, stack, 0).sum(0) / count, np.nan)


def add_levels(page: dict, family: str, masks: dict[float, dict], label: str | None = None) -> None:
    """The smallest level (of ``{level: mask dict}``) whose mask removes each head and MLP
    (``label``: its name on the page; default ``removed at level: <family>``)."""
    L, H = page["layers"], page["heads"]
    heads = np.full((L, H), np.nan)
    mlps = np.full(L, np.nan)
    for level in sorted(masks, reverse=True):
        m = masks[level]
        heads[_grid(m["heads"], L, H, family) == 0] = level
        if m.get("mlps") is not None:
            mlps[_grid(m["mlps"], L, None, family) == 0] = level
    add_quantity(page, label or f"removed at level: {family}", heads, mlps, kind="level", key=family)


def add_steps(page: dict, name: str, removed_at_step: dict, key: str | None = None) -> None:
    """The iterative pruning step that removed each head and MLP (``removed_at_step`` of a
    ``mask.json``: ``{"heads": [L][H], "mlps": [L]}``, 0 = kept), as a ``step`` quantity."""
    L, H = page["layers"], page["heads"]
    heads = _grid(removed_at_step.get("heads"), L, H, name).astype(float)
    mlps = removed_at_step.get("mlps")
    mlps = None if mlps is None else _grid(mlps, L, None, name).astype(float)
    heads[heads == 0] = np.nan
    if mlps is not None:
        mlps[mlps == 0] = np.nan
    add_quantity(page, name if key else f"removed at step: {name}", heads, mlps, kind="step", key=key or name)


def _text(q: dict, value, rank, total: int) -> list:
    if value is None:
        return [{"level": "kept at every level", "step": "kept"}.get(q["kind"], "n/a"), None]
    kind = q["kind"]
    if kind == "mask":
        text = "kept" if value else "removed"
    elif kind == "survival":
        text = f"kept by {int(value)} of {q['n']}"
    elif kind == "pattern":
        text = q["categories"][int(value)]
    elif kind == "level":
        text = f"removed at {value:g}"
    elif kind == "step":
        text = f"removed at step {int(value)}"
    else:
        text = f"{value:.4g}"
    return [text, None if rank is None else f"{rank} of {total}"]


def finish(page: dict) -> dict:
    """Fill ``details`` and ``mlp_details`` from the quantities (call after the last is added)."""
    L, H = page["layers"], page["heads"]
    qs = page["quantities"]

    def count(grid):
        return sum(v is not None for row in grid for v in (row if isinstance(row, list) else [row]))

    totals = [count(q["heads"]) for q in qs]
    page["details"] = [[[_text(q, q["heads"][i][j], q["ranks"][i][j] if q["ranks"] else None, totals[k])
                         for k, q in enumerate(qs)] for j in range(H)] for i in range(L)]
    if any(q["mlps"] is not None for q in qs):
        page["mlp_details"] = [[_text(q, q["mlps"][i], q["mlp_ranks"][i] if q["mlp_ranks"] else None,
                                      count(q["mlps"])) if q["mlps"] is not None else ["n/a", None]
                                for q in qs] for i in range(L)]
    else:
        page["mlp_details"] = None
    return page


# -- attention --------------------------------------------------------------------------------
def choose_k(n_rows: int, budget: int = BUDGET_BYTES) -> int:
    """Weights kept per query row so that ``n_rows`` rows fit ``budget`` bytes at worst
    (a count byte per row and two bytes per weight); between 1 and [`TOP_K`][headcount.experiments.explorer.data.TOP_K].

    >>> choose_k(144 * 16 * 128)   # BERT-base, 16 examples of 128 tokens
    5
    """
    return max(1, min(TOP_K, (budget // max(n_rows, 1) - 1) // 2))


def encode_attention(maps: list[np.ndarray], k: int, min_weight: float = MIN_WEIGHT) -> list[list[str | None]]:
    """Base64 strings ``[layer][head]`` of the examples' attention (see the module docstring).

    Args:
        maps: one float array ``[layers, heads, n, n]`` per example (rows: queries), NaN for a
            head that is not there (pruned): its entry is None.
        k: weights kept per row at most; ``min_weight``: the least kept beside each row's largest.
    """
    if not maps:
        return []
    L, H = maps[0].shape[:2]
    parts: list[list[list[bytes]]] = [[[] for _ in range(H)] for _ in range(L)]
    missing = np.zeros((L, H), dtype=bool)
    for m in maps:
        n = m.shape[-1]
        if n > 255:
            raise HeadcountError(f"an example of {n} tokens is too long for the explorer (at most {MAX_TOKENS})")
        missing |= np.isnan(m).any(axis=(2, 3))
        m = np.nan_to_num(m, nan=0.0)
        kk = min(k, n)
        idx = np.argsort(-m, axis=-1, kind="stable")[..., :kk]
        w = np.take_along_axis(m, idx, -1)
        keep = w >= min_weight
        keep[..., 0] = True
        counts = keep.sum(-1).astype(np.uint8)
        q = np.clip(np.rint(w * 255), 0, 255).astype(np.uint8)
        for i in range(L):
            for j in range(H):
                sel = keep[i, j]
                pairs = np.stack([idx[i, j][sel].astype(np.uint8), q[i, j][sel]], -1)
                parts[i][j].append(counts[i, j].tobytes() + pairs.tobytes())
    return [[None if missing[i, j] else base64.b64encode(b"".join(parts[i][j])).decode("ascii")
             for j in range(H)] for i in range(L)]


def decode_attention(blob: str, lengths: list[int]) -> list[np.ndarray]:
    """The maps (``n x n`` per example, weights / 255, dropped weights 0) of one head's string."""
    data = np.frombuffer(base64.b64decode(blob), dtype=np.uint8)
    out, pos = [], 0
    for n in lengths:
        counts = data[pos:pos + n].astype(int)
        pos += n
        m = np.zeros((n, n))
        for row, c in enumerate(counts):
            pairs = data[pos:pos + 2 * c].reshape(c, 2)
            pos += 2 * c
            m[row, pairs[:, 0]] = pairs[:, 1] / 255
        out.append(m)
    if pos != data.size:
        raise HeadcountError("attention data of the wrong length")
    return out


def attention_block(label: str, tokens: list[list[str]], maps: list[np.ndarray], note: str | None = None) -> dict:
    """The page's ``attention`` entry: the examples' tokens and their encoded maps."""
    rows = int(sum(len(t) for t in tokens)) * int(maps[0].shape[0] * maps[0].shape[1]) if maps else 0
    k = choose_k(rows)
    return {"label": label, "k": k, "min_weight": MIN_WEIGHT, "note": note,
            "examples": [{"tokens": list(t)} for t in tokens], "heads": encode_attention(maps, k)}
