"""The Mask value object: which heads and MLPs are kept (1) or removed (0), with JSON I/O.

``mask.json``: ``{"heads": [[0|1]*n_heads]*n_layers, "mlps": [0|1]*n_layers, ...metadata}``.
For a shared-layer model (ALBERT) ``"shared_heads": [0|1]*n_heads`` may stand instead of (or
beside) ``heads``: a shared head that is 0 is removed at every depth.

Decoders with grouped-query attention have two levels of units: query heads (``heads``, as
above) and key/value groups (one K/V head and the ``n_heads / n_kv`` query heads that read it).
A decoder's mask also states ``"kv_groups": [[0|1]*n_kv]*n_layers`` (derived: a group is gone
when all its query heads are) and may be *given* that way: ``kv_groups`` alone (with
``"n_heads"``) removes every query head of a 0 group; beside ``heads`` the two multiply. Encoder
masks have no ``kv_groups`` and are written exactly as before.
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
from headcount.runtime.jsonfile import parse_json


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
    70
    """

    heads: torch.Tensor  # [n_layers, n_heads], float 0/1
    mlps: torch.Tensor  # [n_layers], float 0/1
    meta: dict = field(default_factory=dict, compare=False)
    #: key/value heads per layer when the mask states KV groups (a grouped-query decoder); None: it does not
    n_kv_heads: int | None = field(default=None, compare=False)

    def __post_init__(self):
        heads = torch.as_tensor(self.heads, dtype=torch.float32)
        mlps = torch.as_tensor(self.mlps, dtype=torch.float32)
        if heads.dim() != 2:
            raise HeadcountError(f"mask heads must be a [n_layers][n_heads] list, got shape {list(heads.shape)}")
        if mlps.dim() != 1 or mlps.shape[0] != heads.shape[0]:
            raise HeadcountError(f"mask mlps must have one entry per layer ({heads.shape[0]}), got shape {list(mlps.shape)}")
        if not bool(((heads == 0) | (heads == 1)).all() and ((mlps == 0) | (mlps == 1)).all()):
            raise HeadcountError("mask values must be 0 or 1")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or heads.shape[1] % self.n_kv_heads):
            raise HeadcountError(f"mask kv_groups: {heads.shape[1]} query heads do not split into "
                                 f"{self.n_kv_heads} key/value groups")
        object.__setattr__(self, "heads", heads)
        object.__setattr__(self, "mlps", mlps)

    # -- construction --------------------------------------------------------------------
    @classmethod
    def full(cls, n_layers: int, n_heads: int, **meta) -> "Mask":
        return cls(torch.ones(n_layers, n_heads), torch.ones(n_layers), dict(meta))

    @classmethod
    def for_model(cls, model) -> "Mask":
        """Everything kept; a decoder with grouped-query attention gets the KV-group level too."""
        grid = layout(model)
        mask = cls.full(*grid)
        if grid.n_kv_heads is not None and grid.n_kv_heads < grid.n_heads:
            mask = Mask(mask.heads, mask.mlps, {}, n_kv_heads=grid.n_kv_heads)
        return mask

    def without_heads(self, heads) -> "Mask":
        h = self.heads.clone()
        for layer, head in heads:
            h[layer, head] = 0
        return Mask(h, self.mlps.clone(), dict(self.meta), self.n_kv_heads)

    def without_kv_groups(self, groups) -> "Mask":
        """Remove whole key/value groups ``[(layer, group)]``: every query head that reads them.

        >>> Mask.full(2, 4).with_kv_heads(2).without_kv_groups([(0, 1)]).heads[0].tolist()
        [1.0, 1.0, 0.0, 0.0]
        """
        if self.n_kv_heads is None:
            raise HeadcountError("this mask has no key/value groups (an encoder's, or a decoder's without "
                                 "grouped-query attention)")
        size = self.heads.shape[1] // self.n_kv_heads
        return self.without_heads([(layer, g * size + i) for layer, g in groups for i in range(size)])

    def with_kv_heads(self, n_kv_heads: int | None) -> "Mask":
        """The same mask, stating ``n_kv_heads`` key/value groups per layer (None: none)."""
        return Mask(self.heads, self.mlps, dict(self.meta), n_kv_heads)

    def without_mlps(self, layers) -> "Mask":
        m = self.mlps.clone()
        for layer in layers:
            m[layer] = 0
        return Mask(self.heads.clone(), m, dict(self.meta), self.n_kv_heads)

    def with_meta(self, **meta) -> "Mask":
        return Mask(self.heads, self.mlps, {**self.meta, **meta}, self.n_kv_heads)

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

    @property
    def kv_groups(self) -> torch.Tensor | None:
        """``[n_layers, n_kv]``: 1 where a key/value group keeps a query head, 0 where all of its
        query heads are gone (surgery then removes its K/V rows); None without KV groups."""
        if self.n_kv_heads is None:
            return None
        return self.heads.view(self.heads.shape[0], self.n_kv_heads, -1).amax(dim=-1)

    def check_model(self, model) -> "Mask":
        """Raise a one-line error unless this mask fits ``model``'s gate grid (and, when it states
        key/value groups, the model's grouped-query attention)."""
        grid = layout(model)
        n_layers, n_heads = grid
        if self.shape != (n_layers, n_heads):
            raise HeadcountError(
                f"mask is for {self.shape[0]} layers x {self.shape[1]} heads, the model has {n_layers} x {n_heads}"
            )
        if self.n_kv_heads is None:
            return self
        if grid.n_kv_heads is None:
            raise HeadcountError("the mask gives key/value groups (kv_groups), but this model is an encoder: its "
                                 "heads have no key/value groups; give the mask as 'heads'")
        if grid.n_kv_heads == n_heads:
            raise HeadcountError(f"the mask gives key/value groups (kv_groups), but this model has no grouped-query "
                                 f"attention ({n_heads} query heads, {n_heads} key/value heads): a KV group is a "
                                 "single head here, so give the mask as 'heads'")
        if self.n_kv_heads != grid.n_kv_heads:
            raise HeadcountError(f"the mask gives {self.n_kv_heads} key/value groups per layer, the model has "
                                 f"{grid.n_kv_heads}")
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
            **self._kv_dict(),
            **self.meta,
        }

    def _kv_dict(self) -> dict:
        kv = self.kv_groups
        if kv is None:  # encoders: the format is unchanged
            return {}
        return {"kv_groups": [[int(v) for v in row] for row in kv.tolist()], "n_kv_groups_kept": int(kv.sum())}

    def save(self, path) -> Path:
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "Mask":
        """A mask from its JSON form; every field is checked (one line naming the field and what
        is wrong), so no value reaches torch that it cannot hold. A decoder's mask may state
        ``kv_groups`` (with ``n_heads`` when it has no ``heads``): a dropped group drops its query heads."""
        if not isinstance(d, dict) or ("heads" not in d and "shared_heads" not in d and "kv_groups" not in d):
            raise HeadcountError("a mask needs a 'heads' (or 'shared_heads', or 'kv_groups') entry")
        derived = ("kv_groups", "n_kv_groups_kept", "n_heads") if "kv_groups" in d else ()
        meta = {k: v for k, v in d.items()
                if k not in ("heads", "mlps", "shared_heads", "n_heads_kept", "n_mlps_kept", *derived)}
        shared = _flags(d["shared_heads"], "shared_heads") if "shared_heads" in d else None
        mlps = _flags(d["mlps"], "mlps") if "mlps" in d else None
        given = _count(d["n_layers"], "n_layers") if "n_layers" in d else None
        kv, n_kv = _kv_groups(d)
        if "heads" in d:
            heads = _grid(d["heads"], "heads")
            if given is not None and given != len(heads):
                raise HeadcountError(f"mask 'n_layers' is {given}, 'heads' has {len(heads)} layers")
        elif "shared_heads" in d:
            n_layers = given if given is not None else len(mlps) if mlps is not None else None
            if n_layers is None:
                raise HeadcountError("a mask with only 'shared_heads' needs 'mlps' or 'n_layers'")
            heads = [list(shared)] * n_layers
        else:  # only kv_groups: each group's flag repeated over its query heads
            if "n_heads" not in d:
                raise HeadcountError("a mask with only 'kv_groups' needs 'n_heads' (query heads per layer)")
            n_heads = _count(d["n_heads"], "n_heads")
            if n_heads % n_kv:
                raise HeadcountError(f"mask kv_groups: {n_heads} query heads do not split into {n_kv} "
                                     "key/value groups")
            heads = kv.repeat_interleave(n_heads // n_kv, dim=1).int().tolist()
        if shared is not None and len(shared) != len(heads[0]):
            raise HeadcountError(f"mask 'shared_heads' has {len(shared)} entries, 'heads' {len(heads[0])} per layer")
        t = torch.tensor(heads, dtype=torch.float32)
        if shared is not None and "heads" in d:
            t = t * torch.tensor(shared, dtype=torch.float32).unsqueeze(0)
        if kv is not None and ("heads" in d or "shared_heads" in d):  # both given: they multiply
            if kv.shape[0] != t.shape[0] or t.shape[1] % n_kv:
                raise HeadcountError(f"mask kv_groups has shape {list(kv.shape)}, which does not fit heads "
                                     f"{list(t.shape)} (one row per layer, query heads split evenly)")
            t = t * kv.repeat_interleave(t.shape[1] // n_kv, dim=1)
        return cls(t, torch.tensor(mlps, dtype=torch.float32) if mlps is not None else torch.ones(t.shape[0]),
                   meta, n_kv)

    @classmethod
    def load(cls, path) -> "Mask":
        path = Path(path)
        if not path.is_file():
            raise HeadcountError(f"mask file not found: {path}")
        try:
            d = parse_json(path.read_text(encoding="utf-8"), f"mask file {path}")  # huge integers, deep nesting: one line
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HeadcountError(f"mask file {path} is not JSON: {e}") from None
        return cls.from_dict(d)


def _kv_groups(d: dict) -> tuple[torch.Tensor | None, int | None]:
    """The ``kv_groups`` entry of a mask dict: ``([n_layers, n_kv] 0/1, n_kv)``, or ``(None, None)``."""
    if "kv_groups" not in d:
        return None, None
    kv = torch.tensor(_grid(d["kv_groups"], "kv_groups"), dtype=torch.float32)
    return kv, int(kv.shape[1])
