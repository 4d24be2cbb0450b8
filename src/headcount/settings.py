"""The settings of the verbs that the commands and the studies share, declared once.

:class:`DataConfig` (which examples, how they are batched), :class:`ScoreSettings` (how
importance is computed) and :class:`PruneSettings` (what drives a pruning run; the loop's own
settings are :class:`~headcount.pruning.PruneConfig`). ``headcount score`` / ``headcount prune``
read their options' defaults from these classes (:func:`default_of`), the studies' job
functions validate their parameters into them (:func:`settings_from`), and
:mod:`headcount.pipeline` takes them. Kept free of transformers so that the command line,
which needs the defaults to declare its options, starts without loading it.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, dataclass, fields

from .embedding import EMBEDDING_OBJECTIVES
from .errors import HeadcountError
from .scoring import DEFAULT_ACCUMULATE, METHODS, check_accumulate, check_method, check_normalize

#: ``embedding`` / ``embedding-supervised``: the contrastive objectives of :mod:`headcount.embedding`
OBJECTIVES = ("task", "mlm", *EMBEDDING_OBJECTIVES)
#: the importance methods that can drive pruning (entropy ranks heads but has no gate to remove)
PRUNE_METHODS = tuple(m for m in METHODS if m != "entropy")
#: the bounds of a tokenised example's length
MAX_LENGTH_RANGE = (8, 8192)


@dataclass(frozen=True)
class DataConfig:
    """Which examples and how they are batched."""

    split: str | None = None  # None: the task's train split
    max_examples: int | None = 1000
    batch_size: int = 32
    max_length: int = 128
    seed: int = 0

    def __post_init__(self):
        if self.max_examples is not None and self.max_examples < 1:
            raise HeadcountError(f"--max-examples must be at least 1, got {self.max_examples}")
        if self.batch_size < 1:
            raise HeadcountError(f"--batch-size must be at least 1, got {self.batch_size}")
        low, high = MAX_LENGTH_RANGE
        if not low <= self.max_length <= high:
            raise HeadcountError(f"--max-length must be in {low}..{high}, got {self.max_length}")


@dataclass(frozen=True)
class ScoreSettings:
    """How importance is computed (``headcount score``, the studies' score jobs).

    Attributes:
        objective: ``task`` (the task's loss), ``mlm`` (masked LM on the task's texts),
            ``embedding`` (SimCSE on the task's texts) or ``embedding-supervised`` (pairs as positives).
        method: one of :data:`~headcount.scoring.METHODS`.
        normalize: one of :data:`~headcount.scoring.NORMALIZE` (raw scores by default).
        accumulate: how gradients sum over batches (:data:`~headcount.scoring.ACCUMULATE`).

    >>> ScoreSettings(method="nonesuch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.errors.HeadcountError: unknown method 'nonesuch'; ...
    """

    objective: str = "task"
    method: str = "gradient"
    normalize: str = "none"
    accumulate: str = DEFAULT_ACCUMULATE

    def __post_init__(self):
        check_objective(self.objective)
        check_method(self.method)
        check_normalize(self.normalize)
        check_accumulate(self.accumulate, self.method)


@dataclass(frozen=True)
class PruneSettings:
    """What drives a pruning run (``headcount prune``, the studies' prune jobs); the loop's own
    settings (threshold, step, schedule) are :class:`~headcount.pruning.PruneConfig`.

    Attributes:
        objective: one of :data:`OBJECTIVES`.
        method: importance method, one of :data:`PRUNE_METHODS`.
        normalize: Prasanna et al.'s layer-wise then global normalisation by default.
        accumulate: as :class:`ScoreSettings`.
        importance_split: where importance is computed (None: the task's train split).
        stop_split: where the stop rule's metric is computed (None: the validation split).
    """

    objective: str = "task"
    method: str = "gradient"
    normalize: str = "layer+global"
    accumulate: str = DEFAULT_ACCUMULATE
    importance_split: str | None = None
    stop_split: str | None = None

    def __post_init__(self):
        check_objective(self.objective)
        if check_method(self.method) not in PRUNE_METHODS:
            raise HeadcountError(f"method {self.method!r} cannot drive pruning; use {', '.join(PRUNE_METHODS)}")
        check_normalize(self.normalize)
        check_accumulate(self.accumulate, self.method)


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


