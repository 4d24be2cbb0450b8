"""The report of a lottery study: sections of figures and tables, and the headline paragraph."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from ...report import ReportContent, ReportTable, Section
from .config import LotteryConfig, LotterySettings
from .figures import scores_figure, overlap_figure, pattern_grid_figure, pattern_mix_figure, survivor_figure, trace_figure
from .plan import job_name, task_name
from .tables import EXPERIMENTS, SUPER_EXPERIMENTS, finished, pattern_tables, seed_scores, summarize, wide_table

def _tag(prefix: str, default: str = "lottery") -> str:
    t = re.sub(r"[^A-Za-z0-9_.-]+", "-", prefix).strip("-_.")
    return t or default


def lottery_sections(store, settings: LotterySettings, prefix: str = "", tag: str | None = None) -> list:
    """The report sections of a lottery study (or of the lottery part of another study).

    Tables (``results/<tag>_*.csv``): ``main`` (tidy: experiment, pruning, task, metric, mean,
    std, n, sizes), ``main_wide`` (the paper's layout, ``mean ± std``), ``seeds`` (every score),
    ``super_survivors``, ``stability``, ``overlap``, ``patterns``, ``pattern_heads``.
    Figures: scores with error bars, pruning traces, survivor heatmaps, overlap across tasks,
    pattern mix (full vs good vs super-survivors), per-head pattern grid.

    Args:
        store: the run's :class:`~headcount.runner.RunStore`.
        settings: the :class:`LotterySettings` the jobs came from.
        prefix: the job-name prefix given to :func:`lottery_jobs`.
        tag: prefix of table and figure names (default: from ``prefix``, else ``lottery``).

    Returns:
        A list of :class:`~headcount.report.Section`.

    >>> lottery_sections(store, config)[0].title           # doctest: +SKIP
    'Good, random and bad subnetworks'
    """

    s = settings
    tag = tag or _tag(prefix)
    scores = seed_scores(store, s, prefix)
    main_names = [e for e, _ in EXPERIMENTS if s.magnitude.enabled or not e.startswith("magnitude")]
    main = summarize(scores[scores["experiment"].isin(main_names)], main_names)
    sections = []
    text = (
        "Per task and seed: the full model fine-tuned; the good structured subnetwork (iterative pruning of heads "
        f"and MLPs, {s.pruning.schedule} schedule, stop below {s.pruning.threshold} x the full model's dev metric) "
        "evaluated on the fine-tuned weights without retraining (good pruned); good, random "
        f"({s.random}) and bad (drawn from the pruned components, topped up with good ones: Prasanna's rule) "
        "subnetworks retrained from the pre-trained weights; magnitude pruning (IMP) good, random and bad masks at "
        f"the same sparsity, retrained from the pre-trained weights. Mean ± sample std over {len(s.seeds)} seed(s) "
        f"({', '.join(map(str, s.seeds))}); dev subsets of {s.train.max_eval_examples or 'all'} examples."
    )
    sections.append(Section(
        "Good, random and bad subnetworks", text,
        figures={f"{tag}_scores": scores_figure(main, main_names, "dev metric, mean ± std over seeds"),
                 f"{tag}_prune_trace": trace_figure(store, s, prefix)},
        tables=[_table(f"{tag}_main_wide", wide_table(main), "The paper's main table: mean ± std over seeds."),
                _table(f"{tag}_main", main, "Tidy main table (also the sizes: heads/MLPs kept, weight sparsity)."),
                _table(f"{tag}_seeds", scores, "Every score, per seed.")],
    ))
    if s.super_survivors.enabled:
        stab = {task_name(t): finished(store, job_name(prefix, "stability", task_name(t))) for t in s.tasks}
        stab = {k: v.result for k, v in stab.items() if v is not None}
        rows = []
        for tname, r in stab.items():
            n_super = {"heads": int(np.sum(r["super_heads"])), "mlps": int(np.sum(r["super_mlps"]))}
            n_super["all"] = n_super["heads"] + n_super["mlps"]
            for comp in ("heads", "mlps", "all"):
                st = r[comp]
                rows.append({"task": tname, "components": comp, "krippendorff_alpha": st["krippendorff_alpha"],
                             "cochran_q": st["cochran_q"], "cochran_df": st["cochran_df"], "cochran_p": st["cochran_p"],
                             "mean_pairwise_jaccard": st["mean_pairwise_jaccard"],
                             "kept_per_seed": " ".join(map(str, st["kept_per_seed"])),
                             "super_survivors": n_super[comp]})
        stability = pd.DataFrame(rows)
        sup = summarize(scores[scores["experiment"].isin(SUPER_EXPERIMENTS)], list(SUPER_EXPERIMENTS))
        figures = {f"{tag}_survivors": survivor_figure(stab)} if stab else {}
        if not sup.empty:
            figures[f"{tag}_super_scores"] = scores_figure(pd.concat([main[main["experiment"] == "full"], sup]),
                                                   ["full", *SUPER_EXPERIMENTS], "super-survivors, retrained")
        sections.append(Section(
            "Stability across seeds and super-survivors",
            "How often each head and MLP survives across seeds (super-survivors, kept by every seed, marked *); "
            "agreement of the good masks across seeds (Krippendorff's alpha, nominal; Cochran's Q: do the seeds "
            "keep different proportions; mean pairwise Jaccard). Super-survivor subnetworks and size-matched "
            "random (uniform) and bad controls, retrained from the pre-trained weights.",
            figures=figures,
            tables=[_table(f"{tag}_stability", stability, "Mask stability across seeds."),
                    _table(f"{tag}_super_survivors", wide_table(sup) if not sup.empty else sup,
                           "Super-survivors and their controls, retrained: mean ± std over seeds."),
                    _table(f"{tag}_super_survivors_tidy", sup, "Tidy super-survivor table.")],
        ))
    if len(s.tasks) > 1:
        ov = finished(store, job_name(prefix, "overlap"))
        if ov is not None:
            tasks = ov.result["tasks"]
            rows = [{"task_a": a, "task_b": b, "heads_jaccard": ov.result["heads_jaccard"][i][j],
                     "mlps_jaccard": ov.result["mlps_jaccard"][i][j],
                     "super_heads_jaccard": ov.result["super_heads_jaccard"][i][j]}
                    for i, a in enumerate(tasks) for j, b in enumerate(tasks)]
            sections.append(Section(
                "Overlap of good subnetworks across tasks",
                "Jaccard index of the kept heads of two tasks' good subnetworks, averaged over all seed pairs "
                "(the diagonal: across seeds of one task), and of their super-survivors.",
                figures={f"{tag}_overlap": overlap_figure(ov.result)},
                tables=[_table(f"{tag}_overlap", pd.DataFrame(rows), "Overlap across tasks.")],
            ))
    if s.patterns.enabled:
        heads_table, dist = pattern_tables(store, s, prefix)
        if not heads_table.empty:
            sections.append(Section(
                "Self-attention patterns",
                "Each head of the fine-tuned full model classified (Kovaleva et al. 2019 classes) by the rule-based "
                "classifier on its mean attention map over dev examples (headcount.analysis.patterns: mass on the "
                "special-token columns, on the diagonal band, within the query's segment, entropy)"
                + (", and by the CNN trained on the labelled maps of the config" if s.patterns.cnn else "")
                + ". Pattern mix of all heads vs the heads of the good subnetworks vs the super-survivors "
                "(mean over seeds).",
                figures={f"{tag}_pattern_mix": pattern_mix_figure(dist),
                         f"{tag}_pattern_grid": pattern_grid_figure(heads_table, s)},
                tables=[_table(f"{tag}_patterns", dist, "Pattern distributions (fraction of heads, mean/std over seeds)."),
                        _table(f"{tag}_pattern_heads", heads_table, "Per-head pattern class and features.")],
            ))
    return sections


def _table(name, df, caption):

    return ReportTable(name, df, caption)


def lottery_summary(store, settings: LotterySettings, prefix: str = "") -> str:
    """One paragraph with the headline numbers (good/random/bad retrained vs full, per task).

    >>> lottery_summary(RunStore("runs/lottery-offline"), config)  # doctest: +SKIP
    'Mean dev metric over seeds. offline/movies: full 0.803, good pruned 0.760, ...'
    """
    scores = seed_scores(store, settings, prefix)
    main = summarize(scores)
    parts = []
    for task in dict.fromkeys(main["task"]):
        t = main[main["task"] == task].set_index("experiment")["mean"]
        picks = [(k, t.get(k)) for k in ("full", "good pruned", "good retrained", "random retrained", "bad retrained")]
        if settings.magnitude.enabled:
            picks.append(("magnitude good retrained", t.get("magnitude good retrained")))
        parts.append(f"{task}: " + ", ".join(f"{k} {v:.3f}" for k, v in picks if v is not None and math.isfinite(v)))
    return "Mean dev metric over seeds. " + "; ".join(parts) + "."


def report(store, config: LotteryConfig):
    """``report_fn`` of the ``lottery`` study type: :func:`lottery_summary` and :func:`lottery_sections`.

    >>> report(RunStore("runs/lottery-offline"), config).sections[0].title  # doctest: +SKIP
    'Good, random and bad subnetworks'
    """

    return ReportContent(summary=lottery_summary(store, config), sections=lottery_sections(store, config))
