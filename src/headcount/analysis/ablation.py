"""The causal test of a head ranking: gate the top-k heads off, gate random k-sets off, compare sets.

A retrieval score ranks heads by how often they copy the needle; Wu et al. (arXiv 2404.15574)
show that masking the top heads breaks needle retrieval while masking random heads does not. This
module runs that test on any ranking and says how sure it is:

- ``k`` = ``max(1, round(fraction * units))`` units, the units being query heads or, for a ranking
  of key/value heads (``unit="kv-groups"``), whole KV groups (every query head that reads the KV
  head is gated);
- needle accuracy (the answer verbatim in the greedy continuation) on the same held-out examples
  for the full model, with the top-k gone, and with each of ``draws`` = K random k-sets gone,
  every set drawn from the units *outside* the top set (its own seed ``[seed, d]``);
- the test compares head sets, since the variation that matters is between them (one random set
  can be devastating, most harmless): under the null the top set is one more draw from the same
  distribution of harm, so its rank among the K + 1 sets is uniform and
  p = (1 + #{random sets at least as harmful: accuracy <= the top set's}) / (1 + K)
  ([`head_set_p_value`][headcount.analysis.ablation.head_set_p_value]); the smallest p is
  1 / (1 + K): K >= 19 to reach 0.05. Each set's accuracy is reported with it;
- described, not tested: the mean over examples of (mean random success - top success) and a
  sign-flip test over examples of it (``p_value_prompts``). With a few random sets shared by
  every example, that test's "random" is those sets' mean, so it cannot tell "the top set is
  devastating" from "one random set was mild": under a null with devastating random sets among
  harmless ones (``tests/analysis/test_ablation_sets.py``) it rejected at 0.05 in 27% of runs,
  the head-set test in 1.5%;
- Wu et al.'s protocol, reported as theirs (``accuracy_random_theirs``): a fresh random set for
  every example (their ``construct_random_head`` per needle), drawn from the units outside the
  top set (their pool leaves out their top 100 heads of 1,024), the accuracy over examples.

Masking (``mask``), the same for every set:

- ``remove`` (default): the head's output is zeroed in prefill and decoding, what removing the
  head does (gates, [`headcount.core.gates`][headcount.core.gates]) and what pruning and the KV
  budgets act on: "does the model need these heads";
- ``reference``: Wu et al.'s rule (``needle_in_haystack_with_mask.py`` @3ac171a and their patched
  attention): the prompt is prefilled with every head, and in each decoding forward the blocked
  heads' queries are zero, so their attention is uniform over the cache and they output the mean
  of its values ([`query_blocked`][headcount.analysis.ablation.query_blocked]). A weaker cut: the
  head still shaped the cache in prefill and still writes the mean of V while decoding.

Generation is the retrieval scorer's
([`headcount.importance.retrieval.retrieval_scores`][headcount.importance.retrieval.retrieval_scores]),
so the accuracy is the one the scores come with.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import numpy as np
import torch

from headcount.analysis.correlation import top_k_mask
from headcount.analysis.paired import paired_sign_flip_test
from headcount.core.arch import get_adapter, require_decoder
from headcount.core.gates import gated, kept_heads, kept_kv_heads, layout
from headcount.runtime.errors import HeadcountError

UNITS = ("heads", "kv-groups")
#: ``remove``: outputs zeroed in prefill and decoding; ``reference``: Wu et al.'s, queries zeroed while decoding
MASKS = ("remove", "reference")
MASK_WORDS = {"remove": "the heads' outputs zeroed in prefill and decoding, as removing them does",
              "reference": "Wu et al.'s rule, the heads' queries zeroed while decoding only (uniform attention: "
                           "the mean of the values), the prompt prefilled with every head"}
#: the random sets Wu et al.'s protocol draws: one per example (theirs, reported beside the test)
THEIRS = ("Wu et al.'s protocol (theirs): a fresh random set of k units for every example, from the units "
          "outside the top set")


@dataclass(frozen=True)
class AblationResult:
    """What [`ablation_test`][headcount.analysis.ablation.ablation_test] found.

    Attributes:
        unit: ``heads`` or ``kv-groups``; ``mask``: ``remove`` or ``reference``.
        k: units gated off in each condition; ``n_units``: how many there are.
        fraction: the fraction asked for.
        accuracy_full / accuracy_top: needle accuracy of the full model and with the top-k gone.
        accuracy_random: one accuracy per random set (K of them); ``accuracy_random_mean`` their mean.
        top: the top-k units as ``[layer, index]`` pairs.
        n_sets: K; ``n_as_harmful``: random sets with accuracy <= the top set's.
        p_value: the head-set test's p = (1 + n_as_harmful) / (1 + K); ``p_min`` = 1 / (1 + K).
        difference: mean over examples of (mean random success - top success) (a description).
        p_value_prompts: the one-sided sign-flip test over examples of that difference (a
            description of the examples, not a test of the head sets).
        accuracy_random_theirs: Wu et al.'s protocol, a fresh random set per example (None when not run).
        n_examples: held-out examples.
        per_example: ``{"full", "top", "random", "theirs"}`` successes (0/1; ``random`` ``[K][examples]``).
    """

    unit: str
    mask: str
    k: int
    n_units: int
    fraction: float
    accuracy_full: float
    accuracy_top: float
    accuracy_random: list[float]
    accuracy_random_mean: float
    top: list[list[int]]
    n_sets: int
    n_as_harmful: int
    p_value: float
    p_min: float
    difference: float
    p_value_prompts: float
    accuracy_random_theirs: float | None
    n_examples: int
    per_example: dict

    def to_dict(self) -> dict:
        return asdict(self)


def head_set_p_value(top: float, random) -> tuple[float, int]:
    """The head-set test: ``(p, n)`` with n the random sets at least as harmful as the top set
    (accuracy ``<=`` ``top``: ties count against it) and p = (1 + n) / (1 + K) for K random sets,
    exact under the null that the top set's harm is one more draw from the random sets' distribution.

    >>> head_set_p_value(0.1, [1.0] * 19)         # the top set worse than all 19: the smallest p
    (0.05, 0)
    >>> head_set_p_value(0.1, [1.0, 0.1, 0.0])    # one tie, one worse
    (0.75, 2)
    """
    r = np.asarray(random, dtype=np.float64)
    if r.size < 1:
        raise HeadcountError("the head-set test needs at least one random set")
    n = int((r <= top).sum())
    return (1 + n) / (1 + r.size), n


@contextmanager
def query_blocked(model, off: np.ndarray):
    """Wu et al.'s masking for the duration: in every forward that extends a cache (decoding) the
    query of each head in ``off`` (``[L, H]`` booleans, original head indices) is zero, so its
    attention is uniform over the cache and it outputs the mean of the values; a forward without a
    cache (prefill) runs every head. The query rows come from the adapter (``Block.unit_rows``),
    zeroed at the projection's output (bias included), before any norm or rotary embedding, which
    keep 0 at 0."""
    lay = require_decoder(model, "mask: reference")  # a cache to decode from
    blocks = get_adapter(model).blocks(model)
    state = {"decoding": False}

    def watch(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        state["decoding"] = cache is not None and int(cache.get_seq_length()) > 0

    handles = [model.register_forward_pre_hook(watch, with_kwargs=True)]
    try:
        for layer, block in enumerate(blocks):
            kept = kept_heads(block.out_projection, lay.n_heads)
            pos = [kept.index(h) for h in np.flatnonzero(off[layer]).tolist() if h in kept]
            if not pos:
                continue
            n_kv = len(kept_kv_heads(block.out_projection, lay.n_kv_heads))
            for proj, rows in block.unit_rows(pos, len(kept), None, n_kv, lay.head_dim):
                def zero(module, args, output, rows=rows):
                    if not state["decoding"]:
                        return None
                    output = output.clone()
                    output[..., rows.to(output.device)] = 0
                    return output

                handles.append(proj.register_forward_hook(zero))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def masked(model, off: np.ndarray | None, mask: str = "remove"):
    """The units of ``off`` (``[L, H]`` query-head booleans; None: none) masked by ``mask`` (``MASKS``)."""
    if off is None or not off.any():
        yield
    elif mask == "remove":
        with gated(model, heads=torch.as_tensor(~off, dtype=torch.float32)):
            yield
    else:
        with query_blocked(model, off):
            yield


def _successes(model, batches, off, mask, score_fn, **kwargs) -> np.ndarray:
    """Each example's needle success (answer verbatim) with the heads of ``off`` ``[L, H]`` masked."""
    with masked(model, off, mask):
        s = score_fn(model, batches, **kwargs)
    return np.array([bool(r["exact"]) for r in s.meta["retrieval"]["examples"]], dtype=np.float64)


def _unit_heads(chosen: np.ndarray, n_heads: int, unit: str) -> np.ndarray:
    """Query heads ``[L, H]`` (booleans) of the chosen units ``[L, units per layer]``: a chosen KV
    group is its ``H / n_kv`` query heads (query head i reads KV head ``i // group``)."""
    if unit == "kv-groups":
        chosen = np.repeat(chosen, n_heads // chosen.shape[1], axis=1)
    return np.asarray(chosen, dtype=bool)


def _unit_gates(chosen: np.ndarray, n_heads: int, unit: str) -> torch.Tensor:
    """Gates ``[L, H]`` with the chosen units off (1 = kept)."""
    return torch.as_tensor(~_unit_heads(chosen, n_heads, unit), dtype=torch.float32)


def _one_example_batches(batches) -> list:
    """Every example of niah ``batches`` as a batch of its own (for one random set per example)."""
    return [SimpleNamespace(examples=[e], decode=b.decode, stop_ids=b.stop_ids) for b in batches for e in b.examples]


def ablation_test(model, batches, scores, *, fraction: float = 0.05, draws: int = 19, seed: int = 0,
                  unit: str = "heads", mask: str = "remove", theirs: bool = True, n_resamples: int = 100_000,
                  **score_kwargs) -> AblationResult:
    """Gate the top ``fraction`` of units by ``scores`` vs ``draws`` random sets of as many (see the module docstring).

    Args:
        model: a decoder with its language-model head (no gates of the caller's active).
        batches: held-out needle-in-a-haystack batches
            ([`niah_batches`][headcount.data.tasks.niah.niah_batches]); the same for every condition.
        scores: ``[L, H]`` per query head (``unit="heads"``) or ``[L, n_kv]`` per KV head
            (``unit="kv-groups"``); higher = gated first. NaN units are never chosen.
        fraction: in (0, 1]: the share of units gated off; the random sets need k units outside
            the top set (fraction <= 0.5 leaves enough).
        draws: K random sets (each its own seed ``[seed, d]``); the head-set p is at least 1 / (1 + K).
        unit: ``heads`` or ``kv-groups``.
        mask: ``remove`` (outputs zeroed in prefill and decoding) or ``reference`` (Wu et al.'s).
        theirs: also run Wu et al.'s protocol (a random set per example, seeds ``[seed, 1, i]``).
        score_kwargs: passed to the retrieval scorer (``max_new_tokens``, ``rt``, ``progress``:
            called with 1..n for each condition in turn).

    Raises:
        HeadcountError: an unknown unit or mask, a grid that does not fit the model, ``draws`` < 1,
            fewer than k units outside the top set.
    """
    from headcount.importance.retrieval import retrieval_scores

    if unit not in UNITS:
        raise HeadcountError(f"unknown unit {unit!r}; choose one of {', '.join(UNITS)}")
    if mask not in MASKS:
        raise HeadcountError(f"unknown mask {mask!r}; choose one of {', '.join(MASKS)}")
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
    pool = np.flatnonzero(finite & ~top.ravel())  # the random sets' units: outside the top set
    if pool.size < k:
        raise HeadcountError(f"the random sets need {k} {unit} outside the top {k}, and only {pool.size} are "
                             f"(fraction {fraction:g} of {int(finite.sum())}; <= 0.5 leaves enough)")

    def heads_of(pick: np.ndarray) -> np.ndarray:  # flat unit indices -> [L, H] query heads
        chosen = np.zeros(grid.size, dtype=bool)
        chosen[pick] = True
        return _unit_heads(chosen.reshape(grid.shape), lay.n_heads, unit)

    def run(off, on=batches, **kw):
        return _successes(model, on, off, mask, retrieval_scores, **{**score_kwargs, **kw})

    full = run(None)
    with_top = run(_unit_heads(top, lay.n_heads, unit))
    rand = np.stack([run(heads_of(np.random.default_rng([seed, d]).choice(pool, size=k, replace=False)))
                     for d in range(draws)])  # [K, examples]
    per = {"full": full.astype(int).tolist(), "top": with_top.astype(int).tolist(), "random": rand.astype(int).tolist()}
    theirs_acc = None
    if theirs:
        progress = score_kwargs.get("progress")
        ones = []
        for i, one in enumerate(_one_example_batches(batches)):
            pick = np.random.default_rng([seed, 1, i]).choice(pool, size=k, replace=False)
            ones.append(run(heads_of(pick), on=[one], progress=None)[0])
            if progress:
                progress(i + 1)
        per["theirs"] = np.asarray(ones, dtype=int).tolist()
        theirs_acc = float(np.mean(ones))
    acc_random = [float(r.mean()) for r in rand]
    p, n_harmful = head_set_p_value(float(with_top.mean()), acc_random)
    prompts = paired_sign_flip_test(rand.mean(0), with_top, alternative="greater", n_resamples=n_resamples, seed=seed)
    return AblationResult(
        unit=unit, mask=mask, k=k, n_units=int(finite.sum()), fraction=float(fraction),
        accuracy_full=float(full.mean()), accuracy_top=float(with_top.mean()), accuracy_random=acc_random,
        accuracy_random_mean=float(rand.mean()), top=[[int(a), int(b)] for a, b in zip(*np.nonzero(top))],
        n_sets=int(draws), n_as_harmful=n_harmful, p_value=float(p), p_min=1 / (1 + draws),
        difference=float((rand.mean(0) - with_top).mean()), p_value_prompts=float(prompts.p_value),
        accuracy_random_theirs=theirs_acc, n_examples=int(full.size), per_example=per)
