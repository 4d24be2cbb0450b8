"""The settings of the verbs that the commands and the studies share, declared once.

:class:`DataConfig` (which examples, how they are batched), :class:`ScoreSettings` (how
importance is computed) and :class:`PruneSettings` (what drives a pruning run; the loop's own
settings are :class:`~headcount.importance.pruning.PruneConfig`). ``headcount score`` / ``headcount prune``
read their options' defaults from these classes (:func:`default_of`), the studies' job
functions validate their parameters into them (:func:`settings_from`), and
:mod:`headcount.importance.pipeline` takes them. Kept free of transformers so that the command line,
which needs the defaults to declare its options, starts without loading it.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields

from headcount.data.embedding import EMBEDDING_OBJECTIVES
from headcount.importance.pruning import check_unit
from headcount.importance.scoring import get_scorer, scorer_names
from headcount.importance.scores import DEFAULT_ACCUMULATE, check_accumulate, check_batch_order, check_method, check_normalize, groups_by_length
from headcount.runtime.errors import HeadcountError

#: ``embedding`` / ``embedding-supervised``: the contrastive objectives of :mod:`headcount.data.embedding`;
#: ``lm``: a decoder's causal-LM (next-token) loss on the task's texts (pruning: next-token accuracy)
OBJECTIVES = ("task", "mlm", *EMBEDDING_OBJECTIVES, "lm")


def prune_methods() -> tuple[str, ...]:
    """The registered scorers that can drive pruning (entropy ranks heads but is not an importance)."""
    return scorer_names(can_prune=True)

#: the bounds of a tokenised example's length
MAX_LENGTH_RANGE = (8, 8192)


# -- the sane range of every numeric setting, declared once -------------------------------------------------------
def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


@dataclass(frozen=True)
class Bound:
    """The sane range of a numeric setting: a finite number (never a bool) from ``low`` to ``high``,
    an end open where said; ``integer``: an int. One declaration serves the library's settings
    classes (their ``__post_init__``, :func:`check_bounds`), the command line (options that no
    settings class checks: :func:`headcount.cli.commands.bounded`) and the study configs (pydantic:
    ``Field(default, **bound.limits())``).

    >>> EPOCHS.check(3, "epochs")
    3
    >>> EPOCHS.check(float("inf"), "--epochs")
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: --epochs must be in (0, 1000], got inf
    >>> SEED.check(True, "seed")
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: seed must be an integer in 0..4294967295, got True
    """

    low: float
    high: float
    integer: bool = False
    low_open: bool = False
    high_open: bool = False

    def __str__(self) -> str:
        if self.integer:
            return f"an integer in {_num(self.low)}..{_num(self.high)}"
        return (f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}"
                f"{')' if self.high_open else ']'}")

    def contains(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if isinstance(value, numbers.Integral):
            value = int(value)  # exact, however large
        elif self.integer or not math.isfinite(value):
            return False
        low_ok = value > self.low if self.low_open else value >= self.low
        high_ok = value < self.high if self.high_open else value <= self.high
        return low_ok and high_ok

    def check(self, value, name: str, *, optional: bool = False):
        """``value`` when it is in range (or None and ``optional``); else a one-line error naming ``name``."""
        if value is None and optional:
            return value
        if not self.contains(value):
            if self.integer and isinstance(value, numbers.Integral) and not isinstance(value, bool) and value < self.low:
                raise HeadcountError(f"{name} must be at least {_num(self.low)}, got {value}")
            got = repr(value) if isinstance(value, str) else value
            raise HeadcountError(f"{name} must be {self}, got {got}")
        return value

    def limits(self) -> dict:
        """The pydantic ``Field`` constraints of this range (a YAML ``.inf`` or ``.nan`` fails them).

        >>> RATE.limits()
        {'gt': 0, 'lt': 1}
        """
        return {"gt" if self.low_open else "ge": self.low, "lt" if self.high_open else "le": self.high}


#: passes over the training split (a fraction is a part of one)
EPOCHS = Bound(0, 1000, low_open=True)
#: a peak learning rate
LEARNING_RATE = Bound(0, 1, low_open=True)
#: examples per batch (training, evaluation, scoring)
BATCH_SIZE = Bound(1, 65536, integer=True)
#: tokens per example
MAX_LENGTH = Bound(*MAX_LENGTH_RANGE, integer=True)
#: how many examples (a subset's size)
EXAMPLES = Bound(1, 10**9, integer=True)
#: a seed (numpy and torch take 32 bits)
SEED = Bound(0, 2**32 - 1, integer=True)
#: optimizer, checkpoint, logging or fitting steps
STEPS = Bound(1, 10**9, integer=True)
#: a step number that may be 0 (rewinding to step 0: the pre-trained weights)
STEP_NUMBER = Bound(0, 10**9, integer=True)
#: warm-up: a fraction of the steps if < 1, else a number of steps
WARMUP = Bound(0, 10**9)
#: micro-batches per optimizer step
ACCUMULATION = Bound(1, 65536, integer=True)
#: AdamW weight decay
WEIGHT_DECAY = Bound(0, 1)
#: gradient clipping (0: none)
GRAD_NORM = Bound(0, 10**6)
#: pruning rounds (steps) of a magnitude search
ROUNDS = Bound(1, 1000, integer=True)
#: a share of a metric, a level, a fraction that may be 0 or 1
FRACTION = Bound(0, 1)
#: the share of the full model's metric a magnitude step must keep: the command line and the study configs
#: take a FRACTION; the library any finite share (above 1: no step passes)
METRIC_SHARE = Bound(0, 10**6)
#: a fraction pruned per step: strictly between 0 and 1
RATE = Bound(0, 1, low_open=True, high_open=True)
#: bootstrap resamples and permutations (0: none)
RESAMPLES = Bound(0, 10**6, integer=True)
#: random draws (orders, masks) per curve
DRAWS = Bound(0, 1000, integer=True)
#: max |onnxruntime - PyTorch| an export accepts
TOLERANCE = Bound(0, 1, low_open=True)
#: real+padding tokens per forward pass (0: batches as given)
TOKENS_PER_BATCH = Bound(0, 10**8, integer=True)
#: GPUs a study job asks Ray for
GPUS_PER_JOB = Bound(0, 256, low_open=True)
#: the side of an attention map (the pattern CNN's input)
MAP_SIDE = Bound(4, 4096, integer=True)
#: passes of the pattern CNN over its maps
CNN_EPOCHS = Bound(1, 10**4, integer=True)
#: synthetic maps per class
MAPS_PER_CLASS = Bound(1, 10**5, integer=True)

#: the words an error names a field by, where its name is not them
_FIELD_WORDS = {"lr": "learning rate", "rounds": "rounds (max steps)"}


def check_bounds(obj, bounds: Mapping[str, Bound]) -> None:
    """Check the fields of a settings dataclass ``obj`` against ``bounds`` (field -> :class:`Bound`);
    a field whose default is None may be None. The error names the field in words
    (``max_train_examples`` -> "max train examples", ``lr`` -> "learning rate").

    >>> check_bounds(DataConfig(), {"batch_size": BATCH_SIZE, "max_examples": EXAMPLES})
    """
    defaults = {f.name: f.default for f in fields(obj)}
    for name, bound in bounds.items():
        words = _FIELD_WORDS.get(name, name.replace("_", " "))
        bound.check(getattr(obj, name), words, optional=defaults.get(name, MISSING) is None)


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
        method: a registered scorer (:mod:`headcount.importance.scorers`).
        normalize: one of :data:`~headcount.importance.scores.NORMALIZE` (raw scores by default).
        accumulate: how gradients sum over batches (:data:`~headcount.importance.scores.ACCUMULATE`).
        batch_order: the order of the batches importance is computed on
            (:data:`~headcount.importance.scores.BATCH_ORDERS`; ``auto``: the split's order in fixed-size
            batches for ``cumulative``, as the references do; grouped by length otherwise).
        unit: ``heads``, or ``kv-groups``: ``scores.json`` also gets ``kv_groups [L, n_kv]``, each
            group's query heads' scores summed (decoders with grouped-query attention).

    >>> ScoreSettings(method="nonesuch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: unknown method 'nonesuch'; ...
    """

    objective: str = "task"
    method: str = "gradient"
    normalize: str = "none"
    accumulate: str = DEFAULT_ACCUMULATE
    batch_order: str = "auto"
    unit: str = "heads"

    def __post_init__(self):
        check_objective(self.objective)
        check_method(self.method)
        check_normalize(self.normalize)
        check_accumulate(self.accumulate, self.method)
        check_batch_order(self.batch_order)
        check_unit(self.unit)

    @property
    def grouped(self) -> bool:
        """Whether the importance batches are grouped by length (see ``batch_order``)."""
        return groups_by_length(self.batch_order, self.accumulate)


@dataclass(frozen=True)
class PruneSettings:
    """What drives a pruning run (``headcount prune``, the studies' prune jobs); the loop's own
    settings (threshold, step, schedule) are :class:`~headcount.importance.pruning.PruneConfig`.

    Attributes:
        objective: one of :data:`OBJECTIVES`.
        method: importance method, a registered scorer that can drive pruning (:func:`prune_methods`).
        normalize: Prasanna et al.'s layer-wise then global normalisation by default.
        accumulate: as :class:`ScoreSettings`.
        batch_order: as :class:`ScoreSettings` (the importance batches; the stop rule's batches
            are grouped by length: a metric does not depend on their order).
        importance_split: where importance is computed (None: the task's train split).
        stop_split: where the stop rule's metric is computed (None: the validation split).
    """

    objective: str = "task"
    method: str = "gradient"
    normalize: str = "layer+global"
    accumulate: str = DEFAULT_ACCUMULATE
    batch_order: str = "auto"
    importance_split: str | None = None
    stop_split: str | None = None

    def __post_init__(self):
        check_objective(self.objective)
        if not get_scorer(check_method(self.method)).can_prune:
            raise HeadcountError(f"method {self.method!r} cannot drive pruning; use {', '.join(prune_methods())}")
        check_normalize(self.normalize)
        check_accumulate(self.accumulate, self.method)
        check_batch_order(self.batch_order)

    @property
    def grouped(self) -> bool:
        """Whether the importance batches are grouped by length (see ``batch_order``)."""
        return groups_by_length(self.batch_order, self.accumulate)


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


