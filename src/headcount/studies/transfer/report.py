"""The transfer study's report: the summary, and the sections of figures and tables.

:func:`transfer_summary` and :func:`transfer_sections` work under a job-name prefix, so another
study (the demo) can include a transfer part; :func:`report` is the study type's ``report_fn``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...analysis.paired import at_chance, seed_interval
from ...analysis.helpers import LEVEL
from ...report import ReportContent, ReportFigure, ReportTable, Section
from ...report.format import finite, nan_runs, seed_cell
from .config import TransferConfig, TransferSettings
from .figures import figures
from .plan import COMPARISONS, plan_of
from .tables import artifact, fmt, prunability_table, stat_rows, transfer_tables

#: Significance level of the summary's verdicts.
ALPHA = 0.05

#: The comparisons the summary states: (comparison, label, whether it rests on the MLM head).
SUMMARY_COMPARISONS: tuple[tuple[str, str, bool], ...] = (
    ("mlm-vs-task", "MLM vs task (fine-tuned)", True),
    ("mlm-vs-task-before", "MLM vs task (frozen encoder)", True),
    ("embedding-vs-task", "Embedding (SimCSE) vs task (fine-tuned)", False),
    ("embedding-vs-task-before", "Embedding (SimCSE) vs task (frozen encoder)", False),
    ("mlm-vs-embedding", "MLM vs embedding (pre-trained)", True),
    ("task-before-vs-after", "Task importance before vs after fine-tuning", False),
    ("task-vs-task", "Task vs task", False),
    ("seed-vs-seed", "Seed vs seed (same task)", False),
)


def mlm_caveat(tables: dict) -> str:
    """The tag every MLM-side sentence carries: which masked-LM head the MLM numbers rest on, and
    its accuracy (the fitted head's held-out masked-token accuracy, from the MLM scoring jobs'
    ``mlm_head``), from ``tables["mlm"]``.

    >>> mlm_caveat({"mlm": pd.DataFrame({"corpus": ["amazon"], "head": ["fitted"], "head_heldout_accuracy": [0.093]})})
    '† MLM head fitted on the frozen encoder, held-out masked-token accuracy 0.09 (amazon): MLM importance is importance for that head'
    """
    m = tables.get("mlm")
    if m is None or m.empty or "head" not in m:
        return "† which MLM head was used is not in this run's tables"
    fitted = m[m["head"] == "fitted"]
    if fitted.empty:
        accs = ", ".join(f"{fmt(r.get('validation_accuracy'))} ({r['corpus']})" for _, r in m.iterrows())
        return f"† the checkpoint's own MLM head, masked-token accuracy {accs}"
    accs = ", ".join(f"{fmt(r.get('head_heldout_accuracy'))} ({r['corpus']})" for _, r in fitted.iterrows())
    return (f"† MLM head fitted on the frozen encoder, held-out masked-token accuracy {accs}: MLM importance is "
            "importance for that head")


def _same_pair(df: pd.DataFrame, row) -> pd.DataFrame:
    """The rows of ``df`` with ``row``'s comparison, statistic, view, task and task_b (None and NaN alike)."""
    d = df[(df["comparison"] == row["comparison"]) & (df["statistic"] == row["statistic"])]
    if "view" in d and "view" in row:
        d = d[d["view"] == row["view"]]
    if "task" in d:
        d = d[d["task"] == row.get("task")]
    if "task_b" in d:
        tb = row.get("task_b")
        d = d[d["task_b"].isna()] if pd_isna(tb) else d[d["task_b"] == tb]
    return d


def coherence_interval(tables: dict, row, level: float = LEVEL) -> tuple[float, float, str]:
    """``(low, high, how)`` of a ``coherence_summary`` row: its interval (``how``: its ``ci``), else
    the t interval over the per-seed estimates of ``tables["coherence"]``; NaN bounds without either."""
    low, high = row.get("low"), row.get("high")
    if _finite(low) and _finite(high):
        ci = row.get("ci")
        return float(low), float(high), ci if isinstance(ci, str) and ci else "bootstrap"
    coh = tables.get("coherence")
    if coh is not None and not coh.empty and {"comparison", "statistic", "estimate"} <= set(coh):
        iv = seed_interval(pd.to_numeric(_same_pair(coh, row)["estimate"], errors="coerce"), level)
        if _finite(iv["low"]):
            return iv["low"], iv["high"], "t interval over seeds"
    return float("nan"), float("nan"), ""


def coherence_phrase(tables: dict, row, level: float = LEVEL, alpha: float = ALPHA) -> str:
    """One task's coherence statistic: ``estimate [low, high] (n=k)``, ``: at chance`` when the
    interval contains the chance level, and the permutation verdict (``p <= ... on each of k seeds``
    or ``not significant (largest p over k seeds = ...)``) when the statistic has p-values.

    >>> r = pd.Series({"comparison": "c", "statistic": "jaccard@0.25", "task": "amazon", "task_b": None,
    ...                "estimate": 0.16, "low": 0.07, "high": 0.25, "chance": 0.1429, "n_finite": 3})
    >>> coherence_phrase({}, r)
    'amazon 0.16 [0.07, 0.25] (n=3): at chance (the interval contains 0.14)'
    """
    task, tb = row.get("task"), row.get("task_b")
    name = str(task) if pd_isna(tb) or tb == task else f"{task} / {tb}"
    n = row.get("n_finite", row.get("n"))
    n = int(n) if _finite(n) else None
    low, high, _ = coherence_interval(tables, row, level)
    text = f"{name} {fmt(row.get('estimate'))}"
    text += f" [{low:.2f}, {high:.2f}]" if _finite(low) and _finite(high) else " (no interval)"
    text += f" (n={n})" if n is not None else ""
    chance, stat = row.get("chance"), str(row.get("statistic", ""))
    if not _finite(chance) and stat.startswith(("spearman", "kendall")):  # a table without the column
        chance = 0.0
    if at_chance(low, high, chance):
        text += f": at chance (the interval contains {float(chance):.2f})"
    p = row.get("p_value_max")
    if _finite(p):
        over = f"each of {n} seeds" if n and n > 1 else "its seed"
        text += (f", p <= {float(p):.3g} on {over}" if float(p) < alpha else
                 f", not significant ({'largest p over ' + str(n) + ' seeds' if n and n > 1 else 'p'} = {float(p):.3g})")
    return text


def coherence_sentence(tables: dict, comparison: str, label: str, settings: TransferSettings,
                       caveat: str = "") -> str:
    """The summary's sentence on one comparison: per task, Spearman with its interval, ``at chance``
    where the interval contains 0, and the permutation verdict; then the top-25% Jaccard with its
    interval and ``at chance`` where it contains the Jaccard chance level. ``""`` without rows.

    Args:
        tables: :func:`~.tables.transfer_tables` output (``coherence_summary``; ``coherence`` for
            the fallback interval; the application view).
        comparison: a key of :data:`~.plan.COMPARISONS`.
        label: its name in the text.
        settings: the part's settings (``stats``: level, fractions, permutation).
        caveat: appended to the label (the MLM head's, :func:`mlm_caveat`, for MLM-side comparisons).
    """
    s = tables["coherence_summary"]
    d = stat_rows(s, comparison, "spearman")
    if d.empty:
        return ""
    level = settings.stats.level
    how = {coherence_interval(tables, r, level)[2] for _, r in d.iterrows()} - {""}
    test = ("heads permuted within layers" if settings.stats.permutation == "within-layer" else "heads permuted globally")
    text = (f"{label}{f' ({caveat})' if caveat else ''}: Spearman, mean over seeds [{level:.0%} interval"
            f"{': ' + ', '.join(sorted(how)) if how else ''}], p: two-sided permutation test, {test}: "
            + "; ".join(coherence_phrase(tables, r, level) for _, r in d.iterrows()) + ".")
    j = stat_rows(s, comparison, "jaccard@0.25") if 0.25 in settings.stats.fractions else d.iloc[0:0]
    if len(j):
        chance = j["chance"].iloc[0] if "chance" in j else None
        text += (f" Top-25% Jaccard (chance {fmt(chance)}): "
                 + "; ".join(coherence_phrase(tables, r.drop(labels=["p_value_max"], errors="ignore"), level)
                             for _, r in j.iterrows()) + ".")
    return text


def _mlm_accuracy(r) -> str:
    """An MLM accuracy with its binomial (Wilson) 95% interval over the masked tokens, when counted."""
    acc, n = r.get("validation_accuracy"), r.get("validation_masked_tokens")
    if not _finite(acc):
        return "n/a"
    if not _finite(n) or int(n) < 1:
        return f"{fmt(acc)} (no interval: masked tokens not counted)"
    from scipy.stats import binomtest

    ci = binomtest(round(float(acc) * int(n)), int(n)).proportion_ci(method="wilson")
    return f"{fmt(acc)} [{ci.low:.2f}, {ci.high:.2f}] (Wilson interval over {int(n):,} masked tokens, approximate: tokens of one text are not independent)"


def _per_seed_removable(tables: dict, task, threshold: float) -> dict[str, list[float]]:
    """Per order: the removable share of each seed's own curve (task objective, application view)."""
    c = tables.get("curves")
    if c is None or c.empty or not {"seed", "objective", "view", "order"} <= set(c):
        return {}
    c = c[(c["task"] == task) & (c["objective"] == "task") & (c["view"] == "application") & c["seed"].notna()]
    out: dict[str, list[float]] = {}
    for _, g in c.groupby("seed", sort=True):
        for _, r in prunability_table(g, threshold).iterrows():
            out.setdefault(r["order"], []).append(float(r["removable_fraction"]))
    return out


def prunability_sentence(tables: dict, settings: TransferSettings, caveat: str = "") -> str:
    """Heads removable at the threshold, per task and order (the mean curve), with the per-seed
    shares' mean ± std (n) when the curves are there. ``""`` without a prunability table."""
    pr = tables["prunability"]
    if pr.empty:
        return ""
    threshold = settings.before_after.threshold
    d = pr[(pr["objective"] == "task") & (pr["view"] == "application")]
    orders = ("task", "mlm", "embedding", "random")
    parts = []
    for t, g in d.groupby("task", sort=False):
        txt = f"{t}: " + ", ".join(f"{o} {_share(g[g['order'] == o]['removable_fraction'].iloc[0])}"
                                   for o in orders if (g["order"] == o).any())
        seeds = _per_seed_removable(tables, t, threshold)
        spread = []
        for o in orders:
            iv = seed_interval(seeds.get(o, []))
            if iv["n"] > 1:
                spread.append(f"{o} {iv['mean']:.0%} ± {iv['std']:.0%} (n={iv['n']})")
        if spread:
            txt += " (each seed's curve, mean ± std: " + ", ".join(spread) + ")"
        parts.append(txt)
    return (f"Heads removable with >= {threshold:.0%} of the fine-tuned score (no retraining), by order"
            + (f" (the mlm order: {caveat})" if caveat else "") + ": " + "; ".join(parts) + ".")


def deduction_sentence(tables: dict, settings: TransferSettings, caveat: str = "") -> str:
    """The acceptable deduction per task, with the pruned-then-fine-tuned score at that level
    (mean ± std, n) against the threshold share of the full score. ``""`` without the table."""
    ad = tables["acceptable_deduction_summary"]
    if ad.empty:
        return ""
    threshold = settings.before_after.threshold
    ba = tables.get("before_after")
    parts = []
    for _, r in ad.iterrows():
        if _no_full_score(r):
            parts.append(f"{r['task']}: {NA}")
            continue
        if r["level"] is None or pd_isna(r["level"]):
            parts.append(f"{r['task']}: none")
            continue
        txt = f"{r['task']}: {r['level']:.0%} of heads, MLM loss +{r['mlm_loss_increase']:.2f}"
        if ba is not None and not ba.empty and {"task", "level", "setting", "score"} <= set(ba):
            x = ba[(ba["task"] == r["task"]) & (ba["setting"] == "prune (mlm) then fine-tune")
                   & np.isclose(ba["level"].astype(float), float(r["level"]))]
            if len(x):
                x = x.iloc[0]
                score = cell(x["score"], x.get("score_std"), n=x.get("n"), n_total=x.get("n_total"))
                n = x.get("n")
                full = r.get("full_score")
                txt += (f" (fine-tuned score there {score}" + (f", n={int(n)}" if _finite(n) else "")
                        + (f", against {threshold:g} x full = {threshold * float(full):.2f}" if _finite(full) else "")
                        + ")")
        parts.append(txt)
    return (f"Acceptable deduction (prune by MLM, then fine-tune, >= {threshold:.0%}"
            + (f"; {caveat}" if caveat else "") + "): " + "; ".join(parts) + ".")


def transfer_summary(tables: dict, settings: TransferSettings, prefix: str = "") -> str:
    """The headline numbers as text (for the report's summary): every estimate with its interval
    (or mean ± std over seeds, n), ``at chance`` wherever an interval contains the chance level,
    ``not significant`` wherever a p-value is >= 0.05, and the MLM head's caveat (:func:`mlm_caveat`)
    on every sentence that rests on it.

    >>> transfer_summary(transfer_tables(store, config), config)    # doctest: +SKIP
    'Masked LM of the pre-trained model: ...'
    """
    caveat = mlm_caveat(tables)
    parts = []
    m = tables.get("mlm")
    if m is not None and not m.empty:
        fitted = "head" in m and (m["head"] == "fitted").any()
        parts.append("Masked LM of the pre-trained model: " + "; ".join(
            f"{r['corpus']}: accuracy {_mlm_accuracy(r)}, loss {fmt(r.get('validation_loss'))} "
            + (f"(head fitted on the frozen encoder, its held-out masked-token accuracy "
               f"{fmt(r.get('head_heldout_accuracy'))})" if r.get("head") == "fitted" else "(its own head)")
            for _, r in m.iterrows())
            + (f". {caveat}, not evidence about masked-LM pre-training as such." if fitted else "."))
    for comparison, label, mlm_side in SUMMARY_COMPARISONS:
        txt = coherence_sentence(tables, comparison, label, settings, caveat if mlm_side else "")
        if txt:
            parts.append(txt)
    for txt in (prunability_sentence(tables, settings, caveat), deduction_sentence(tables, settings, caveat)):
        if txt:
            parts.append(txt)
    return "\n\n".join(parts)


# =============================================================================================
# the paper's main tables, with this run's numbers
# =============================================================================================
def _finite(x) -> bool:
    return finite(x) and isinstance(x, (int, float, np.floating, np.integer))


#: What a removable share reads when the full model's metric is undefined (NaN).
NA = "n/a (full score undefined)"


def _share(x) -> str:
    """A removable share as a percentage; :data:`NA` when it is NaN (the full metric is undefined).

    >>> _share(0.25), _share(float("nan"))
    ('25%', 'n/a (full score undefined)')
    """
    return f"{float(x):.0%}" if _finite(x) else NA


def _no_full_score(row) -> bool:
    """Whether an acceptable-deduction summary row has no full fine-tuned score (NaN on every seed)."""
    return "full_score" in row and not _finite(row["full_score"])


def cell(mean, std=None, low=None, high=None, digits: int = 2, n=None, n_total=None) -> str:
    """``mean ± std [low, high]`` with the parts that are defined, ``(n=k of m)`` when only k of
    m seeds gave a number (:func:`headcount.report.format.seed_cell`); blank without a mean.

    >>> cell(0.3141, 0.02, 0.2, 0.4), cell(0.5), cell(float("nan")), cell(0.5, float("nan"), None, 0.7)
    ('0.31 ± 0.02 [0.20, 0.40]', '0.50', '', '0.50')
    >>> cell(**_over_seeds(pd.Series([0.345, float("nan")])), digits=3)
    '0.345 (n=1 of 2)'
    """
    return seed_cell(mean, std, low, high, n=n, n_total=n_total, digits=digits)


def _over_seeds(values: pd.Series) -> dict:
    """``mean``, ``std``, ``n`` (finite values) and ``n_total`` over seeds, for ``cell(**...)``; NaN left out, counted."""
    v = pd.to_numeric(values, errors="coerce")
    ok = v.dropna()
    mean = float(ok.mean()) if len(ok) else float("nan")
    std = float(ok.std(ddof=1)) if len(ok) > 1 else float("nan")
    return {"mean": mean, "std": std, "n": len(ok), "n_total": len(v)}


def main_coherence(tables: dict, settings: TransferSettings) -> pd.DataFrame:
    """Coherence of head importance, one row per comparison and task: mean ± std over seeds
    [hierarchical bootstrap interval over seeds and examples]; Spearman on layer-normalised
    grids; the largest within-layer and global permutation p over seeds."""
    coh = tables["coherence"]
    coh = coh[coh["view"] == "application"]
    summ = tables["coherence_summary"]
    summ = summ[summ["view"] == "application"]
    stats = [("spearman", "Spearman"), ("kendall", "Kendall"),
             *[(f"jaccard@{f:g}", f"top-{f:.0%} Jaccard (chance {f / (2 - f):.2f})") for f in settings.stats.fractions],
             ("layer_mass_l1", "layer-mass L1"), ("spearman@layer-norm", "Spearman, layer-normalised")]
    rows = []
    for comparison, label in COMPARISONS.items():
        d = coh[coh["comparison"] == comparison]
        for (task, task_b), g in d.groupby(["task", "task_b"], dropna=False, sort=False):
            row = {"comparison": label,
                   "task": task if pd.isna(task_b) or task_b == task else f"{task} / {task_b}",
                   "pairs": int(g["pair"].nunique())}
            same = summ[(summ["comparison"] == comparison) & (summ["task"] == task)
                        & ((summ["task_b"] == task_b) | (summ["task_b"].isna() & pd.isna(task_b)))]
            for stat, name in stats:
                x = g[g["statistic"] == stat]
                if x.empty:  # results saved before the statistic existed
                    continue
                h = same[same["statistic"] == stat]
                low, high = (h["low"].iloc[0], h["high"].iloc[0]) if len(h) else (None, None)
                row[name] = cell(**_over_seeds(x["estimate"]), low=low, high=high)
            for col, header in (("p_value", f"Spearman p {settings.stats.permutation} (max)"),
                                ("p_value_global", "Spearman p global (max)")):
                if col == "p_value_global" and settings.stats.permutation == "global":
                    continue
                p = pd.to_numeric(g[g["statistic"] == "spearman"][col], errors="coerce").max()
                row[header] = "" if not _finite(p) else f"{p:.3g}"
            rows.append(row)
    return pd.DataFrame(rows)


def main_pruning(tables: dict, settings: TransferSettings) -> pd.DataFrame:
    """Per task: full and head-only scores (mean ± std over seeds), the share of heads removable by
    each order without retraining, and the acceptable deduction."""
    ft, pr, ad = tables["finetune"], tables["prunability"], tables["acceptable_deduction_summary"]
    pct = f"{settings.before_after.threshold:.0%}"
    rows = []
    for t, g in ft.groupby("task", sort=False):
        row = {"task": t, "metric": g["metric"].iloc[0], "seeds": len(g),
               "fine-tuned": cell(**_over_seeds(g["fine_tuned"])),
               "head only (frozen encoder)": cell(**_over_seeds(g["head_only"]))}
        for col in [c for c in ft.columns if c.startswith("fine_tuned_")]:  # extra dev sets: MNLI-mm
            row[f"fine-tuned ({col[len('fine_tuned_'):]})"] = cell(**_over_seeds(g[col])) if g[col].notna().any() else ""
        d = pr[(pr["task"] == t) & (pr["objective"] == "task") & (pr["view"] == "application")] if len(pr) else pr
        for order in ("task", "mlm", "random"):
            x = d[d["order"] == order] if len(d) else d
            txt = _share(x["removable_fraction"].iloc[0]) if len(x) else ""
            raw = x["removable_fraction_raw"].iloc[0] if len(x) and "removable_fraction_raw" in x else None
            if _finite(raw) and raw != x["removable_fraction"].iloc[0]:  # a level passes after a lower one failed
                txt += f" (raw curve {float(raw):.0%})"
            row[f"removable at {pct}, by {order}"] = txt
        a = ad[ad["task"] == t] if len(ad) else ad
        level = a["level"].iloc[0] if len(a) else None
        row["acceptable deduction: heads removed"] = (f"{float(level):.0%}" if _finite(level) else
                                                      NA if len(a) and _no_full_score(a.iloc[0]) else "")
        raw = a["level_raw"].iloc[0] if len(a) and "level_raw" in a else None
        if _finite(raw) and raw != level:  # acceptable again above a level that was not
            row["acceptable deduction: heads removed"] += f" (raw curve {float(raw):.0%})"
        loss = a["mlm_loss_increase"].iloc[0] if len(a) else None
        row["acceptable deduction: MLM loss +"] = cell(loss)
        rows.append(row)
    return pd.DataFrame(rows)


def main_before_after(tables: dict) -> pd.DataFrame:
    """Per task and level: pruned before fine-tuning vs after (mean ± std over seeds)."""
    ba = tables["before_after"]
    if ba.empty:
        return pd.DataFrame()
    rows = []
    for (t, level), g in ba.groupby(["task", "level"], sort=False):
        row = {"task": t, "heads removed": f"{level:.0%}"}
        for _, r in g.iterrows():
            row[r["setting"]] = cell(r["score"], r.get("score_std"), n=r.get("n"), n_total=r.get("n_total"))
        row["full fine-tuned"] = cell(g["full"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows)


def main_section(tables: dict, settings: TransferSettings, art: str = "") -> Section:
    """The first section: the paper's questions answered with this run's numbers."""
    ts = [ReportTable(f"{art}main_coherence", main_coherence(tables, settings),
                      caption="Do MLM and task importance agree? Application view (depth x head); mean ± std over "
                              "fine-tuning seeds, [hierarchical bootstrap over seeds and examples, t interval; "
                              "grids of the same examples resampled as pairs by example id]; (n=k of m): only k of "
                              "m seeds gave a number (see the runs that produced NaN). Layer-normalised: each "
                              "layer's scores z-scored first. p: two-sided permutation p-value, the largest over "
                              "seeds, " + ("heads permuted within their layer (the default test) and over all heads."
                                           if settings.stats.permutation == "within-layer" else "over all heads.")),
          ReportTable(f"{art}main_pruning", main_pruning(tables, settings),
                      caption="Fine-tuned and head-only scores (mean ± std over seeds); the largest share of heads "
                              "removable (gates, no retraining) such that at it and every lower level the mean score "
                              "stays at the threshold share of the full model's (raw curve: the largest passing "
                              "level, when a level passes after a lower one failed); the acceptable deduction (prune "
                              "by MLM importance, then fine-tune; the same contiguous rule).")]
    nan = nan_table(tables)
    if not nan.empty:
        ts.append(ReportTable(f"{art}nan_runs", nan,
                              caption="Runs that produced NaN, and why: they are left out of the means over seeds "
                                      "(cells marked (n=k of m))."))
    ba = main_before_after(tables)
    if not ba.empty:
        ts.append(ReportTable(f"{art}main_before_after", ba,
                              caption="Pruning before fine-tuning (by MLM importance of the pre-trained model, or at "
                                      "random) vs after (the fine-tuned model by task or MLM importance, not "
                                      "retrained): downstream score, mean ± std over seeds."))
    return Section("Main results",
                   "The questions of Chiang & Chen (2021), answered with this run's numbers. The paper has no "
                   "public code and headcount records no published values to set beside these; the figures and "
                   "the raw tables (folded, with their CSV files) follow.", tables=ts)


def nan_table(tables: dict) -> pd.DataFrame:
    """The runs that produced NaN, and why: fine-tuned and head-only scores, pruned-then-fine-tuned
    scores (seeds missing from a mean), removable shares and acceptable deductions that are n/a
    because the full model's metric is NaN, coherence statistics."""
    undefined = "the metric is undefined (e.g. a constant prediction under a correlation metric)"
    rows = []
    ft = tables["finetune"]
    for col, what in (("fine_tuned", "fine-tuned"), ("head_only", "head only (frozen encoder)")):
        if col in ft:
            rows += [{"table": "finetune", "run": f"{r['task']} seed {r['seed']}, {what}", "value": col,
                      "why": undefined} for r in nan_runs(ft.to_dict("records"), col, ["task", "seed"])]
    ba = tables.get("before_after")
    if ba is not None and not ba.empty and "n_total" in ba:
        for _, r in ba[ba["n"] < ba["n_total"]].iterrows():
            rows.append({"table": "before_after", "run": f"{r['task']} {r['setting']} at {r['level']:.0%}",
                         "value": f"score: {int(r['n_total'] - r['n'])} of {int(r['n_total'])} seeds NaN",
                         "why": undefined})
    no_full = "the full model's metric is undefined (NaN), so no share of it can be kept: n/a, not 0% removable"
    pr = tables.get("prunability")
    if pr is not None and not pr.empty and "removable_fraction" in pr:
        bad = pr[pd.to_numeric(pr["removable_fraction"], errors="coerce").isna()]
        for (t, objective, view), g in bad.groupby(["task", "objective", "view"], sort=False):
            rows.append({"table": "prunability", "run": f"{t} {objective} curve ({view})",
                         "value": "removable_fraction by " + ", ".join(g["order"].astype(str)), "why": no_full})
    ad = tables.get("acceptable_deduction_summary")
    if ad is not None and not ad.empty and "full_score" in ad:
        for _, r in ad[pd.to_numeric(ad["full_score"], errors="coerce").isna()].iterrows():
            rows.append({"table": "acceptable_deduction_summary", "run": f"{r['task']}", "value": "level",
                         "why": no_full})
    coh = tables["coherence"]
    if not coh.empty:
        bad = coh[pd.to_numeric(coh["estimate"], errors="coerce").isna()]
        for (pair, view), g in bad.groupby(["pair", "view"], sort=False):
            rows.append({"table": "coherence", "run": f"{pair} ({view})", "value": ", ".join(g["statistic"]),
                         "why": "a score grid is constant (every head scored alike, e.g. all zero): rank "
                                "statistics are undefined"})
    return pd.DataFrame(rows, columns=["table", "run", "value", "why"])


def pd_isna(x) -> bool:
    try:
        return x is None or bool(np.isnan(x))
    except TypeError:
        return False


def transfer_sections(store, settings: TransferSettings, prefix: str = "", tables: dict | None = None) -> list:
    """The report sections of a finished transfer part (figures and tables from saved results).

    Args:
        store: the run's :class:`~headcount.runner.RunStore`.
        settings: the part's settings.
        prefix: the job-name prefix given to :func:`transfer_jobs`; figure and table names get
            it too (``/`` -> ``-``), so several parts fit in one report.
        tables: :func:`transfer_tables` output, when already computed.

    Returns:
        A list of :class:`~headcount.report.Section`.

    >>> sections = transfer_sections(store, config)      # doctest: +SKIP
    """
    p = plan_of(settings)
    art = artifact(prefix)
    tables = tables if tables is not None else transfer_tables(store, settings, prefix)
    figs = figures(tables, settings, p, art)

    def F(*names):
        return [ReportFigure(f"{art}{nm}", figs[f"{art}{nm}"][0], figs[f"{art}{nm}"][1])
                for nm in names if f"{art}{nm}" in figs]

    def T(name, caption="", **kw):  # a raw table: folded below the figures
        return ReportTable(f"{art}{name}", tables[name], caption=caption or name, collapsed=True, **kw)

    coh_cols = ["comparison", "view", "task", "task_b", "statistic", "grids", "estimate", "estimate_min",
                "estimate_max", "low", "high", "ci", "p_value_max", "p_value_global_max", "chance", "n", "n_finite"]
    sections = [
        main_section(tables, settings, art),
        Section("Importance of heads: MLM and tasks",
                "Gate-gradient importance (Michel et al.) on the same training examples: masked LM on the "
                "pre-trained model, the task on the pre-trained encoder with a fitted head, and the task on the "
                "fine-tuned model. All scores are in head_scores.csv.",
                figures=F("heatmaps", "scatter", "shared-heads"),
                tables=[T("finetune", "Fine-tuned and head-only (frozen encoder) validation scores."),
                        T("mlm", "The masked-LM head (from the checkpoint, or fitted on the frozen encoder: its "
                                 "held-out loss/accuracy) and the pre-trained model's MLM loss/accuracy on each "
                                 "task's validation texts.")]),
        Section("Coherence",
                "Spearman and Kendall rank correlation, Jaccard overlap of the top 10/25/50% heads, and the L1 "
                "distance of per-layer importance shares, on the raw grids and (statistics ending @layer-norm, "
                "grids: layer-normalised) on grids whose layers are each z-scored. Per seed in coherence.csv "
                "(percentile bootstrap intervals over scoring examples, paired by example id where both grids "
                "come from the same examples (pairing); two-sided permutation p-values: p_value heads permuted "
                "within their layer by default, p_value_global over all heads); here the mean over seeds "
                "(estimate_min/max: range over seeds; low/high: hierarchical bootstrap over seeds and examples, "
                "t interval (ci), approximate where the pairs share a grid: the MLM grid of every seed, "
                "seed-vs-seed pairs; p_value_max, p_value_global_max: the largest over seeds; n_finite of n: "
                "seeds with a number; chance: the expected value for unrelated scores).",
                figures=F("correlation-matrix", "layer-mass"),
                tables=[ReportTable(f"{art}coherence_summary", tables["coherence_summary"][coh_cols],
                                    caption="Coherence, mean over seeds.", max_rows=80, collapsed=True),
                        T("coherence", "Coherence per seed.", max_rows=20),
                        T("layer_mass", "Share of importance per layer.", max_rows=12),
                        T("head_scores", "Every head score.", max_rows=12)]),
        Section("Prunability",
                "Heads removed in order of importance (computed once; per-layer L2 normalised) and applied as "
                "gates to the fine-tuned model (task metric) or the pre-trained model (MLM accuracy), without "
                "retraining. removable_fraction: the largest level such that at it and every lower level the "
                "mean score stays at or above the threshold share of the full model's (removable_fraction_raw: "
                "the largest passing level, ignoring failures below it).",
                figures=F("prunability"),
                tables=[T("prunability", "Removable fraction, score at 50% and area under each curve."),
                        T("curves", "Every point of every curve.", max_rows=20)]),
    ]
    if not tables["before_after"].empty:
        sections.append(Section(
            "Pruning before vs after fine-tuning",
            "Pruned before: the pre-trained model without its least MLM-important heads, fine-tuned with the "
            "full model's settings. Pruned after: the fine-tuned model with its least important heads (by task "
            "or by MLM importance) gated off, not retrained.",
            figures=F("before-after"), tables=[T("before_after", "Scores before vs after, per level.")]))
        sections.append(Section(
            "Acceptable deduction",
            "For each task, the largest masked-LM loss increase of the pruned pre-trained model at which the "
            "fine-tuned pruned model keeps the threshold share of the full fine-tuned score, over the levels up "
            "to the largest one such that it and every lower level are acceptable (level_raw: ignoring failures "
            "below).",
            figures=F("acceptable-deduction"),
            tables=[T("acceptable_deduction_summary", "Acceptable deduction per task."),
                    T("acceptable_deduction", "Every level.")]))
    return sections


def report(store, config: TransferConfig):
    """``report_fn`` of the ``transfer`` study type.

    >>> report(RunStore("runs/transfer-offline"), config).sections[0].title   # doctest: +SKIP
    'Main results'
    """
    tables = transfer_tables(store, config)
    return ReportContent(summary=transfer_summary(tables, config), sections=transfer_sections(store, config, tables=tables))
