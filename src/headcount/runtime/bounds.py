"""The sane range of a numeric setting ([`Bound`][headcount.runtime.bounds.Bound]), and the ranges that several layers share.

A range that one concern owns is declared beside it: training's in [`headcount.train.config`][headcount.train.config]
and [`headcount.train.magnitude_search`][headcount.train.magnitude_search], the pattern CNN's in [`headcount.analysis.patterns`][headcount.analysis.patterns],
the export tolerance in [`headcount.core.export`][headcount.core.export], the Ray executor's GPUs per job in
[`headcount.experiments.runner.ray_executor`][headcount.experiments.runner.ray_executor]. What stays here is generic: sizes of data and
batches, seeds, steps, learning rates, fractions, resamples and token budgets, which the
importance settings, training, the pattern CNN, the study configs and the command line all use.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields

from headcount.runtime.errors import HeadcountError


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


@dataclass(frozen=True)
class Bound:
    """The sane range of a numeric setting: a finite number (never a bool) from ``low`` to ``high``,
    an end open where said; ``integer``: an int. One declaration serves the library's settings
    classes (their ``__post_init__``, [`check_bounds`][headcount.runtime.bounds.check_bounds]), the command line (options that no
    settings class checks: [`headcount.cli.commands.bounded`][headcount.cli.commands.bounded]) and the study configs (pydantic:
    ``Field(default, **bound.limits())``).

    >>> LEARNING_RATE.check(0.5, "lr")
    0.5
    >>> LEARNING_RATE.check(float("inf"), "--lr")
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: --lr must be in (0, 1], got inf
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

        >>> Bound(0, 1, low_open=True, high_open=True).limits()
        {'gt': 0, 'lt': 1}
        """
        return {"gt" if self.low_open else "ge": self.low, "lt" if self.high_open else "le": self.high}


#: the words an error names a field by, where its name is not them
_FIELD_WORDS = {"lr": "learning rate", "rounds": "rounds (max steps)"}


def check_bounds(obj, bounds: Mapping[str, Bound]) -> None:
    """Check the fields of a settings dataclass ``obj`` against ``bounds`` (field -> [`Bound`][headcount.runtime.bounds.Bound]);
    a field whose default is None may be None. The error names the field in words
    (``max_train_examples`` -> "max train examples", ``lr`` -> "learning rate").
    """
    defaults = {f.name: f.default for f in fields(obj)}
    for name, bound in bounds.items():
        words = _FIELD_WORDS.get(name, name.replace("_", " "))
        bound.check(getattr(obj, name), words, optional=defaults.get(name, MISSING) is None)


#: the bounds of a tokenised example's length
MAX_LENGTH_RANGE = (8, 8192)

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
#: a share of a metric, a level, a fraction that may be 0 or 1
FRACTION = Bound(0, 1)
#: bootstrap resamples and permutations (0: none)
RESAMPLES = Bound(0, 10**6, integer=True)
#: random draws (orders, masks) per curve
DRAWS = Bound(0, 1000, integer=True)
#: real+padding tokens per forward pass (0: batches as given)
TOKENS_PER_BATCH = Bound(0, 10**8, integer=True)
