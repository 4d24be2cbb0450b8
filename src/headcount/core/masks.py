"""The Mask value object: which heads and MLPs are kept (1) or removed (0), with JSON I/O.

``mask.json``: ``{"heads": [[0|1]*n_heads]*n_layers, "mlps": [0|1]*n_layers, ...metadata}``.
For a shared-layer model (ALBERT) ``"shared_heads": [0|1]*n_heads`` may stand instead of (or
beside) ``heads``: a shared head that is 0 is removed at every depth.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headcount.core.gates import layout
from headcount.runtime.atomic import atomic_write_json
from headcount.runtime.errors import HeadcountError


#: the most layers (and heads per layer) a mask file may give: no encoder has more, and a
#: larger count ("n_layers": 1e999) would only exhaust memory
MAX_SIZE = 10_000


def _json(value) -> str:
    try:
        return json.dumps(value)[:40]
    except (TypeError, ValueError):
        return type(value).__name__


def _count(value, what: str) -> int:
    """A whole number 1..MAX_SIZE (``n_layers``)."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and value == int(value) and 1 <= value <= MAX_SIZE)
    if not ok:
        raise HeadcountError(f"mask '{what}' must be a whole number in 1..{MAX_SIZE}, got {_json(value)}")
    return int(value)


def _flags(value, what: str) -> list[int]:
    """A non-empty list of 0/1 numbers, at most MAX_SIZE long."""
    if not isinstance(value, list) or not value:
        raise HeadcountError(f"mask '{what}' must be a non-empty list of 0/1, got {_json(value)}")
    if len(value) > MAX_SIZE:
        raise HeadcountError(f"mask '{what}' has {len(value)} entries; at most {MAX_SIZE}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v not in (0, 1):
            raise HeadcountError(f"mask '{what}[{i}]' must be 0 or 1, got {_json(v)}")
    return [int(v) for v in value]


def _grid(value, what: str) -> list[list[int]]:
    """``[n_layers][n_heads]`` 0/1 numbers, every row as long."""
    if not isinstance(value, list) or not value:
        raise HeadcountError(f"mask '{what}' must be a non-empty [n_layers][n_heads] list of 0/1, got {_json(value)}")
    if len(value) > MAX_SIZE:
        raise HeadcountError(f"mask '{what}' has {len(value)} layers; at most {MAX_SIZE}")
    rows = [_flags(row, f"{what}[{i}]") for i, row in enumerate(value)]
    if len({len(r) for r in rows}) > 1:
        raise HeadcountError(f"mask '{what}' rows differ in length ({', '.join(str(len(r)) for r in rows[:8])}{', ...' if len(rows) > 8 else ''}): "
                             "every layer needs one entry per head")
    return rows


@dataclass(frozen=True)
class Mask:
    """Kept (1) / removed (0) heads ``[n_layers, n_heads]`` and MLPs ``[n_layers]``.

    >>> m = Mask.full(6, 12).without_heads([(0, 3), (5, 11)])
    >>> m.n_heads_kept
    142
    """

    heads: torch.Tensor  # [n_layers, n_heads], float 0/1
    mlps: torch.Tensor  # [n_layers], float 0/1
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        heads = torch.as_tensor(self.heads, dtype=torch.float32)
        mlps = torch.as_tensor(self.mlps, dtype=torch.float32)
        if heads.dim() != 2:
            raise HeadcountError(f"mask heads must be a [n_layers][n_heads] list, got shape {list(heads.shape)}")
        if mlps.dim() != 1 or mlps.shape[0] != heads.shape[0]:
            raise HeadcountError(f"mask mlps must have one entry per layer ({heads.shape[0]}), got shape {list(mlps.shape)}")
        if not bool(((heads == 0) | (heads == 1)).all() and ((mlps == 0) | (mlps == 1)).all()):
            raise HeadcountError("mask values must be 0 or 1")
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "mlps", mlps)

    # -- construction --------------------------------------------------------------------
    @classmethod
    def full(cls, n_layers: int, n_heads: int, **meta) -> "Mask":
        return cls(torch.ones(n_layers, n_heads), torch.ones(n_layers), dict(meta))

    @classmethod
    def for_model(cls, model) -> "Mask":
        return cls.full(*layout(model))

    def without_heads(self, heads) -> "Mask":
        h = self.heads.clone()
        for layer, head in heads:
            h[layer, head] = 0
        return Mask(h, self.mlps.clone(), dict(self.meta))

    def without_mlps(self, layers) -> "Mask":
        m = self.mlps.clone()
        for layer in layers:
            m[layer] = 0
        return Mask(self.heads.clone(), m, dict(self.meta))

    def with_meta(self, **meta) -> "Mask":
        return Mask(self.heads, self.mlps, {**self.meta, **meta})

    # -- properties -----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.heads.shape)

    @property
    def n_heads_kept(self) -> int:
        return int(self.heads.sum())

    @property
    def n_mlps_kept(self) -> int:
        return int(self.mlps.sum())

    def check_model(self, model) -> "Mask":
        """Raise a one-line error unless this mask fits ``model``'s gate grid."""
        n_layers, n_heads = layout(model)
        if self.shape != (n_layers, n_heads):
            raise HeadcountError(
                f"mask is for {self.shape[0]} layers x {self.shape[1]} heads, the model has {n_layers} x {n_heads}"
            )
        return self

    def __eq__(self, other) -> bool:
        return isinstance(other, Mask) and torch.equal(self.heads, other.heads) and torch.equal(self.mlps, other.mlps)

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "heads": [[int(v) for v in row] for row in self.heads.tolist()],
            "mlps": [int(v) for v in self.mlps.tolist()],
            "n_heads_kept": self.n_heads_kept,
            "n_mlps_kept": self.n_mlps_kept,
            **self.meta,
        }

    def save(self, path) -> Path:
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "Mask":
        """A mask from its JSON form; every field is checked (one line naming the field and what
        is wrong), so no value reaches torch that it cannot hold."""
        if not isinstance(d, dict) or ("heads" not in d and "shared_heads" not in d):
            raise HeadcountError("a mask needs a 'heads' (or 'shared_heads') entry")
        meta = {k: v for k, v in d.items() if k not in ("heads", "mlps", "shared_heads", "n_heads_kept", "n_mlps_kept")}
        shared = _flags(d["shared_heads"], "shared_heads") if "shared_heads" in d else None
        mlps = _flags(d["mlps"], "mlps") if "mlps" in d else None
        given = _count(d["n_layers"], "n_layers") if "n_layers" in d else None
        if "heads" in d:
            heads = _grid(d["heads"], "heads")
            if given is not None and given != len(heads):
                raise HeadcountError(f"mask 'n_layers' is {given}, 'heads' has {len(heads)} layers")
        else:
            n_layers = given if given is not None else len(mlps) if mlps is not None else None
            if n_layers is None:
                raise HeadcountError("a mask with only 'shared_heads' needs 'mlps' or 'n_layers'")
            heads = [list(shared)] * n_layers
        if shared is not None and len(shared) != len(heads[0]):
            raise HeadcountError(f"mask 'shared_heads' has {len(shared)} entries, 'heads' {len(heads[0])} per layer")
        t = torch.tensor(heads, dtype=torch.float32)
        if shared is not None and "heads" in d:
            t = t * torch.tensor(shared, dtype=torch.float32).unsqueeze(0)
        return cls(t, torch.tensor(mlps, dtype=torch.float32) if mlps is not None else torch.ones(t.shape[0]), meta)

    @classmethod
    def load(cls, path) -> "Mask":
        path = Path(path)
        if not path.is_file():
            raise HeadcountError(f"mask file not found: {path}")
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HeadcountError(f"mask file {path} is not JSON: {e}") from None
        return cls.from_dict(d)
