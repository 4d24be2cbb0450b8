"""Magnitude-pruning procedures: which weight mask to keep, and its retraining.

The weight-mask primitives (which weights, masks, controls, files) are ``headcount.importance.magnitude``;
this module holds the searches that decide how far to prune; the runs built on them (search,
retraining, files) are [`headcount.train.magnitude_prune`][headcount.train.magnitude_prune].

Two procedures (``MagnitudeConfig.procedure``):

- ``"prasanna"`` (Prasanna et al. 2020, ``find_global_weight_mask.py``; the default): rank the
  FINE-TUNED weights (global L1 over [`weight_targets`][headcount.importance.magnitude.weight_targets]), prune ``rate``
  of the remaining ones per step WITHOUT retraining, evaluate the masked fine-tuned model on dev
  after each step, stop when that un-retrained metric falls below ``threshold`` x the full
  model's (or after ``rounds`` steps), keep a mask, then retrain ONCE from the pre-trained weights
  with it ([`prasanna_magnitude_mask`][headcount.train.magnitude_search.prasanna_magnitude_mask], [`prasanna_magnitude_prune`][headcount.train.magnitude_prune.prasanna_magnitude_prune]). Which mask: the
  reference code's loop saves the current mask at the top of each iteration, before pruning, so
  it keeps the step before the one that stopped it: the last passing step when a step fails, and
  step ``rounds - 1`` when all ``rounds`` steps pass (step 9 of 10, 61.3% of BERT's weights, not
  step 10's 65.1%). That is the default (``at_cap="reference"``); ``at_cap="last"`` keeps the
  last passing step at the cap too (step 10, headcount's earlier behaviour).
- ``"imp"`` (iterative magnitude pruning with rewinding, Chen et al. 2020): every round prunes
  ``rate`` of the remaining weights by the magnitudes of the last RETRAINED weights, rewinds and
  retrains; the stop rule reads the retrained metric ([`iterative_magnitude_prune`][headcount.train.magnitude_prune.iterative_magnitude_prune]). It
  usually keeps a sparser mask, and its kept mask passes the retrained threshold by construction.

Controls (``control="random"`` / ``"bad"``) are one shot at the good run's sparsity (``match``):
a mask ranked on the same fine-tuned weights, retrained the same way, for either procedure.

When no step passes there is no mask: the summary says ``no_passing_mask: true`` with
``metric``/``sparsity`` null (a NaN row in a study's table), no ``weight_mask.safetensors`` is
written, and a control matched to it is skipped (``skipped: true``, nothing trained).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from headcount.importance.magnitude import (
    CONTROLS,
    VARIANTS,
    WeightMask,
    _param,
    check_sparsity,
    magnitude_mask,
    masked_weights,
    weight_targets,
)
from headcount.runtime.bounds import Bound, check_bounds
from headcount.runtime.errors import HeadcountError

PROCEDURES = ("prasanna", "imp")
#: pruning rounds (steps) of a magnitude search
ROUNDS = Bound(1, 1000, integer=True)
#: a step number that may be 0 (rewinding to step 0: the pre-trained weights)
STEP_NUMBER = Bound(0, 10**9, integer=True)
#: the share of the full model's metric a magnitude step must keep: the command line and the study configs
#: take a FRACTION; the library any finite share (above 1: no step passes)
METRIC_SHARE = Bound(0, 10**6)
#: a fraction pruned per step: strictly between 0 and 1
RATE = Bound(0, 1, low_open=True, high_open=True)
SCHEDULES = ("remaining", "original")
#: which step the paper's search keeps when all ``rounds`` steps pass (``MagnitudeConfig.at_cap``)
AT_CAP = ("reference", "last")
#: why the paper's search stopped (``MaskSearch.stopped``, ``stopped`` in ``magnitude.json``)
STOPS = ("threshold", "cap", "exhausted")


# -- settings ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MagnitudeConfig:
    """Magnitude-pruning settings, declared once (the CLI and the lottery study read them).

    Defaults: Prasanna et al. 2020.

    Attributes:
        procedure: ``"prasanna"`` (prune the fine-tuned weights step by step without retraining,
            stop on the un-retrained dev metric, retrain the kept mask once) or ``"imp"``
            (retrain every round, stop on the retrained metric).
        rounds: at most this many pruning steps (prasanna) or retrained rounds (imp); the
            paper: 10. The CLI also accepts it as ``--max-steps``.
        threshold: stop when the metric < threshold x the full model's metric.
        rate: the fraction pruned per step (``schedule="remaining"``: of the remaining weights).
        control: ``"good"``, ``"random"`` or ``"bad"``: how a mask chooses (random and bad are
            one shot at a good run's sparsity, see ``sparsity`` and ``match``).
        variant: ``"prasanna"`` or ``"chen"``: which weights compete.
        schedule: ``"remaining"`` (step k reaches 1 - (1 - rate)^k) or ``"original"`` (k x rate,
            Chen et al.'s 10%, 20%, ... 90%).
        sparsity: one shot instead of a search: prune to exactly this sparsity, retrain once.
        rewind_step: imp only: 0 = rewind to the pre-trained weights; N > 0 = to the full
            fine-tuning run's weights after N steps (early-checkpoint rewinding).
        at_cap: prasanna only: which mask the search keeps when all ``rounds`` steps pass.
            ``"reference"`` (the default, the reference code's ``find_global_weight_mask.py``,
            which saves the mask before each step's pruning): step ``rounds - 1``, the mask
            before the last step (so ``rounds=1`` would keep nothing; the CLI and the study
            refuse it). ``"last"``: step ``rounds``, the last passing step (headcount's earlier
            behaviour). A failing step keeps the step before it either way.

    >>> MagnitudeConfig(rounds=3).rate, MagnitudeConfig().procedure, MagnitudeConfig().at_cap
    (0.1, 'prasanna', 'reference')
    """

    procedure: str = "prasanna"
    rounds: int = 10
    threshold: float = 0.9
    rate: float = 0.1
    control: str = "good"
    variant: str = "prasanna"
    schedule: str = "remaining"
    sparsity: float | None = None
    rewind_step: int = 0
    at_cap: str = "reference"

    #: the sane range of each numeric field (above; ``sparsity``: [`check_sparsity`][headcount.importance.magnitude.check_sparsity])
    BOUNDS = {"rounds": ROUNDS, "threshold": METRIC_SHARE, "rate": RATE, "rewind_step": STEP_NUMBER}

    def __post_init__(self):
        if self.procedure not in PROCEDURES:
            raise HeadcountError(f"unknown procedure {self.procedure!r}; choose one of {', '.join(PROCEDURES)}")
        check_bounds(self, self.BOUNDS)
        if self.control not in CONTROLS:
            raise HeadcountError(f"unknown control {self.control!r}; choose one of {', '.join(CONTROLS)}")
        if self.variant not in VARIANTS:
            raise HeadcountError(f"unknown variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if self.schedule not in SCHEDULES:
            raise HeadcountError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if self.at_cap not in AT_CAP:
            raise HeadcountError(f"unknown at cap {self.at_cap!r}; choose one of {', '.join(AT_CAP)}")
        if self.sparsity is not None:
            check_sparsity(self.sparsity)


def _n_pruned(k: int, total: int, previous: int, config: MagnitudeConfig) -> int:
    """Weights pruned after step k (``previous`` after step k - 1), of ``total``."""
    if config.schedule == "original":
        return min(total, int(round(k * config.rate * total)))
    return previous + int(round(config.rate * (total - previous)))


# -- the paper's search (no retraining between steps) ----------------------------------------------------
@dataclass
class MaskSearch:
    """What [`prasanna_magnitude_mask`][headcount.train.magnitude_search.prasanna_magnitude_mask] found.

    Attributes:
        mask: the kept mask (``{name: bool}``, True = kept), or None when the kept step is 0
            (no step passed).
        step: the step whose mask was kept (0 = none).
        full_metric: the un-pruned fine-tuned model's dev metric (the threshold's reference).
        metric: the kept mask's un-retrained dev metric (NaN when none was kept).
        trace: one row per step evaluated: step, sparsity, metric (un-retrained), passed, pruned,
            total, seconds; step 0 is the full model.
        stopped: why the search stopped: ``"threshold"`` (a step fell below it), ``"cap"`` (all
            ``rounds`` steps passed) or ``"exhausted"`` (the next step would prune nothing, or
            every weight).
    """

    mask: WeightMask | None
    step: int
    full_metric: float
    metric: float
    trace: list[dict] = field(default_factory=list)
    stopped: str = "threshold"

    @property
    def no_passing_mask(self) -> bool:
        return self.mask is None


def prasanna_magnitude_mask(model: nn.Module, evaluate: Callable[[nn.Module], float], *,
                            config: MagnitudeConfig | None = None, full_metric: float | None = None,
                            progress: Callable[[str], None] | None = None) -> MaskSearch:
    """Prasanna et al.'s magnitude search on a fine-tuned ``model``, without retraining.

    Step k prunes ``config.rate`` of the remaining [`weight_targets`][headcount.importance.magnitude.weight_targets]
    (global L1 on ``model``'s fine-tuned weights; what step k - 1 pruned stays pruned), zeroes
    them in place for ``evaluate(model)`` and restores them after; it passes when that metric is
    >= ``config.threshold`` x ``full_metric``. The first failing step stops the search (so does
    ``config.rounds``, the cap, and a step that would prune nothing or every weight). Kept: the
    last passing step's mask, except at the cap under ``config.at_cap="reference"`` (the
    default): there the reference loop (``mask = new_mask.clone()`` before each step's pruning,
    ``while total_steps != 0 and score >= threshold x full``) returns the mask from before the
    last step, step ``rounds - 1``; ``at_cap="last"`` keeps step ``rounds``. Every step's metric
    is in ``trace`` either way (the reference evaluates step ``rounds`` too).

    Args:
        model: the fine-tuned model (unchanged on return).
        evaluate: ``model -> dev metric`` (higher is better), called once per step.
        config: [`MagnitudeConfig`][headcount.train.magnitude_search.MagnitudeConfig] (``rate``, ``rounds``, ``threshold``, ``variant``,
            ``schedule``, ``at_cap``); the procedure and control fields are not read.
        full_metric: the reference; default ``evaluate(model)`` before any pruning.
        progress: one-line progress messages.

    Returns:
        [`MaskSearch`][headcount.train.magnitude_search.MaskSearch].

    >>> found = prasanna_magnitude_mask(model, lambda m: evaluate(m, dev)["score"])   # doctest: +SKIP
    >>> found.step, found.stopped, mask_sparsity(found.mask)["sparsity"]              # doctest: +SKIP
    (5, 'threshold', 0.40951)
    """
    config = config or MagnitudeConfig()
    say = progress or (lambda msg: None)
    total = sum(_param(m, a).numel() for m, a in weight_targets(model, config.variant).values())
    t0 = time.perf_counter()
    full = float(evaluate(model)) if full_metric is None else float(full_metric)
    trace = [{"step": 0, "sparsity": 0.0, "metric": full, "passed": True, "pruned": 0, "total": total,
              "seconds": round(time.perf_counter() - t0, 3)}]
    found = MaskSearch(mask=None, step=0, full_metric=full, metric=math.nan, trace=trace, stopped="cap")
    current: WeightMask | None = None
    previous = 0
    passing = [(0, None, math.nan)]  # (step, mask, metric) of the last two passing steps; step 0: no mask
    for k in range(1, config.rounds + 1):
        n = _n_pruned(k, total, previous, config)
        if n >= total or n <= previous:  # nothing left to prune, or a step too small to prune one
            found.stopped = "exhausted"  # (a zero step: the reference's later masks would all be this one)
            break
        t0 = time.perf_counter()
        mask = magnitude_mask(model, n / total, variant=config.variant, control="good", current=current)
        with masked_weights(model, mask):
            score = float(evaluate(model))
        passed = bool(score >= config.threshold * full)  # NaN fails
        trace.append({"step": k, "sparsity": n / total, "metric": score, "passed": passed, "pruned": n,
                      "total": total, "seconds": round(time.perf_counter() - t0, 3)})
        say(f"step {k}: sparsity {n / total:.4f}, un-retrained metric {score:.4f} vs {config.threshold} x "
            f"{full:.4f} -> {'pass' if passed else 'stop'}")
        if not passed:
            found.stopped = "threshold"
            break
        passing = [passing[-1], (k, mask, score)]
        current, previous = mask, n
    # the reference returns the mask saved before the last step's pruning: at the cap, the one before
    before_last = found.stopped == "cap" and config.at_cap == "reference"
    found.step, found.mask, found.metric = passing[0] if before_last else passing[-1]
    say(f"stopped ({found.stopped}): keeping " + (f"step {found.step}" if found.step else "no mask (step 0)")
        + (" (at cap reference: the mask before the last step, as the reference code)" if before_last else ""))
    return found


# -- checks before a run ------------------------------------------------------------------------------------
def check_procedure(config: MagnitudeConfig, match=None) -> None:
    """Raise a one-line error for settings the chosen procedure cannot run (before any work).

    The paper's search finds the good mask only (random and bad are one shot at its sparsity),
    it retrains from the pre-trained weights (``rewind_step`` is IMP's), and with
    ``at_cap="reference"`` one step keeps nothing (the mask before step 1).

    >>> check_procedure(MagnitudeConfig(control="bad"))
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: the prasanna search finds the good mask; a bad control is one shot at a good run's sparsity: give --match (or --sparsity)
    """
    if config.procedure != "prasanna" or config.sparsity is not None or match is not None:
        return
    if config.control != "good":
        raise HeadcountError(f"the prasanna search finds the good mask; a {config.control} control is one "
                             "shot at a good run's sparsity: give --match (or --sparsity)")
    if config.rewind_step:
        raise HeadcountError("rewind step is an imp setting (the prasanna procedure retrains from the pre-trained "
                             "weights): add --procedure imp")
    if config.rounds == 1 and config.at_cap == "reference":
        raise HeadcountError("with at cap 'reference' the search keeps the mask from before the last step, so 1 step "
                             "(rounds 1) keeps nothing: give 2 or more steps, or at cap 'last'")


__all__ = ["AT_CAP", "PROCEDURES", "SCHEDULES", "STOPS", "MagnitudeConfig", "MaskSearch", "check_procedure",
           "prasanna_magnitude_mask"]
