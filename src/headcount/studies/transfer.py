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
    mask/<c>/mlm-<p>, mask/random-<p>   5. masks of the pre-trained model at each level
    prune-then-finetune/<t>/seed<s>/mlm-<p>   ... fine-tuned after pruning (vs fine-tune-then-prune
                                           from the curves); 6. the acceptable deduction is read
                                           off these and the MLM curve in the report

Design choices (the paper leaves them open):

- **Importance** is Michel et al.'s (``scoring.method: gradient-token``: sum over tokens of
  |dL/dg| per token, eval mode; ``gradient``, the per-batch form of run_bertology, is an option),
  un-normalised for every statistic (ranks do not depend on a loss's scale; layer mass needs the
  raw values). Only heads are compared; MLP scores stay in the score files; head scores are in
  ``head_scores.csv``.
- **Data**: every score is computed on the same seeded subset of the task's *train* split
  (``scoring.data``); MLM scores use the texts of that subset (``mlm.corpus: null``, the default:
  each task's own texts, so "MLM vs task" differs in the objective only) or of one fixed text
  source (``mlm.corpus: <task>``). Curves and fine-tuning scores use the validation split.
- **MLM head**: a checkpoint's own MLM head when it has one; otherwise one head fitted on the
  frozen pre-trained encoder (:func:`headcount.tasks.fit_mlm_head`, on ``mlm.head_corpus``,
  cached). On a fine-tuned encoder the *pre-trained* head is put back on top
  (``mlm.after_head: pretrained``, what fine-tuning a model that keeps its MLM head would give),
  or a new one is fitted (``refit``).
- **MLM cost**: the vocabulary projection runs only at masked positions
  (:func:`masked_positions_only`); the loss and its gradients are those of the full model.
- **Before fine-tuning**: a task head fitted on the frozen pre-trained encoder
  (:func:`fit_task_head`; ``head_fit``, merged over ``train``: by default lr 1e-3, 10 epochs). Its
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
  pruned pre-trained model (and the matching accuracy drop), over the before/after levels, at
  which the fine-tuned pruned model scores at least ``before_after.threshold`` (0.9) x the full
  fine-tuned model's score (both means over seeds).
- **Uncertainty**: percentile bootstrap over scoring examples (per-example contributions of
  ``per_example.safetensors``: each row is an example's share of its batch's score; with ``gradient-token`` they
  sum exactly to the score grid, so the interval is about the reported estimate; with
  ``gradient`` they sum to a per-example-absolute proxy, whose full-data value is the
  ``boot_estimate`` column). Both grids are resampled jointly when they come from the same
  examples in the same order (before vs after, seed vs seed), independently otherwise.
  Permutation p-values permute head positions (two-sided). Seeded from ``stats.seed`` and the
  pair's name.
- **Shared layers** (ALBERT): every statistic and curve is reported per application (depth x
  head) and per shared head (importance summed over the depths that run a shared layer); the
  ``layout`` job records the groups (:func:`headcount.gates.shared_groups`).

Composable: :func:`transfer_jobs` returns the jobs of a :class:`TransferSettings` under a name
prefix and :func:`transfer_sections` the report sections, so another study type (the demo)
can include a transfer part.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from ..errors import HeadcountError
from ..runner import ConfigSection, Job, StudyConfig, register_study
from ..evaluation import masked_positions_only
from .jobs import step_messages

HERE = "headcount.studies.transfer"
SHARED_JOBS = "headcount.studies.jobs"

#: the comparisons of the coherence table, in the order the report shows them
COMPARISONS = {
    "mlm-vs-task": "MLM (pre-trained) vs task (fine-tuned)",
    "mlm-vs-task-before": "MLM (pre-trained) vs task (pre-trained encoder, fitted head)",
    "task-before-vs-after": "task: pre-trained encoder vs fine-tuned",
    "mlm-before-vs-after": "MLM: pre-trained vs fine-tuned encoder",
    "task-vs-task": "task vs task (fine-tuned, same seed)",
    "seed-vs-seed": "same task, two fine-tuning seeds",
    "mlm-vs-mlm": "MLM on one task's texts vs another's",
}


# =============================================================================================
# config
# =============================================================================================
class TrainSettings(ConfigSection):
    """Fine-tuning settings: any field of :class:`headcount.training.TrainConfig`; unset = its default."""

    lr: float | None = None
    batch_size: int | None = None
    epochs: float | None = None
    max_length: int | None = None
    weight_decay: float | None = None
    warmup: float | None = None
    max_grad_norm: float | None = None
    eval_each_epoch: bool | None = None
    bf16: bool | None = None
    group_by_length: bool | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    eval_batch_size: int | None = None
    max_steps: int | None = None
    gradient_accumulation_steps: int | None = None
    data_seed: int | None = None
    save_steps: int | None = None

    def values(self) -> dict:
        """The fields that are set (what overrides the defaults)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}

    @model_validator(mode="after")
    def _valid(self):
        from ..training import TrainConfig

        try:
            TrainConfig(**self.values())
        except HeadcountError as e:  # a ValueError is what pydantic reports with the key and line
            raise ValueError(str(e)) from None
        return self


class DataSettings(ConfigSection):
    """Which examples and how they are batched (:class:`headcount.pipeline.DataConfig`)."""

    max_examples: int | None = Field(512, ge=1)
    batch_size: int = Field(32, ge=1)
    max_length: int = Field(128, ge=8, le=8192)
    seed: int = 0


class MlmSettings(ConfigSection):
    """The masked-LM objective.

    Attributes:
        corpus: a task (name or YAML) whose texts carry the MLM objective for every task;
            None = each task's own texts.
        head_corpus: texts to fit an MLM head on when the checkpoint has none (a task,
            ``offline/corpus``, a ``.txt`` file); None = the MLM corpus (the first task's).
        head_steps: optimisation steps of that fit.
        head_max_texts: texts used for the fit (a seeded subset).
        after_head: on a fine-tuned encoder, put the pre-trained MLM head back (``pretrained``)
            or fit a new one (``refit``).
        eval: the validation texts of the MLM prunability curve.
    """

    corpus: str | None = None
    head_corpus: str | None = None
    head_steps: int = Field(300, ge=1)
    head_max_texts: int = Field(2000, ge=2)
    after_head: Literal["pretrained", "refit"] = "pretrained"
    eval: DataSettings = DataSettings(max_examples=256)


class ScoringSettings(ConfigSection):
    """Importance scores: the method and the (train-split) examples."""

    method: Literal["gradient", "gradient-token"] = "gradient-token"
    data: DataSettings = DataSettings()


class PruningSettings(ConfigSection):
    """Prunability curves (masks as gates, no retraining).

    Attributes:
        levels: fractions of heads removed, each in (0, 1).
        random_draws: random removal orders per curve.
        normalize: score normalisation before ranking (``layer``: per-layer L2, Michel et al.).
        views: ``application`` (depth x head) and, for shared-layer models, ``shared``.
    """

    levels: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    random_draws: int = Field(3, ge=0)
    normalize: Literal["none", "layer"] = "layer"
    views: tuple[Literal["application", "shared"], ...] = ("application", "shared")

    @field_validator("levels")
    @classmethod
    def _levels(cls, v):
        return _check_levels(v)


class BeforeAfterSettings(ConfigSection):
    """Prune the pre-trained model by MLM importance, then fine-tune.

    Attributes:
        enabled: run this part (and the acceptable deduction).
        levels: fractions of heads removed before fine-tuning.
        seeds: fine-tuning seeds for it (None = the study's seeds).
        view: rank per application or per shared head (shared: removable from shared weights).
        mask_mode: ``prune`` (physical) or ``gate``.
        random_control: also prune at random (one draw per level) and fine-tune.
        threshold: "acceptable" = at least this share of the full fine-tuned score.
    """

    enabled: bool = True
    levels: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
    seeds: tuple[int, ...] | None = None
    view: Literal["application", "shared"] = "application"
    mask_mode: Literal["prune", "gate"] = "prune"
    random_control: bool = False
    threshold: float = Field(0.9, gt=0, le=1)

    @field_validator("levels")
    @classmethod
    def _levels(cls, v):
        return _check_levels(v)


class StatsSettings(ConfigSection):
    """Uncertainty of the coherence statistics.

    Attributes:
        n_boot: bootstrap resamples over examples (0 = no intervals).
        n_permutations: permutations for the p-values (0 = none).
        level: confidence level.
        seed: base seed (each pair adds a hash of its name).
        fractions: top-k fractions for the Jaccard overlap.
    """

    n_boot: int = Field(1000, ge=0)
    n_permutations: int = Field(9999, ge=0)
    level: float = Field(0.95, gt=0, lt=1)
    seed: int = 0
    fractions: tuple[float, ...] = (0.1, 0.25, 0.5)

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, v):
        if not v or any(not 0 < f <= 1 for f in v):
            raise ValueError("fractions must be in (0, 1]")
        return tuple(sorted(set(v)))


class TaskSpec(ConfigSection):
    """A task with an explicit short id (used in job names, tables and figure labels)."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    task: str


class TransferSettings(ConfigSection):
    """Everything a transfer part needs (the ``transfer`` study config without ``study:``).

    Attributes:
        model: hub id, checkpoint directory or ``offline``.
        tasks: task names / YAML paths, or ``{id, task}`` mappings.
        seeds: fine-tuning seeds.
        train: fine-tuning settings.
        head_fit: settings of the task head fitted on the frozen encoder, over ``train``.
        mlm / scoring / pruning / before_after / stats: see their sections.
    """

    model: str = "offline"
    tasks: tuple[str | TaskSpec, ...]
    seeds: tuple[int, ...] = (1,)
    train: TrainSettings = TrainSettings()
    head_fit: TrainSettings = TrainSettings(lr=1e-3, epochs=10)
    mlm: MlmSettings = MlmSettings()
    scoring: ScoringSettings = ScoringSettings()
    pruning: PruningSettings = PruningSettings()
    before_after: BeforeAfterSettings = BeforeAfterSettings()
    stats: StatsSettings = StatsSettings()

    @field_validator("model")
    @classmethod
    def _model(cls, v, info: ValidationInfo):
        return _resolve_path(v, info, must_exist=False)

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks(cls, v, info: ValidationInfo):
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError("give at least one task")
        out = []
        for item in v:
            if isinstance(item, str):
                out.append(_resolve_path(item, info))
            elif isinstance(item, Mapping) and isinstance(item.get("task"), str):
                out.append({**item, "task": _resolve_path(item["task"], info)})
            else:
                out.append(item)
        return out

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v):
        if not v or len(set(v)) != len(v):
            raise ValueError("seeds must be a non-empty list without repeats")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        ids = [task_id(t) for t in self.tasks]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"two tasks have the id {dup[0]!r}; give them ids: {{id: ..., task: ...}}")
        if self.before_after.seeds is not None and not set(self.before_after.seeds) <= set(self.seeds):
            raise ValueError("before_after.seeds must be among seeds")
        return self

    @field_validator("mlm")
    @classmethod
    def _mlm_paths(cls, v: MlmSettings, info: ValidationInfo):
        upd = {k: _resolve_path(getattr(v, k), info) for k in ("corpus", "head_corpus") if getattr(v, k)}
        return v.model_copy(update=upd) if upd else v


class TransferConfig(StudyConfig, TransferSettings):
    """The ``study: transfer`` config: :class:`TransferSettings` plus name and description.

    >>> c = TransferConfig(study="transfer", tasks=["offline/movies", "offline/tweets"])
    >>> [task_id(t) for t in c.tasks], c.pruning.levels[:2]
    (['movies', 'tweets'], (0.1, 0.2))
    """


def _check_levels(v):
    if not v or any(not 0 < x < 1 for x in v):
        raise ValueError("levels must be fractions in (0, 1)")
    return tuple(sorted(set(float(x) for x in v)))


def _resolve_path(value: str, info: ValidationInfo, must_exist: bool = False) -> str:
    """A relative path that exists next to the config file becomes absolute; names stay names."""
    if not isinstance(value, str):
        return value
    base = (info.context or {}).get("base_dir") if info is not None else None
    p = Path(value).expanduser()
    if p.is_absolute():
        return str(p)
    if base is not None:
        candidate = Path(base) / p
        if candidate.exists() or (p.suffix.lower() in (".yaml", ".yml", ".txt") and not p.exists()):
            return str(candidate.resolve())
    if p.exists() and (p.suffix or value.startswith(".")):
        return str(p.resolve())
    return value


def task_id(spec: str | TaskSpec) -> str:
    """The short id of a task entry: its ``id``, else the name's last part without a suffix.

    >>> task_id("offline/movies"), task_id("/data/my-task.yaml"), task_id(TaskSpec(id="a", task="x"))
    ('movies', 'my-task', 'a')
    """
    if isinstance(spec, TaskSpec):
        return spec.id
    name = Path(str(spec)).name
    for suffix in (".yaml", ".yml"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    out = "".join(c if c.isalnum() or c in "_.-" else "-" for c in name).strip("-.") or "task"
    return out


def _task_name(spec: str | TaskSpec) -> str:
    return spec.task if isinstance(spec, TaskSpec) else str(spec)


# =============================================================================================
# pure helpers: views, masks, coherence, acceptable deduction
# =============================================================================================
def shared_view(grid, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Per-shared-head importance: the rows of each group of applications summed.

    Args:
        grid: ``[n_applications, n_heads]`` (or ``[..., n_applications, n_heads]``).
        groups: applications that run the same physical layer (``layout`` job, ``shared_groups``).

    Returns:
        ``[..., n_groups, n_heads]``.

    >>> shared_view([[1, 2], [3, 4], [5, 6]], [[0, 2], [1]]).tolist()
    [[6.0, 8.0], [3.0, 4.0]]
    """
    g = np.asarray(grid, dtype=np.float64)
    return np.stack([g[..., list(apps), :].sum(axis=-2) for apps in groups], axis=-2)


def view_of(grid, view: str, groups: Sequence[Sequence[int]] | None = None) -> np.ndarray:
    """``grid`` in a view: ``application`` (as is) or ``shared`` (:func:`shared_view`).

    >>> view_of([[1, 2], [3, 4]], "shared", [[0, 1]]).tolist()
    [[4.0, 6.0]]
    """
    if view == "application":
        return np.asarray(grid, dtype=np.float64)
    if view == "shared":
        if not groups:
            raise HeadcountError("the shared view needs the layer groups")
        return shared_view(grid, groups)
    raise HeadcountError(f"unknown view {view!r}; use 'application' or 'shared'")


def removal_mask(grid, fraction: float, *, view: str = "application", groups=None, normalize: str = "layer"):
    """The mask that removes ``round(fraction x units)`` least important heads of ``grid``.

    Args:
        grid: importance ``[n_layers, n_heads]`` (higher = more important; NaN = least).
        fraction: share of units removed, in [0, 1].
        view: ``application`` (units = heads per depth) or ``shared`` (units = shared heads,
            removed at every depth of their group).
        groups: the shared-layer groups (needed for ``shared``).
        normalize: ``layer`` divides each row (layer / group) by its L2 norm first; ``none``.

    Returns:
        A :class:`headcount.masks.Mask` over ``[n_layers, n_heads]`` (MLPs kept).

    >>> removal_mask([[1.0, 5.0], [2.0, 3.0]], 0.5, normalize="none").heads.tolist()
    [[0.0, 1.0], [0.0, 1.0]]
    """
    import torch

    from ..masks import Mask
    from ..pruning import select_lowest

    g = np.asarray(grid, dtype=np.float64)
    n_layers, n_heads = g.shape
    units = view_of(g, view, groups)
    if normalize == "layer":
        norm = np.sqrt(np.nansum(units ** 2, axis=-1, keepdims=True))
        units = units / np.where(norm > 0, norm, 1.0)
    elif normalize != "none":
        raise HeadcountError(f"unknown normalisation {normalize!r}; use 'layer' or 'none'")
    if not 0 <= fraction <= 1:
        raise HeadcountError(f"fraction must be in [0, 1], got {fraction}")
    n = int(round(fraction * units.size))
    keep = select_lowest(torch.from_numpy(units), torch.ones(units.shape), n)
    if view == "shared":
        heads = torch.ones(n_layers, n_heads)
        for row, apps in enumerate(groups):
            heads[list(apps)] = keep[row]
    else:
        heads = keep
    return Mask(heads, torch.ones(n_layers), {"fraction": fraction, "view": view})


def _pair_seed(base: int, name: str) -> int:
    return (int(base) * 1_000_003 + zlib.crc32(name.encode())) % (2 ** 32)


def coherence(a, b, contributions: tuple | None = None, *, paired: bool = False,
              fractions: Sequence[float] = (0.1, 0.25, 0.5), n_boot: int = 1000, n_permutations: int = 9999,
              level: float = 0.95, seed: int = 0, view: str = "application", groups=None) -> dict:
    """Coherence of two head-importance grids, with bootstrap intervals and permutation p-values.

    Statistics (on ``view_of(grid, view, groups)``): ``spearman``, ``kendall`` (tau-b),
    ``jaccard@F`` (top-F overlap, for each fraction) and ``layer_mass_l1`` (L1 distance of the
    per-layer importance shares, in [0, 2]).

    Args:
        a: ``[n_layers, n_heads]`` importance (``scores.json`` ``heads``).
        b: the same shape.
        contributions: optional ``(per_example_a, per_example_b)``, each ``[n_examples, n_layers,
            n_heads]``: bootstrap over examples (the grids are re-aggregated as sums).
        paired: resample both with the same indices (same examples in the same order).
        fractions: top-k fractions for the Jaccard overlap.
        n_boot: bootstrap resamples (0: no intervals).
        n_permutations: permutations for the Spearman and Kendall p-values (0: none).
        level: confidence level.
        seed: seeds both procedures (same seed, same numbers).
        view: ``application`` or ``shared``.
        groups: shared-layer groups for the ``shared`` view.

    Returns:
        ``{statistic: {"estimate", "low", "high", "p_value", "chance"}}``; ``low``/``high`` are
        None without contributions, ``p_value`` None where no test applies, ``chance`` the
        expected value for unrelated grids (0 for correlations, f/(2-f) for Jaccard).

    >>> a = np.arange(12.0).reshape(3, 4)                    # 3 layers x 4 heads
    >>> c = coherence(a, a[::-1], n_boot=0, n_permutations=0)  # the layers in reverse order
    >>> [round(c[k]["estimate"], 2) for k in ("spearman", "jaccard@0.25", "layer_mass_l1")]
    [-0.79, 0.0, 0.97]
    """
    from ..analysis import bootstrap_ci, compare_scores, permutation_test

    fractions = tuple(float(f) for f in fractions)
    va, vb = view_of(a, view, groups), view_of(b, view, groups)
    names = ["spearman", "kendall", *[f"jaccard@{f:g}" for f in fractions], "layer_mass_l1"]

    def vector(x, y) -> np.ndarray:
        c = compare_scores(x, y, fractions)
        return np.array([c["spearman"], c["kendall"], *[c["top_k_jaccard"][str(f)] for f in fractions],
                         c["layer_mass_l1"]], dtype=np.float64)

    est = vector(va, vb)
    out = {n: {"estimate": float(e), "low": None, "high": None, "p_value": None, "chance": 0.0}
           for n, e in zip(names, est)}
    for f in fractions:
        out[f"jaccard@{f:g}"]["chance"] = f / (2 - f)
    out["layer_mass_l1"]["chance"] = None
    rng = np.random.default_rng(seed)
    if n_permutations > 0:
        for stat in ("spearman", "kendall"):
            r = permutation_test(va, vb, stat, n_permutations=n_permutations, seed=rng)
            out[stat]["p_value"] = None if math.isnan(r.pvalue) else float(r.pvalue)
    if contributions is not None and n_boot > 0 and all(c is not None for c in contributions):
        ca, cb = (np.asarray(c, dtype=np.float64) for c in contributions)

        def stat(x, y):
            return vector(view_of(x, view, groups), view_of(y, view, groups))

        r = bootstrap_ci(stat, ca, cb, n_boot=n_boot, level=level, seed=rng, reduce="sum",
                         paired=paired and ca.shape[0] == cb.shape[0])
        for i, n in enumerate(names):
            lo, hi = float(r.low[i]), float(r.high[i])
            out[n]["low"] = None if math.isnan(lo) else lo
            out[n]["high"] = None if math.isnan(hi) else hi
            out[n]["boot_estimate"] = float(r.estimate[i])
    return out


def acceptable_deduction(rows: Sequence[Mapping], threshold: float = 0.9) -> dict:
    """The largest MLM-quality loss at which the fine-tuned pruned model keeps ``threshold`` of the full score.

    Args:
        rows: one per pruning level: ``level``, ``mlm_loss_increase``, ``mlm_accuracy_drop``,
            ``relative_score`` (fine-tuned pruned score / full fine-tuned score).
        threshold: the share of the full score that counts as acceptable.

    Returns:
        ``{"level", "mlm_loss_increase", "mlm_accuracy_drop", "relative_score"}`` of the
        acceptable row with the largest loss increase (all None when no level is acceptable).

    >>> acceptable_deduction([{"level": .2, "mlm_loss_increase": .1, "mlm_accuracy_drop": .01, "relative_score": .99},
    ...                       {"level": .4, "mlm_loss_increase": .5, "mlm_accuracy_drop": .05, "relative_score": .95},
    ...                       {"level": .6, "mlm_loss_increase": 1.5, "mlm_accuracy_drop": .2, "relative_score": .7}])["level"]
    0.4
    """
    ok = [r for r in rows if r.get("relative_score") is not None and r["relative_score"] >= threshold
          and r.get("mlm_loss_increase") is not None and math.isfinite(r["mlm_loss_increase"])]
    if not ok:
        return {"level": None, "mlm_loss_increase": None, "mlm_accuracy_drop": None, "relative_score": None}
    best = max(ok, key=lambda r: (r["mlm_loss_increase"], r["level"]))
    return {k: best.get(k) for k in ("level", "mlm_loss_increase", "mlm_accuracy_drop", "relative_score")}


# =============================================================================================
# the masked-LM objective: a head for the encoder, and a forward that only decodes masked tokens
# =============================================================================================
def evaluate_mlm(model, batches, mask=None) -> dict:
    """Masked-LM loss and accuracy over masked tokens (decoding only those; see :func:`masked_positions_only`).

    Args:
        model: a masked-LM model.
        batches: from :func:`headcount.tasks.mlm_batches`.
        mask: optional :class:`~headcount.masks.Mask` applied as gates.

    Returns:
        ``{"score": accuracy, "accuracy", "loss", "n_masked"}`` (as ``evaluate_batches``).

    >>> evaluate_mlm(model, batches)["score"]       # doctest: +SKIP
    0.41
    """
    from ..evaluation import MLM_METRIC, evaluate_batches

    return evaluate_batches(model, batches, MLM_METRIC, mask=mask)


def mlm_model(model_spec: str, head: Mapping, encoder: str | None = None):
    """A masked-LM model: the checkpoint's MLM head (or one fitted on its frozen encoder), optionally on another encoder.

    Args:
        model_spec: the pre-trained model (hub id, directory, ``offline``).
        head: ``corpus`` (texts for fitting a head, see :func:`headcount.tasks.mlm_texts`),
            ``steps``, ``max_texts``, ``seed``, ``after`` (``pretrained`` | ``refit``).
        encoder: a fine-tuned checkpoint of the same model: its encoder weights are loaded under
            the pre-trained head (``after: pretrained``), or a head is fitted on it (``refit``).

    Returns:
        ``(model, tokenizer, info)``; ``info["mlm_head"]`` is the fit report.

    >>> model, tok, info = mlm_model("offline", {"corpus": "offline/corpus"})   # doctest: +SKIP
    """
    from ..models import load_model, load_tokenizer
    from ..tasks import fit_mlm_head, mlm_texts

    texts = mlm_texts(head["corpus"], max_examples=int(head.get("max_texts", 2000)), seed=int(head.get("seed", 0)))
    fit = dict(steps=int(head.get("steps", 300)), max_texts=int(head.get("max_texts", 2000)), seed=int(head.get("seed", 0)))
    tokenizer = load_tokenizer(model_spec)
    if encoder is not None and head.get("after", "pretrained") == "refit":
        model, report = fit_mlm_head(str(encoder), texts, tokenizer=tokenizer, **fit)
        return model, tokenizer, {"mlm_head": report, "encoder": str(encoder), "after": "refit"}
    model, report = fit_mlm_head(model_spec, texts, tokenizer=tokenizer, **fit)
    info = {"mlm_head": report}
    if encoder is not None:
        tuned = load_model(str(encoder), head="base")
        missing, unexpected = model.base_model.load_state_dict(tuned.state_dict(), strict=False)
        if missing:
            raise HeadcountError(f"{encoder} lacks encoder weights of {model_spec}: {', '.join(missing[:3])}")
        info.update(encoder=str(encoder), after="pretrained", ignored=sorted(unexpected))
    return model.eval(), tokenizer, info


# =============================================================================================
# job functions  (params, inputs, workdir, progress) -> dict
# =============================================================================================
def layout_job(params, inputs, workdir: Path, progress) -> dict:
    """The model's gate grid and shared-layer groups: ``n_layers``, ``n_heads``, ``groups``, ``shared``.

    >>> layout_job({"model": "offline"}, {}, Path("."), print)["n_heads"]   # doctest: +SKIP
    12
    """
    from ..gates import layout, shared_groups
    from ..models import load_model
    from ..surgery import count_parameters

    model = load_model(params["model"], head="base")
    n_layers, n_heads = layout(model)
    groups = shared_groups(model)
    return {"n_layers": n_layers, "n_heads": n_heads, "groups": groups,
            "shared": any(len(g) > 1 for g in groups), "model_type": str(model.config.model_type),
            "n_params": count_parameters(model)}


def mlm_score_job(params, inputs, workdir: Path, progress) -> dict:
    """Masked-LM importance of the pre-trained model, or of a fine-tuned encoder (input ``encoder``).

    params: model (pre-trained), task (whose texts carry the objective), data, method, mlm_head.
    Writes ``scores.json`` and ``per_example.safetensors`` like the shared ``score_job``.

    >>> mlm_score_job(params, {}, Path("out"), print)["objective"]   # doctest: +SKIP
    'mlm'
    """
    from dataclasses import replace

    from safetensors.torch import save_file

    from ..io import atomic_path
    from ..pipeline import DataConfig, batches_for
    from ..scoring import score
    from ..tasks import get_task

    task = get_task(params["task"])
    data = DataConfig(**params.get("data", {}))
    encoder = str(inputs["encoder"].path("model")) if "encoder" in inputs else None
    model, tokenizer, info = mlm_model(params["model"], params["mlm_head"], encoder=encoder)
    batches = batches_for(task, tokenizer, "mlm", data)
    with masked_positions_only(model):
        s = score(model, batches, method=params.get("method", "gradient"), normalize="none",
                  keep_per_example=True, progress=lambda i: progress(i, len(batches), "scoring"))
    head = info["mlm_head"]
    s = replace(s, meta={**s.meta, "task": task.name, "objective": "mlm", "model": params["model"],
                         "encoder": encoder, "head": "fitted" if head.get("fitted") else "checkpoint",
                         "mlm_head": {k: head.get(k) for k in ("fitted", "loss", "accuracy", "message")}})
    s.save(workdir / "scores.json")
    if s.per_example is not None:
        with atomic_path(workdir / "per_example.safetensors") as tmp:
            save_file({"heads": s.per_example.contiguous()}, str(tmp))
    return s.to_dict()


@contextmanager
def _replayed_encoder(model):
    """Inside the block, the base model returns ``holder["out"]`` instead of running."""
    base = model.base_model
    holder: dict = {}
    base.forward = lambda *args, **kwargs: holder["out"]
    try:
        yield holder
    finally:
        del base.forward


def fit_task_head(model, batches, *, lr: float = 1e-3, epochs: float = 10, weight_decay: float = 0.0,
                  seed: int = 0, progress=None) -> dict:
    """Train only a classifier's task head (the parameters outside ``model.base_model``) on a frozen encoder.

    The encoder runs once over ``batches`` (no gradient); its outputs at the first position
    and its pooled output, all a sequence-classification head reads, are kept and replayed to the
    head for every epoch (AdamW, batches in a seeded random order, dropout on in the head).

    Args:
        model: a sequence-classification model (its encoder is left unchanged).
        batches: task batches with ``labels`` (``headcount.tasks.make_batches``).
        lr / epochs / weight_decay: AdamW settings; a fractional epoch count runs that share of
            the last epoch's batches.
        seed: order of the batches.
        progress: called with one line per epoch.

    Returns:
        ``{"steps", "train_loss", "trainable_params"}``.

    >>> fit_task_head(model, batches, lr=1e-3, epochs=10)["steps"]      # doctest: +SKIP
    250
    """
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    base = model.base_model
    device = next(model.parameters()).device
    in_base = {id(p) for p in base.parameters()}
    head = [p for p in model.parameters() if id(p) not in in_base]
    if not head:
        raise HeadcountError("the model has no task head outside its encoder")
    cached = []
    model.eval()
    with torch.no_grad():
        for b in batches:
            inputs = {k: v.to(device) for k, v in b.items() if k != "labels"}
            out = base(**inputs)
            first = out[0][:, :1].detach().clone()  # [batch, 1, hidden]: what the heads read from the sequence
            pooled = getattr(out, "pooler_output", None)
            cached.append((first, None if pooled is None else pooled.detach().clone(), b["labels"].to(device),
                           b["input_ids"][:, :1].to(device)))
    for p in model.parameters():
        p.requires_grad_(False)
    for p in head:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(head, lr=lr, weight_decay=weight_decay)
    rng = np.random.default_rng(seed)
    n_steps = int(math.ceil(epochs * len(cached)))
    losses, step = [], 0
    model.train()
    try:
        with _replayed_encoder(model) as holder:
            while step < n_steps:
                for i in rng.permutation(len(cached)):
                    if step >= n_steps:
                        break
                    first, pooled, labels, ids = cached[i]
                    holder["out"] = BaseModelOutputWithPooling(last_hidden_state=first, pooler_output=pooled)
                    loss = model(input_ids=ids, labels=labels).loss
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    losses.append(float(loss.detach()))
                    step += 1
                if progress:
                    progress(f"epoch {step / len(cached):.1f}: loss {np.mean(losses[-len(cached):]):.4f}")
    finally:
        for p in model.parameters():
            p.requires_grad_(True)
        model.eval()
    return {"steps": step, "train_loss": float(np.mean(losses[-len(cached):])) if losses else float("nan"),
            "trainable_params": int(sum(p.numel() for p in head))}


def head_fit_job(params, inputs, workdir: Path, progress) -> dict:
    """A task head fitted on the frozen pre-trained encoder ("before fine-tuning" has a task loss).

    params: model, task, seed (head initialisation, batch order), train (TrainConfig fields:
    lr, epochs, weight_decay, batch_size, max_length, max_train_examples, max_eval_examples,
    eval_batch_size, data_seed). Writes ``model/`` (encoder unchanged) and ``metrics.json``
    (``final``: validation metrics, as ``finetune_job``).

    >>> head_fit_job({"model": "offline", "task": "offline/movies", "seed": 1}, {}, Path("o"), print)  # doctest: +SKIP
    """
    import time

    from ..evaluation import evaluate_batches
    from ..io import atomic_write_json
    from ..tasks import encode, get_task, make_batches
    from ..training import TrainConfig, prepare_model

    cfg = TrainConfig(**params.get("train", {}))
    task = get_task(params["task"])
    seed = int(params.get("seed", 0))
    say = step_messages(progress)
    t0 = time.perf_counter()
    model, tokenizer, info = prepare_model(params["model"], task, seed=seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def batches(split, n, size):
        data = task.load(split, max_examples=n, seed=cfg.data_seed)
        return make_batches(encode(data, tokenizer, max_length=cfg.max_length), size, shuffle=True, seed=cfg.data_seed,
                            group_by_length=True, pad_token_id=pad)

    train = batches(task.train_split, cfg.max_train_examples, cfg.batch_size)
    fit = fit_task_head(model, train, lr=cfg.lr, epochs=cfg.epochs, weight_decay=cfg.weight_decay, seed=seed,
                        progress=say)
    final = evaluate_batches(model, batches(task.validation_split, cfg.max_eval_examples, cfg.eval_batch_size), task.metric)
    model.save_pretrained(workdir / "model", safe_serialization=True)
    tokenizer.save_pretrained(workdir / "model")
    metrics = {"task": task.name, "metric": task.metric, "model": params["model"], "seed": seed,
               "final": {k: v for k, v in final.items() if isinstance(v, (int, float))}, "frozen_encoder": True,
               **fit, "train_seconds": round(time.perf_counter() - t0, 3), "n_train": sum(len(b["labels"]) for b in train),
               "head": info["head"]}
    atomic_write_json(workdir / "metrics.json", metrics)
    say(f"{task.name}: {task.metric} {final['score']:.4f} with the encoder frozen")
    return metrics


def _grid(result) -> np.ndarray:
    return np.asarray(result.load_json("scores.json")["heads"], dtype=np.float64)


def mask_job(params, inputs, workdir: Path, progress) -> dict:
    """A mask removing ``level`` of the heads: by the upstream ``scores`` or at random (``order: random``).

    params: level, order (``scores`` | ``random``), view, normalize, seed. Writes ``mask.json``.

    >>> mask_job({"level": 0.5, "order": "random", "seed": 0}, {"layout": layout}, Path("o"), print)  # doctest: +SKIP
    """
    lay = inputs["layout"].result
    shape = (lay["n_layers"], lay["n_heads"])
    if params.get("order", "scores") == "random":
        grid = np.random.default_rng([int(params.get("seed", 0)), 7]).random(shape)
    else:
        grid = _grid(inputs["scores"])
    mask = removal_mask(grid, float(params["level"]), view=params.get("view", "application"),
                        groups=lay["groups"], normalize=params.get("normalize", "layer"))
    mask = mask.with_meta(order=params.get("order", "scores"), level=float(params["level"]))
    mask.save(workdir / "mask.json")
    return mask.to_dict()


def curve_job(params, inputs, workdir: Path, progress) -> dict:
    """Prunability curve: the metric of a model with the lowest-ranked heads gated off, level by level.

    params: objective (``task``: the upstream ``model``; ``mlm``: ``model`` with ``mlm_head``),
    task, eval (DataConfig fields, validation split), levels, normalize, views, orders
    (``{order: {replicate: input name}}``: score grids that rank the heads), random_draws,
    random_seed. Writes ``curve.csv``; returns ``full`` and ``rows`` (one per view, order,
    replicate, level).

    >>> curve_job(params, inputs, Path("out"), print)["rows"][0]["fraction"]   # doctest: +SKIP
    0.0
    """
    import pandas as pd

    from ..evaluation import evaluate_batches
    from ..io import atomic_write_text
    from ..pipeline import DataConfig, batches_for, load_for
    from .jobs import model_spec

    from ..tasks import get_task

    task = get_task(params["task"])
    objective = params.get("objective", "task")
    data = DataConfig(**params.get("eval", {}))
    split = params.get("split") or task.validation_split
    if objective == "mlm":
        model, tokenizer, _ = mlm_model(params["model"], params["mlm_head"])
        batches = batches_for(task, tokenizer, "mlm", data, split=split)
        metric = "mlm_accuracy"

        def evaluate(mask):
            return evaluate_mlm(model, batches, mask)
    else:
        model, tokenizer, _ = load_for(model_spec(params, inputs), task, "task", seed=data.seed)
        batches = batches_for(task, tokenizer, "task", data, split=split)
        metric = task.metric

        def evaluate(mask):
            return evaluate_batches(model, batches, metric, mask=mask)

    lay = inputs["layout"].result
    shape = (lay["n_layers"], lay["n_heads"])
    views = [v for v in params.get("views", ["application"]) if v == "application" or (v == "shared" and lay["shared"])]
    orders: list[tuple[str, str, np.ndarray]] = []
    for order, reps in params.get("orders", {}).items():
        for rep, alias in reps.items():
            orders.append((order, str(rep), _grid(inputs[alias])))
    for d in range(int(params.get("random_draws", 0))):
        orders.append(("random", str(d), np.random.default_rng([int(params.get("random_seed", 0)), d]).random(shape)))
    levels = [float(x) for x in params["levels"]]
    total = 1 + len(views) * len(orders) * len(levels)
    done = 1
    full = evaluate(None)
    progress(done, total, f"full model: {metric} {full['score']:.4f}")
    keep_keys = ("score", "loss")
    rows = []
    cache: dict[bytes, dict] = {}
    for view in views:
        for order, rep, grid in orders:
            rows.append({"view": view, "order": order, "replicate": rep, "fraction": 0.0, "heads_removed": 0,
                         "heads_kept": shape[0] * shape[1], **{k: full[k] for k in keep_keys}})
            for level in levels:
                mask = removal_mask(grid, level, view=view, groups=lay["groups"],
                                    normalize=params.get("normalize", "layer"))
                key = mask.heads.numpy().tobytes()
                if key not in cache:
                    cache[key] = evaluate(mask)
                r = cache[key]
                rows.append({"view": view, "order": order, "replicate": rep, "fraction": level,
                             "heads_removed": shape[0] * shape[1] - mask.n_heads_kept, "heads_kept": mask.n_heads_kept,
                             **{k: r[k] for k in keep_keys}})
                done += 1
                progress(done, total, f"{view}/{order}/{rep} {level:g}: {r['score']:.4f}")
    for r in rows:
        r.update(metric=metric, objective=objective)
    atomic_write_text(workdir / "curve.csv", pd.DataFrame(rows).to_csv(index=False))
    return {"task": task.name, "objective": objective, "metric": metric, "full": full, "rows": rows,
            "n_evaluations": 1 + len(cache)}


def _load_per_example(result):
    p = result.dir / "per_example.safetensors"
    if not p.is_file():
        return None
    from safetensors.torch import load_file

    # each row is one example's share of its batch's score: for gradient-token they sum to the grid
    return load_file(str(p))["heads"].double().numpy()


def coherence_job(params, inputs, workdir: Path, progress) -> dict:
    """Coherence of every pair of score grids the study compares, in every view.

    params: pairs (``{"name", "comparison", "a", "b", "task", "task_b", "seed", "seed_b",
    "paired"}``, ``a``/``b`` input names of score jobs), grids (``{input name: {"kind", "task",
    "seed"}}``), stats (StatsSettings fields), views. Writes ``coherence.csv`` and
    ``layer_mass.csv``; returns their rows.

    >>> coherence_job(params, inputs, Path("out"), print)["rows"][0]["statistic"]   # doctest: +SKIP
    'spearman'
    """
    import pandas as pd

    from ..analysis import layer_mass
    from ..io import atomic_write_text

    lay = inputs["layout"].result
    views = [v for v in params.get("views", ["application"]) if v == "application" or (v == "shared" and lay["shared"])]
    st = params.get("stats", {})
    grids = {alias: _grid(inputs[alias]) for alias in params["grids"]}
    per_example = {alias: _load_per_example(inputs[alias]) for alias in params["grids"]}
    rows = []
    pairs = params["pairs"]
    for i, pair in enumerate(pairs):
        for view in views:
            c = coherence(grids[pair["a"]], grids[pair["b"]], (per_example[pair["a"]], per_example[pair["b"]]),
                          paired=bool(pair.get("paired")), fractions=st.get("fractions", (0.1, 0.25, 0.5)),
                          n_boot=int(st.get("n_boot", 1000)), n_permutations=int(st.get("n_permutations", 9999)),
                          level=float(st.get("level", 0.95)), seed=_pair_seed(st.get("seed", 0), f"{pair['name']}/{view}"),
                          view=view, groups=lay["groups"])
            for stat, v in c.items():
                rows.append({"pair": pair["name"], "comparison": pair["comparison"], "view": view,
                             "task": pair.get("task"), "task_b": pair.get("task_b"), "seed": pair.get("seed"),
                             "seed_b": pair.get("seed_b"), "a": pair["a"], "b": pair["b"], "statistic": stat,
                             "estimate": v["estimate"], "low": v["low"], "high": v["high"],
                             "boot_estimate": v.get("boot_estimate"), "p_value": v["p_value"],
                             "chance": v["chance"], "paired": bool(pair.get("paired"))})
        progress(i + 1, len(pairs), pair["name"])
    mass = []
    for alias, meta in params["grids"].items():
        for view in views:
            m = layer_mass(view_of(grids[alias], view, lay["groups"]))
            mass += [{"grid": alias, **meta, "view": view, "layer": layer, "mass": float(x)} for layer, x in enumerate(m)]
    atomic_write_text(workdir / "coherence.csv", pd.DataFrame(rows).to_csv(index=False))
    atomic_write_text(workdir / "layer_mass.csv", pd.DataFrame(mass).to_csv(index=False))
    return {"rows": rows, "layer_mass": mass, "views": views}


# =============================================================================================
# expand: settings -> jobs
# =============================================================================================
def _level(x: float) -> str:
    return f"{x:g}"


class Names:
    """Job names of a transfer part under a prefix (shared by :func:`transfer_jobs` and the report).

    >>> Names("demo/").finetune("movies", 1)
    'demo/finetune/movies/seed1'
    """

    def __init__(self, prefix: str = ""):
        self.prefix = prefix

    def __call__(self, *parts) -> str:
        return self.prefix + "/".join(str(p) for p in parts)

    def layout(self):
        return self("layout")

    def mlm_pre(self, corpus):
        return self("mlm-scores", corpus)

    def finetune(self, t, s):
        return self("finetune", t, f"seed{s}")

    def head_fit(self, t, s):
        return self("head-fit", t, f"seed{s}")

    def task_after(self, t, s):
        return self("task-scores", t, f"seed{s}", "fine-tuned")

    def task_before(self, t, s):
        return self("task-scores", t, f"seed{s}", "pre-trained")

    def mlm_after(self, t, s):
        return self("mlm-scores", t, f"seed{s}", "fine-tuned")

    def curve(self, t, s):
        return self("curve", t, f"seed{s}")

    def mlm_curve(self, t):
        return self("curve", t, "mlm")

    def mask(self, corpus, order, level):
        return self("mask", corpus, f"{order}-{_level(level)}") if order == "mlm" else self("mask", f"random-{_level(level)}")

    def pruned_finetune(self, t, s, order, level):
        return self("prune-then-finetune", t, f"seed{s}", f"{order}-{_level(level)}")

    def coherence(self):
        return self("coherence")


def _plan(settings: TransferSettings) -> dict:
    """What the jobs and the report both derive from a config: ids, corpora, levels, seeds."""
    tasks = {task_id(t): _task_name(t) for t in settings.tasks}
    ids = list(tasks)
    corpus_of = {t: ("corpus" if settings.mlm.corpus else t) for t in ids}
    corpora = {"corpus": settings.mlm.corpus} if settings.mlm.corpus else dict(tasks)
    ba = settings.before_after
    ba_seeds = list(ba.seeds if ba.seeds is not None else settings.seeds) if ba.enabled else []
    ba_levels = list(ba.levels) if ba.enabled else []
    curve_levels = sorted(set(settings.pruning.levels) | set(ba_levels))
    head_corpus = settings.mlm.head_corpus or settings.mlm.corpus or tasks[ids[0]]
    return {"tasks": tasks, "ids": ids, "seeds": list(settings.seeds), "corpus_of": corpus_of, "corpora": corpora,
            "ba_seeds": ba_seeds, "ba_levels": ba_levels, "curve_levels": curve_levels, "head_corpus": head_corpus}


def transfer_jobs(settings: TransferSettings, prefix: str = "") -> list[Job]:
    """The jobs of a transfer part (see the module docstring), named under ``prefix``.

    Args:
        settings: a :class:`TransferSettings` (or the whole :class:`TransferConfig`).
        prefix: prepended to every job name (``"transfer/"`` inside another study).

    Returns:
        The jobs (upstream jobs are reached through ``deps``).

    >>> jobs = transfer_jobs(TransferSettings(tasks=["offline/movies"]), prefix="t/")
    >>> sorted({j.name.split("/")[1] for j in jobs})[:3]
    ['coherence', 'curve', 'finetune']
    """
    s = settings
    n = Names(prefix)
    p = _plan(s)
    train = s.train.values()
    head_train = {**train, **s.head_fit.values()}
    data = s.scoring.data.model_dump()
    task_eval = {"max_examples": train.get("max_eval_examples"), "batch_size": train.get("eval_batch_size", 64),
                 "max_length": train.get("max_length", 128), "seed": train.get("data_seed", 0)}
    mlm_head = {"corpus": p["head_corpus"], "steps": s.mlm.head_steps, "max_texts": s.mlm.head_max_texts, "seed": 0,
                "after": s.mlm.after_head}
    method = s.scoring.method
    views = list(s.pruning.views)

    layout = Job(n.layout(), "transfer-layout", f"{HERE}:layout_job", {"model": s.model})
    mlm_pre = {c: Job(n.mlm_pre(c), "transfer-mlm-score", f"{HERE}:mlm_score_job",
                      {"model": s.model, "task": name, "data": data, "method": method, "mlm_head": mlm_head})
               for c, name in p["corpora"].items()}
    jobs: list[Job] = [layout, *mlm_pre.values()]
    grids: dict[str, dict] = {}
    inputs: dict[str, Job] = {"layout": layout}
    pairs: list[dict] = []
    for c, job in mlm_pre.items():
        alias = f"mlm.{c}"
        inputs[alias] = job
        grids[alias] = {"kind": "mlm-pre-trained", "task": c, "seed": None}

    ft: dict[tuple, Job] = {}
    after: dict[tuple, Job] = {}
    for t in p["ids"]:
        name, corpus = p["tasks"][t], p["corpus_of"][t]
        for seed in p["seeds"]:
            ft[t, seed] = Job(n.finetune(t, seed), "finetune", f"{SHARED_JOBS}:finetune_job",
                              {"model": s.model, "task": name, "seed": seed, "train": train})
            after[t, seed] = Job(n.task_after(t, seed), "score", f"{SHARED_JOBS}:score_job",
                                 {"task": name, "objective": "task", "method": method, "normalize": "none", "data": data},
                                 deps={"model": ft[t, seed]})
            head = Job(n.head_fit(t, seed), "transfer-head-fit", f"{HERE}:head_fit_job",
                       {"model": s.model, "task": name, "seed": seed, "train": head_train})
            before = Job(n.task_before(t, seed), "score", f"{SHARED_JOBS}:score_job",
                         {"task": name, "objective": "task", "method": method, "normalize": "none", "data": data},
                         deps={"model": head})
            mlm_after = Job(n.mlm_after(t, seed), "transfer-mlm-score", f"{HERE}:mlm_score_job",
                            {"model": s.model, "task": p["corpora"][corpus], "data": data, "method": method,
                             "mlm_head": mlm_head}, deps={"encoder": ft[t, seed]})
            curve = Job(n.curve(t, seed), "transfer-curve", f"{HERE}:curve_job",
                        {"objective": "task", "task": name, "eval": task_eval, "levels": p["curve_levels"],
                         "normalize": s.pruning.normalize, "views": views,
                         "orders": {"mlm": {"pre-trained": "mlm"}, "task": {str(seed): "task"}},
                         "random_draws": s.pruning.random_draws, "random_seed": seed},
                        deps={"model": ft[t, seed], "layout": layout, "mlm": mlm_pre[corpus], "task": after[t, seed]})
            jobs += [ft[t, seed], after[t, seed], head, before, mlm_after, curve]
            for alias, job, kind in ((f"ft.{t}.{seed}", after[t, seed], "task-fine-tuned"),
                                     (f"pre.{t}.{seed}", before, "task-pre-trained"),
                                     (f"mlmft.{t}.{seed}", mlm_after, "mlm-fine-tuned")):
                inputs[alias] = job
                grids[alias] = {"kind": kind, "task": t, "seed": seed}
            base = {"task": t, "seed": seed, "task_b": None, "seed_b": None}
            pairs += [
                {**base, "name": f"mlm-vs-task/{t}/{seed}", "comparison": "mlm-vs-task", "a": f"mlm.{corpus}",
                 "b": f"ft.{t}.{seed}", "paired": False},
                {**base, "name": f"mlm-vs-task-before/{t}/{seed}", "comparison": "mlm-vs-task-before",
                 "a": f"mlm.{corpus}", "b": f"pre.{t}.{seed}", "paired": False},
                {**base, "name": f"task-before-vs-after/{t}/{seed}", "comparison": "task-before-vs-after",
                 "a": f"pre.{t}.{seed}", "b": f"ft.{t}.{seed}", "paired": True},
                {**base, "name": f"mlm-before-vs-after/{t}/{seed}", "comparison": "mlm-before-vs-after",
                 "a": f"mlm.{corpus}", "b": f"mlmft.{t}.{seed}", "paired": True},
            ]
        # MLM prunability of the pre-trained model on this task's MLM texts
        mlm_eval = s.mlm.eval.model_dump()
        jobs.append(Job(n.mlm_curve(t), "transfer-curve", f"{HERE}:curve_job",
                        {"objective": "mlm", "task": p["corpora"][corpus], "model": s.model, "mlm_head": mlm_head,
                         "eval": mlm_eval, "levels": p["curve_levels"], "normalize": s.pruning.normalize,
                         "views": views, "orders": {"mlm": {"pre-trained": "mlm"},
                                                    "task": {str(seed): f"task.{seed}" for seed in p["seeds"]}},
                         "random_draws": s.pruning.random_draws, "random_seed": 0},
                        deps={"layout": layout, "mlm": mlm_pre[corpus],
                              **{f"task.{seed}": after[t, seed] for seed in p["seeds"]}}))
        # before vs after: prune the pre-trained model, then fine-tune
        for level in p["ba_levels"]:
            orders = {"mlm": Job(n.mask(corpus, "mlm", level), "transfer-mask", f"{HERE}:mask_job",
                                 {"level": level, "order": "scores", "view": s.before_after.view,
                                  "normalize": s.pruning.normalize}, deps={"layout": layout, "scores": mlm_pre[corpus]})}
            if s.before_after.random_control:
                orders["random"] = Job(n.mask(corpus, "random", level), "transfer-mask", f"{HERE}:mask_job",
                                       {"level": level, "order": "random", "view": s.before_after.view,
                                        "normalize": s.pruning.normalize, "seed": 0}, deps={"layout": layout})
            for order, mask in orders.items():
                for seed in p["ba_seeds"]:
                    jobs.append(Job(n.pruned_finetune(t, seed, order, level), "finetune", f"{SHARED_JOBS}:finetune_job",
                                    {"model": s.model, "task": name, "seed": seed, "train": train,
                                     "mask_mode": s.before_after.mask_mode}, deps={"mask": mask}))
    ids, seeds = p["ids"], p["seeds"]
    for seed in seeds:
        for i, t1 in enumerate(ids):
            for t2 in ids[i + 1:]:
                pairs.append({"name": f"task-vs-task/{t1}/{t2}/{seed}", "comparison": "task-vs-task", "task": t1,
                              "task_b": t2, "seed": seed, "seed_b": seed, "a": f"ft.{t1}.{seed}", "b": f"ft.{t2}.{seed}",
                              "paired": False})
    for t in ids:
        for i, s1 in enumerate(seeds):
            for s2 in seeds[i + 1:]:
                pairs.append({"name": f"seed-vs-seed/{t}/{s1}/{s2}", "comparison": "seed-vs-seed", "task": t,
                              "task_b": t, "seed": s1, "seed_b": s2, "a": f"ft.{t}.{s1}", "b": f"ft.{t}.{s2}",
                              "paired": True})
    corpora = list(p["corpora"])
    for i, c1 in enumerate(corpora):
        for c2 in corpora[i + 1:]:
            pairs.append({"name": f"mlm-vs-mlm/{c1}/{c2}", "comparison": "mlm-vs-mlm", "task": c1, "task_b": c2,
                          "seed": None, "seed_b": None, "a": f"mlm.{c1}", "b": f"mlm.{c2}", "paired": False})
    jobs.append(Job(n.coherence(), "transfer-coherence", f"{HERE}:coherence_job",
                    {"pairs": pairs, "grids": grids, "stats": s.stats.model_dump(mode="json"), "views": views},
                    deps=inputs))
    return jobs


def expand(config: TransferConfig) -> list[Job]:
    """``expand_fn`` of the ``transfer`` study type: :func:`transfer_jobs` without a prefix.

    >>> len(expand(TransferConfig(study="transfer", tasks=["offline/movies"]))) > 5
    True
    """
    return transfer_jobs(config)


# =============================================================================================
# report: saved results -> tables -> figures
# =============================================================================================
def _artifact(prefix: str) -> str:
    """A report-name prefix from a job-name prefix (``"transfer/"`` -> ``"transfer-"``)."""
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in prefix)


def transfer_tables(store, settings: TransferSettings, prefix: str = "") -> dict:
    """The tidy tables of a finished transfer part, read from saved results (pandas DataFrames).

    Keys: ``layout`` (the layout job's result, a dict), ``mlm`` (the MLM head and the
    pre-trained model's MLM quality per text source), ``coherence``, ``coherence_summary``, ``layer_mass``, ``head_scores``, ``finetune``,
    ``curves``, ``prunability``, ``before_after``, ``acceptable_deduction``,
    ``acceptable_deduction_summary`` (the last three empty when ``before_after`` is off).

    >>> tables = transfer_tables(RunStore("runs/transfer-offline"), config)   # doctest: +SKIP
    """
    import pandas as pd

    n, p = Names(prefix), _plan(settings)
    coh = store.result(n.coherence())
    coherence_df = pd.DataFrame(coh.result["rows"])
    summary = (coherence_df.groupby(["comparison", "view", "task", "task_b", "statistic"], dropna=False, sort=False)
               .agg(estimate=("estimate", "mean"), estimate_min=("estimate", "min"), estimate_max=("estimate", "max"),
                    low=("low", "mean"), high=("high", "mean"), p_value_max=("p_value", "max"),
                    chance=("chance", "first"), n=("estimate", "size")).reset_index())

    scores = []
    def add_scores(result, kind, task, seed):
        d = result.load_json("scores.json")
        for layer, row in enumerate(d["heads"]):
            for head, v in enumerate(row):
                scores.append({"kind": kind, "task": task, "seed": seed, "layer": layer, "head": head, "score": v})

    mlm_rows = []
    for c in p["corpora"]:
        job = store.result(n.mlm_pre(c))
        add_scores(job, "mlm-pre-trained", c, None)
        head = job.result.get("mlm_head") or {}
        mlm_rows.append({"corpus": c, "texts": p["corpora"][c], "head": job.result.get("head"),
                         "head_heldout_loss": head.get("loss"), "head_heldout_accuracy": head.get("accuracy")})
    ft_rows, curve_rows = [], []
    for t in p["ids"]:
        for seed in p["seeds"]:
            add_scores(store.result(n.task_after(t, seed)), "task-fine-tuned", t, seed)
            add_scores(store.result(n.task_before(t, seed)), "task-pre-trained", t, seed)
            add_scores(store.result(n.mlm_after(t, seed)), "mlm-fine-tuned", t, seed)
            f, h = store.result(n.finetune(t, seed)).result, store.result(n.head_fit(t, seed)).result
            ft_rows.append({"task": t, "seed": seed, "metric": f["metric"], "fine_tuned": f["final"]["score"],
                            "head_only": h["final"]["score"], "train_seconds": f["train_seconds"],
                            "head_fit_seconds": h["train_seconds"], "n_train": f["n_train"], "n_eval": f["n_eval"]})
            cur = store.result(n.curve(t, seed)).result
            curve_rows += [{"task": t, "seed": seed, **r} for r in cur["rows"]]
        cur = store.result(n.mlm_curve(t)).result
        curve_rows += [{"task": t, "seed": None, **r} for r in cur["rows"]]
        for r in mlm_rows:
            if r["corpus"] == p["corpus_of"][t]:
                r.update(validation_loss=cur["full"]["loss"], validation_accuracy=cur["full"]["score"],
                         validation_masked_tokens=cur["full"].get("n_masked"))
    curves = pd.DataFrame(curve_rows)

    prun = []
    for (t, objective, view, order), g in curves.groupby(["task", "objective", "view", "order"], sort=False):
        full = g[g["fraction"] == 0]["score"].mean()
        mean = g.groupby("fraction")["score"].mean()
        ok = [f for f, v in mean.items() if v >= settings.before_after.threshold * full]
        prun.append({"task": t, "objective": objective, "view": view, "order": order, "full": full,
                     "removable_fraction": max(ok) if ok else 0.0,
                     "score_at_50": float(mean.get(0.5, np.nan)), "auc": float(np.trapezoid(mean.values, mean.index))})
    prunability = pd.DataFrame(prun)

    ba_rows, ad_rows, ad_summary = [], [], []
    if p["ba_levels"]:
        ftd = pd.DataFrame(ft_rows)
        for t in p["ids"]:
            full = float(ftd[(ftd["task"] == t) & ftd["seed"].isin(p["ba_seeds"])]["fine_tuned"].mean())
            c = curves[curves["task"] == t]
            mlm_c = c[(c["objective"] == "mlm") & (c["order"] == "mlm") & (c["view"] == settings.before_after.view)]
            if mlm_c.empty:  # a model without shared layers: the application view stands for both
                mlm_c = c[(c["objective"] == "mlm") & (c["order"] == "mlm") & (c["view"] == "application")]
            mlm_full = mlm_c[mlm_c["fraction"] == 0].iloc[0]
            task_c = c[(c["objective"] == "task") & (c["view"] == "application")]
            orders = ["mlm"] + (["random"] if settings.before_after.random_control else [])
            for level in p["ba_levels"]:
                pruned_first = {}
                for order in orders:
                    vals = [store.result(n.pruned_finetune(t, seed, order, level)).result["final"]["score"]
                            for seed in p["ba_seeds"]]
                    pruned_first[order] = float(np.mean(vals))
                    ba_rows.append({"task": t, "level": level, "setting": f"prune ({order}) then fine-tune",
                                    "score": pruned_first[order], "score_min": float(np.min(vals)),
                                    "score_max": float(np.max(vals)), "full": full})
                for order in ("task", "mlm"):
                    v = task_c[(task_c["order"] == order) & np.isclose(task_c["fraction"], level)]["score"]
                    ba_rows.append({"task": t, "level": level, "setting": f"fine-tune then prune ({order})",
                                    "score": float(v.mean()), "score_min": float(v.min()), "score_max": float(v.max()),
                                    "full": float(task_c[task_c["fraction"] == 0]["score"].mean())})
                m = mlm_c[np.isclose(mlm_c["fraction"], level)].iloc[0]
                rel = pruned_first["mlm"] / full if full else float("nan")
                ad_rows.append({"task": t, "level": level, "mlm_loss": float(m["loss"]), "mlm_accuracy": float(m["score"]),
                                "mlm_loss_increase": float(m["loss"] - mlm_full["loss"]),
                                "mlm_accuracy_drop": float(mlm_full["score"] - m["score"]),
                                "fine_tuned_score": pruned_first["mlm"], "full_score": full, "relative_score": rel,
                                "acceptable": bool(rel >= settings.before_after.threshold)})
            best = acceptable_deduction([r for r in ad_rows if r["task"] == t], settings.before_after.threshold)
            ad_summary.append({"task": t, "threshold": settings.before_after.threshold, **best})
    return {"layout": store.result(n.layout()).result, "mlm": pd.DataFrame(mlm_rows), "coherence": coherence_df, "coherence_summary": summary, "layer_mass": pd.DataFrame(coh.result["layer_mass"]),
            "head_scores": pd.DataFrame(scores), "finetune": pd.DataFrame(ft_rows), "curves": curves,
            "prunability": prunability, "before_after": pd.DataFrame(ba_rows),
            "acceptable_deduction": pd.DataFrame(ad_rows), "acceptable_deduction_summary": pd.DataFrame(ad_summary)}


def _rank01(grid) -> np.ndarray:
    """Percentile ranks in [0, 1] (the scale every coherence statistic sees)."""
    from scipy.stats import rankdata

    g = np.asarray(grid, dtype=np.float64)
    r = rankdata(g.ravel())
    return ((r - 1) / max(r.size - 1, 1)).reshape(g.shape)


def _grid_of(scores, kind, task, seed=None) -> np.ndarray:
    d = scores[(scores["kind"] == kind) & (scores["task"] == task)]
    if seed is not None:
        d = d[d["seed"] == seed]
    if d.empty:
        return np.zeros((0, 0))
    grids = [g.pivot(index="layer", columns="head", values="score").to_numpy()
             for _, g in d.groupby("seed", dropna=False)]
    return np.mean([_rank01(g) for g in grids], axis=0)


def _stat(summary, comparison, statistic, view="application", **where):
    d = summary[(summary["comparison"] == comparison) & (summary["statistic"] == statistic) & (summary["view"] == view)]
    for k, v in where.items():
        d = d[d[k] == v]
    return d


def _fmt(x, digits=2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def _figures(tables: dict, settings: TransferSettings, p: dict, art: str) -> dict:
    """Every figure of the report, drawn from the tables."""
    from matplotlib.colors import TwoSlopeNorm

    from ..report import new_figure

    figs = {}
    scores, summary, curves = tables["head_scores"], tables["coherence_summary"], tables["curves"]
    ids = p["ids"]

    # --- heatmaps: MLM | task before | task after, one row per task (percentile ranks)
    fig, axes = new_figure(len(ids), 3, size=(10, 2.6 * len(ids)))
    axes = np.atleast_2d(axes)
    for i, t in enumerate(ids):
        c = p["corpus_of"][t]
        for j, (kind, task, label) in enumerate((("mlm-pre-trained", c, f"MLM ({c} texts), pre-trained"),
                                                  ("task-pre-trained", t, f"{t}: pre-trained encoder"),
                                                  ("task-fine-tuned", t, f"{t}: fine-tuned"))):
            ax = axes[i, j]
            g = _grid_of(scores, kind, task)
            im = ax.imshow(g, aspect="auto", cmap="viridis", vmin=0, vmax=1)
            ax.set_title(label, fontsize=8)
            ax.set_xlabel("head", fontsize=7)
            ax.set_ylabel("layer", fontsize=7)
            ax.set_xticks(range(g.shape[1]))
            ax.set_yticks(range(g.shape[0]))
            ax.tick_params(labelsize=6)
    fig.colorbar(im, ax=axes, shrink=0.6, label="importance percentile")
    figs[f"{art}heatmaps"] = (fig, "Head importance as percentile ranks (1 = most important): MLM on the pre-trained "
                                   "model beside the task, before (frozen encoder + fitted head) and after fine-tuning "
                                   "(mean over seeds).")

    # --- scatter MLM vs task per head
    fig, axes = new_figure(1, len(ids), size=(3.4 * len(ids), 3.2))
    axes = np.atleast_1d(axes)
    for ax, t in zip(axes, ids):
        x = _grid_of(scores, "mlm-pre-trained", p["corpus_of"][t])
        y = _grid_of(scores, "task-fine-tuned", t)
        layers = np.repeat(np.arange(x.shape[0]), x.shape[1])
        sc = ax.scatter(x.ravel(), y.ravel(), c=layers, cmap="plasma", s=14, alpha=0.8)
        rho = _stat(summary, "mlm-vs-task", "spearman", task=t)["estimate"]
        ax.set_title(f"{t}: Spearman {_fmt(float(rho.mean()) if len(rho) else None)}", fontsize=9)
        ax.set_xlabel("MLM importance (percentile)", fontsize=8)
        ax.set_ylabel("task importance (percentile)", fontsize=8)
        ax.plot([0, 1], [0, 1], ls=":", color="0.5", lw=0.8)
    fig.colorbar(sc, ax=axes, label="layer", shrink=0.8)
    figs[f"{art}scatter"] = (fig, "Each head's MLM importance (pre-trained) against its task importance (fine-tuned), "
                                  "as percentile ranks; colour = layer.")

    # --- shared layers: importance per shared head (summed over the depths that run it)
    lay = tables.get("layout") or {}
    if lay.get("shared"):
        fig, axes = new_figure(len(ids), 1, size=(max(6.0, 0.35 * lay["n_heads"] * len(lay["groups"])), 2.4 * len(ids)))
        axes = np.atleast_1d(axes)
        for ax, t in zip(axes, ids):
            for k, (kind, task, label) in enumerate((("mlm-pre-trained", p["corpus_of"][t], "MLM (pre-trained)"),
                                                      ("task-fine-tuned", t, f"{t} (fine-tuned)"))):
                d = scores[(scores["kind"] == kind) & (scores["task"] == task)]
                grids = [_rank01(shared_view(g.pivot(index="layer", columns="head", values="score").to_numpy(),
                                             lay["groups"])) for _, g in d.groupby("seed", dropna=False)]
                v = np.mean(grids, axis=0).ravel()
                ax.bar(np.arange(v.size) + (k - 0.5) * 0.4, v, width=0.4, label=label)
            ax.set_xlabel("shared head (group x head)", fontsize=8)
            ax.set_ylabel("percentile", fontsize=8)
            ax.legend(fontsize=7)
        figs[f"{art}shared-heads"] = (fig, "Shared-layer model: importance per shared head (summed over the depths "
                                           "that run the shared layer), as percentile ranks.")

    # --- correlation matrix: MLM grids and tasks; task diagonal = seed-vs-seed agreement
    labels = [f"MLM:{c}" for c in p["corpora"]] + ids
    mat = np.full((len(labels), len(labels)), np.nan)
    idx = {lab: i for i, lab in enumerate(labels)}
    for lab in labels:
        mat[idx[lab], idx[lab]] = 1.0
    for _, r in summary[(summary["statistic"] == "spearman") & (summary["view"] == "application")].iterrows():
        comp = r["comparison"]
        if comp == "mlm-vs-task":
            a, b = f"MLM:{p['corpus_of'][r['task']]}", r["task"]
        elif comp == "task-vs-task":
            a, b = r["task"], r["task_b"]
        elif comp == "mlm-vs-mlm":
            a, b = f"MLM:{r['task']}", f"MLM:{r['task_b']}"
        elif comp == "seed-vs-seed":
            a = b = r["task"]
        else:
            continue
        mat[idx[a], idx[b]] = mat[idx[b], idx[a]] = r["estimate"]
    fig, ax = new_figure(size=(1.0 * len(labels) + 2.5, 0.9 * len(labels) + 1.8))
    im = ax.imshow(mat, cmap="RdBu_r", norm=TwoSlopeNorm(0, -1, 1))
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    for i in range(len(labels)):
        for j in range(len(labels)):
            if np.isfinite(mat[i, j]):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="Spearman (mean over seeds)")
    figs[f"{art}correlation-matrix"] = (fig, "Spearman correlation of head importance between objectives (fine-tuned "
                                             "tasks); a task's diagonal cell is the agreement of two fine-tuning seeds "
                                             "(1 with one seed); blank: not compared.")

    # --- layer mass
    lm = tables["layer_mass"]
    lm = lm[lm["view"] == "application"]
    fig, axes = new_figure(1, len(ids), size=(3.4 * len(ids), 3.0))
    axes = np.atleast_1d(axes)
    for ax, t in zip(axes, ids):
        for kind, style in (("mlm-pre-trained", "-"), ("task-pre-trained", "--"), ("task-fine-tuned", "-."),
                            ("mlm-fine-tuned", ":")):
            task = p["corpus_of"][t] if kind == "mlm-pre-trained" else t
            d = lm[(lm["kind"] == kind) & (lm["task"] == task)].groupby("layer")["mass"].mean()
            if len(d):
                ax.plot(d.index, d.values, style, marker="o", ms=3, label=kind)
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("layer", fontsize=8)
        ax.set_ylabel("share of importance", fontsize=8)
    axes[0].legend(fontsize=6)
    figs[f"{art}layer-mass"] = (fig, "Share of the total head importance in each layer.")

    # --- prunability curves
    views = sorted(curves["view"].unique(), key=lambda v: v != "application")
    fig, axes = new_figure(2, len(ids), size=(3.6 * len(ids), 6.0))
    axes = np.asarray(axes).reshape(2, len(ids))
    colors = {"mlm": "C0", "task": "C1", "random": "0.45"}
    for col, t in enumerate(ids):
        for row, objective in enumerate(("task", "mlm")):
            ax = axes[row, col]
            d = curves[(curves["task"] == t) & (curves["objective"] == objective)]
            for view in views:
                ls = "-" if view == "application" else "--"
                for order in ("mlm", "task", "random"):
                    g = d[(d["view"] == view) & (d["order"] == order)]
                    if g.empty:
                        continue
                    agg = g.groupby("fraction")["score"].agg(["mean", "min", "max"])
                    label = f"by {order}" + ("" if view == "application" else " (shared heads)")
                    ax.plot(agg.index, agg["mean"], ls, color=colors[order], marker="o", ms=2.5, label=label)
                    ax.fill_between(agg.index, agg["min"], agg["max"], color=colors[order], alpha=0.15)
            if not d.empty:
                full = d[d["fraction"] == 0]["score"].mean()
                ax.axhline(settings.before_after.threshold * full, ls=":", color="C3", lw=0.8)
            ax.set_title(f"{t}: {'task (fine-tuned)' if objective == 'task' else 'MLM (pre-trained)'}", fontsize=9)
            ax.set_xlabel("fraction of heads removed", fontsize=8)
            ax.set_ylabel(d["metric"].iloc[0] if len(d) else "", fontsize=8)
    axes[0, 0].legend(fontsize=6)
    figs[f"{art}prunability"] = (fig, "Metric vs fraction of heads removed (gates, no retraining): heads removed by "
                                      "MLM importance, by the task's own importance, or at random; lines = means, "
                                      "bands = min-max over seeds and random draws; dotted = 90% of the full model.")

    # --- before / after and acceptable deduction
    ba, ad = tables["before_after"], tables["acceptable_deduction"]
    if not ba.empty:
        fig, axes = new_figure(1, len(ids), size=(3.6 * len(ids), 3.2))
        axes = np.atleast_1d(axes)
        for ax, t in zip(axes, ids):
            d = ba[ba["task"] == t]
            for k, (setting, g) in enumerate(d.groupby("setting", sort=False)):
                ax.errorbar(g["level"], g["score"], yerr=[g["score"] - g["score_min"], g["score_max"] - g["score"]],
                            marker="os^v"[k % 4], ms=4, capsize=2, label=setting)
            full = d["full"].iloc[0]
            ax.axhline(full, color="k", lw=0.8, label="full fine-tuned")
            ax.axhline(settings.before_after.threshold * full, color="C3", ls=":", lw=0.8)
            ax.set_title(t, fontsize=9)
            ax.set_xlabel("fraction of heads removed", fontsize=8)
        axes[0].legend(fontsize=6)
        figs[f"{art}before-after"] = (fig, "Downstream score when heads are removed before fine-tuning (by MLM "
                                           "importance of the pre-trained model, then fine-tuned) vs after "
                                           "(fine-tuned model pruned by task or MLM importance, not retrained).")
        fig, ax = new_figure(size=(5.0, 3.4))
        for k, t in enumerate(ids):
            d = ad[ad["task"] == t].sort_values("mlm_loss_increase")
            ax.plot(d["mlm_loss_increase"], d["relative_score"], marker="o", color=f"C{k}", label=t)
            for _, r in d.iterrows():
                ax.annotate(f"{r['level']:g}", (r["mlm_loss_increase"], r["relative_score"]), fontsize=6,
                            xytext=(2, 2), textcoords="offset points")
            best = tables["acceptable_deduction_summary"]
            b = best[best["task"] == t]
            if len(b) and b["mlm_loss_increase"].notna().all():
                ax.axvline(float(b["mlm_loss_increase"].iloc[0]), color=f"C{k}", ls="--", lw=0.8)
        ax.axhline(settings.before_after.threshold, color="C3", ls=":", lw=0.8)
        ax.set_xlabel("MLM loss increase of the pruned pre-trained model (nats)", fontsize=8)
        ax.set_ylabel("fine-tuned score / full fine-tuned score", fontsize=8)
        ax.legend(fontsize=7)
        figs[f"{art}acceptable-deduction"] = (fig, "Downstream score after fine-tuning a pruned pre-trained model "
                                                   "against the MLM loss the pruning cost (labels: fraction removed); "
                                                   "dashed: the acceptable deduction of each task.")
    return figs


def transfer_summary(tables: dict, settings: TransferSettings, prefix: str = "") -> str:
    """The headline numbers as text (for the report's summary).

    >>> transfer_summary(transfer_tables(store, config), config)    # doctest: +SKIP
    'MLM vs task (fine-tuned): Spearman 0.31 ...'
    """
    s = tables["coherence_summary"]
    parts = []

    def line(comparison, label):
        d = _stat(s, comparison, "spearman")
        j = _stat(s, comparison, "jaccard@0.25") if 0.25 in settings.stats.fractions else d.iloc[0:0]
        if d.empty:
            return
        txt = f"{label}: Spearman {_fmt(d['estimate'].mean())}"
        if len(d) > 1:
            txt += f" (per task {_fmt(d['estimate'].min())}..{_fmt(d['estimate'].max())})"
        p_max = d["p_value_max"].max()
        if pd_isna(p_max) is False:
            txt += f", p <= {p_max:.3g}"
        if len(j):
            txt += f", top-25% Jaccard {_fmt(j['estimate'].mean())} (chance {_fmt(j['chance'].iloc[0])})"
        parts.append(txt + ".")

    m = tables.get("mlm")
    if m is not None and not m.empty:
        parts.append("Masked LM of the pre-trained model: " + "; ".join(
            f"{r['corpus']}: accuracy {_fmt(r.get('validation_accuracy'))}, loss {_fmt(r.get('validation_loss'))} "
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
    from ..report import ReportTable, Section

    p = _plan(settings)
    art = _artifact(prefix)
    tables = tables if tables is not None else transfer_tables(store, settings, prefix)
    figs = _figures(tables, settings, p, art)

    def F(*names):
        from ..report.content import ReportFigure

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
    from ..report import ReportContent

    tables = transfer_tables(store, config)
    return ReportContent(summary=transfer_summary(tables, config), sections=transfer_sections(store, config, tables=tables))


register_study("transfer", TransferConfig, expand, report,
               description="how head importance transfers from masked LM to downstream tasks (Chiang & Chen 2021)")
