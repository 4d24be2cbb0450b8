"""The ``transfer`` study's settings (pydantic).

Every setting is declared once, here: [`TransferConfig`][headcount.experiments.studies.transfer.config.TransferConfig] is what a ``study: transfer``
YAML holds, [`TransferSettings`][headcount.experiments.studies.transfer.config.TransferSettings] the same without ``study:`` (a part of another study,
e.g. the demo). The job parameter models (``*Params``, [`params`][headcount.experiments.studies.transfer.params]) reuse these sections.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from headcount.analysis.helpers import DEFAULT_FRACTIONS, LEVEL, N_BOOT, N_PERMUTATIONS
from headcount.data.mlm_head import MLM_HEAD_MAX_TEXTS, MLM_HEAD_STEPS
from headcount.experiments.runner import ConfigSection, StudyConfig
from headcount.experiments.runner.config import model_ref, task_ref
from headcount.experiments.runner.schema import fields_of, nonempty_model
from headcount.importance.pipeline import DataConfig
from headcount.runtime.bounds import BATCH_SIZE, DRAWS, EXAMPLES, FRACTION, MAX_LENGTH, RESAMPLES, SEED, STEPS
from headcount.runtime.errors import HeadcountError
from headcount.train import TrainConfig


def _per_example_scorer(name: str) -> str:
    """A registered scorer with per-example contributions (the paired bootstrap needs them)."""
    from headcount.importance.scoring import get_scorer, scorer_names

    try:
        scorer = get_scorer(name)
    except HeadcountError as e:
        raise ValueError(str(e)) from None
    if not scorer.per_example:
        raise ValueError(f"method {name!r} gives no per-example contributions, which the transfer study's paired "
                         f"bootstrap needs; use one of {', '.join(scorer_names(per_example=True))}")
    return name


#: an importance method of the transfer study: any registered scorer with per-example rows
Method = Annotated[str, AfterValidator(_per_example_scorer)]
Normalize = Literal["none", "layer"]
View = Literal["application", "shared"]
AfterHead = Literal["pretrained", "refit"]
#: the pre-training objectives whose importance is compared with task importance
PretrainObjective = Literal["mlm", "embedding", "lm"]

_DATA_DEFAULTS = {f.name: f.default for f in fields(DataConfig)}


# =============================================================================================
# settings (the YAML)
# =============================================================================================
#: [`headcount.train.TrainConfig`][headcount.train.TrainConfig] fields a transfer config may set under ``train``
TRAIN_FIELDS: tuple[str, ...] = (
    "lr", "batch_size", "epochs", "max_length", "weight_decay", "warmup", "max_grad_norm", "eval_each_epoch", "bf16",
    "group_by_length", "max_train_examples", "max_eval_examples", "eval_batch_size", "max_steps",
    "gradient_accumulation_steps", "data_seed", "save_steps",
)


class TrainSettings(create_model("TransferTrainFields", __base__=ConfigSection,
                                 **fields_of(TrainConfig, TRAIN_FIELDS, optional=True))):
    """Fine-tuning settings: the [`TRAIN_FIELDS`][headcount.experiments.studies.transfer.config.TRAIN_FIELDS] of [`headcount.train.TrainConfig`][headcount.train.TrainConfig]
    (their types read from it); unset = its default."""

    def values(self) -> dict:
        """The fields that are set (what overrides the defaults)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}

    def config(self) -> TrainConfig:
        """The [`TrainConfig`][headcount.train.TrainConfig] these settings give (its defaults where unset)."""
        return TrainConfig(**self.values())

    @model_validator(mode="after")
    def _valid(self):
        try:
            self.config()
        except HeadcountError as e:  # a ValueError is what pydantic reports with the key and line
            raise ValueError(str(e)) from None
        return self


class DataSettings(ConfigSection):
    """Which examples and how they are batched ([`headcount.importance.pipeline.DataConfig`][headcount.importance.pipeline.DataConfig]; its defaults
    except ``max_examples``, which the study keeps smaller)."""

    max_examples: int | None = Field(512, **EXAMPLES.limits())
    batch_size: int = Field(_DATA_DEFAULTS["batch_size"], **BATCH_SIZE.limits())
    max_length: int = Field(_DATA_DEFAULTS["max_length"], **MAX_LENGTH.limits())
    seed: int = Field(_DATA_DEFAULTS["seed"], **SEED.limits())

    def config(self, split: str | None = None) -> DataConfig:
        return DataConfig(split=split, **self.model_dump())


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
    head_steps: int = Field(MLM_HEAD_STEPS, **STEPS.limits())
    head_max_texts: int = Field(MLM_HEAD_MAX_TEXTS, ge=2, le=EXAMPLES.high)
    after_head: AfterHead = "pretrained"
    eval: DataSettings = DataSettings(max_examples=256)


class ScoringSettings(ConfigSection):
    """Importance scores: the method and the (train-split) examples."""

    method: Method = "gradient-token"
    data: DataSettings = DataSettings()


def _check_levels(v):
    if not v or any(not 0 < x < 1 for x in v):
        raise ValueError("levels must be fractions in (0, 1)")
    return tuple(sorted(set(float(x) for x in v)))


class PruningSettings(ConfigSection):
    """Prunability curves (masks as gates, no retraining).

    Attributes:
        levels: fractions of heads removed, each in (0, 1).
        random_draws: random removal orders per curve.
        normalize: score normalisation before ranking (``layer``: per-layer L2, Michel et al.).
        views: ``application`` (depth x head) and, for shared-layer models, ``shared``.
    """

    levels: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    random_draws: int = Field(3, **DRAWS.limits())
    normalize: Normalize = "layer"
    views: tuple[View, ...] = ("application", "shared")

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
    view: View = "application"
    mask_mode: Literal["prune", "gate"] = "prune"
    random_control: bool = False
    threshold: float = Field(0.9, gt=0, le=FRACTION.high)

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
        permutation: the test behind the tables' ``p_value``: ``within-layer`` (default: heads
            permuted only within their layer, so layer effects shared by both grids do not
            count as agreement) or ``global`` (all heads permuted: the earlier default). The
            global p-value is always reported too (``p_value_global``).
        seed_interval: the interval of a mean over seeds (``coherence_seeds.csv``, the tables'
            ``[low, high]``): ``t`` (default): the t interval over the seed estimates plus the
            example noise the seeds share (every seed scores the same examples; bounded by the
            seeds' mean bootstrap variance: [`headcount.analysis.coherence.seed_mean_ci`][headcount.analysis.coherence.seed_mean_ci]);
            ``t-resampled``: headcount's earlier interval, the t interval of the hierarchical
            bootstrap samples, which counts example noise twice (too wide).
    """

    n_boot: int = Field(N_BOOT, **RESAMPLES.limits())
    n_permutations: int = Field(N_PERMUTATIONS, **RESAMPLES.limits())
    permutation: Literal["within-layer", "global"] = "within-layer"
    level: float = Field(LEVEL, gt=0, lt=1)
    seed: int = Field(0, **SEED.limits())
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    seed_interval: Literal["t", "t-resampled"] = "t"

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
        objectives: the pre-training objectives whose importance (on the pre-trained model) is
            compared with task importance: ``mlm`` (always) and optionally ``embedding`` (SimCSE's
            unsupervised contrastive loss on the same texts, ``headcount.data.embedding``): its
            score jobs, its comparisons and an ``embedding`` order in the task prunability curves.
            A decoder takes ``[lm]`` instead: its own causal-LM (next-token) loss in MLM's place
            (the jobs and comparisons keep their ``mlm`` names; curves stop on next-token accuracy).
        mlm / scoring / pruning / before_after / stats: see their sections.
    """

    model: str = "offline"
    tasks: tuple[str | TaskSpec, ...]
    seeds: tuple[int, ...] = (1,)
    train: TrainSettings = TrainSettings()
    head_fit: TrainSettings = TrainSettings(lr=1e-3, epochs=10)
    objectives: tuple[PretrainObjective, ...] = ("mlm",)
    mlm: MlmSettings = MlmSettings()
    scoring: ScoringSettings = ScoringSettings()
    pruning: PruningSettings = PruningSettings()
    before_after: BeforeAfterSettings = BeforeAfterSettings()
    stats: StatsSettings = StatsSettings()

    @field_validator("model")
    @classmethod
    def _model(cls, v, info: ValidationInfo):
        return model_ref(_resolve_path(nonempty_model(v), info))  # a checkpoint that is not there: refused now

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks(cls, v, info: ValidationInfo):
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError("give at least one task")
        out = []
        for item in v:  # a registered name wins; a path ends in .yaml or starts with ./ ../ /; built and checked
            if isinstance(item, str):
                out.append(task_ref(item, info))
            elif isinstance(item, Mapping) and isinstance(item.get("task"), str):
                out.append({**item, "task": task_ref(item["task"], info)})
            else:
                out.append(item)
        return out

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v):
        if len(set(v)) != len(v) or ("mlm" in v) == ("lm" in v):
            raise ValueError("objectives must include mlm (the curves and before/after use it), or lm in its place "
                             "for a decoder, without repeats")
        if "lm" in v and "embedding" in v:
            raise ValueError("objectives: embedding is for encoders; a decoder takes [lm]")
        return v

    @property
    def pretrain(self) -> str:
        """The objective in MLM's role: ``mlm``, or ``lm`` (a decoder's next-token loss)."""
        return "lm" if "lm" in self.objectives else "mlm"

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
        upd = {}
        if v.corpus:  # a task: the task rule (a folder named like a registered task changes nothing)
            upd["corpus"] = task_ref(v.corpus, info)
        if v.head_corpus:
            upd["head_corpus"] = _corpus_ref(v.head_corpus, info)
        return v.model_copy(update=upd) if upd else v


class TransferConfig(StudyConfig, TransferSettings):
    """The ``study: transfer`` config: [`TransferSettings`][headcount.experiments.studies.transfer.config.TransferSettings] plus name and description.

    >>> c = TransferConfig(study="transfer", tasks=["offline/movies", "offline/tweets"])
    >>> [task_id(t) for t in c.tasks], c.pruning.levels[:2]
    (['movies', 'tweets'], (0.1, 0.2))
    """


def _resolve_path(value: str, info: ValidationInfo) -> str:
    """A relative path that exists next to the config file becomes absolute; names stay names.

    Wider than the lottery study's rule ([`headcount.experiments.studies.lottery.config._resolve_path`][headcount.experiments.studies.lottery.config._resolve_path],
    which only does the first): ``~`` is expanded; a ``.yaml``/``.yml``/``.txt`` that exists
    nowhere yet points at the config's folder (so the error names that path); a path that exists
    relative to the working directory (with a suffix, or starting with ``.``) becomes absolute;
    a value that is not a string passes through. The two stay apart because the resolved value is
    part of each study's config hash (one rule for both would re-plan existing runs).
    """
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


def _corpus_ref(value: str, info: ValidationInfo) -> str:
    """Texts to fit an MLM head on ([`headcount.data.tasks.mlm_texts`][headcount.data.tasks.mlm_texts]): ``offline/corpus`` and
    registered task names as they are, a task YAML by the task rule, a ``.txt`` file or a path
    (``./``, ``../``, ``/``, ``~``) relative to the config's folder, anything else (a ``datasets``
    id) as it is."""
    from headcount.data.tasks import list_tasks

    if value == "offline/corpus" or value in list_tasks():
        return value
    if value.lower().endswith((".yaml", ".yml")):
        return task_ref(value, info)
    if value.lower().endswith(".txt") or value.startswith(("./", "../", "/", "~")):
        path = _resolve_path(value, info)
        if not Path(path).expanduser().exists():  # refused now, not when the MLM head is fitted
            raise ValueError(f"head_corpus: file not found: {path}")
        return path
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
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in name).strip("-.") or "task"


def task_name(spec: str | TaskSpec) -> str:
    """The task a task entry names (what [`headcount.data.tasks.get_task`][headcount.data.tasks.get_task] reads).

    The reference as written (a registered name or a task YAML path), not the task's registered
    name that the lottery study's [`headcount.experiments.studies.lottery.plan.task_name`][headcount.experiments.studies.lottery.plan.task_name] returns by
    building the task; transfer job names use [`task_id`][headcount.experiments.studies.transfer.config.task_id] instead.
    """
    return spec.task if isinstance(spec, TaskSpec) else str(spec)
