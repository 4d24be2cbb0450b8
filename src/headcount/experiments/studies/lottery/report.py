"""The report of a lottery study: the paper's main tables filled with this run's numbers beside
the published ones, then the figures, then the raw tables (folded, each with its CSV).
"""

from __future__ import annotations

import math
import re

import pandas as pd

from headcount.analysis.paired import at_chance, metric_range, paired_sign_flip_test, seed_interval
from headcount.experiments.report import ReportContent, ReportTable, Section, glance_table, headline_of
from headcount.experiments.studies.lottery.config import LotteryConfig, LotterySettings
from headcount.experiments.studies.lottery.figures import (
    overlap_figure,
    pattern_grid_figure,
    pattern_mix_figure,
    scores_figure,
    survivor_figure,
    trace_figure,
)
from headcount.experiments.studies.lottery.plan import job_name, task_name
from headcount.experiments.studies.lottery.tables import (
    EXPERIMENTS,
    SUPER_EXPERIMENTS,
    chance_levels,
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
        store: the run's [`RunStore`][headcount.experiments.runner.RunStore].
        settings: the [`LotterySettings`][headcount.experiments.studies.lottery.config.LotterySettings] the jobs came from.
        prefix: the job-name prefix given to ``lottery_jobs``.
        tag: prefix of table and figure names (default: from ``prefix``, else ``lottery``).

    Returns:
        A list of [`Section`][headcount.experiments.report.Section].

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
        figures={f"{tag}_scores": scores_figure(main, main_names, "dev metric, mean ± std over seeds",
                                                         s.pruning.threshold),
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
                                                           ["full", *SUPER_EXPERIMENTS], "super-survivors, retrained",
                                                           s.pruning.threshold)
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


#: The experiments the summary states, in order (the magnitude ones when magnitude pruning ran).
SUMMARY_EXPERIMENTS: tuple[str, ...] = ("full", "good pruned", "good retrained", "random retrained", "bad retrained",
                                        "magnitude good retrained", "magnitude random retrained",
                                        "magnitude bad retrained")

#: The paper's order of the retrained subnetworks (good > random > bad), per pruning kind: each
#: pair is tested one-sided in this direction ([`ordering_phrase`][headcount.experiments.studies.lottery.report.ordering_phrase]).
ORDERINGS: dict[str, tuple[str, str, str]] = {
    "structured": ("good retrained", "random retrained", "bad retrained"),
    "magnitude": ("magnitude good retrained", "magnitude random retrained", "magnitude bad retrained"),
}

#: Significance level of the summary's tests.
ALPHA = 0.05

#: How the summary's numbers and tests are made (the paragraph's first sentence).
SUMMARY_METHOD = (
    "Dev metric per task: mean ± sample std over seeds [95% t interval over seeds] (n seeds); \"interval contains chance\": "
    "the interval cannot tell the score from the chance level. Orderings: exact paired sign-flip permutation test on the "
    "per-seed differences (all 2^n sign patterns), one-sided in the paper's direction (good > random > bad), "
    f"significant when p < {ALPHA:g} (each test on its own: no correction for the several tests)."
)


def _short(experiment: str) -> str:
    """``magnitude good retrained`` -> ``good``: the name inside an ordering of one pruning kind."""
    return experiment.replace("magnitude ", "").replace(" retrained", "")


def score_phrase(values, chance: float | None = None, n_total: int | None = None, digits: int = 3,
                 metric: str | None = None) -> str:
    """``mean ± std [low, high] (n=k)`` of one experiment's per-seed scores (95% t interval,
    clipped to the ``metric``'s range, marked ``clipped``), followed by ``: interval contains chance`` when
    the interval contains ``chance`` (it cannot tell the score from chance: no stronger word); ``""``
    without a score.

    >>> score_phrase([0.576, 0.576, 0.576], chance=0.576)
    '0.576 ± 0.000 [0.576, 0.576] (n=3): interval contains chance'
    >>> score_phrase([0.8, float("nan")], chance=0.5, n_total=2)
    '0.800 (n=1 of 2, no interval)'
    >>> print(score_phrase([0.70, 0.98], metric="accuracy"))
    0.840 ± 0.198 [0.000, 1.000] (n=2, interval clipped to the metric's range)
    """
    iv = seed_interval(values, bounds=metric_range(metric))
    n = iv["n"]
    if n == 0:
        return ""
    seeds = f"n={n}" + (f" of {n_total}" if n_total is not None and n_total > n else "")
    if n == 1:
        return f"{iv['mean']:.{digits}f} ({seeds}, no interval)"
    if iv["clipped"]:
        seeds += ", interval clipped to the metric's range"  # the t interval of 2-3 seeds reaches past it
    text = f"{iv['mean']:.{digits}f} ± {iv['std']:.{digits}f} [{iv['low']:.{digits}f}, {iv['high']:.{digits}f}] ({seeds})"
    return text + (": interval contains chance" if at_chance(iv["low"], iv["high"], chance) else "")


def ordering_phrase(a_scores, b_scores, a: str, b: str, alpha: float = ALPHA) -> str:
    """``a > b`` tested over seeds (one-sided exact paired sign-flip test, [`paired_sign_flip_test`][headcount.analysis.paired.paired_sign_flip_test]).

    Args:
        a_scores: per-seed scores of the experiment the paper puts higher (NaN: left out with its pair).
        b_scores: the other experiment's, on the same seeds in the same order.
        a: the name of ``a`` in the text.
        b: the name of ``b``.
        alpha: significance level.

    Returns:
        The mean difference ± its std over seeds, on how many seeds ``a`` is higher, and the
        verdict: ``p = ... (one-sided), significant at 0.05``, or ``not significant (p = ...,
        one-sided)`` with, when the seeds are too few for any p below ``alpha``, the design's floor.

    >>> ordering_phrase([0.8] * 5, [0.7] * 5, "good", "random")
    'good > random: difference +0.100 ± 0.000, good higher on 5 of 5 seeds, p = 0.0312 (one-sided), significant at 0.05'
    >>> ordering_phrase([0.8] * 4, [0.7] * 4, "good", "random").split("seeds, ", 1)[1]
    'not significant (p = 0.0625, one-sided; with 4 seeds the smallest possible p is 1/2^4 = 0.0625: this design cannot show significance at 0.05)'
    """
    r = paired_sign_flip_test(a_scores, b_scores, alternative="greater")
    if r.n < 2:
        return f"{a} > {b}: no test ({r.n} seed{'' if r.n == 1 else 's'} with both scores)"
    text = (f"{a} > {b}: difference {r.mean_diff:+.3f} ± {r.std_diff:.3f}, {a} higher on {r.n_above} of {r.n} seeds, ")
    if r.significant(alpha):
        return text + f"p = {r.p_value:.3g} (one-sided), significant at {alpha:g}"
    text += f"not significant (p = {r.p_value:.3g}, one-sided"
    if not r.can_reach(alpha):
        text += (f"; with {r.n} seeds the smallest possible p is 1/2^{r.n} = {r.min_p:.3g}: this design cannot "
                 f"show significance at {alpha:g}")
    return text + ")"


def summary_text(scores, chance: dict | None = None, experiments=SUMMARY_EXPERIMENTS) -> str:
    """The summary paragraph from the per-seed scores: per task, every experiment's mean ± std
    [95% t interval] (n), ``interval contains chance`` wherever the interval contains the task's chance level,
    and the paper's orderings good > random > bad tested over seeds ([`ordering_phrase`][headcount.experiments.studies.lottery.report.ordering_phrase]).

    Args:
        scores: [`seed_scores`][headcount.experiments.studies.lottery.tables.seed_scores] (columns experiment, task, seed, metric, score).
        chance: task -> ``(chance level, what it is)`` ([`chance_levels`][headcount.experiments.studies.lottery.tables.chance_levels]);
            a task without one gets no ``interval contains chance`` verdicts and says so.
        experiments: the experiments stated, in order (those without scores are left out).

    >>> import pandas as pd
    >>> df = pd.DataFrame({"experiment": ["full"] * 3, "task": ["t"] * 3, "seed": [1, 2, 3],
    ...                    "metric": ["accuracy"] * 3, "score": [0.80, 0.82, 0.84]})
    >>> summary_text(df, {"t": (0.5, "majority-class rate")}).split("\\n\\n")[1]
    't (accuracy; chance 0.500 = majority-class rate): full 0.820 ± 0.020 [0.770, 0.870] (n=3).'
    """
    chance = chance or {}
    parts = [SUMMARY_METHOD]
    for task in dict.fromkeys(scores["task"]):
        t = scores[scores["task"] == task]
        metrics = [m for m in dict.fromkeys(t["metric"]) if isinstance(m, str)]
        level, what = chance.get(task, (math.nan, "unknown"))
        head = f"{task} ({metrics[0] if metrics else 'dev metric'}; " + (
            f"chance {level:.3f} = {what})" if level is not None and math.isfinite(level) else f"chance level {what})")
        cells = []
        for exp in experiments:
            e = t[t["experiment"] == exp]
            phrase = (score_phrase(e["score"].astype(float), level, n_total=len(e),
                                   metric=metrics[0] if metrics else None) if len(e) else "")
            if phrase:
                cells.append(f"{exp} {phrase}")
        if not cells:
            continue
        text = f"{head}: " + "; ".join(cells) + "."
        by_seed = t.pivot_table(index="seed", columns="experiment", values="score", aggfunc="first", dropna=False)
        for kind, chain in ORDERINGS.items():
            if not all(e in by_seed for e in chain):
                continue
            tests = [ordering_phrase(by_seed[hi].astype(float), by_seed[lo].astype(float), _short(hi), _short(lo))
                     for hi, lo in ((chain[0], chain[1]), (chain[1], chain[2]), (chain[0], chain[2]))]
            text += f" {kind.capitalize()}, " + "; ".join(tests) + "."
        parts.append(text)
    return "\n\n".join(parts)


def lottery_summary(store, settings: LotterySettings, prefix: str = "") -> str:
    """The summary: [`summary_text`][headcount.experiments.studies.lottery.report.summary_text] of the run's per-seed scores, with each task's chance
    level ([`chance_levels`][headcount.experiments.studies.lottery.tables.chance_levels]).

    >>> lottery_summary(RunStore("runs/lottery-offline"), config)  # doctest: +SKIP
    'Dev metric per task: mean ± sample std over seeds [95% t interval over seeds] ...'
    """
    scores = seed_scores(store, settings, prefix)
    experiments = [e for e in SUMMARY_EXPERIMENTS if settings.magnitude.enabled or not e.startswith("magnitude")]
    return summary_text(scores, chance_levels(settings), experiments)


#: The glance table's quantity for each experiment.
GLANCE_NAMES = {"full": "full model, fine-tuned", "good pruned": "good subnetwork, not retrained",
                "good retrained": "good subnetwork, retrained", "random retrained": "random subnetwork, retrained",
                "bad retrained": "bad subnetwork, retrained", "magnitude good retrained": "magnitude: good, retrained",
                "magnitude random retrained": "magnitude: random, retrained",
                "magnitude bad retrained": "magnitude: bad, retrained"}

#: The glance table's caption for a lottery study.
LOTTERY_GLANCE = ("This run's dev metric (mean ± std over seeds) beside Prasanna et al.'s published dev mean "
                  "(BERT-base, 5 seeds), for the task or, for an offline sentiment task the paper lacks, its nearest "
                  "(SST-2, named in the cell); the tables below have the rest.")


def lottery_glance(store, settings: LotterySettings, prefix: str = "") -> list[dict]:
    """The glance rows of a lottery part, per task: each experiment's mean ± std over seeds beside
    the paper's mean ([`nearest_published`][headcount.experiments.studies.lottery.published.nearest_published]), and the heads the good subnetwork keeps.

    >>> lottery_glance(RunStore("runs/lottery-offline"), config)[0]["quantity"]   # doctest: +SKIP
    'full model, fine-tuned'
    """
    from headcount.experiments.report.format import seed_cell
    from headcount.experiments.studies.lottery.published import PAPER_HEADS_KEPT, nearest_published

    scores = seed_scores(store, settings, prefix)
    names = [e for e in SUMMARY_EXPERIMENTS if settings.magnitude.enabled or not e.startswith("magnitude")]
    main = summarize(scores[scores["experiment"].isin(names)], names)
    rows = []
    for task in dict.fromkeys(main["task"]):
        sub = main[main["task"] == task].set_index("experiment")
        for exp in names:
            if exp not in sub.index:
                continue
            r = sub.loc[exp]
            value, col = nearest_published(exp, task)
            rows.append({"quantity": GLANCE_NAMES[exp] + (f" ({r['metric']})" if exp == "full" else ""), "task": task,
                         "this run": seed_cell(r["mean"], r["std"], n=r.get("n"), n_total=r.get("n_total")),
                         "paper": "" if value is None else f"{value:.2f} ({col})"})
        good = [e for e in ("good pruned", "good retrained") if e in sub.index]
        kept = float(sub.loc[good[0], "heads_kept"]) if good else math.nan
        if math.isfinite(kept):
            _, col = nearest_published("full", task)
            paper = f"{PAPER_HEADS_KEPT[col]} of 144 ({col})" if col in PAPER_HEADS_KEPT else ""
            masks = _good_masks(store, settings, prefix, task)
            cell = f"{kept:.1f}" + (f" of {sum(map(len, masks[0]['heads']))}" if masks else "")  # the model's heads
            if masks and all(m.get("n_kv_groups_kept") is not None for m in masks):  # a GQA decoder: whole groups too
                groups = sum(m["n_kv_groups_kept"] for m in masks) / len(masks)
                cell += f" query heads ({groups:.1f} of {sum(map(len, masks[0]['kv_groups']))} KV groups)"
            rows.append({"quantity": "heads the good subnetwork keeps", "task": task, "this run": cell, "paper": paper})
    return rows


def _good_masks(store, settings: LotterySettings, prefix: str, task: str) -> list[dict]:
    """The good masks (``mask`` of each seed's finished ``prune`` job) of ``task``."""
    jobs = [finished(store, job_name(prefix, "prune", task, f"seed{seed}")) for seed in settings.seeds]
    return [j.result["mask"] for j in jobs if j is not None and j.result.get("mask")]


def report(store, config: LotteryConfig):
    """``report_fn`` of the ``lottery`` study type: [`lottery_summary`][headcount.experiments.studies.lottery.report.lottery_summary] and [`lottery_sections`][headcount.experiments.studies.lottery.report.lottery_sections].

    >>> report(RunStore("runs/lottery-offline"), config).sections[0].title  # doctest: +SKIP
    "The paper's main tables"
    """
    sections = lottery_sections(store, config)
    return ReportContent(summary=lottery_summary(store, config), sections=sections,
                         glance=glance_table(lottery_glance(store, config), "glance", LOTTERY_GLANCE),
                         headline=headline_of(sections, ("lottery_scores",)))
