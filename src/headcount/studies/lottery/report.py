"""The report of a lottery study: the paper's main tables filled with this run's numbers beside
the published ones, then the figures, then the raw tables (folded, each with its CSV).
"""

from __future__ import annotations

import math
import re

import pandas as pd

from ...report import ReportContent, ReportTable, Section
from .config import LotteryConfig, LotterySettings
from .figures import (
    overlap_figure,
    pattern_grid_figure,
    pattern_mix_figure,
    scores_figure,
    survivor_figure,
    trace_figure,
)
from .plan import job_name, task_name
from .tables import (
    EXPERIMENTS,
    SUPER_EXPERIMENTS,
    finished,
    nan_table,
    overlap_table,
    paper_table,
    pattern_tables,
    seed_scores,
    stability_table,
    summarize,
    wide_table,
)

#: Columns of the paper's structured-pruning table: experiment -> header.
STRUCTURED_COLUMNS = {"full": "full", "good pruned": "good, not retrained", "good retrained": "good",
                      "random retrained": "random", "bad retrained": "bad"}

#: Columns of the paper's magnitude-pruning table: experiment -> header.
MAGNITUDE_COLUMNS = {"full": "full", "magnitude good retrained": "good", "magnitude random retrained": "random",
                     "magnitude bad retrained": "bad"}


#: How each magnitude procedure finds the good mask, in a caption's words.
MAGNITUDE_PROCEDURES = {
    "prasanna": "the paper's procedure: 10% of the remaining fine-tuned weights per step without retraining, "
                "the last mask whose un-retrained dev metric is >= threshold x full, retrained once",
    "imp": "IMP, Chen et al.: retrained every round, stopped on the retrained dev metric",
}


def no_passing_sentence(scores) -> str:
    """A sentence naming the magnitude runs without a passing mask (NaN rows), or ``""``.

    >>> no_passing_sentence(pd.DataFrame({"task": ["t"], "seed": [1], "flag": ["no_passing_mask"]}))
    ' No pruning step passed for t seed 1 (no_passing_mask): NaN, left out of the means; its random and bad controls were skipped (not trained).'
    """
    if "flag" not in scores:
        return ""
    hit = scores[scores["flag"] == "no_passing_mask"]
    if hit.empty:
        return ""
    runs = ", ".join(f"{t} seed {sd}" for t, sd in zip(hit["task"], hit["seed"]))
    return (f" No pruning step passed for {runs} (no_passing_mask): NaN, left out of the means; "
            f"{'its' if len(hit) == 1 else 'their'} random and bad controls were skipped (not trained).")


def _tag(prefix: str, default: str = "lottery") -> str:
    t = re.sub(r"[^A-Za-z0-9_.-]+", "-", prefix).strip("-_.")
    return t or default


def _raw(name, df, caption):
    """A raw table: folded under its caption, with its CSV."""
    return ReportTable(name, df, caption, collapsed=True)


def lottery_sections(store, settings: LotterySettings, prefix: str = "", tag: str | None = None) -> list:
    """The report sections of a lottery study (or of the lottery part of another study).

    First the paper's main tables (``paper_structured``, ``paper_magnitude``: per task, this
    run's mean ± std over seeds beside Prasanna et al.'s published means), then per part its
    figures and its raw tables, folded. Tables (``results/<tag>_*.csv``): ``paper_structured``,
    ``paper_magnitude``, ``main`` (tidy: experiment, pruning, task, metric, mean, std, n, sizes),
    ``main_wide`` (experiments x tasks, ``mean ± std``), ``seeds`` (every score),
    ``super_survivors`` (+ ``_tidy``), ``stability``, ``overlap``, ``patterns``, ``pattern_heads``.
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
    "The paper's main tables"
    """
    s = settings
    tag = tag or _tag(prefix)
    scores = seed_scores(store, s, prefix)
    main_names = [e for e, _ in EXPERIMENTS if s.magnitude.enabled or not e.startswith("magnitude")]
    main = summarize(scores[scores["experiment"].isin(main_names)], main_names)
    seeds = f"{len(s.seeds)} seed{'s' if len(s.seeds) > 1 else ''} ({', '.join(map(str, s.seeds))})"
    paper = [ReportTable(f"{tag}_paper_structured", paper_table(main, STRUCTURED_COLUMNS, heads=True),
                         "Structured pruning (heads and MLPs): dev metric, mean ± std over seeds; good heads: "
                         "heads the good subnetwork keeps, mean over seeds.")]
    if s.magnitude.enabled:
        paper.append(ReportTable(f"{tag}_paper_magnitude", paper_table(main, MAGNITUDE_COLUMNS),
                                 "Magnitude pruning (weights, " + MAGNITUDE_PROCEDURES[s.magnitude.procedure]
                                 + "): dev metric, mean ± std over seeds." + no_passing_sentence(scores)))
    flagged = nan_table(store, s, scores, prefix)
    if not flagged.empty:  # a NaN drops out of a mean over seeds: cells say (n=k of m), this says why
        paper.append(ReportTable(f"{tag}_nan_runs", flagged, "Runs that produced NaN (left out of the means over "
                                 "seeds: cells marked (n=k of m)) and control subnetworks drawn empty, with why."))
    sections = [Section(
        "The paper's main tables",
        f"Prasanna et al. (2020), Table 1 and its magnitude counterpart, with this run's numbers: mean ± sample std "
        f"over {seeds}. Columns \"…, paper\": the published dev means (bert-base-uncased, 5 seeds), blank for tasks "
        "the paper does not have (and for glue/mnli-mm: the same MNLI models on the mismatched dev set, which the "
        "paper does not report). Good: the good subnetwork retrained from the pre-trained weights (\"not retrained\": "
        "evaluated on the fine-tuned weights with its mask); random and bad: size-matched controls, retrained.",
        tables=paper,
    )]
    text = (
        "Per task and seed: the full model fine-tuned; the good structured subnetwork (iterative pruning of heads "
        f"and MLPs, {s.pruning.schedule} schedule, stop below {s.pruning.threshold} x the full model's dev metric) "
        "evaluated on the fine-tuned weights without retraining (good pruned); good, random "
        f"({s.random}) and bad (drawn from the pruned components, topped up with good ones: Prasanna's rule) "
        f"subnetworks retrained from the pre-trained weights; magnitude pruning ({s.magnitude.procedure}: "
        f"{MAGNITUDE_PROCEDURES[s.magnitude.procedure]}) good, random and bad masks at "
        f"the same sparsity, retrained from the pre-trained weights. Mean ± sample std over {seeds}; "
        f"dev subsets of {s.train.max_eval_examples or 'all'} examples."
    )
    sections.append(Section(
        "Good, random and bad subnetworks", text,
        figures={f"{tag}_scores": scores_figure(main, main_names, "dev metric, mean ± std over seeds"),
                 f"{tag}_prune_trace": trace_figure(store, s, prefix)},
        tables=[_raw(f"{tag}_main_wide", wide_table(main), "All experiments x tasks: mean ± std over seeds."),
                _raw(f"{tag}_main", main, "Tidy main table (also the sizes: heads/MLPs kept, weight sparsity)."),
                _raw(f"{tag}_seeds", scores, "Every score, per seed.")],
    ))
    if s.super_survivors.enabled:
        stab = {task_name(t): finished(store, job_name(prefix, "stability", task_name(t))) for t in s.tasks}
        stab = {k: v.result for k, v in stab.items() if v is not None}
        sup = summarize(scores[scores["experiment"].isin(SUPER_EXPERIMENTS)], list(SUPER_EXPERIMENTS))
        figures = {f"{tag}_survivors": survivor_figure(stab)} if stab else {}
        if not sup.empty:
            figures[f"{tag}_super_scores"] = scores_figure(pd.concat([main[main["experiment"] == "full"], sup]),
                                                           ["full", *SUPER_EXPERIMENTS], "super-survivors, retrained")
        sections.append(Section(
            "Stability across seeds and super-survivors",
            "How often each head and MLP survives across seeds (super-survivors, kept by every seed, marked *); "
            "agreement of the good masks across seeds (Krippendorff's alpha, nominal; Cochran's Q: do the seeds "
            "keep different proportions; mean pairwise Jaccard; the paper: alpha .18-.33 for heads). Super-survivor "
            "subnetworks and size-matched random (uniform) and bad controls, retrained from the pre-trained weights.",
            figures=figures,
            tables=[ReportTable(f"{tag}_stability", stability_table(stab), "Mask stability across seeds."),
                    ReportTable(f"{tag}_super_survivors", wide_table(sup) if not sup.empty else sup,
                                "Super-survivors and their controls, retrained: mean ± std over seeds."),
                    _raw(f"{tag}_super_survivors_tidy", sup, "Tidy super-survivor table.")],
        ))
    if len(s.tasks) > 1:
        ov = finished(store, job_name(prefix, "overlap"))
        if ov is not None:
            sections.append(Section(
                "Overlap of good subnetworks across tasks",
                "Jaccard index of the kept heads of two tasks' good subnetworks, averaged over all seed pairs "
                "(the diagonal: across seeds of one task), and of their super-survivors.",
                figures={f"{tag}_overlap": overlap_figure(ov.result)},
                tables=[_raw(f"{tag}_overlap", overlap_table(ov.result), "Overlap across tasks.")],
            ))
    if s.patterns.enabled:
        heads_table, dist = pattern_tables(store, s, prefix)
        if not heads_table.empty:
            sections.append(Section(
                "Self-attention patterns",
                "Heads of the fine-tuned full model in the Kovaleva et al. (2019) classes. Rule classifier on "
                "per-head mean maps (headcount): each head's mean attention map over dev examples, classified by "
                "rules (headcount.analysis.patterns: mass on the special-token columns, on the diagonal band, "
                "within the query's segment, entropy); shares are fractions of heads."
                + (" CNN on per-example maps (Prasanna et al.): the CNN trained on the labelled maps of the config "
                   "classifies every example's map of every head, centre-padded with zeros to its side; shares are "
                   "fractions of examples x heads, as the paper counts them (a head mask applies to every example)."
                   if s.patterns.cnn else "")
                + " Pattern mix of all heads vs the heads of the good subnetworks vs the super-survivors "
                "(mean over seeds).",
                figures={f"{tag}_pattern_mix": pattern_mix_figure(dist),
                         f"{tag}_pattern_grid": pattern_grid_figure(heads_table, s)},
                tables=[_raw(f"{tag}_patterns", dist, "Pattern distributions (fraction of heads, or of examples x heads "
                             "for the CNN: see counted_over; mean/std over seeds)."),
                        _raw(f"{tag}_pattern_heads", heads_table, "Per-head pattern class and features.")],
            ))
    return sections


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
    "The paper's main tables"
    """
    return ReportContent(summary=lottery_summary(store, config), sections=lottery_sections(store, config))
