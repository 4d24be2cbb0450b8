"""The lottery study (Prasanna, Rogers & Rumshisky 2020, "When BERT Plays the Lottery, All
Tickets Are Winning"): good, random and bad subnetworks, and what their heads attend to.

Per task and seed the study

1. fine-tunes the full model (``finetune``);
2. finds the *good* structured subnetwork by iterative pruning of heads and MLPs with the
   Prasanna schedule until the dev metric falls below ``threshold`` x the full model's
   (``prune``; importance and stop rule on the dev set, as the paper's code does);
3. evaluates the good subnetwork on the fine-tuned weights without retraining (``evaluate``:
   the mask as gates);
4. draws a *random* subnetwork (as many heads and MLPs, uniformly; or the paper's Bernoulli
   draw, ``random: bernoulli``) and a *bad* one (drawn from the pruned components, topped up
   with random good ones when the good set is larger: Prasanna's rule) and retrains good,
   random and bad from the **pre-trained** weights, physically pruned (``lottery.retrain``);
5. magnitude pruning (``lottery.magnitude``, global L1 over the Prasanna weights): the good
   weight mask by the paper's procedure (``magnitude.procedure: prasanna``, the default: 10% of
   the remaining fine-tuned weights a step without retraining, the last mask whose un-retrained
   dev metric is >= 0.9 x full) or by IMP (``imp``: retrained every round); random and bad masks
   at exactly the same sparsity; each retrained once from the pre-trained weights. No passing
   step: a NaN row flagged ``no_passing_mask``, its controls skipped;
6. classifies every head of the fine-tuned model into the five Kovaleva et al. (2019) pattern
   classes with the rule-based classifier on mean attention maps (``lottery.patterns``), and
   with a CNN trained on user-labelled maps when the config names them (``lottery.pattern-cnn``).

Across seeds, per task: super-survivors (components every seed keeps) with size-matched random
and bad controls, each retrained (``lottery.subnetwork`` + ``lottery.retrain``); mask stability
(Krippendorff's alpha, Cochran's Q, pairwise Jaccard; ``lottery.stability``). Across tasks: the
overlap of good subnetworks (``lottery.overlap``).

The modules: [`config`][headcount.experiments.studies.lottery.config] (settings, job parameters), [`plan`][headcount.experiments.studies.lottery.plan] (settings -> jobs),
[`jobs`][headcount.experiments.studies.lottery.jobs] (the job functions), [`tables`][headcount.experiments.studies.lottery.tables], [`figures`][headcount.experiments.studies.lottery.figures] and [`report`][headcount.experiments.studies.lottery.report] (the report
from saved results). The maths lives elsewhere: [`headcount.importance.pruning`][headcount.importance.pruning] (the loop),
[`headcount.train.magnitude_search`][headcount.train.magnitude_search] (the magnitude procedures) on ``headcount.importance.magnitude``
(weight masks and their controls), ``headcount.train`` (retraining),
``headcount.analysis`` (controls, stability, overlap, super-survivors, pattern classes).

Composable: [`lottery_jobs`][headcount.experiments.studies.lottery.plan.lottery_jobs] returns the jobs of a [`LotterySettings`][headcount.experiments.studies.lottery.config.LotterySettings] under a name
prefix and [`lottery_sections`][headcount.experiments.studies.lottery.report.lottery_sections] the report sections for them, so another study type (the
demo) can include a lottery part::

    class DemoConfig(StudyConfig):
        lottery: LotterySettings | None = None

    def expand(config):
        return [..., *lottery_jobs(config.lottery, prefix="lottery/")]
"""

from headcount.experiments.runner import register_study
from headcount.experiments.studies.lottery.config import (
    LotteryConfig,
    LotterySettings,
    MagnitudeSettings,
    PatternCNNSettings,
    PatternSettings,
    PruningSettings,
    SuperSurvivorSettings,
    TrainSettings,
)
from headcount.experiments.studies.lottery.jobs import (
    control_rng,
    magnitude_job,
    overlap_job,
    pattern_cnn_job,
    patterns_job,
    retrain_job,
    stability_job,
    subnetwork_job,
    super_random_rng,
)
from headcount.experiments.studies.lottery.plan import expand, job_name, lottery_jobs, lottery_metric, task_name
from headcount.experiments.studies.lottery.report import lottery_sections, lottery_summary, report
from headcount.experiments.studies.lottery.tables import (
    EXPERIMENTS,
    SUPER_EXPERIMENTS,
    seed_scores,
    summarize,
    wide_table,
)

__all__ = [
    "EXPERIMENTS",
    "SUPER_EXPERIMENTS",
    "LotteryConfig",
    "LotterySettings",
    "MagnitudeSettings",
    "PatternCNNSettings",
    "PatternSettings",
    "PruningSettings",
    "SuperSurvivorSettings",
    "TrainSettings",
    "control_rng",
    "expand",
    "job_name",
    "lottery_jobs",
    "lottery_metric",
    "lottery_sections",
    "lottery_summary",
    "magnitude_job",
    "overlap_job",
    "pattern_cnn_job",
    "patterns_job",
    "report",
    "retrain_job",
    "seed_scores",
    "stability_job",
    "subnetwork_job",
    "summarize",
    "super_random_rng",
    "task_name",
    "wide_table",
]

register_study("lottery", LotteryConfig, expand, report,
               description="good / random / bad subnetworks, super-survivors and attention patterns (Prasanna et al. 2020)")
