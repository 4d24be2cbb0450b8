"""KV cache methods compared on the same prompts: one row per method, its accuracy's interval and
its paired tests against the full cache and the uniform window, and the accuracy-memory figure.

The rows come from [`measure_kv_budget`][headcount.kv.measure.measure_kv_budget] runs on the same
needle prompts and LM texts. Needle accuracy gets a Wilson interval (binomial, over prompts:
each prompt answered or not); the paired tests are the reports' one-sided sign-flip test
([`paired_sign_flip_test`][headcount.analysis.paired.paired_sign_flip_test]) over the prompts'
0/1 successes: against the full cache H1 "the method answers fewer", against the uniform window
H1 "the method answers more".
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from headcount.analysis.helpers import LEVEL
from headcount.analysis.paired import paired_sign_flip_test

__all__ = ["COLUMNS", "kv_eval_figure", "method_rows", "wilson_interval"]

#: the columns of ``kv-eval.csv``, in order (docs/kv-budgets.md says what each means)
COLUMNS = ("method", "n_full", "n_kv", "needle_accuracy", "needle_low", "needle_high", "n_needles", "lm_loss",
           "n_lm_texts", "kv_bytes", "kv_bytes_predicted", "kv_bytes_end", "full_cache_bytes", "kv_ratio", "prefill_s",
           "decode_s_per_token", "p_vs_full", "p_vs_uniform")


def wilson_interval(successes: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The Wilson score interval of a proportion (NaN, NaN without a trial).

    >>> [round(x, 3) for x in wilson_interval(8, 10)]
    [0.49, 0.943]
    """
    if n <= 0:
        return math.nan, math.nan
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


def _p(a, b, alternative: str) -> float:
    if a is None or b is None or len(a) != len(b) or not len(a):
        return math.nan
    return float(paired_sign_flip_test(a, b, alternative=alternative).p_value)


def method_rows(runs: Mapping[str, dict], level: float = LEVEL) -> list[dict]:
    """One row (``COLUMNS``) per method of ``runs`` (method name -> a dict with ``budget``, the
    [`KVBudget`][headcount.kv.budget.KVBudget] measured, ``context`` and the measurement).
    ``p_vs_full`` needs a ``full`` run, ``p_vs_uniform`` a ``uniform`` one (NaN for the method itself)."""
    def wins(name):
        run = runs.get(name)
        return None if run is None else [int(a["exact"]) for a in run["answers"]]

    full, uniform = wins("full"), wins("uniform")
    rows = []
    for name, run in runs.items():
        budget, context, element = run["budget"], run["context"], run["element_size"]
        won = wins(name)
        low, high = wilson_interval(sum(won), len(won), level)
        steps = sum(max(n - 1, 0) for n in run["new_tokens"])
        full_bytes = budget.full_bytes(context, element_size=element)
        rows.append({
            "method": name, "n_full": budget.n_full, "n_kv": budget.n_layers * budget.n_kv_heads,
            "needle_accuracy": float(np.mean(won)) if won else math.nan, "needle_low": low, "needle_high": high,
            "n_needles": len(won), "lm_loss": float(np.mean(run["losses"])) if run["losses"] else math.nan,
            "n_lm_texts": len(run["losses"]), "kv_bytes": run["kv_bytes"],
            "kv_bytes_predicted": budget.kv_bytes(context, element_size=element),
            "kv_bytes_end": max(run["kv_bytes_end"]) if run["kv_bytes_end"] else None,
            "full_cache_bytes": full_bytes, "kv_ratio": run["kv_bytes"] / full_bytes,
            "prefill_s": float(np.mean(run["prefill_s"])) if run["prefill_s"] else math.nan,
            "decode_s_per_token": float(sum(run["decode_s"]) / steps) if steps else math.nan,
            "p_vs_full": math.nan if name == "full" else _p(won, full, "less"),
            "p_vs_uniform": math.nan if name == "uniform" else _p(won, uniform, "greater"),
        })
    return rows


def kv_eval_figure(rows: list[dict], path=None, title: str | None = None):
    """Needle accuracy (with its Wilson interval) against the KV cache's measured bytes, one point per method."""
    from headcount.analysis.plots import _save, plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    unit, scale = ("MiB", 2**20) if max(r["kv_bytes"] for r in rows) >= 2**20 else ("KiB", 2**10)
    markers = "osD^vP*X"  # the baselines sit at the budget's memory: a marker each, open ones, so none hides another
    for i, r in enumerate(rows):
        acc = r["needle_accuracy"]
        err = [[max(acc - r["needle_low"], 0)], [max(r["needle_high"] - acc, 0)]]
        ax.errorbar([r["kv_bytes"] / scale], [acc], yerr=err, fmt=markers[i % len(markers)], color=f"C{i}",
                    mfc="none" if i else f"C{i}", ms=9 - 1.5 * min(i, 3), capsize=3, label=r["method"])
    ax.set_xlabel(f"KV cache after prefill ({unit}, measured)")
    ax.set_ylabel("needle accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title or "KV budget: accuracy vs memory", fontsize=9)
    ax.legend(fontsize=7)
    if path is None:
        return fig
    _save(fig, path)
