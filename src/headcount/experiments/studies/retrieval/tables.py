"""The retrieval study's tables, read from saved results only (a report is redrawn without a model).

Each function takes the run's store, the settings and the job-name prefix, and returns a tidy
DataFrame (empty, with its columns, while the jobs it reads have not finished):
[`score_runs`][headcount.experiments.studies.retrieval.tables.score_runs] (one row per scorer, template
and seed), [`head_scores`][headcount.experiments.studies.retrieval.tables.head_scores] (every head's score),
[`stability_table`][headcount.experiments.studies.retrieval.tables.stability_table] and its
[`stability_summary`][headcount.experiments.studies.retrieval.tables.stability_summary],
[`ablation_table`][headcount.experiments.studies.retrieval.tables.ablation_table],
[`curve_table`][headcount.experiments.studies.retrieval.tables.curve_table] and the targets of issue 33
([`targets`][headcount.experiments.studies.retrieval.tables.targets]).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from headcount.analysis.paired import paired_sign_flip_test
from headcount.experiments.studies.retrieval.config import RetrievalSettings
from headcount.experiments.studies.retrieval.plan import Names, budgets_of
from headcount.runtime.errors import HeadcountError

RUN_COLUMNS = ["method", "template", "seed", "n_examples", "n_counted", "needle_accuracy", "share_above",
               "share_low", "share_high", "threshold", "n_queries", "seconds"]
ABLATION_COLUMNS = ["unit", "ranking", "mask", "k", "n_units", "n_positive", "fraction", "accuracy_full", "accuracy_top",
                    "accuracy_random_mean", "accuracy_random", "n_sets", "n_as_harmful", "p_value", "p_min",
                    "difference", "p_value_prompts", "accuracy_random_theirs", "n_examples", "length"]
CURVE_COLUMNS = ["budget", "kind", "memory", "draw", "context", "n_full", "n_kv", "kv_bytes", "kv_bytes_predicted",
                 "full_cache_bytes", "kv_ratio", "needle_accuracy", "n_needles", "lm_loss", "seconds"]
#: the targets of issue 33 and the reference numbers beside them
TARGET_COLUMNS = ["target", "this run", "reference"]
#: Wu et al.'s published share of heads above 0.1 (their score files: Llama-2-7B-80K 3.2%,
#: Mistral-7B 4.2%, Qwen1.5-14B 3.8%, Mixtral 6.2%; 2.1-6.2% over their models)
PAPER_SHARE = "2.1-6.2% (Wu et al. 2024, 7B-14B models)"
#: the budget criterion: at least this much smaller KV cache, within this many points of full-cache accuracy
SMALLER, POINTS = 2.0, 0.05


def finished(store, name):
    """A finished job's result, or None (an unfinished job leaves a gap, not an error)."""
    try:
        return store.result(name) if store.has(name) else None
    except HeadcountError:
        return None


def _scores(store, name) -> dict | None:
    r = finished(store, name)
    return None if r is None or not (r.dir / "scores.json").is_file() else r.load_json("scores.json")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def score_runs(store, settings: RetrievalSettings, prefix: str = "") -> pd.DataFrame:
    """One row per scorer, template and haystack seed: examples, those counted, needle accuracy and
    (retrieval) the share of heads above the threshold with its bootstrap interval."""
    n = Names(prefix)
    rows = []
    for method in ("retrieval", "long-range"):
        for t in settings.templates:
            for seed in settings.seeds:
                name = n.score(method, t, seed)
                d = _scores(store, name)
                if d is None:
                    continue
                row = {"method": method, "template": t, "seed": seed, "n_examples": d.get("n_examples"),
                       "seconds": d.get("seconds")}
                r = d.get("retrieval")
                if r is not None:
                    share = r.get("share_above_threshold") or {}
                    row.update(n_counted=r.get("n_counted"), needle_accuracy=r.get("needle_accuracy"),
                               share_above=share.get("estimate"), share_low=share.get("low"),
                               share_high=share.get("high"), threshold=share.get("threshold"))
                else:
                    row["n_queries"] = d.get("n_queries")
                rows.append(row)
    return pd.DataFrame(rows, columns=RUN_COLUMNS)


def pooled(store, settings: RetrievalSettings, prefix: str = "") -> dict[str, dict]:
    """The pooled scores files (``retrieval``, ``long-range``) that exist."""
    n = Names(prefix)
    out = {m: _scores(store, n.pooled(m)) for m in ("retrieval", "long-range")}
    return {m: d for m, d in out.items() if d is not None}


def head_scores(store, settings: RetrievalSettings, prefix: str = "") -> pd.DataFrame:
    """Every query head's score in every run and pooled (``run``: ``<template>/seed<s>`` or
    ``pooled``), with the retrieval interval where there is one and the KV head it reads."""
    n = Names(prefix)
    rows = []
    names = [(m, f"{t}/seed{s}", n.score(m, t, s)) for m in ("retrieval", "long-range")
             for t in settings.templates for s in settings.seeds]
    names += [(m, "pooled", n.pooled(m)) for m in ("retrieval", "long-range")]
    for method, run, name in names:
        d = _scores(store, name)
        if d is None:
            continue
        grid = np.asarray([[np.nan if v is None else v for v in row] for row in d["heads"]], dtype=float)
        iv = d.get("interval") or {}
        low, high = (np.asarray(iv[k], dtype=float) if k in iv else np.full(grid.shape, np.nan) for k in ("low", "high"))
        group = grid.shape[1] // int(d["layout"]["n_kv_heads"])
        for layer in range(grid.shape[0]):
            for head in range(grid.shape[1]):
                rows.append({"method": method, "run": run, "layer": layer, "head": head, "kv_head": head // group,
                             "score": grid[layer, head], "low": low[layer, head], "high": high[layer, head]})
    return pd.DataFrame(rows, columns=["method", "run", "layer", "head", "kv_head", "score", "low", "high"])


def stability_table(store, prefix: str = "") -> pd.DataFrame:
    """The ``stability`` job's rows (one per pair of head sets), or an empty table."""
    r = finished(store, Names(prefix).stability())
    return pd.DataFrame(r.result["rows"]) if r is not None and r.result.get("rows") else pd.DataFrame()


def stability_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per head set, comparison (seeds, templates, scorers) and scorer: the pairs, the mean
    Jaccard with its range over pairs, the mean chance level, the mean Spearman with its range.

    >>> rows = pd.DataFrame({"head_set": ["s"] * 2, "unit": ["u"] * 2, "comparison": ["seeds"] * 2,
    ...                      "scorer": ["retrieval"] * 2, "jaccard": [0.5, 0.7], "chance": [0.1, 0.1],
    ...                      "spearman": [0.6, 0.8], "k_a": [4, 4], "k_b": [4, 4], "n": [10, 10]})
    >>> stability_summary(rows)[["pairs", "jaccard", "jaccard_min", "chance"]].iloc[0].tolist()
    [2.0, 0.6, 0.5, 0.1]
    """
    cols = ["head_set", "unit", "comparison", "scorer", "pairs", "k_mean", "n", "jaccard", "jaccard_min",
            "jaccard_max", "chance", "spearman", "spearman_min", "spearman_max", "tied"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for (hs, unit, comp, scorer), g in rows.groupby(["head_set", "unit", "comparison", "scorer"], sort=False):
        j, sp = pd.to_numeric(g["jaccard"], errors="coerce"), pd.to_numeric(g["spearman"], errors="coerce")
        out.append({"head_set": hs, "unit": unit, "comparison": comp, "scorer": scorer, "pairs": len(g),
                    "k_mean": float((g["k_a"].mean() + g["k_b"].mean()) / 2), "n": int(g["n"].max()),
                    "jaccard": j.mean(), "jaccard_min": j.min(), "jaccard_max": j.max(),
                    "chance": pd.to_numeric(g["chance"], errors="coerce").mean(),
                    "spearman": sp.mean(), "spearman_min": sp.min(), "spearman_max": sp.max(),
                    "tied": int(g["tied"].sum()) if "tied" in g else 0})
    return pd.DataFrame(out, columns=cols)


def ablation_table(store, settings: RetrievalSettings, prefix: str = "") -> pd.DataFrame:
    """One row per ablation unit: the full model's, the top set's and each random set's accuracy;
    ``p_value`` the head-set test (the top set's rank among the ``n_sets`` random sets: ``n_as_harmful``
    at least as harmful; ``p_min`` the smallest p they allow); ``difference`` and ``p_value_prompts``
    describe the examples (mean random - top success, sign-flip over examples), not a test of the
    sets; ``accuracy_random_theirs``: Wu et al.'s protocol (a random set per example), theirs."""
    rows = []
    for unit in settings.ablation.units if settings.ablation.enabled else ():
        r = finished(store, Names(prefix).ablation(unit))
        if r is None:
            continue
        d = r.result
        if "n_sets" not in d:  # saved before the head-set test: its p_value was the one over prompts
            d = {**d, "p_value": None, "p_value_prompts": d.get("p_value"), "mask": "remove"}
        rows.append({**{k: d.get(k) for k in ABLATION_COLUMNS},
                     "accuracy_random": " ".join(f"{x:.2f}" for x in d.get("accuracy_random", []))})
    return pd.DataFrame(rows, columns=ABLATION_COLUMNS)


def curve_table(store, settings: RetrievalSettings, prefix: str = "") -> pd.DataFrame:
    """One row per budget of the curve: measured and predicted KV bytes at the context length,
    their share of the full cache, needle accuracy and LM loss."""
    n = Names(prefix)
    rows = []
    for memory, kind, draw in budgets_of(settings) if settings.budgets.enabled else ():
        r = finished(store, n.curve(memory, kind, draw))
        if r is None:
            continue
        d = r.result
        rows.append({"budget": n.curve(memory, kind, draw)[len(prefix) + len("curve/"):], "kind": kind,
                     "memory": memory, "draw": draw, "seconds": r.meta.get("seconds"),
                     **{k: d.get(k) for k in CURVE_COLUMNS if k in d and k not in ("kind", "memory")}})
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def _successes(store, settings, prefix, memory, kind, draw=None):
    r = finished(store, Names(prefix).curve(memory, kind, draw))
    return None if r is None else np.asarray(r.result.get("successes", []), dtype=float)


def budget_verdict(store, settings: RetrievalSettings, prefix: str = "") -> dict | None:
    """The smallest ``scores`` budget whose measured KV cache is at least 2x smaller than the full
    one and whose needle accuracy is within 5 points of the full cache's, and how it fares against
    the uniform window at the same target (accuracy, and a one-sided paired sign-flip test over the
    held-out examples: H1 the budget answers more of them). None without the full cache's row;
    ``{"budget": None, ...}`` when no budget qualifies."""
    curve = curve_table(store, settings, prefix)
    full = curve[curve["kind"] == "full"]
    if full.empty:
        return None
    acc_full, bytes_full = float(full["needle_accuracy"].iloc[0]), float(full["kv_bytes"].iloc[0])
    ok = curve[(curve["kind"] == "scores") & (curve["kv_bytes"] * SMALLER <= bytes_full)
               & (curve["needle_accuracy"] >= acc_full - POINTS - 1e-12)].sort_values("kv_bytes")
    out = {"accuracy_full": acc_full, "bytes_full": bytes_full, "budget": None}
    if ok.empty:
        return out
    best = ok.iloc[0]
    out.update(budget=best["budget"], memory=float(best["memory"]), accuracy=float(best["needle_accuracy"]),
               kv_bytes=float(best["kv_bytes"]), kv_ratio=float(best["kv_bytes"]) / bytes_full)
    uni = curve[(curve["kind"] == "uniform") & (curve["memory"] == best["memory"])]
    if not uni.empty:
        a = _successes(store, settings, prefix, best["memory"], "scores")
        b = _successes(store, settings, prefix, best["memory"], "uniform")
        test = paired_sign_flip_test(a, b, alternative="greater") if a is not None and b is not None and len(a) == len(
            b) and len(a) else None
        out.update(uniform_accuracy=float(uni["needle_accuracy"].iloc[0]),
                   uniform_kv_bytes=float(uni["kv_bytes"].iloc[0]),
                   beats_uniform=bool(best["needle_accuracy"] > uni["needle_accuracy"].iloc[0]),
                   p_value=None if test is None else float(test.p_value))
    return out


def ablation_text(r) -> str:
    """One ablation row in words: the accuracies, the head-set test with its n, and theirs."""
    text = f"{r['accuracy_top']:.2f} vs {r['accuracy_random_mean']:.2f} (full {r['accuracy_full']:.2f}"
    if pd.notna(r.get("n_sets")):
        sets = [float(x) for x in str(r["accuracy_random"]).split()]
        text += (f"; {int(r['n_sets'])} random sets {min(sets):.2f}-{max(sets):.2f}); head-set p = {r['p_value']:.3g} "
                 f"({int(r['n_as_harmful'])} of {int(r['n_sets'])} random sets as harmful; the smallest p "
                 f"{int(r['n_sets'])} sets allow: {r['p_min']:.3g}), {int(r['n_examples'])} examples, mask {r['mask']}")
    else:  # saved before the head-set test
        text += f"); no head-set test (saved before it): prompt sign-flip p = {_num(r['p_value_prompts'], 3)}"
    if pd.notna(r.get("accuracy_random_theirs")):
        text += f"; Wu et al.'s protocol (theirs, a random set per example): {r['accuracy_random_theirs']:.2f}"
    return text


def versus_uniform(higher: bool, p_value, alpha: float) -> str:
    """What the budget's row may say against the uniform window: "beats it" only when the paired
    test rejects at ``alpha`` (a higher accuracy alone is "higher, not significant").

    >>> versus_uniform(True, 0.0625, 0.05)
    'higher, not significant (p = 0.0625, one-sided)'
    >>> versus_uniform(True, 0.01, 0.05), versus_uniform(False, 0.01, 0.05)
    ('beats it (p = 0.01, one-sided)', 'does not beat it (p = 0.01, one-sided)')
    """
    p = f" (p = {p_value:.3g}, one-sided)" if _finite(p_value) else " (no paired test)"
    if not higher:
        return "does not beat it" + p
    return ("beats it" if _finite(p_value) and p_value < alpha else "higher, not significant") + p


def _pct(x) -> str:
    return f"{100 * x:.1f}%" if _finite(x) else ""


def _num(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if _finite(x) else "n/a"


def targets(store, settings: RetrievalSettings, prefix: str = "") -> pd.DataFrame:
    """The targets of issue 33 in this run's numbers: the share of heads above 0.1 (pooled, with
    its interval), the stability of the retrieval heads across seeds and templates, top 5% vs
    random ablation per unit, and the smallest budget with a 2x smaller cache within 5 points."""
    rows = []
    pool = pooled(store, settings, prefix).get("retrieval")
    if pool is not None:
        share = pool["retrieval"].get("share_above_threshold") or {}
        iv = f" [{_pct(share.get('low'))}, {_pct(share.get('high'))}]" if _finite(share.get("low")) else ""
        heads = int(np.isfinite(np.asarray(pool["heads"], dtype=float)).sum())
        text = (f"{_pct(share.get('estimate'))}{iv} of {heads} heads" if _finite(share.get("estimate"))
                else "n/a: no example counts (no retrieval succeeded)")
        rows.append({"target": f"share of query heads with retrieval score > {share.get('threshold', 0.1):g} "
                               f"(pooled over {pool['n_examples']} example{'' if pool['n_examples'] == 1 else 's'}, "
                               f"{settings.scoring.level:.0%} bootstrap "
                               "interval over them)",
                     "this run": text, "reference": PAPER_SHARE})
    summ = stability_summary(stability_table(store, prefix))
    first = f"top {settings.stability.fractions[0]:.0%} query heads"
    for comparison, what in (("seeds", "haystack seeds"), ("templates", "prompt templates")):
        g = summ[(summ["head_set"] == first) & (summ["comparison"] == comparison) & (summ["scorer"] == "retrieval")]
        if len(g):
            x = g.iloc[0]
            text = (f"{_num(x['jaccard'])} ({_num(x['chance'])}) / {_num(x['spearman'])}, {x['pairs']} pairs"
                    if _finite(x["jaccard"]) else f"n/a: no head scores above 0 (Spearman {_num(x['spearman'])})")
            rows.append({"target": f"retrieval heads stable across {what}: {first}, Jaccard (chance) / Spearman",
                         "this run": text,
                         "reference": "QRHead #6/#8: detected heads change with template and seed"})
    ab = ablation_table(store, settings, prefix)
    for _, r in ab.iterrows():
        unit = "query heads" if r["unit"] == "heads" else "KV heads (whole groups)"
        rows.append({"target": f"needle accuracy, top {r['fraction']:.0%} {unit} masked vs as many random",
                     "this run": ablation_text(r), "reference": "Wu et al.: masking retrieval heads breaks retrieval, "
                                                                "random heads do not"})
    v = budget_verdict(store, settings, prefix)
    if v is not None:
        what = f"smallest budget with a >= {SMALLER:g}x smaller KV cache within {POINTS * 100:g} points of full-cache accuracy"
        if v["budget"] is None:
            text = f"none (full cache {v['accuracy_full']:.2f})"
        else:
            text = (f"{v['budget']}: {v['kv_ratio']:.2f} of the cache, accuracy {v['accuracy']:.2f} "
                    f"(full {v['accuracy_full']:.2f})")
            if "uniform_accuracy" in v:
                text += (f"; uniform window at the same target {v['uniform_accuracy']:.2f}: "
                         + versus_uniform(v["beats_uniform"], v.get("p_value"), 1 - settings.scoring.level))
        rows.append({"target": what, "this run": text,
                     "reference": "DuoAttention: total long-context inference memory on GPU -1.67x (GQA; weights, "
                                  "activations and KV cache together, not KV bytes) at minimal accuracy loss"})
    return pd.DataFrame(rows, columns=TARGET_COLUMNS)
