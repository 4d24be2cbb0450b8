"""The retrieval study: which heads of a decoder read far back into the context, how sure that is,
whether they are needed (a causal test), and whether keeping the full KV cache for them only
saves real memory at the context length (issue 33: Wu et al. 2024, *Retrieval Head Mechanistically
Explains Long-Context Factuality*, arXiv 2404.15574; DuoAttention, arXiv 2410.10819).

What a ``study: retrieval`` config runs (job names; ``<t>`` a prompt template, ``<s>`` a haystack
seed, ``<m>`` a memory target)::

    scores/retrieval/<t>/seed<s>    1. Wu et al.'s retrieval score per query head, bootstrap interval
    scores/long-range/<t>/seed<s>      attention mass outside sink + window, per query and per KV head
    pooled/retrieval, pooled/long-range   every example of a scorer at once: the study's rankings,
                                       the share of heads above 0.1 with its interval
    stability                       2. top-k query heads, top-k KV heads and the budgets' full KV
                                       heads: Jaccard (chance level) and Spearman across haystack
                                       seeds, templates and scorers
    ablation/heads, ablation/kv-groups  3. top 5% vs random units gated, needle accuracy on
                                       held-out haystacks, paired sign-flip test over examples
    budget/full, budget/<m>/<kind>  4. budgets: full cache; from the scores, uniform sink + window
    curve/full, curve/<m>/<kind>       (StreamingLLM), random full KV heads, each at memory <m>:
                                       measured KV bytes, needle accuracy and LM loss at the context

Design choices (the reference's where it has one; ``docs/retrieval.md`` says
where headcount differs):

- **Scores**: [`headcount.importance.retrieval`][headcount.importance.retrieval] as the scorers
  compute them, on generated needle-in-a-haystack prompts
  ([`headcount.data.tasks.niah`][headcount.data.tasks.niah]); one job per scorer, template and
  haystack seed, so each (t, s) is one replicate of the ranking.
- **Pooled rankings**: retrieval: the mean of each head's copies over the counted examples of every
  run (Wu et al. average over all their needles); long-range: the mass over every run's queries.
  They rank query heads for the head ablation and KV heads for the budgets
  (``budgets.ranking``: by default retrieval's max over each group, its ties, mostly at 0,
  broken by the long-range mass; or the long-range mass alone).
- **Head sets** are the top fraction of units among those scoring above 0 (ties at 0 are not a
  set); the chance level of a Jaccard is that of two random sets of the same sizes.
- **Held-out haystacks**: another seed (``held_out.seed``, none of ``seeds``) on another split of
  the haystack texts; the ablation at the scoring length, the curve at ``budgets.context``.

Composable: [`retrieval_jobs`][headcount.experiments.studies.retrieval.plan.retrieval_jobs] returns the jobs under a name prefix and
[`retrieval_sections`][headcount.experiments.studies.retrieval.report.retrieval_sections] the report sections.

The package: [`config`][headcount.experiments.studies.retrieval.config] (settings and job parameters),
[`plan`][headcount.experiments.studies.retrieval.plan] (settings -> jobs),
[`jobs`][headcount.experiments.studies.retrieval.jobs] (the job functions; the stability job in
[`stability`][headcount.experiments.studies.retrieval.stability]),
[`tables`][headcount.experiments.studies.retrieval.tables], [`figures`][headcount.experiments.studies.retrieval.figures],
[`report`][headcount.experiments.studies.retrieval.report].
"""

from __future__ import annotations

from headcount.experiments.runner import register_study
from headcount.experiments.studies.retrieval.config import (
    AblationSettings,
    BudgetSettings,
    HeldOutSettings,
    NiahSettings,
    RetrievalConfig,
    RetrievalSettings,
    ScoringSettings,
    StabilitySettings,
)
from headcount.experiments.studies.retrieval.plan import (
    Names,
    budgets_of,
    expand,
    retrieval_jobs,
)

# The job functions, the tables and the report import models, pandas and matplotlib, which
# validating or planning a config does not need: import them from their modules.
__all__ = ["AblationSettings", "BudgetSettings", "HeldOutSettings", "Names", "NiahSettings", "RetrievalConfig",
           "RetrievalSettings", "ScoringSettings", "StabilitySettings", "budgets_of", "expand", "retrieval_jobs"]


def _report(store, config: RetrievalConfig):
    """``report_fn`` of the ``retrieval`` study type ([`report.report`][headcount.experiments.studies.retrieval.report.report], imported when a report is built)."""
    from headcount.experiments.studies.retrieval.report import report

    return report(store, config)


register_study("retrieval", RetrievalConfig, expand, _report,
               description="retrieval heads (Wu et al. 2024), their stability, a causal test, and per-KV-head "
                           "cache budgets against StreamingLLM and random heads")
