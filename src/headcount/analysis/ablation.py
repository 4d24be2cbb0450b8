"""The causal test of a head ranking: gate the top-k heads off, gate k random heads off, compare.

A retrieval score ranks heads by how often they copy the needle; Wu et al. (arXiv 2404.15574)
show that masking the top heads breaks needle retrieval while masking random heads does not. This
module runs that test on any ranking and says how sure it is:

- ``k`` = ``max(1, round(fraction * units))`` units, the units being query heads or, for a ranking
  of key/value heads (``unit="kv-groups"``), whole KV groups (every query head that reads the KV
  head is gated);
- needle accuracy (the answer verbatim in the greedy continuation) on the same held-out examples
  for the full model, with the top-k gated off, and with ``draws`` random k-sets gated off (each
  drawn uniformly from all units with its own seed);
- a paired sign-flip test over examples of "random minus top" (each example's mean success over
  the random draws minus its success with the top-k gone; H1: gating the top-k hurts more).

Gates multiply each head's output by 0 (exactly what removing the head does; see
[`headcount.core.gates`][headcount.core.gates]); generation is the retrieval scorer's
([`headcount.importance.retrieval.retrieval_scores`][headcount.importance.retrieval.retrieval_scores]),
so the accuracy is the one the scores come with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from headcount.analysis.correlation import top_k_mask
from headcount.analysis.paired import paired_sign_flip_test
from headcount.core.gates import gated, layout
from headcount.runtime.errors import HeadcountError

UNITS = ("heads", "kv-groups")


@dataclass(frozen=True)
class AblationResult:
    """What [`ablation_test`][headcount.analysis.ablation.ablation_test] found.

    Attributes:
        unit: ``heads`` or ``kv-groups``.
        k: units gated off in each condition; ``n_units``: how many there are.
        fraction: the fraction asked for.
        accuracy_full / accuracy_top: needle accuracy of the full model and with the top-k gone.
        accuracy_random: one accuracy per random draw; ``accuracy_random_mean`` their mean.
        top: the top-k units as ``[layer, index]`` pairs.
        difference: mean over examples of (mean random success - top success).
        p_value: the paired sign-flip test's p (H1: the difference is > 0); ``n_examples`` pairs.
        per_example: ``{"full", "top", "random"}`` successes (0/1; ``random`` ``[draws][examples]``).
    """

    unit: str
    k: int
    n_units: int
    fraction: float
    accuracy_full: float
    accuracy_top: float
    accuracy_random: list[float]
    accuracy_random_mean: float
    top: list[list[int]]
    difference: float
    p_value: float
    n_examples: int
    per_example: dict

    def to_dict(self) -> dict:
        return asdict(self)


def _successes(model, batches, heads: torch.Tensor | None, score_fn, **kwargs) -> np.ndarray:
    """Each example's needle success (answer verbatim) with ``heads`` ``[L, H]`` as gates (None: none)."""
    if heads is None:
        s = score_fn(model, batches, **kwargs)
    else:
        with gated(model, heads=heads):
            s = score_fn(model, batches, **kwargs)
    return np.array([bool(r["exact"]) for r in s.meta["retrieval"]["examples"]], dtype=np.float64)


def _unit_gates(chosen: np.ndarray, n_heads: int, unit: str) -> torch.Tensor:
    """Gates ``[L, H]`` with the chosen units off: ``chosen`` ``[L, units per layer]`` booleans; a
    chosen KV group gates its ``H / n_kv`` query heads (query head i reads KV head ``i // group``)."""
    if unit == "kv-groups":
        group = n_heads // chosen.shape[1]
        chosen = np.repeat(chosen, group, axis=1)
    return torch.as_tensor(~chosen, dtype=torch.float32)


def ablation_test(model, batches, scores, *, fraction: float = 0.05, draws: int = 5, seed: int = 0,
                  unit: str = "heads", n_resamples: int = 100_000, **score_kwargs) -> AblationResult:
    """Gate the top ``fraction`` of units by ``scores`` vs ``draws`` random sets of as many.

    Args:
        model: a decoder with its language-model head (no gates of the caller's active).
        batches: held-out needle-in-a-haystack batches
            ([`niah_batches`][headcount.data.tasks.niah.niah_batches]); the same for every condition.
        scores: ``[L, H]`` per query head (``unit="heads"``) or ``[L, n_kv]`` per KV head
            (``unit="kv-groups"``); higher = gated first. NaN units are never chosen.
        fraction: in (0, 1]: the share of units gated off.
        draws: random sets (each its own seed ``[seed, d]``).
        unit: ``heads`` or ``kv-groups``.
        score_kwargs: passed to the retrieval scorer (``max_new_tokens``, ``rt``, ``progress``).

    Raises:
        HeadcountError: an unknown unit, a grid that does not fit the model, ``draws`` < 1.
    """
    from headcount.importance.retrieval import retrieval_scores

    if unit not in UNITS:
        raise HeadcountError(f"unknown unit {unit!r}; choose one of {', '.join(UNITS)}")
    if draws < 1:
        raise HeadcountError(f"draws must be >= 1, got {draws}")
    lay = layout(model)
    grid = np.asarray(torch.as_tensor(scores, dtype=torch.float64))
    per_layer = lay.n_heads if unit == "heads" else (lay.n_kv_heads or 0)
    if grid.shape != (lay.n_layers, per_layer) or per_layer == 0:
        raise HeadcountError(f"a {unit} ranking of this model is [{lay.n_layers}, {per_layer or 'n_kv'}], "
                             f"got {list(grid.shape)}")
    top = top_k_mask(grid, fraction)
    k = int(top.sum())
    finite = np.isfinite(grid).ravel()
    full = _successes(model, batches, None, retrieval_scores, **score_kwargs)
    with_top = _successes(model, batches, _unit_gates(top, lay.n_heads, unit), retrieval_scores, **score_kwargs)
    random_rows = []
    for d in range(draws):
        pick = np.zeros(grid.size, dtype=bool)
        pick[np.random.default_rng([seed, d]).choice(np.flatnonzero(finite), size=k, replace=False)] = True
        random_rows.append(_successes(model, batches, _unit_gates(pick.reshape(grid.shape), lay.n_heads, unit),
                                      retrieval_scores, **score_kwargs))
    rand = np.stack(random_rows)  # [draws, examples]
    test = paired_sign_flip_test(rand.mean(0), with_top, alternative="greater", n_resamples=n_resamples, seed=seed)
    return AblationResult(
        unit=unit, k=k, n_units=int(finite.sum()), fraction=float(fraction),
        accuracy_full=float(full.mean()), accuracy_top=float(with_top.mean()),
        accuracy_random=[float(r.mean()) for r in rand], accuracy_random_mean=float(rand.mean()),
        top=[[int(a), int(b)] for a, b in zip(*np.nonzero(top))],
        difference=float((rand.mean(0) - with_top).mean()), p_value=float(test.p_value), n_examples=int(full.size),
        per_example={"full": full.astype(int).tolist(), "top": with_top.astype(int).tolist(),
                     "random": rand.astype(int).tolist()})
