"""Claims over seeds: is experiment A above experiment B on the same seeds, is a score at chance?

The reports' ordering claims ("good > random > bad") rest on one test, [`paired_sign_flip_test`][headcount.analysis.paired.paired_sign_flip_test]:
the paired sign-flip permutation test on the per-seed differences ``a - b``. Under the null
hypothesis (no difference) each seed's difference is as likely to have either sign, so the
null distribution of the mean difference is that of the mean with every pattern of signs. With
up to ``EXACT_MAX`` seeds all ``2^n`` patterns are enumerated (exact); above, a seeded
random sample of them is drawn.

Why this test and not a paired t test or Wilcoxon's signed-rank test: it is exact for any
number of seeds, assumes no distribution of the differences (a t test assumes normal ones,
which 3-5 seeds cannot check), and tests the mean difference the reports print (Wilcoxon
tests ranks, and with 5 seeds has the same floor). Its floor matters: with ``n`` seeds the
smallest two-sided p-value is ``2 / 2^n`` (5 seeds: 2/32 = 0.0625) and the smallest one-sided
one ``1 / 2^n`` (5 seeds: 1/32 = 0.031), so with 5 seeds only a one-sided test, of a direction
fixed before the data (a paper's claim), can reach 0.05, and only when every seed agrees.
``PairedResult.min_p`` says what the design can reach; a report says "not significant"
whenever ``p >= 0.05`` and that the design cannot show significance when ``min_p >= 0.05``.

[`seed_interval`][headcount.analysis.paired.seed_interval] gives a score's t interval over seeds and [`at_chance`][headcount.analysis.paired.at_chance] whether an
interval contains a chance level (a score "at chance").

>>> r = paired_sign_flip_test([0.80, 0.82, 0.79, 0.85, 0.81], [0.70, 0.75, 0.72, 0.74, 0.70], "greater")
>>> r.n, r.n_above, r.p_value, r.min_p
(5, 5, 0.03125, 0.03125)
>>> paired_sign_flip_test([0.80, 0.82, 0.79, 0.85, 0.81], [0.70, 0.75, 0.72, 0.74, 0.70]).p_value
0.0625
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from scipy import stats as _sps

from headcount.analysis.helpers import LEVEL
from headcount.runtime.errors import HeadcountError

__all__ = ["EXACT_MAX", "METRIC_RANGES", "PairedResult", "at_chance", "metric_range", "paired_sign_flip_test",
           "seed_interval"]

#: Up to this many seeds (pairs) every sign pattern is enumerated (2^20 patterns at most).
EXACT_MAX = 20

Alternative = Literal["two-sided", "greater", "less"]


@dataclass(frozen=True)
class PairedResult:
    """A paired sign-flip test of ``a`` against ``b`` over seeds.

    Attributes:
        n: seeds (pairs) where both values are finite; the others are left out.
        mean_diff: mean of ``a - b`` over them.
        std_diff: their sample standard deviation (NaN with fewer than two).
        n_above: seeds with ``a > b``.
        n_below: seeds with ``a < b`` (ties count in neither).
        p_value: the test's p-value (NaN without a pair).
        min_p: the smallest p-value ``n`` pairs can give: ``2 / 2^n`` two-sided, ``1 / 2^n`` one-sided.
        alternative: ``"two-sided"``, ``"greater"`` (H1: a > b) or ``"less"`` (H1: a < b).
        exact: whether every sign pattern was enumerated.
    """

    n: int
    mean_diff: float
    std_diff: float
    n_above: int
    n_below: int
    p_value: float
    min_p: float
    alternative: str
    exact: bool

    def significant(self, alpha: float = 0.05) -> bool:
        """``p < alpha`` (False for a NaN p)."""
        return bool(math.isfinite(self.p_value) and self.p_value < alpha)

    def can_reach(self, alpha: float = 0.05) -> bool:
        """Whether this many seeds can give ``p < alpha`` at all (``min_p < alpha``)."""
        return bool(math.isfinite(self.min_p) and self.min_p < alpha)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def paired_sign_flip_test(a: Sequence[float], b: Sequence[float], alternative: Alternative = "two-sided",
                          n_resamples: int = 100_000, seed: int = 0) -> PairedResult:
    """The paired sign-flip permutation test of the mean of ``a - b`` over seeds.

    Args:
        a: one value per seed (NaN: left out with its pair).
        b: the other experiment's value on the same seeds, in the same order.
        alternative: ``"two-sided"`` (|mean| as extreme), ``"greater"`` (H1: a > b) or ``"less"``.
        n_resamples: random sign patterns drawn above ``EXACT_MAX`` pairs.
        seed: seed of those draws.

    Returns:
        A [`PairedResult`][headcount.analysis.paired.PairedResult]. The p-value counts the sign patterns whose mean difference is
        at least as extreme as the observed one (the observed pattern included), over all ``2^n``
        patterns when exact, else ``(1 + hits) / (1 + n_resamples)``.

    Raises:
        HeadcountError: ``a`` and ``b`` of different lengths, or an unknown ``alternative``.

    >>> r = paired_sign_flip_test([1.0, 2.0, 3.0], [0.5, 2.5, 2.0])
    >>> r.n_above, r.n_below, r.p_value, r.min_p
    (2, 1, 0.75, 0.25)
    """
    x, y = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise HeadcountError(f"paired values need the same number of seeds, got {x.size} and {y.size}")
    if alternative not in ("two-sided", "greater", "less"):
        raise HeadcountError(f"alternative must be two-sided, greater or less, not {alternative!r}")
    d = (x - y)[np.isfinite(x) & np.isfinite(y)]
    n = int(d.size)
    floor = (2.0 if alternative == "two-sided" else 1.0) / 2.0**n if n else math.nan
    if n == 0:
        return PairedResult(0, math.nan, math.nan, 0, 0, math.nan, math.nan, alternative, True)
    observed = float(d.mean())
    exact = n <= EXACT_MAX
    if exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))  # [2^n, n]
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(int(n_resamples), n))
    null = signs @ d / n
    tol = 1e-12 * max(1.0, float(np.abs(d).sum()))  # the same sum in another order: equal, not smaller
    if alternative == "two-sided":
        hits = np.abs(null) >= abs(observed) - tol
    elif alternative == "greater":
        hits = null >= observed - tol
    else:
        hits = null <= observed + tol
    p = float(hits.mean()) if exact else float((1 + hits.sum()) / (1 + len(null)))
    std = float(d.std(ddof=1)) if n > 1 else math.nan
    return PairedResult(n, observed, std, int((d > 0).sum()), int((d < 0).sum()), min(p, 1.0), floor,
                        alternative, exact)


def seed_interval(values: Sequence[float], level: float = LEVEL,
                  bounds: tuple[float, float] | None = None) -> dict[str, float]:
    """Mean, sample std, n and the t interval ``mean ± t(level, n-1) std / sqrt(n)`` over seeds.

    The t quantile (not 1.96) keeps the coverage with 3-5 seeds. NaN values are left out; the
    bounds are NaN with fewer than two finite values. ``bounds``: the metric's range (e.g.
    ``(0, 1)`` for accuracy, [`metric_range`][headcount.analysis.paired.metric_range]): the interval is clipped to it, and
    ``clipped`` says whether it was (the t interval of 2-3 seeds can reach past 1).

    >>> r = seed_interval([0.80, 0.82, 0.84])
    >>> round(r["low"], 3), round(r["high"], 3), r["n"]
    (0.77, 0.87, 3)
    >>> r = seed_interval([0.70, 0.98], bounds=(0.0, 1.0))
    >>> round(r["low"], 3), r["high"], r["clipped"]
    (0.0, 1.0, True)
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    n = int(v.size)
    mean = float(v.mean()) if n else math.nan
    if n < 2:
        return {"mean": mean, "std": math.nan, "n": n, "low": math.nan, "high": math.nan, "clipped": False}
    std = float(v.std(ddof=1))
    half = float(_sps.t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)
    low, high = mean - half, mean + half
    clipped = False
    if bounds is not None:
        clipped = low < bounds[0] or high > bounds[1]
        low, high = max(low, float(bounds[0])), min(high, float(bounds[1]))
    return {"mean": mean, "std": std, "n": n, "low": low, "high": high, "clipped": clipped}


#: the range of each bounded task metric (what an interval of its scores is clipped to)
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "accuracy": (0.0, 1.0), "f1": (0.0, 1.0), "mlm_accuracy": (0.0, 1.0), "mcc": (-1.0, 1.0),
    "pearson": (-1.0, 1.0), "spearman": (-1.0, 1.0), "pearson_spearman": (-1.0, 1.0),
}


def metric_range(metric) -> tuple[float, float] | None:
    """The possible values of a task metric (None when unknown or unbounded).

    >>> metric_range("accuracy"), metric_range("mcc"), metric_range("loss")
    ((0.0, 1.0), (-1.0, 1.0), None)
    """
    return METRIC_RANGES.get(metric) if isinstance(metric, str) else None


def at_chance(low, high, chance) -> bool | None:
    """Whether the interval ``[low, high]`` contains the chance level; None when any is undefined.

    >>> at_chance(0.07, 0.25, 0.14), at_chance(0.2, 0.3, 0.0), at_chance(float("nan"), 0.3, 0.0)
    (True, False, None)
    """
    vals = [low, high, chance]
    if any(v is None for v in vals):
        return None
    try:
        lo, hi, c = (float(v) for v in vals)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(c)):
        return None
    tol = 1e-9 * max(1.0, abs(c))  # an accuracy equal to the majority rate, up to rounding
    return bool(lo - tol <= c <= hi + tol)
