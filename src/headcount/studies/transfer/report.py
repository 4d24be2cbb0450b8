"""The transfer study's report: the summary, and the sections of figures and tables.

:func:`transfer_summary` and :func:`transfer_sections` work under a job-name prefix, so another
study (the demo) can include a transfer part; :func:`report` is the study type's ``report_fn``.
"""

from __future__ import annotations

import numpy as np

from ...report import ReportContent, ReportFigure, ReportTable, Section
from .config import TransferConfig, TransferSettings
from .figures import figures
from .plan import plan_of
from .tables import artifact, fmt, stat_rows, transfer_tables


def transfer_summary(tables: dict, settings: TransferSettings, prefix: str = "") -> str:
    """The headline numbers as text (for the report's summary).

    >>> transfer_summary(transfer_tables(store, config), config)    # doctest: +SKIP
    'MLM vs task (fine-tuned): Spearman 0.31 ...'
    """
    s = tables["coherence_summary"]
    parts = []

    def line(comparison, label):
        d = stat_rows(s, comparison, "spearman")
        j = stat_rows(s, comparison, "jaccard@0.25") if 0.25 in settings.stats.fractions else d.iloc[0:0]
        if d.empty:
            return
        txt = f"{label}: Spearman {fmt(d['estimate'].mean())}"
        if len(d) > 1:
            txt += f" (per task {fmt(d['estimate'].min())}..{fmt(d['estimate'].max())})"
        p_max = d["p_value_max"].max()
        if pd_isna(p_max) is False:
            txt += f", p <= {p_max:.3g}"
        if len(j):
            txt += f", top-25% Jaccard {fmt(j['estimate'].mean())} (chance {fmt(j['chance'].iloc[0])})"
        parts.append(txt + ".")

    m = tables.get("mlm")
    if m is not None and not m.empty:
        parts.append("Masked LM of the pre-trained model: " + "; ".join(
            f"{r['corpus']}: accuracy {fmt(r.get('validation_accuracy'))}, loss {fmt(r.get('validation_loss'))} "
            f"({'head fitted on the frozen encoder' if r['head'] == 'fitted' else 'its own head'})"
            for _, r in m.iterrows()) + ".")
    line("mlm-vs-task", "MLM vs task (fine-tuned)")
    line("mlm-vs-task-before", "MLM vs task (frozen encoder)")
    line("task-before-vs-after", "Task importance before vs after fine-tuning")
    line("task-vs-task", "Task vs task")
    line("seed-vs-seed", "Seed vs seed (same task)")
    pr = tables["prunability"]
    if not pr.empty:
        d = pr[(pr["objective"] == "task") & (pr["view"] == "application")]
        txt = "; ".join(f"{t}: " + ", ".join(f"{o} {g[g['order'] == o]['removable_fraction'].iloc[0]:.0%}"
                                              for o in ("task", "mlm", "random") if (g["order"] == o).any())
                        for t, g in d.groupby("task", sort=False))
        parts.append(f"Heads removable with >= {settings.before_after.threshold:.0%} of the fine-tuned score "
                     f"(no retraining), by order: {txt}.")
    ad = tables["acceptable_deduction_summary"]
    if not ad.empty:
        txt = "; ".join(f"{r['task']}: " + ("none" if r["level"] is None or pd_isna(r["level"]) else
                                            f"{r['level']:.0%} of heads, MLM loss +{r['mlm_loss_increase']:.2f}")
                        for _, r in ad.iterrows())
        parts.append(f"Acceptable deduction (prune by MLM, then fine-tune, >= {settings.before_after.threshold:.0%}): {txt}.")
    return "\n\n".join(parts)


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

    def T(name, caption=""):
        return ReportTable(f"{art}{name}", tables[name], caption=caption)

    coh_cols = ["comparison", "view", "task", "task_b", "statistic", "estimate", "estimate_min", "estimate_max",
                "low", "high", "p_value_max", "chance", "n"]
    sections = [
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
                "distance of per-layer importance shares. Per seed in coherence.csv (percentile bootstrap "
                "intervals over scoring examples, two-sided permutation p-values); here averaged over seeds "
                "(estimate_min/max: range over seeds; low/high: each seed's bounds averaged; p_value_max: the "
                "largest p-value over seeds; chance: the expected value for unrelated scores).",
                figures=F("correlation-matrix", "layer-mass"),
                tables=[ReportTable(f"{art}coherence_summary", tables["coherence_summary"][coh_cols],
                                    caption="Coherence, mean over seeds.", max_rows=80),
                        ReportTable(f"{art}coherence", tables["coherence"], caption="Coherence per seed.", max_rows=20),
                        ReportTable(f"{art}layer_mass", tables["layer_mass"], max_rows=12),
                        ReportTable(f"{art}head_scores", tables["head_scores"], max_rows=12)]),
        Section("Prunability",
                "Heads removed in order of importance (computed once; per-layer L2 normalised) and applied as "
                "gates to the fine-tuned model (task metric) or the pre-trained model (MLM accuracy), without "
                "retraining. removable_fraction: the largest level whose mean score stays at or above the "
                "threshold share of the full model's.",
                figures=F("prunability"),
                tables=[T("prunability"), ReportTable(f"{art}curves", tables["curves"], max_rows=20)]),
    ]
    if not tables["before_after"].empty:
        sections.append(Section(
            "Pruning before vs after fine-tuning",
            "Pruned before: the pre-trained model without its least MLM-important heads, fine-tuned with the "
            "full model's settings. Pruned after: the fine-tuned model with its least important heads (by task "
            "or by MLM importance) gated off, not retrained.",
            figures=F("before-after"), tables=[T("before_after")]))
        sections.append(Section(
            "Acceptable deduction",
            "For each task, the largest masked-LM loss increase of the pruned pre-trained model at which the "
            "fine-tuned pruned model keeps the threshold share of the full fine-tuned score.",
            figures=F("acceptable-deduction"),
            tables=[T("acceptable_deduction_summary"), T("acceptable_deduction")]))
    return sections


def report(store, config: TransferConfig):
    """``report_fn`` of the ``transfer`` study type.

    >>> report(RunStore("runs/transfer-offline"), config).sections[0].title   # doctest: +SKIP
    'Importance of heads: MLM and tasks'
    """
    tables = transfer_tables(store, config)
    return ReportContent(summary=transfer_summary(tables, config), sections=transfer_sections(store, config, tables=tables))
