"""The settings of a lottery study (pydantic models), and the parameters of its jobs.

One declaration per setting: the training settings are [`headcount.train.TrainConfig`][headcount.train.TrainConfig]'s
fields and the magnitude settings [`headcount.train.magnitude_search.MagnitudeConfig`][headcount.train.magnitude_search.MagnitudeConfig]'s (their types
and defaults, read from those classes); the pattern CNN's defaults are those of
[`headcount.analysis.patterns.train_pattern_cnn`][headcount.analysis.patterns.train_pattern_cnn]. Each job function validates its
``params`` into one of the ``*Params`` models below ([`job_params`][headcount.experiments.studies.jobs.job_params]).
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from headcount.analysis.patterns import ARCHITECTURES, CNN_EPOCHS, MAP_SIDE, MAP_SIZE, train_pattern_cnn
from headcount.data.tasks import get_task
from headcount.experiments.runner import ConfigSection, StudyConfig
from headcount.experiments.runner.config import model_ref, task_ref
from headcount.experiments.runner.schema import fields_of, nonempty_model
from headcount.runtime.bounds import BATCH_SIZE, EXAMPLES, FRACTION, LEARNING_RATE, MAX_LENGTH, SEED, STEPS
from headcount.runtime.errors import HeadcountError
from headcount.train import TrainConfig
from headcount.train.magnitude_search import MagnitudeConfig, check_procedure

#: How a random subnetwork is drawn: as many heads and MLPs as the good one (``uniform``) or
#: each kept with p = the good subnetwork's kept fraction (``bernoulli``, the paper's draw).
RandomDraw = Literal["uniform", "bernoulli"]

#: Side of the fixed-size mean attention maps (at least 8 cells).
MapSide = Annotated[int, Field(ge=8, le=MAP_SIDE.high)]

#: [`headcount.train.TrainConfig`][headcount.train.TrainConfig] fields a lottery config exposes under ``train``.
TRAIN_FIELDS: tuple[str, ...] = (
    "lr", "batch_size", "epochs", "max_length", "weight_decay", "warmup", "max_grad_norm", "max_train_examples",
    "max_eval_examples", "eval_batch_size", "max_steps", "gradient_accumulation_steps", "data_seed", "bf16",
    "eval_each_epoch", "save_steps",
)

#: [`headcount.train.magnitude_search.MagnitudeConfig`][headcount.train.magnitude_search.MagnitudeConfig] fields a lottery config exposes under ``magnitude``.
MAGNITUDE_FIELDS: tuple[str, ...] = ("procedure", "rounds", "rate", "threshold", "variant", "schedule", "at_cap")

_CNN_DEFAULTS = {k: p.default for k, p in inspect.signature(train_pattern_cnn).parameters.items()}


def _resolve_path(value: str, info: ValidationInfo) -> str:
    """A relative path that exists next to the config file becomes absolute; names stay names.

    Everything else stays as written: absolute paths, ``~``, paths relative to the working
    directory, files that do not exist yet, the empty string. Narrower than the transfer study's
    rule ([`headcount.experiments.studies.transfer.config._resolve_path`][headcount.experiments.studies.transfer.config._resolve_path], which also expands ``~``, makes
    existing working-directory paths absolute and points a missing ``.yaml``/``.txt`` at the
    config's folder). Kept apart on purpose: the resolved value is part of the config hash, so
    the wider rule would re-plan lottery runs already written with this one.
    """
    base = (info.context or {}).get("base_dir") if info is not None else None
    if base is None or not value or os.path.isabs(value):
        return value
    candidate = Path(base) / value
    return str(candidate.resolve()) if candidate.exists() else value


def _check(build, values: dict) -> None:
    """Surface a library config's own validation (a HeadcountError) as a pydantic error."""
    try:
        build(**values)
    except HeadcountError as e:
        raise ValueError(str(e)) from None


class TrainSettings(create_model("TrainFields", __base__=ConfigSection, **fields_of(TrainConfig, TRAIN_FIELDS))):
    """Fine-tuning / retraining hyper-parameters: the [`TRAIN_FIELDS`][headcount.experiments.studies.lottery.config.TRAIN_FIELDS] of
    [`headcount.train.TrainConfig`][headcount.train.TrainConfig], with its defaults and checks.

    Defaults are Prasanna et al.'s: lr 2e-5, batch 32, 3 epochs, max length 128, no weight
    decay, no warm-up, clipping at 1.0. ``max_train_examples`` / ``max_eval_examples`` take
    subsets (drawn with ``data_seed``, the same for every seed); the dev subset is also what
    pruning, the no-retraining evaluation and the pattern maps use.

    >>> TrainSettings().lr == TrainConfig().lr
    True
    """

    @model_validator(mode="after")
    def _valid(self):
        _check(TrainConfig, self.model_dump())
        return self

    def config(self) -> TrainConfig:
        """The [`headcount.train.TrainConfig`][headcount.train.TrainConfig] of these settings."""
        return TrainConfig(**self.model_dump())


class PruningSettings(ConfigSection):
    """Structured pruning to the good subnetwork ([`headcount.importance.pruning.iterative_prune`][headcount.importance.pruning.iterative_prune]).

    Attributes:
        threshold: keep the last mask whose dev metric is >= threshold x the full model's.
        step: fraction of the heads removed per step (with one MLP per step in the joint phase).
        step_of: ``total`` (Prasanna: int(0.1 x 144) = 14 heads a step) or ``remaining``.
        schedule: ``prasanna`` (joint heads+MLPs, then heads at half the step, then MLPs) or ``heads``.
        importance: which split the importance scores use: ``validation`` (the paper's code)
            or ``train``.
        max_examples: examples for importance (default: the dev subset ``train.max_eval_examples``).
        batch_size: importance batch size (the paper: 64).
        method: importance method (``gradient``: |dL/dgate| summed over batches).
        accumulate: ``cumulative`` (the default, the paper's code: the gate gradient is never
            zeroed, so it sums |running gradient| after each batch) or ``per-batch`` (sum of each
            batch's |gradient|).
        normalize: ``layer+global`` (the paper: layer-wise L2 for heads, then global min-max).
        max_steps: optional cap on pruning steps.
        shrink: physically shrink the working copy between steps (faster; heads already cut out
            then score 0). ``false`` (the default) keeps them, gated off, so that their gradient
            at gate 0 counts in the layer-wise L2 norm as in the paper's code.
        unit: ``heads`` (query heads, the default) or ``kv-groups`` (decoders with grouped-query
            attention: whole key/value groups are pruned, and the random and bad controls are
            drawn in whole groups too, so that every subnetwork shrinks the KV cache alike).
    """

    threshold: float = Field(0.9, gt=0, le=1)
    step: float = Field(0.1, gt=0, lt=1)
    step_of: Literal["total", "remaining"] = "total"
    schedule: Literal["prasanna", "heads"] = "prasanna"
    importance: Literal["validation", "train"] = "validation"
    max_examples: int | None = Field(None, **EXAMPLES.limits())
    batch_size: int = Field(64, **BATCH_SIZE.limits())
    method: str = "gradient"  # a registered scorer that can drive pruning (headcount.importance.scorers)
    accumulate: Literal["cumulative", "per-batch"] = "cumulative"
    normalize: Literal["none", "layer", "layer+global"] = "layer+global"
    max_steps: int | None = Field(None, **STEPS.limits())
    shrink: bool = False
    unit: Literal["heads", "kv-groups"] = "heads"

    @model_validator(mode="after")
    def _accumulate_fits_method(self):
        from headcount.importance.scoring import get_scorer, scorer_names
        from headcount.importance.scores import check_accumulate

        try:
            scorer = get_scorer(self.method)
            check_accumulate(self.accumulate, self.method)
        except HeadcountError as e:
            raise ValueError(f"{e}; use accumulate: per-batch" if "accumulate" in str(e) else str(e)) from None
        if not scorer.can_prune:
            raise ValueError(f"method {self.method!r} cannot drive pruning; use one of "
                             f"{', '.join(scorer_names(can_prune=True))}")
        return self



class MagnitudeSettings(create_model("MagnitudeFields", __base__=ConfigSection,
                                     **fields_of(MagnitudeConfig, MAGNITUDE_FIELDS))):
    """Magnitude pruning ([`headcount.train.magnitude_prune.magnitude_prune`][headcount.train.magnitude_prune.magnitude_prune]): the good mask, then
    random and bad masks at exactly its sparsity; all retrained from the pre-trained weights.

    The [`MAGNITUDE_FIELDS`][headcount.experiments.studies.lottery.config.MAGNITUDE_FIELDS] of [`headcount.train.magnitude_search.MagnitudeConfig`][headcount.train.magnitude_search.MagnitudeConfig] (its
    defaults and checks), and ``enabled``. When no step passes the good run has no mask: a NaN
    row flagged ``no_passing_mask`` in the tables, and its random and bad controls are skipped.

    Attributes:
        enabled: run the magnitude part.
        procedure: ``prasanna`` (the default, the paper's: prune the fine-tuned weights without
            retraining, stop on the un-retrained dev metric, retrain the kept mask once) or
            ``imp`` (Chen et al.: retrain every round, stop on the retrained metric).
        rounds: at most this many pruning steps (imp: retrained rounds; the paper: 10).
        rate: fraction of the remaining weights pruned per step (the paper: 0.1).
        threshold: stop below threshold x the full model's metric.
        variant: ``prasanna`` (Q, K, V, O, intermediate and output weights + biases) or ``chen``.
        schedule: ``remaining`` (1 - (1 - rate)^k) or ``original`` (k x rate).
        at_cap: prasanna: the mask kept when all ``rounds`` steps pass: ``reference`` (the
            default, the authors' code: the step before the last) or ``last`` (the last step).
    """

    enabled: bool = True

    @model_validator(mode="after")
    def _valid(self):
        _check(MagnitudeConfig, self.model_dump(exclude={"enabled"}))
        _check(FRACTION.check, {"value": self.threshold, "name": "threshold"})  # as `headcount magnitude --threshold`
        _check(lambda **v: check_procedure(MagnitudeConfig(**v)), self.model_dump(exclude={"enabled"}))  # as the CLI
        return self

    def config(self, control: str = "good") -> MagnitudeConfig:
        """The [`headcount.train.magnitude_search.MagnitudeConfig`][headcount.train.magnitude_search.MagnitudeConfig] of these settings for one control."""
        return MagnitudeConfig(**self.model_dump(exclude={"enabled"}), control=control)


#: How the super-survivors' random and bad controls are drawn ([`SuperSurvivorSettings`][headcount.experiments.studies.lottery.config.SuperSurvivorSettings]).
SuperControls = Literal["reference", "as-good-mask"]
SuperRandomDraws = Literal["per-seed", "per-task"]
LotteryMetric = Literal["reference", "task"]


class SuperSurvivorSettings(ConfigSection):
    """Super-survivors: heads and MLPs kept by the good subnetwork of every seed.

    Attributes:
        enabled: compute them (and the mask stability statistics).
        retrain: retrain the super-survivor subnetwork and its size-matched random (uniform)
            and bad controls from the pre-trained weights.
        seeds: training seeds of those retrainings (default: every seed of the study).
        draw_seed: seed of the random and bad draws.
        controls: how those controls are drawn (both as large as the super-survivors, heads and
            MLPs sized separately). ``reference`` (default, the authors' code): bad = the
            components pruned in every seed, resized to the super-survivors' size (dropping
            random ones, or topping up with random components that are neither); random = the
            "middlings", components neither super-survivors nor in that bad control, resized
            likewise ([`headcount.analysis.super_controls`][headcount.analysis.super_controls]). ``as-good-mask`` (headcount
            before): the super mask's controls as any good mask's: bad from the components it
            prunes, random uniformly from all ([`headcount.analysis.draw_controls`][headcount.analysis.draw_controls]); its
            jobs keep their earlier keys.
        random_draws: with ``controls: reference``, how often the random (middling) control is
            drawn. ``per-seed`` (default, the authors' ``compute_super_masks.py``, whose loop over
            the seeds draws the middlings again for every seed; the bad control it is drawn around
            is resized once, on the first seed, and stays the same): one draw per retraining seed,
            job ``subnetwork/super-random/<task>/seed<s>``. ``per-task`` (headcount before): one
            draw for the task, retrained with every seed (job ``subnetwork/super-random/<task>``).
    """

    enabled: bool = True
    retrain: bool = True
    seeds: list[int] | None = None
    draw_seed: int = Field(0, **SEED.limits())
    controls: SuperControls = "reference"
    random_draws: SuperRandomDraws = "per-seed"


class PatternCNNSettings(ConfigSection):
    """The pattern CNN of Prasanna et al., trained on user-labelled maps (see ``headcount
    patterns train``): ``maps`` a .safetensors with ``maps`` [N, S, S], ``labels`` a .csv/.json.
    The other fields are [`headcount.analysis.patterns.train_pattern_cnn`][headcount.analysis.patterns.train_pattern_cnn]'s, with its
    defaults (the paper's recipe: their net, 200 epochs, batch 64, Adam 1e-3, 20% held out)."""

    maps: str
    labels: str
    epochs: int = Field(_CNN_DEFAULTS["epochs"], **CNN_EPOCHS.limits())
    seed: int = Field(_CNN_DEFAULTS["seed"], **SEED.limits())
    holdout: float = Field(_CNN_DEFAULTS["holdout"], ge=0, le=0.9)
    batch_size: int = Field(_CNN_DEFAULTS["batch_size"], **BATCH_SIZE.limits())
    lr: float = Field(_CNN_DEFAULTS["lr"], **LEARNING_RATE.limits())
    architecture: Literal[ARCHITECTURES] = _CNN_DEFAULTS["architecture"]  # type: ignore[valid-type]
    size: int | None = Field(_CNN_DEFAULTS["size"], **MAP_SIDE.limits())

    @field_validator("maps", "labels")
    @classmethod
    def _paths(cls, v: str, info: ValidationInfo) -> str:
        path = _resolve_path(v, info)
        if info.context is not None and not Path(path).expanduser().is_file():  # a config file: refused now
            raise ValueError(f"{info.field_name}: file not found: {path}")
        return path


class PatternSettings(ConfigSection):
    """Self-attention patterns of the fine-tuned full model, per head.

    Attributes:
        enabled: classify the heads.
        max_examples: dev examples whose attention maps are averaged.
        batch_size: examples per forward pass.
        max_length: tokens per example (default: ``train.max_length``).
        size: side of the fixed-size mean maps the rule classifier reads
            ([`headcount.analysis.patterns.mean_attention_maps`][headcount.analysis.patterns.mean_attention_maps]).
        cnn: optional labelled maps to train the CNN on; it classifies every example's map of
            every head (the same ``max_examples`` dev examples), centre-padded to the CNN's size,
            and its shares over examples x heads are reported beside the rules' shares of heads.
    """

    enabled: bool = True
    max_examples: int = Field(64, **EXAMPLES.limits())
    batch_size: int = Field(16, **BATCH_SIZE.limits())
    max_length: int | None = Field(None, **MAX_LENGTH.limits())
    size: MapSide = MAP_SIZE
    cnn: PatternCNNSettings | None = None


class LotterySettings(ConfigSection):
    """Everything a lottery study (or the lottery part of another study) needs.

    Attributes:
        model: the pre-trained model (hub id, local directory, or ``offline``).
        tasks: task names or task YAML paths (relative paths: next to the config file).
        seeds: training seeds; each gives its own fine-tuning, good subnetwork and controls.
        random: ``bernoulli`` (the default, the paper's draw: each head and MLP kept with p = the
            good subnetwork's kept fraction, so the size matches only on average) or ``uniform``
            (exactly as many heads and MLPs as the good subnetwork, drawn uniformly).
        train: [`TrainSettings`][headcount.experiments.studies.lottery.config.TrainSettings].
        pruning: [`PruningSettings`][headcount.experiments.studies.lottery.config.PruningSettings].
        magnitude: [`MagnitudeSettings`][headcount.experiments.studies.lottery.config.MagnitudeSettings].
        super_survivors: [`SuperSurvivorSettings`][headcount.experiments.studies.lottery.config.SuperSurvivorSettings].
        patterns: [`PatternSettings`][headcount.experiments.studies.lottery.config.PatternSettings].
        keep_models: keep the checkpoints of retrained subnetworks (default: only metrics; the
            fine-tuned full models are always kept, later jobs read them).
        metric: the dev metric of the stop rule and of every score the study reports.
            ``reference`` (default, the authors' code: accuracy for every classification task but
            CoLA, so accuracy where a task declares F1, i.e. GLUE's MRPC and QQP; any other
            task's own metric) or ``task`` (the task's declared metric: F1 on MRPC and QQP, the
            GLUE official one). See [`headcount.experiments.studies.lottery.plan.lottery_metric`][headcount.experiments.studies.lottery.plan.lottery_metric].

    >>> LotterySettings(tasks=["offline/movies"], seeds=[1, 2]).random
    'bernoulli'
    """

    model: str = "offline"
    tasks: list[str] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    random: RandomDraw = "bernoulli"
    train: TrainSettings = TrainSettings()
    pruning: PruningSettings = PruningSettings()
    magnitude: MagnitudeSettings = MagnitudeSettings()
    super_survivors: SuperSurvivorSettings = SuperSurvivorSettings()
    patterns: PatternSettings = PatternSettings()
    keep_models: bool = False
    metric: LotteryMetric = "reference"

    @field_validator("model")
    @classmethod
    def _model(cls, v: str, info: ValidationInfo) -> str:
        return model_ref(_resolve_path(nonempty_model(v), info))  # a checkpoint that is not there: refused now

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, v: list[str], info: ValidationInfo) -> list[str]:
        out = [task_ref(t, info) for t in v]  # the task rule; each task built and checked
        names = [get_task(t).name for t in out]
        if len(set(names)) != len(names):
            raise ValueError(f"tasks must be distinct (got {names})")
        return out

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"seeds must be distinct (got {v})")
        return v

    @model_validator(mode="after")
    def _super_seeds(self):
        s = self.super_survivors.seeds
        if s is not None and (not s or len(set(s)) != len(s)):
            raise ValueError("super_survivors.seeds must be a non-empty list of distinct seeds")
        return self


class LotteryConfig(StudyConfig, LotterySettings):
    """The ``study: lottery`` config: [`LotterySettings`][headcount.experiments.studies.lottery.config.LotterySettings] plus ``study``, ``name``, ``description``.

    >>> LotteryConfig(study="lottery", tasks=["offline/movies"], seeds=[1]).model
    'offline'
    """


# =============================================================================================
# job parameters: what each job function of .jobs reads from ``params``
# =============================================================================================
SUBNETWORK_KINDS: tuple[str, ...] = ("random", "bad", "super")


class SubnetworkParams(ConfigSection):
    """``lottery.subnetwork``: ``kind`` (``random`` / ``bad``: a control of the upstream good
    mask; ``super``: the super-survivors of the upstream masks), the draw ``seed`` and the
    random ``mode`` (both needed by the controls); ``controls``: ``reference`` for a control
    of the super-survivors of all upstream good masks drawn as the authors' code does
    ([`headcount.analysis.super_controls`][headcount.analysis.super_controls]; random: ``mode`` uniform), unset (or
    ``as-good-mask``) for a control of the one upstream ``good`` mask."""

    kind: str
    seed: int | None = None
    mode: RandomDraw | None = None
    controls: SuperControls | None = None
    draw: int | None = None  # reference random super control drawn per retraining seed: that seed

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in SUBNETWORK_KINDS:
            raise ValueError(f"unknown subnetwork kind {v!r}; use 'random', 'bad' or 'super'")
        return v

    @model_validator(mode="after")
    def _needs(self):
        if self.kind != "super" and self.seed is None:
            raise ValueError(f"a {self.kind} subnetwork needs a seed")
        if self.kind == "random" and self.mode is None:
            raise ValueError("a random subnetwork needs a mode ('uniform' or 'bernoulli')")
        if self.controls == "reference" and (self.kind == "super" or self.mode == "bernoulli"):
            raise ValueError("controls 'reference' is for random (mode 'uniform') and bad subnetworks")
        return self


class RetrainParams(ConfigSection):
    """``lottery.retrain``: the shared fine-tuning parameters and ``keep_model``."""

    model: str
    task: str
    seed: int
    train: TrainSettings
    mask_mode: Literal["prune", "gate"]
    keep_model: bool
    metric: str | None = None  # the study's metric where it is not the task's (lottery_metric)


class MagnitudeParams(ConfigSection):
    """``lottery.magnitude``: the pre-trained ``model``, ``task``, ``seed``, ``train``,
    ``magnitude`` settings, the ``control`` and ``keep_models``."""

    model: str
    task: str
    seed: int
    train: TrainSettings
    magnitude: MagnitudeSettings
    control: Literal["good", "random", "bad"]
    keep_models: bool
    metric: str | None = None  # the study's metric where it is not the task's (lottery_metric)


class PatternsParams(ConfigSection):
    """``lottery.patterns``: ``task``, ``split``, the map ``size`` and ``data``
    ([`headcount.importance.pipeline.DataConfig`][headcount.importance.pipeline.DataConfig] fields); the model is the upstream ``model`` job."""

    task: str
    split: str | None
    size: MapSide
    data: dict[str, Any]


class PatternCNNParams(PatternCNNSettings):
    """``lottery.pattern-cnn``: [`PatternCNNSettings`][headcount.experiments.studies.lottery.config.PatternCNNSettings] and the ``digests`` of its two files
    (so that a changed file re-trains the CNN)."""

    digests: list[str | None]


class OverlapParams(ConfigSection):
    """``lottery.overlap``: the task names and seeds, in the order of the ``t{i}-s{j}`` inputs."""

    tasks: list[str]
    seeds: list[int]
