"""The transfer study's report: the summary, and the sections of figures and tables.

[`transfer_summary`][headcount.experiments.studies.transfer.summary.transfer_summary] and [`transfer_sections`][headcount.experiments.studies.transfer.report.transfer_sections] work under a job-name prefix, so another
study (the demo) can include a transfer part; [`report`][headcount.experiments.studies.transfer.report.report] is the study type's ``report_fn``.
Every label names the objective in MLM's role as [`objective_words`][headcount.experiments.studies.transfer.tables.objective_words] does (a decoder's
next-token LM with ``objectives: [lm]``); table and figure names stay.
"""

from __future__ import annotations

import pandas as pd

from headcount.experiments.report import ReportContent, ReportFigure, ReportTable, Section, glance_table, headline_of
from headcount.experiments.report.format import nan_runs
from headcount.experiments.studies.transfer.config import TransferConfig, TransferSettings
from headcount.experiments.studies.transfer.figures import figures
from headcount.experiments.studies.transfer.plan import COMPARISONS, plan_of
from headcount.experiments.studies.transfer.summary import (
    MARK,
    NA,
    _finite,
    _no_full_score,
    _over_seeds,
    _share,
    cell,
    stat_rows,
    transfer_caveats,
    transfer_summary,
)
from headcount.experiments.studies.transfer.tables import artifact, objective_words, transfer_tables


def main_coherence(tables: dict, settings: TransferSettings) -> pd.DataFrame:
    """Coherence of head importance, one row per comparison and task: mean ± std over seeds
    [hierarchical bootstrap interval over seeds and examples]; Spearman on layer-normalised
    grids; the largest within-layer and global permutation p over seeds."""
    coh = tables["coherence"]
    coh = coh[coh["view"] == "application"]
    summ = tables["coherence_summary"]
    summ = summ[summ["view"] == "application"]
    w = objective_words(settings)
    stats = [("spearman", "Spearman"), ("kendall", "Kendall"),
             *[(f"jaccard@{f:g}", f"top-{f:.0%} Jaccard (chance {f / (2 - f):.2f})") for f in settings.stats.fractions],
             ("layer_mass_l1", "layer-mass L1"), ("spearman@layer-norm", "Spearman, layer-normalised")]
    rows = []
    for comparison in COMPARISONS:
        d = coh[coh["comparison"] == comparison]
        for (task, task_b), g in d.groupby(["task", "task_b"], dropna=False, sort=False):
            row = {"comparison": w.comparison(comparison),
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
    w = objective_words(settings)
    rows = []
    for t, g in ft.groupby("task", sort=False):
        row = {"task": t, "metric": g["metric"].iloc[0], "seeds": len(g),
               "fine-tuned": cell(**_over_seeds(g["fine_tuned"])),
               f"head only (frozen {w.encoder})": cell(**_over_seeds(g["head_only"]))}
        for col in [c for c in ft.columns if c.startswith("fine_tuned_")]:  # extra dev sets: MNLI-mm
            row[f"fine-tuned ({col[len('fine_tuned_'):]})"] = cell(**_over_seeds(g[col])) if g[col].notna().any() else ""
        d = pr[(pr["task"] == t) & (pr["objective"] == "task") & (pr["view"] == "application")] if len(pr) else pr
        for order in ("task", "mlm", "random"):
            x = d[d["order"] == order] if len(d) else d
            txt = _share(x["removable_fraction"].iloc[0]) if len(x) else ""
            raw = x["removable_fraction_raw"].iloc[0] if len(x) and "removable_fraction_raw" in x else None
            if _finite(raw) and raw != x["removable_fraction"].iloc[0]:  # a level passes after a lower one failed
                txt += f" (raw curve {float(raw):.0%})"
            row[f"removable at {pct}, by {w.by(order)}"] = txt
        a = ad[ad["task"] == t] if len(ad) else ad
        level = a["level"].iloc[0] if len(a) else None
        row["acceptable deduction: heads removed"] = (f"{float(level):.0%}" if _finite(level) else
                                                      NA if len(a) and _no_full_score(a.iloc[0]) else "")
        raw = a["level_raw"].iloc[0] if len(a) and "level_raw" in a else None
        if _finite(raw) and raw != level:  # acceptable again above a level that was not
            row["acceptable deduction: heads removed"] += f" (raw curve {float(raw):.0%})"
        loss = a["mlm_loss_increase"].iloc[0] if len(a) else None
        row[f"acceptable deduction: {w.label} loss +"] = cell(loss)
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
    w = objective_words(settings)
    ts = [ReportTable(f"{art}main_coherence", main_coherence(tables, settings),
                      caption=f"Do {w.label} and task importance agree? Application view (depth x head); mean ± std over "
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
                              f"by {w.label} importance, then fine-tune; the same contiguous rule).")]
    nan = nan_table(tables)
    if not nan.empty:
        ts.append(ReportTable(f"{art}nan_runs", nan,
                              caption="Runs that produced NaN, and why: they are left out of the means over seeds "
                                      "(cells marked (n=k of m))."))
    ba = main_before_after(tables)
    if not ba.empty:
        ts.append(ReportTable(f"{art}main_before_after", ba,
                              caption=f"Pruning before fine-tuning (by {w.label} importance of the pre-trained model, "
                                      f"or at random) vs after (the fine-tuned model by task or {w.label} importance, "
                                      "not retrained): downstream score, mean ± std over seeds."))
    return Section("Main results",
                   "The questions of Chiang & Chen (2021), answered with this run's numbers. The paper has no "
                   "public code and headcount records no published values to set beside these; the figures and "
                   "the raw tables (folded, with their CSV files) follow.", tables=ts)


def transfer_glance(tables: dict, settings: TransferSettings) -> list[dict]:
    """The glance rows of a transfer part, per task: the fine-tuned score, Spearman of MLM vs task
    importance and of task importance before vs after fine-tuning (mean over seeds [interval]),
    the share of heads removable by task / MLM / random order, the acceptable deduction. MLM-side
    rows carry ``†`` (a decoder's LM side none, and says LM). The paper column is blank: Chiang &
    Chen (2021) publish no numbers that headcount records.

    >>> transfer_glance(transfer_tables(store, config), config)[0]["quantity"]   # doctest: +SKIP
    'fine-tuned accuracy'
    """
    rows = []
    pr = main_pruning(tables, settings) if not tables["finetune"].empty else pd.DataFrame()
    summ = tables["coherence_summary"]
    pct = f"{settings.before_after.threshold:.0%}"
    w = objective_words(settings)
    mark = MARK if w.caveat else ""
    for _, r in pr.iterrows():
        t = r["task"]
        rows.append({"quantity": f"fine-tuned {r['metric']}", "task": t, "this run": r["fine-tuned"]})
        for comparison, what in (("mlm-vs-task", f"Spearman, {w.label}{mark} vs task importance"),
                                 ("task-before-vs-after", "Spearman, task importance: pre-trained vs fine-tuned")):
            d = stat_rows(summ, comparison, "spearman") if not summ.empty else summ
            d = d[d["task"] == t] if len(d) else d
            if len(d):
                x = d.iloc[0]
                rows.append({"quantity": what, "task": t,
                             "this run": cell(x.get("estimate"), low=x.get("low"), high=x.get("high"))})
        shares = [r.get(f"removable at {pct}, by {w.by(o)}", "") for o in ("task", "mlm", "random")]
        if any(shares):
            rows.append({"quantity": f"heads removable at >= {pct}, by task / {w.label}{mark} / random",
                         "task": t, "this run": " / ".join(x or "?" for x in shares)})
        if r.get("acceptable deduction: heads removed"):
            rows.append({"quantity": f"acceptable deduction{mark} (heads pruned, then fine-tuned)", "task": t,
                         "this run": r["acceptable deduction: heads removed"]})
    return [{**row, "paper": ""} for row in rows]


#: The glance table's caption for a transfer study.
TRANSFER_GLANCE = ("This run's main numbers (mean ± std over seeds, [interval] where there is one; the tables below "
                   "have the rest). Chiang & Chen (2021) publish no numbers that headcount records: the paper column "
                   "is blank.")


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


def transfer_sections(store, settings: TransferSettings, prefix: str = "", tables: dict | None = None) -> list:
    """The report sections of a finished transfer part (figures and tables from saved results).

    Args:
        store: the run's [`RunStore`][headcount.experiments.runner.RunStore].
        settings: the part's settings.
        prefix: the job-name prefix given to ``transfer_jobs``; figure and table names get
            it too (``/`` -> ``-``), so several parts fit in one report.
        tables: [`transfer_tables`][headcount.experiments.studies.transfer.tables.transfer_tables] output, when already computed.

    Returns:
        A list of [`Section`][headcount.experiments.report.Section].

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

    w = objective_words(settings)
    coh_cols = ["comparison", "view", "task", "task_b", "statistic", "grids", "estimate", "estimate_min",
                "estimate_max", "low", "high", "ci", "p_value_max", "p_value_global_max", "chance", "n", "n_finite"]
    sections = [
        main_section(tables, settings, art),
        Section(f"Importance of heads: {w.label} and tasks",
                f"Gate-gradient importance (Michel et al.) on the same training examples: {w.name} on the "
                f"pre-trained model, the task on the pre-trained {w.encoder} with a fitted head, and the task on the "
                "fine-tuned model. All scores are in head_scores.csv.",
                figures=F("heatmaps", "scatter", "shared-heads"),
                tables=[T("finetune", f"Fine-tuned and head-only (frozen {w.encoder}) validation scores."),
                        T("mlm", f"{w.head} and the pre-trained model's {w.label} loss/accuracy on each task's "
                                 "validation texts.")]),
        Section("Coherence",
                "Spearman and Kendall rank correlation, Jaccard overlap of the top 10/25/50% heads, and the L1 "
                "distance of per-layer importance shares, on the raw grids and (statistics ending @layer-norm, "
                "grids: layer-normalised) on grids whose layers are each z-scored. Per seed in coherence.csv "
                "(bootstrap intervals over scoring examples, the estimate +- z (1.96 at 95%) x the replicates' standard deviation "
                "(boot_estimate: their centre, a proxy's with the gradient scorer), paired by example id where both grids "
                "come from the same examples (pairing); two-sided permutation p-values: p_value heads permuted "
                "within their layer by default, p_value_global over all heads); here the mean over seeds "
                "(estimate_min/max: range over seeds; low/high: the interval over seeds named in ci, by default the t "
                "interval over the seed estimates with the noise of the examples every seed shares added once "
                f"(stats.seed_interval), approximate where the pairs share a grid: the {w.label} grid of every seed, "
                "seed-vs-seed pairs; with one seed (or one seed pair) no seed variance can be estimated and ci says "
                "normal: the estimate +- z x the standard deviation of its example bootstrap; p_value_max, p_value_global_max: the largest over seeds; n_finite of n: "
                "seeds with a number; chance: the expected value for unrelated scores).",
                figures=F("correlation-matrix", "layer-mass"),
                tables=[ReportTable(f"{art}coherence_summary", tables["coherence_summary"][coh_cols],
                                    caption="Coherence, mean over seeds.", max_rows=80, collapsed=True),
                        T("coherence", "Coherence per seed.", max_rows=20),
                        T("layer_mass", "Share of importance per layer.", max_rows=12),
                        T("head_scores", "Every head score.", max_rows=12)]),
        Section("Prunability",
                "Heads removed in order of importance (computed once; per-layer L2 normalised) and applied as "
                f"gates to the fine-tuned model (task metric) or the pre-trained model ({w.label} accuracy), without "
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
            f"Pruned before: the pre-trained model without its least {w.label}-important heads, fine-tuned with the "
            "full model's settings. Pruned after: the fine-tuned model with its least important heads (by task "
            f"or by {w.label} importance) gated off, not retrained.",
            figures=F("before-after"),
            tables=[T("before_after", "Scores before vs after, per level."),
                    T("before_after_seeds", "Per seed: the pruned-then-fine-tuned model beside the same seed's "
                                            "fine-tuned model gated at the same level (the summary counts the seeds "
                                            "where pruning first scores higher).")]))
        sections.append(Section(
            "Acceptable deduction",
            f"For each task, the largest {w.loss} increase of the pruned pre-trained model at which the "
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
    sections = transfer_sections(store, config, tables=tables)
    return ReportContent(summary=transfer_summary(tables, config), sections=sections,
                         glance=glance_table(transfer_glance(tables, config), "glance", TRANSFER_GLANCE),
                         headline=headline_of(sections, HEADLINES), caveats=transfer_caveats(tables))


#: The transfer study's headline figures, the first one drawn is shown at the top.
HEADLINES = ("heatmaps", "scatter", "prunability")
