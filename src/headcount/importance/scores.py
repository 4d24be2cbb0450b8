"""The Scores value and the options of scoring, each checked once.

[`Scores`][headcount.importance.scores.Scores]: head importance ``[n_layers, n_heads]`` and MLP importance ``[n_layers]`` of one
model for one objective (+ optional per-example rows ``[n_examples, n_layers, n_heads]``), with
JSON I/O; [`normalize_scores`][headcount.importance.scores.normalize_scores] (Prasanna et al.'s per-layer L2 then global min-max); the
accumulation, normalisation and batch-order options (``ACCUMULATE``, ``NORMALIZE``,
``BATCH_ORDERS``) with their checks; [`kv_pool`][headcount.importance.scores.kv_pool], the one
rule set that makes a key/value head's score from its query heads' (``KV_POOLING``: ``sum`` for
pruning whole groups, ``max`` for KV budgets, ``max`` or ``mean`` for the long-range scorer), and
[`score_grid`][headcount.importance.scores.score_grid], the checked reading of a JSON grid of
scores. The scorers that compute scores are in [`scoring`][headcount.importance.scoring].
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from headcount.importance.scorers import Scorer, get_scorer
from headcount.runtime.atomic import atomic_write_json
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import read_json

NORMALIZE = ("none", "layer", "layer+global")
#: how the ``gradient`` method sums over batches: ``per-batch`` = sum_b |g_b|; ``cumulative`` =
#: sum_b |sum_{b' <= b} g_b'| (run_bertology, Prasanna et al.: the gate gradient is never zeroed)
ACCUMULATE = ("per-batch", "cumulative")
#: the library's default (the CLI and the study configs read it from here)
DEFAULT_ACCUMULATE = "per-batch"
#: the order of the importance batches: ``file`` = the examples in the split's order, fixed-size
#: batches (run_bertology's and Prasanna et al.'s ``SequentialSampler``); ``length`` = grouped by
#: length, longest first (less padding); ``auto`` = ``file`` for ``cumulative`` (its running
#: gradient depends on which examples share a batch and on the batches' order, so only the
#: reference's order gives the reference's scores), ``length`` otherwise (``per-batch`` is
#: headcount's own accumulation: no reference order to follow)
BATCH_ORDERS = ("auto", "length", "file")
#: how a key/value head's score is made from its query heads' ([`kv_pool`][headcount.importance.scores.kv_pool])
KV_POOLING = ("sum", "max", "mean")


def check_batch_order(order: str) -> str:
    if order not in BATCH_ORDERS:
        raise HeadcountError(f"unknown batch order {order!r}; choose one of {', '.join(BATCH_ORDERS)}")
    return order


def groups_by_length(order: str, accumulate: str) -> bool:
    """Whether importance batches are grouped by length (``order`` ``auto`` resolved by ``accumulate``).

    >>> groups_by_length("auto", "cumulative"), groups_by_length("auto", "per-batch")
    (False, True)
    """
    check_batch_order(order)
    return order == "length" or (order == "auto" and accumulate != "cumulative")


def check_normalize(mode: str) -> str:
    """``mode`` if it is one of ``NORMALIZE``, else a one-line error (the one check of it)."""
    if mode not in NORMALIZE:
        raise HeadcountError(f"unknown normalisation {mode!r}; choose one of {', '.join(NORMALIZE)}")
    return mode


@dataclass(frozen=True)
class Scores:
    """Importance scores of one model for one objective.

    Attributes:
        heads: ``[n_layers, n_heads]``.
        mlps: ``[n_layers]``.
        per_example: optional ``[n_examples, n_layers, n_heads]`` head contributions (gradient
            methods): each example's |dL_b/dg_example|, its share of its batch's score. For
            ``gradient-token`` the rows sum exactly to ``heads``; for ``gradient`` per-batch (the
            absolute value of a batch sum) to an upper bound; for ``cumulative`` they are still
            each example's share of its own batch's gradient (a running sum has no per-example
            decomposition). Used for bootstrap statistics.
        per_example_signed: ``gradient`` only (with ``per_example``): ``[n_examples, n_layers,
            n_heads]`` each example's *signed* part of its batch's gradient (a batch's rows sum to
            its gradient), with ``example_batches`` ``[n_examples]`` (the batch of each row, as
            given, in order) and ``example_labels`` ``[n_examples]`` (each example's label entries:
            its batch's mean loss divides by their sum). What rebuilding the estimator on a
            resample takes (``headcount.analysis.batched.BatchedRows``): a bootstrap of the
            absolute rows is one of a proxy, far narrower than the estimator's own spread.
        attention: optional ``[n_layers]`` whole-attention-block importance (``gradient`` where the
            adapter declares a norm after the attention block: the attention gate's, accumulated as
            the MLPs'); ``scores.json``'s ``attention``, absent in files without it.
    """

    heads: torch.Tensor
    mlps: torch.Tensor
    method: str = "gradient"
    normalize: str = "none"
    n_examples: int = 0
    n_tokens: int = 0
    meta: dict = field(default_factory=dict)
    per_example: torch.Tensor | None = None
    per_example_signed: torch.Tensor | None = None
    example_batches: torch.Tensor | None = None
    example_labels: torch.Tensor | None = None
    attention: torch.Tensor | None = None

    def normalized(self, mode: str) -> "Scores":
        heads, mlps = normalize_scores(self.heads, self.mlps, mode)
        attention = self.attention
        if attention is not None:  # one score per layer, as the MLPs: min-max under layer+global
            _, attention = normalize_scores(self.heads, attention, mode)
        return replace(self, heads=heads, mlps=mlps, attention=attention, normalize=mode)

    def to_dict(self) -> dict:
        return {
            "heads": self.heads.tolist(),
            "mlps": self.mlps.tolist(),
            **({"attention": self.attention.tolist()} if self.attention is not None else {}),
            "method": self.method,
            "normalize": self.normalize,
            "n_examples": int(self.n_examples),
            "n_tokens": int(self.n_tokens),
            **self.meta,
        }

    def save(self, path) -> Path:
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, d: dict, dtype: torch.dtype = torch.float32) -> "Scores":
        """Scores from their JSON form: ``heads`` checked ([`score_grid`][headcount.importance.scores.score_grid]:
        one line for a grid that is not one; null reads as NaN). ``dtype``: float64 keeps the
        file's numbers exactly (a KV budget writes the scores it ranked by back as they were)."""
        known = {"heads", "mlps", "attention", "method", "normalize", "n_examples", "n_tokens"}
        return cls(
            heads=score_grid(d["heads"], "heads", dtype=dtype),
            mlps=torch.tensor(d.get("mlps") or [0.0] * len(d["heads"]), dtype=dtype),
            attention=(torch.tensor([math.nan if v is None else v for v in d["attention"]], dtype=dtype)
                       if d.get("attention") is not None else None),  # optional: older files have none
            method=d.get("method", "gradient"),
            normalize=d.get("normalize", "none"),
            n_examples=int(d.get("n_examples", 0)),
            n_tokens=int(d.get("n_tokens", 0)),
            meta={k: v for k, v in d.items() if k not in known},
        )

    @classmethod
    def load(cls, path, dtype: torch.dtype = torch.float32) -> "Scores":
        d = read_json(path, "scores file", kind=dict)
        try:
            return cls.from_dict(d, dtype)
        except KeyError as e:
            raise HeadcountError(f"scores file {path} has no {e}: not a scores file") from None
        except HeadcountError as e:  # a malformed grid: the line names the file
            raise HeadcountError(f"scores file {path}: {e}") from None


def _number(value, what: str) -> float:
    """One score: a number, or null (NaN: a head that is gone, or a score that is undefined)."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HeadcountError(f"scores '{what}' must be a number, got {json.dumps(value)[:40]}")
    return float(value)


def score_grid(value, what: str, shape: tuple[int, int] | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A ``[rows][cols]`` JSON grid of scores as a tensor, checked: every row a non-empty list of
    the same length (``shape``: of ``shape[0]`` rows, the model's layers, of ``shape[1]`` heads),
    every entry a number or null (NaN).

    >>> score_grid([[0.5, None]], "heads").tolist()
    [[0.5, nan]]
    >>> score_grid([[1, 2]], "kv_groups", shape=(2, 2))
    Traceback (most recent call last):
    headcount.runtime.errors.HeadcountError: scores 'kv_groups' must have 2 rows (the model's layers), got 1 rows
    """
    rows = shape[0] if shape is not None else None
    if not isinstance(value, list) or not value or (rows is not None and len(value) != rows):
        got = f"{len(value)} rows" if isinstance(value, list) else type(value).__name__
        raise HeadcountError(f"scores '{what}' must have {rows or 'some'} rows (the model's layers), got {got}")
    cols = shape[1] if shape is not None else len(value[0]) if isinstance(value[0], list) else None
    for i, row in enumerate(value):
        if not isinstance(row, list) or not row or len(row) != cols:
            got = f"{len(row)} entries" if isinstance(row, list) else type(row).__name__
            raise HeadcountError(f"scores '{what}[{i}]' must list {cols} heads, got {got}")
    return torch.tensor([[_number(v, f"{what}[{i}][{j}]") for j, v in enumerate(row)] for i, row in enumerate(value)],
                        dtype=dtype)


def kv_pool(scores: "Scores | torch.Tensor", n_kv: int, rule: str = "max") -> torch.Tensor:
    """Each key/value head's score from its query heads', ``heads [L, H] -> [L, n_kv]`` (query head
    h reads KV head ``h // (H / n_kv)``), in the dtype of ``heads``. Heads that are gone (NaN) are
    left out; a group of NaN only is NaN. The rules (``KV_POOLING``):

    - ``sum``: what removing the group removes (``headcount prune --unit kv-groups``; for gate
      gradients the sum of the heads' absolute gradients). With one KV head per layer and a
      ``Scores`` whose scorer gives ``attention [L]`` (gradients behind a norm after the attention
      block, where the heads' gradients sum to ~0 by scale invariance), the group *is* the
      layer's attention and its score the attention block's;
    - ``max``: the neediest query head (KV budgets: streaming a KV head cuts every query head that
      reads it; the long-range scorer's default);
    - ``mean``: the group's mean (the long-range scorer's ``kv_reduce mean``).

    ``scores``: a [`Scores`][headcount.importance.scores.Scores] or its ``heads`` tensor.

    >>> kv_pool(torch.tensor([[1., 2., 3., float("nan")]]), 2, "sum").tolist()
    [[3.0, 3.0]]
    >>> kv_pool(torch.tensor([[0.1, 0.5, 0.2, float("nan")]]), 2).tolist()
    [[0.5, 0.20000000298023224]]
    >>> kv_pool(Scores(torch.tensor([[1., 2.]]), torch.zeros(1), attention=torch.tensor([0.5])), 1, "sum").tolist()
    [[0.5]]
    """
    if rule not in KV_POOLING:
        raise HeadcountError(f"unknown KV pooling {rule!r}; choose one of {', '.join(KV_POOLING)}")
    # a Scores (or what has its fields), or the heads themselves
    heads: torch.Tensor = scores.heads if isinstance(scores, Scores) else getattr(scores, "heads", scores)
    attention: torch.Tensor | None = getattr(scores, "attention", None)
    if rule == "sum" and attention is not None and n_kv == 1:  # the whole attention block: [L] -> [L, 1]
        gone = torch.isnan(heads).all(-1, keepdim=True)  # a layer with no head left
        return attention.reshape(-1, 1).float().masked_fill(gone, float("nan"))
    grouped = heads.reshape(heads.shape[0], n_kv, -1)  # [L, n_kv, heads per group]
    empty = torch.isnan(grouped).all(-1)  # [L, n_kv]
    if rule == "sum":
        out = torch.nan_to_num(grouped, nan=0.0).sum(-1)
    elif rule == "max":
        out = torch.nan_to_num(grouped, nan=-torch.inf).max(-1).values
    else:
        out = torch.nanmean(grouped, -1)
    return out.masked_fill(empty, float("nan"))


def normalize_scores(heads: torch.Tensor, mlps: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``none``; ``layer``: each layer's head scores divided by their L2 norm; ``layer+global``:
    then min-max over all heads to [0, 1] (MLPs: min-max over layers), as Prasanna et al.

    >>> h, m = normalize_scores(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0]), "layer")
    >>> h.tolist()
    [[0.6000000238418579, 0.800000011920929]]
    """
    check_normalize(mode)
    heads, mlps = heads.clone().float(), mlps.clone().float()
    if mode == "none":
        return heads, mlps
    finite = torch.nan_to_num(heads, nan=0.0)
    norm = finite.pow(2).sum(-1, keepdim=True).sqrt()  # [n_layers, 1]
    heads = heads / (norm + 1e-20)
    if mode == "layer+global":
        heads = _minmax(heads)
        mlps = _minmax(mlps)
    return heads, mlps


def _minmax(x: torch.Tensor) -> torch.Tensor:
    ok = torch.isfinite(x)
    if not ok.any():
        return x
    lo, hi = x[ok].min(), x[ok].max()
    return (x - lo) / (hi - lo) if hi > lo else torch.zeros_like(x)


def check_accumulate(accumulate: str, method: str | Scorer = "gradient") -> None:
    """Refuse an unknown accumulation, and ``cumulative`` for methods it does not define
    (``gradient-token`` sums per-token absolute values: it has no running batch gradient).
    ``method``: a scorer's name, or the [`Scorer`][headcount.importance.scorers.Scorer] itself."""
    if accumulate not in ACCUMULATE:
        raise HeadcountError(f"unknown accumulation {accumulate!r}; choose one of {', '.join(ACCUMULATE)}")
    scorer = method if isinstance(method, Scorer) else get_scorer(method)
    if accumulate != DEFAULT_ACCUMULATE and accumulate not in scorer.accumulations:
        raise HeadcountError(f"accumulate {accumulate!r} is defined for the gradient method only, not {scorer.name!r}")
