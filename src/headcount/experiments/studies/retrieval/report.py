"""The retrieval study's report: the targets of issue 33 beside the reference numbers with the
budget curve as the headline figure, then per part its figures and its tables (the raw ones
folded, each with its CSV).

[`retrieval_sections`][headcount.experiments.studies.retrieval.report.retrieval_sections] works under a job-name prefix, so another study can
include a retrieval part; [`report`][headcount.experiments.studies.retrieval.report.report] is the study type's ``report_fn``.
"""

from __future__ import annotations

import re

from headcount.analysis.ablation import MASK_WORDS
from headcount.experiments.report import ReportContent, ReportTable, Section
from headcount.experiments.studies.retrieval.config import (
    RetrievalConfig,
    RetrievalSettings,
)
from headcount.experiments.studies.retrieval.figures import (
    ablation_figure,
    curve_figure,
    scores_figure,
    stability_figure,
)
from headcount.experiments.studies.retrieval.tables import (
    POINTS,
    ablation_table,
    curve_table,
    head_scores,
    pooled,
    score_runs,
    stability_summary,
    stability_table,
    targets,
)


def _tag(prefix: str) -> str:
    t = re.sub(r"[^A-Za-z0-9_.-]+", "-", prefix).strip("-_.")
    return f"{t}_" if t else ""


def _raw(name, df, caption, **kw):
    """A raw table: folded under its caption, with its CSV."""
    return ReportTable(name, df, caption, collapsed=True, **kw)


def _what(s: RetrievalSettings) -> str:
    n = s.niah
    return (f"{n.needle} needles in {n.haystack if n.haystack == 'offline' else 'file'} haystacks ({n.split} texts) "
            f"of {'/'.join(map(str, n.lengths))} tokens at {len(n.depths)} depths, {n.examples} examples per "
            f"template ({', '.join(s.templates)}) and haystack seed ({', '.join(map(str, s.seeds))})")


def retrieval_sections(store, settings: RetrievalSettings, prefix: str = "") -> list[Section]:
    """The report sections of a retrieval part: the budget curve, the scores, their stability, the
    ablation. Tables (``results/<tag>*.csv``): ``curve``, ``runs``, ``head_scores``,
    ``stability_summary``, ``stability``, ``ablation``.

    Args:
        store: the run's [`RunStore`][headcount.experiments.runner.RunStore].
        settings: the [`RetrievalSettings`][headcount.experiments.studies.retrieval.config.RetrievalSettings] the jobs came from.
        prefix: the job-name prefix given to ``retrieval_jobs``.

    Returns:
        A list of [`Section`][headcount.experiments.report.Section].

    >>> retrieval_sections(store, config)[0].title           # doctest: +SKIP
    'KV budgets'
    """
    s, tag = settings, _tag(prefix)
    b, h, sc = s.budgets, s.held_out, s.scoring
    sections = []
    curve = curve_table(store, s, prefix)
    if not curve.empty:
        sections.append(Section(
            "KV budgets",
            f"Each KV head keeps the full cache or a sink of {b.sink} and a window of {b.window} tokens (GQA: a "
            f"budget per KV head, its query heads following it). Budgets from the scores keep "
            f"the full cache for the KV heads the pooled {b.ranking} scores rank highest"
            f"{' (the max over each group; ties, mostly at 0, broken by the pooled long-range mass)' if b.ranking == 'retrieval' else ''}"
            ", as many as the memory target allows; the uniform baseline streams every KV head with the widest window the target allows "
            "(StreamingLLM); the random baseline keeps as many full KV heads as the scores' budget, drawn at random. "
            f"KV memory is measured (cache.nbytes()) after a prefill of {b.context:,} tokens, as a share of the "
            f"full cache's measured bytes. Needle accuracy: {h.examples} held-out {s.niah.needle} prompts of "
            f"{b.context:,} tokens (haystack seed {h.seed}, {h.split} texts, template {h.template}), greedy decoding "
            "with the budget's cache, the answer exact. LM loss: mean next-token loss on "
            f"{b.lm_texts} ordinary texts of {b.context:,} tokens ({b.lm_split} haystack texts, no needle), the "
            "budget's attention in the forward pass (the first sink + window positions read the same keys "
            "under every budget).",
            figures={f"{tag}curve": curve_figure(curve, POINTS)},
            tables=[ReportTable(f"{tag}curve", curve, "Every budget: measured and predicted KV bytes, their share of "
                                "the full cache, needle accuracy and LM loss.")],
            main=True))
    runs = score_runs(store, s, prefix)
    pool = pooled(store, s, prefix)
    if pool or not runs.empty:
        sections.append(Section(
            "Retrieval and long-range scores",
            f"Wu et al.'s retrieval score per query head ({sc.max_new_tokens} greedy tokens, an example counts when "
            f"{'its ROUGE-1 recall exceeds 0.5' if sc.success == 'rouge1' else 'the answer is exact'}), and the "
            f"attention mass outside the first {sc.sink} tokens and the last {sc.window} keys (long-range; per KV "
            f"head the {sc.kv_reduce} over its query heads), on {_what(s)}. Pooled: every example of every run "
            f"at once (the ranking the ablation and the budgets use); the share of heads above {sc.threshold:g} with "
            f"its {sc.level:.0%} percentile bootstrap interval over examples ({sc.n_boot} resamples).",
            figures={f"{tag}scores": scores_figure(pool, sc.threshold)} if pool else None,
            tables=[ReportTable(f"{tag}runs", runs, "Per scorer, template and haystack seed: examples, those counted, "
                                "needle accuracy while scoring, share of heads above the threshold [interval]."),
                    _raw(f"{tag}head_scores", head_scores(store, s, prefix), "Every head's score (per run and "
                         "pooled; the retrieval interval where there is one).", max_rows=12)]))
    rows = stability_table(store, prefix)
    if not rows.empty:
        summ = stability_summary(rows)
        sections.append(Section(
            "Stability of the head sets",
            "Every head set the study writes, compared across haystack seeds (same template and scorer), prompt "
            "templates (same seed and scorer) and scorers (retrieval vs long-range, same run): the top "
            f"{', '.join(f'{f:.0%}' for f in s.stability.fractions)} of query heads and of KV heads (among those "
            "scoring above 0), and the full KV heads of the budget each run's scores give at each memory target. "
            "Jaccard of the two sets beside its chance level (two random sets of the same sizes among the same "
            "units), and the Spearman correlation of the grids; mean over pairs [min, max]. tied: set members chosen "
            "among equal scores at the set's cut (broken by position, alike in every grid: agreement there is no "
            "evidence; a budget from scores that are mostly 0 has many).",
            figures={f"{tag}stability": stability_figure(summ)},
            tables=[ReportTable(f"{tag}stability_summary", summ, "Agreement per head set, comparison and scorer: "
                                "mean over pairs, with the range."),
                    _raw(f"{tag}stability", rows, "Every pair of head sets.", max_rows=20)]))
    ab = ablation_table(store, s, prefix)
    if not ab.empty:
        a = s.ablation
        sections.append(Section(
            "Ablation: are the top heads needed?",
            f"On {h.examples} held-out prompts of {s.ablation_length} tokens (haystack seed {h.seed}, {h.split} "
            f"texts): needle accuracy (answer exact, {a.max_new_tokens} greedy tokens) of the full model, with the "
            f"top {a.fraction:.0%} of query heads by the pooled retrieval score masked (heads) or of KV heads by "
            f"the pooled {b.ranking} score (kv-groups: every query head of the group), and with each of {a.draws} "
            "random sets of as many units, drawn from the units outside the top set, masked (mask "
            f"{a.mask}: {MASK_WORDS[a.mask]}). p_value: the head-set test, the top set ranked among the random "
            "sets, p = (1 + n_as_harmful) / (1 + n_sets), n_as_harmful the random sets with an accuracy at most "
            "the top set's (p_min = 1 / (1 + n_sets) is the smallest p possible); difference and "
            "p_value_prompts (a one-sided sign-flip test over examples of mean random - top success) describe "
            "the examples, not the head sets. accuracy_random_theirs: Wu et al.'s protocol, theirs: a fresh random "
            "set for every example. n_positive: units with a retrieval score above 0 (with fewer than k, the "
            "top set is completed by the pooled long-range mass).",
            figures={f"{tag}ablation": ablation_figure(ab)},
            tables=[ReportTable(f"{tag}ablation", ab, "Top-k vs random units gated off, per unit.")]))
    return sections


def retrieval_summary(store, settings: RetrievalSettings, prefix: str = "") -> str:
    """The summary paragraph: the targets, one sentence each."""
    t = targets(store, settings, prefix)
    if t.empty:
        return "No results yet."
    return " ".join(f"{r['target'][0].upper()}{r['target'][1:]}: {r['this run']}." for _, r in t.iterrows())


#: the glance table's caption
GLANCE = ("The targets of the retrieval-heads issue in this run's numbers, beside the references' (their models and "
          "settings differ: 7B-14B models at up to 100k tokens); the sections below have the rest.")


def report(store, config: RetrievalConfig):
    """``report_fn`` of the ``retrieval`` study type.

    >>> report(RunStore("runs/retrieval-offline-decoder"), config).headline   # doctest: +SKIP
    'curve'
    """
    sections = retrieval_sections(store, config)
    t = targets(store, config)
    drawn = {f.name for sec in sections for f in sec.figures}
    headline = next((n for n in ("curve", "scores", "ablation") if n in drawn), "")
    return ReportContent(summary=retrieval_summary(store, config), sections=sections,
                         glance=ReportTable("targets", t, GLANCE) if not t.empty else None, headline=headline)
