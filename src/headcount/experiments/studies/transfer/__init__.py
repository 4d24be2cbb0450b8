"""The transfer study: do the heads that matter for masked LM matter downstream?

A reproduction, for any supported encoder and task set, of Chiang & Chen (2021), *Why Can You
Lay Off Heads? Investigating How BERT Heads Transfer* (arXiv 2106.07137). The paper has no public
code; the choices it leaves open are made here and listed below.

What a ``study: transfer`` config runs (job names; ``<t>`` a task id, ``<s>`` a seed, ``<c>``
the masked-LM text source, ``<p>`` a pruning level)::

    layout                              gate grid and shared-layer groups of the model
    mlm-scores/<c>                      1. MLM importance on the pre-trained model
    finetune/<t>/seed<s>                2. fine-tune (shared job)
    task-scores/<t>/seed<s>/fine-tuned     task importance on the fine-tuned model
    head-fit/<t>/seed<s>                   a task head fitted on the frozen pre-trained encoder
    task-scores/<t>/seed<s>/pre-trained    task importance with that head ("before fine-tuning")
    mlm-scores/<t>/seed<s>/fine-tuned      MLM importance on the fine-tuned encoder
    coherence                           3. rank correlation, top-k overlap, layer mass; bootstrap
                                           CIs over examples and permutation p-values
    curve/<t>/seed<s>, curve/<t>/mlm    4. prunability curves: metric vs fraction of heads removed,
                                           heads chosen by MLM, by task, and at random
    embedding-scores/<c>                with ``objectives: [mlm, embedding]``: embedding (SimCSE)
                                           importance of the pre-trained model on the MLM texts,
    curve/<t>/embedding                    and its prunability (similarity structure kept)
    mask/<c>/mlm-<p>, mask/random-<p>   5. masks of the pre-trained model at each level
    prune-then-finetune/<t>/seed<s>/mlm-<p>   ... fine-tuned after pruning (vs fine-tune-then-prune
                                           from the curves); 6. the acceptable deduction is read
                                           off these and the MLM curve in the report

Design choices (the paper leaves them open):

- **Importance** is Michel et al.'s (``scoring.method: gradient-token``: sum over tokens of
  |dL/dg| per token, eval mode; ``gradient``, the sum of each batch's |dL/dg|, is an option),
  un-normalised for every statistic (ranks do not depend on a loss's scale; layer mass needs the
  raw values). Only heads are compared; MLP scores stay in the score files; head scores are in
  ``head_scores.csv``.
- **Data**: every score is computed on the same seeded subset of the task's *train* split
  (``scoring.data``); MLM scores use the texts of that subset (``mlm.corpus: null``, the default:
  each task's own texts, so "MLM vs task" differs in the objective only) or of one fixed text
  source (``mlm.corpus: <task>``). Curves and fine-tuning scores use the validation split.
- **MLM head**: a checkpoint's own MLM head when it has one; otherwise one head fitted on the
  frozen pre-trained encoder ([`headcount.data.mlm_head.fit_mlm_head`][headcount.data.mlm_head.fit_mlm_head], on ``mlm.head_corpus``,
  cached). On a fine-tuned encoder the *pre-trained* head is put back on top
  (``mlm.after_head: pretrained``, what fine-tuning a model that keeps its MLM head would give),
  or a new one is fitted (``refit``).
- **MLM cost**: the vocabulary projection runs only at masked positions
  ([`headcount.data.evaluation.masked_positions_only`][headcount.data.evaluation.masked_positions_only]); the loss and its gradients are those of
  the full model.
- **Before fine-tuning**: a task head fitted on the frozen pre-trained encoder
  (``headcount.data.heads.fit_task_head``; ``head_fit``, merged over ``train``: by default lr 1e-3, 10 epochs). Its
  parameters are those outside ``model.base_model`` (a pooler inside the encoder stays frozen);
  the encoder runs once and its outputs are replayed to the head every epoch.
- **Pruning levels** remove ``round(level x n_heads)`` heads with the lowest importance,
  computed once (Michel et al.'s one-shot ranking), after a per-layer L2 normalisation
  (``pruning.normalize: layer``), as masks applied with gates: no retraining. Random orders are
  random permutations (``pruning.random_draws`` per seed), nested across levels.
- **Before vs after**: prune the pre-trained model by its MLM importance (physically,
  ``before_after.mask_mode: prune``) and fine-tune it with the same settings as the full model;
  compared with fine-tune-then-prune by task importance (and by MLM importance) at the same
  levels, read from the prunability curves (no retraining after pruning). Optional random
  control: ``before_after.random_control``.
- **Acceptable deduction**: per task, the largest increase of the masked-LM loss of the
  pruned pre-trained model (and the matching accuracy drop), over the before/after levels up to
  the largest level such that it and every lower level are acceptable (fine-tuned pruned model
  at least ``before_after.threshold`` (0.9) x the full fine-tuned model's score, both means over
  seeds); ``level_raw`` ignores failures below (the raw curve). ``removable_fraction`` of the
  prunability curves follows the same rule (``removable_fraction_raw`` beside it).
- **Uncertainty**: bootstrap over scoring examples (per-example contributions of
  ``per_example.safetensors``: each row is an example's share of its batch's score, with the
  example's id (task, split, index); with ``gradient-token`` they sum exactly to the score grid;
  with ``gradient`` they sum to a per-example-absolute proxy, whose full-data value is the
  ``boot_estimate`` column). A pair's interval is its estimate +- z x the replicates' standard
  deviation (centred on the estimate: the replicates centre on ``boot_estimate``). Grids of
  the same examples (MLM vs task on the task's own texts, before vs after, seed vs seed) are
  resampled as pairs matched by example id; others independently (``pairing`` column). A mean
  over seeds gets a hierarchical bootstrap interval (seeds resampled, then examples within each;
  t interval; ``coherence_seeds.csv``); approximate where the pairs share a grid (the MLM grid of
  every seed, seed-vs-seed pairs); with one seed (or pair) the estimate +- z x its example
  bootstrap's standard deviation (``normal``: example noise only, centred on the estimate). Coherence is also computed on layer-normalised grids (each
  layer z-scored; statistics ``...@layer-norm``). Permutation p-values: ``p_value`` within layers
  by default (``stats.permutation``; layer effects shared by both grids do not count),
  ``p_value_global`` over all heads; two-sided. Seeded from ``stats.seed`` and the pair's name.
- **A second pre-training objective** (``objectives: [mlm, embedding]``; default ``[mlm]``, whose
  jobs keep their keys): ``headcount.data.embedding``'s unsupervised SimCSE loss scored like MLM
  (same texts, method, example ids), compared with task importance and with MLM
  (``embedding-vs-task``, ``embedding-vs-task-before``, ``mlm-vs-embedding``), and an ``embedding``
  order in the task prunability curves. Its per-example rows split the gate gradient exactly
  over texts but each is conditional on its batch's negatives: the bootstrap, which resamples
  rows as independent, is approximate for these grids.
- **Shared layers** (ALBERT): every statistic and curve is reported per application (depth x
  head) and per shared head (importance summed over the depths that run a shared layer); the
  ``layout`` job records the groups ([`headcount.core.gates.shared_groups`][headcount.core.gates.shared_groups]).

Composable: [`transfer_jobs`][headcount.experiments.studies.transfer.plan.transfer_jobs] returns the jobs of a [`TransferSettings`][headcount.experiments.studies.transfer.config.TransferSettings] under a name
prefix and [`report.transfer_sections`][headcount.experiments.studies.transfer.report.transfer_sections] the report sections, so another study type (the demo)
can include a transfer part.

The package: [`config`][headcount.experiments.studies.transfer.config] (settings and job parameters), [`plan`][headcount.experiments.studies.transfer.plan] (settings -> jobs),
[`jobs`][headcount.experiments.studies.transfer.jobs] (the job functions), [`tables`][headcount.experiments.studies.transfer.tables], [`figures`][headcount.experiments.studies.transfer.figures], [`report`][headcount.experiments.studies.transfer.report]. The maths is
in [`headcount.analysis.coherence`][headcount.analysis.coherence] (views, coherence) and [`headcount.analysis.removal`][headcount.analysis.removal]
(removal masks, acceptable deduction); fitting heads on a frozen encoder in [`headcount.data.heads`][headcount.data.heads].
"""

from __future__ import annotations

from headcount.experiments.runner import register_study
from headcount.experiments.studies.transfer.config import (
    BeforeAfterSettings,
    DataSettings,
    MlmSettings,
    PruningSettings,
    ScoringSettings,
    StatsSettings,
    TaskSpec,
    TrainSettings,
    TransferConfig,
    TransferSettings,
    task_id,
)
from headcount.experiments.studies.transfer.plan import COMPARISONS, Names, expand, plan_of, transfer_jobs

# The job functions, the tables and the report import torch models, pandas and matplotlib (about
# 1 s), which validating or planning a config does not need: import them from their modules.
__all__ = ["COMPARISONS", "BeforeAfterSettings", "DataSettings", "MlmSettings", "Names", "PruningSettings",
           "ScoringSettings", "StatsSettings", "TaskSpec", "TrainSettings", "TransferConfig", "TransferSettings",
           "expand", "plan_of", "task_id", "transfer_jobs"]


def _report(store, config: TransferConfig):
    """``report_fn`` of the ``transfer`` study type ([`report.report`][headcount.experiments.studies.transfer.report.report], imported when a report is built)."""
    from headcount.experiments.studies.transfer.report import report

    return report(store, config)


register_study("transfer", TransferConfig, expand, _report,
               description="how head importance transfers from masked LM to downstream tasks (Chiang & Chen 2021)")
