"""The settings of the verbs that the commands and the studies share, declared once.

[`DataConfig`][headcount.importance.settings.DataConfig] (which examples, how they are batched), [`ScoreSettings`][headcount.importance.settings.ScoreSettings] (how
importance is computed) and [`PruneSettings`][headcount.importance.settings.PruneSettings] (what drives a pruning run; the loop's own
settings are [`PruneConfig`][headcount.importance.pruning.PruneConfig]). ``headcount score`` / ``headcount prune``
read their options' defaults from these classes ([`default_of`][headcount.importance.settings.default_of]), the studies' job
functions validate their parameters into them ([`settings_from`][headcount.importance.settings.settings_from]), and
[`headcount.importance.pipeline`][headcount.importance.pipeline] takes them. Kept free of transformers so that the command line,
which needs the defaults to declare its options, starts without loading it.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, asdict, dataclass, fields

from headcount.data.embedding import EMBEDDING_OBJECTIVES
from headcount.importance.pruning import check_unit
from headcount.importance.scorer_options import ScorerOptions
from headcount.importance.scorers import Scorer
from headcount.importance.scoring import get_scorer, scorer_names
from headcount.importance.scores import DEFAULT_ACCUMULATE, check_accumulate, check_batch_order, check_normalize, groups_by_length
from headcount.runtime.bounds import BATCH_SIZE, EXAMPLES, MAX_LENGTH, SEED
from headcount.runtime.errors import HeadcountError

#: ``embedding`` / ``embedding-supervised``: the contrastive objectives of ``headcount.data.embedding``;
#: ``lm``: a decoder's causal-LM (next-token) loss on the task's texts (pruning: next-token accuracy)
OBJECTIVES = ("task", "mlm", *EMBEDDING_OBJECTIVES, "lm")


def prune_methods() -> tuple[str, ...]:
    """The registered scorers that can drive pruning (entropy ranks heads but is not an importance)."""
    return scorer_names(can_prune=True)


@dataclass(frozen=True)
class DataConfig:
    """Which examples and how they are batched."""

    split: str | None = None  # None: the task's train split
    max_examples: int | None = 1000
    batch_size: int = 32
    max_length: int = 128
    seed: int = 0

    def __post_init__(self):  # named as the options (score, prune) that set them
        EXAMPLES.check(self.max_examples, "--max-examples", optional=True)
        BATCH_SIZE.check(self.batch_size, "--batch-size")
        MAX_LENGTH.check(self.max_length, "--max-length")
        SEED.check(self.seed, "--seed")


@dataclass(frozen=True)
class ScoreSettings:
    """How importance is computed (``headcount score``, the studies' score jobs).

    Attributes:
        objective: ``task`` (the task's loss), ``mlm`` (masked LM on the task's texts),
            ``embedding`` (SimCSE on the task's texts), ``embedding-supervised`` (pairs as positives)
            or ``lm`` (a decoder's next-token loss on the task's texts).
        method: a registered scorer ([`headcount.importance.scorers`][headcount.importance.scorers]).
        normalize: one of ``NORMALIZE`` (raw scores by default).
        accumulate: how gradients sum over batches (``ACCUMULATE``).
        batch_order: the order of the batches importance is computed on
            (``BATCH_ORDERS``; ``auto``: the split's order in fixed-size
            batches for ``cumulative``, as the references do; grouped by length otherwise).
        unit: ``heads``, or ``kv-groups``: ``scores.json`` also gets ``kv_groups [L, n_kv]``, each
            group's query heads' scores summed (decoders with grouped-query attention).
        options: the chosen scorer's own options: an instance of its options class
            (``scorer.options``, e.g. [`RetrievalOptions`][headcount.importance.scorer_options.RetrievalOptions]
            for ``retrieval``, [`LongRangeOptions`][headcount.importance.scorer_options.LongRangeOptions] for
            ``long-range``; declared in [`headcount.importance.scorer_options`][headcount.importance.scorer_options]),
            or a mapping of its fields, built into one (None: its defaults). A field the method does
            not take is refused, naming the method that takes it.

    >>> ScoreSettings(method="nonesuch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: unknown method 'nonesuch'; ...
    >>> ScoreSettings(method="retrieval", options={"max_new_tokens": 20}).options
    RetrievalOptions(max_new_tokens=20, success='rouge1', stop='newline', rouge='porter', copies='reference')
    """

    objective: str = "task"
    method: str = "gradient"
    normalize: str = "none"
    accumulate: str = DEFAULT_ACCUMULATE
    batch_order: str = "auto"
    unit: str = "heads"
    options: ScorerOptions | None = None

    def __post_init__(self):
        check_objective(self.objective)
        scorer = get_scorer(self.method)  # looked up once: the verbs are handed the Scorer (``.scorer``)
        object.__setattr__(self, "_scorer", scorer)  # not a field: equality, asdict and identities ignore it
        check_normalize(self.normalize)
        check_accumulate(self.accumulate, scorer)
        check_batch_order(self.batch_order)
        check_unit(self.unit)
        object.__setattr__(self, "options", scorer.options_of(self.options))

    @property
    def scorer(self) -> Scorer:
        """The registered [`Scorer`][headcount.importance.scorers.Scorer] that ``method`` names."""
        return self._scorer

    @property
    def grouped(self) -> bool:
        """Whether the importance batches are grouped by length (see ``batch_order``)."""
        return groups_by_length(self.batch_order, self.accumulate)

    def identity(self) -> dict:
        """The settings as a command's run identity records them: the generic fields and, flat,
        every registered scorer's options (this method's as given, the others' defaults), as
        before the options moved to their scorers, so that earlier outputs keep their identity.

        >>> ScoreSettings(method="long-range", options={"sink": 2}).identity()["sink"]
        2
        """
        flat: dict = {}
        for name in scorer_names():  # registration order: the built-ins' options, then the user's
            flat.update({k: v for k, v in asdict(get_scorer(name).options()).items() if k not in flat})
        flat.update(asdict(self.options))
        generic = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "options"}
        return {**generic, **flat}


@dataclass(frozen=True)
class PruneSettings(ScoreSettings):
    """What drives a pruning run (``headcount prune``, the studies' prune jobs); the loop's own
    settings (threshold, step, schedule) are [`PruneConfig`][headcount.importance.pruning.PruneConfig].

    Attributes:
        objective: one of [`OBJECTIVES`][headcount.importance.settings.OBJECTIVES].
        method: importance method, a registered scorer that can drive pruning ([`prune_methods`][headcount.importance.settings.prune_methods]).
        normalize: Prasanna et al.'s layer-wise then global normalisation by default.
        accumulate: as [`ScoreSettings`][headcount.importance.settings.ScoreSettings].
        batch_order: as [`ScoreSettings`][headcount.importance.settings.ScoreSettings] (the importance batches; the stop rule's batches
            are grouped by length: a metric does not depend on their order).
        importance_split: where importance is computed (None: the task's train split).
        stop_split: where the stop rule's metric is computed (None: the validation split).
    """

    normalize: str = "layer+global"
    importance_split: str | None = None
    stop_split: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if not self.scorer.can_prune:
            raise HeadcountError(f"method {self.method!r} cannot drive pruning; use {', '.join(prune_methods())}")


def settings_from(cls, params: dict, **given):
    """``cls`` (a settings dataclass) from the keys of ``params`` it declares; a missing or None
    value takes ``cls``'s default (job parameters never restate one). ``given`` wins.

    >>> settings_from(ScoreSettings, {"method": "ablation", "normalize": None, "task": "x"}).normalize
    'none'
    """
    names = {f.name for f in fields(cls)}
    values = {k: v for k, v in params.items() if k in names and v is not None}
    return cls(**{**values, **given})


def default_of(cls, name: str):
    """The default of field ``name`` of a settings class (a dataclass or a pydantic model), or of a
    function's keyword: what a command-line option shows, read from the one place it is declared.

    >>> default_of(PruneSettings, "normalize")
    'layer+global'
    """
    if hasattr(cls, "model_fields"):  # pydantic
        field = cls.model_fields.get(name)
        if field is not None and not field.is_required():
            return field.get_default(call_default_factory=True)
    elif not isinstance(cls, type):  # a function: the default of its keyword (finetune's seed)
        param = inspect.signature(cls).parameters.get(name)
        if param is not None and param.default is not inspect.Parameter.empty:
            return param.default
    else:
        for f in fields(cls):
            if f.name == name and f.default is not MISSING:
                return f.default
    raise KeyError(f"{cls.__name__} declares no default for {name!r}")


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise HeadcountError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    return objective


