"""Each scorer's own options, declared once: a frozen dataclass per scorer whose fields carry their
default, their range ([`Bound`][headcount.runtime.bounds.Bound]) or their choices, and one line of help.

A scorer names its options class when it is registered (``Scorer(..., options=RetrievalOptions)``,
[`headcount.importance.scorers`][headcount.importance.scorers]) and is handed one built from it
(``ctx.options``). The same declaration gives ``headcount score``'s flags and their help
([`headcount.cli.commands.options`][headcount.cli.commands.options]), the options of
[`ScoreSettings`][headcount.importance.settings.ScoreSettings] and the retrieval study's
``scoring:`` section. This module imports neither torch nor the scorers (only the bounds and the
needle-in-a-haystack rule names): the command line declares its options from it, and the study
configs read it, without loading what the scorers compute with.

>>> RetrievalOptions(max_new_tokens=0)
Traceback (most recent call last):
...
headcount.runtime.errors.HeadcountError: --max-new-tokens must be at least 1, got 0
>>> LongRangeOptions(kv_reduce="median")
Traceback (most recent call last):
...
headcount.runtime.errors.HeadcountError: --kv-reduce must be one of max, mean, not 'median'
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields

from headcount.data.tasks.niah_examples import ROUGE_RULES
from headcount.runtime.bounds import Bound
from headcount.runtime.errors import HeadcountError


def option(default, check: Bound | tuple[str, ...], help: str = ""):
    """A field of a scorer's options class: its ``default``, what it may be (``check``: a
    [`Bound`][headcount.runtime.bounds.Bound], or the tuple of its choices) and its ``--help`` line."""
    return field(default=default, metadata={"check": check, "help": help})


def flag(name: str) -> str:
    """The command-line flag of option ``name`` (``kv_reduce`` -> ``--kv-reduce``)."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class ScorerOptions:
    """A scorer's options (a scorer without options is handed this: no fields). A subclass declares
    each of its fields with [`option`][headcount.importance.scorer_options.option]; building one checks
    every field and names the flag that sets it in the one error line."""

    def __post_init__(self):
        for f in fields(self):
            check, value = f.metadata.get("check"), getattr(self, f.name)
            if isinstance(check, Bound):
                check.check(value, flag(f.name))
            elif check is not None and value not in check:
                raise HeadcountError(f"{flag(f.name)} must be one of {', '.join(check)}, not {value!r}")


def declared(cls: type[ScorerOptions]) -> dict[str, tuple[type, object, Bound | tuple | None, str]]:
    """``{name: (type, default, check, help)}`` of an options class, in its order (the flags, the
    study config's fields).

    >>> declared(LongRangeOptions)["sink"][:2]
    (<class 'int'>, 4)
    """
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.default, f.metadata.get("check"), f.metadata.get("help", "")) for f in fields(cls)}


#: ``rouge1``: ROUGE-1 recall of the answer > 0.5 (the reference); ``exact``: the answer verbatim
SUCCESS_RULES = ("rouge1", "exact")
#: ``reference``: every copy of a needle token adds ``1 / span`` (scores can exceed 1 when the model
#: repeats the needle); ``once``: each needle position counts once per head and example (at most 1)
COPY_RULES = ("reference", "once")
#: where decoding stops: ``newline`` (after a token holding a line break: the reference's rule, which
#: decodes on after an end-of-sequence token) or ``eos-or-newline`` (also after end-of-sequence)
STOP_RULES = ("newline", "eos-or-newline")
#: greedy decoding lengths (the retrieval score's, and the held-out needles' of the retrieval study)
MAX_NEW_TOKENS_RANGE = Bound(1, 100_000, integer=True)
#: ``long-range``: the first tokens every query may read (StreamingLLM's attention sinks), the recent window
SINK_RANGE, WINDOW_RANGE = Bound(0, 10**7, integer=True), Bound(1, 10**7, integer=True)
#: how a KV head's score comes from its query heads'
KV_REDUCE = ("max", "mean")


@dataclass(frozen=True)
class RetrievalOptions(ScorerOptions):
    """``retrieval``'s options ([`headcount.importance.retrieval`][headcount.importance.retrieval]).

    Attributes:
        max_new_tokens: greedy decoding length (the reference's 50).
        success: which examples count: ``rouge1`` (ROUGE-1 recall of the answer > 0.5, the
            reference) or ``exact`` (the answer verbatim).
        stop: ``newline`` (decoding stops after a line-break token only: the reference) or
            ``eos-or-newline`` (also after an end-of-sequence token).
        rouge: ``porter`` (ROUGE-1 with rouge_score's Porter stemmer: the reference) or ``plain``
            (without the stemmer).
        copies: ``reference`` (every copy of a needle token adds 1/span: scores can exceed 1 when
            the model repeats the needle) or ``once`` (each needle position once).

    (In the order of the retrieval study's ``scoring:`` section and of ``headcount score --help``.)
    """

    max_new_tokens: int = option(50, MAX_NEW_TOKENS_RANGE, "greedy decoding length (the reference's)")
    success: str = option(SUCCESS_RULES[0], SUCCESS_RULES,
                          "which examples count: rouge1 (ROUGE-1 recall of the answer > 0.5, the reference) | "
                          "exact (the answer verbatim)")
    stop: str = option(STOP_RULES[0], STOP_RULES,
                       "where decoding stops: newline (after a line-break token only, the reference) | eos-or-newline "
                       "(also after end-of-sequence)")
    rouge: str = option(ROUGE_RULES[1], ROUGE_RULES,
                        "the ROUGE-1 of success rouge1: porter (rouge_score with its Porter stemmer, the reference) | "
                        "plain (no stemmer)")
    copies: str = option(COPY_RULES[0], COPY_RULES,
                         "reference (every copy of a needle token adds 1/span; a head that copies a repeated needle "
                         "scores above 1) | once (each needle position once: at most 1)")


@dataclass(frozen=True)
class LongRangeOptions(ScorerOptions):
    """``long-range``'s options ([`headcount.importance.retrieval`][headcount.importance.retrieval]).

    Attributes:
        sink: the first tokens every query reads "nearby" (StreamingLLM's attention sinks).
        window: the last keys every query reads "nearby" (itself included).
        kv_reduce: a KV head's score from its query heads' (``max`` or ``mean``).
    """

    sink: int = option(4, SINK_RANGE, "the first tokens every query reads nearby")
    window: int = option(64, WINDOW_RANGE, "the last keys every query reads nearby")
    kv_reduce: str = option(KV_REDUCE[0], KV_REDUCE, "a KV head's score from its query heads': max | mean")


__all__ = ["COPY_RULES", "KV_REDUCE", "MAX_NEW_TOKENS_RANGE", "SINK_RANGE", "STOP_RULES", "SUCCESS_RULES", "WINDOW_RANGE",
           "LongRangeOptions", "RetrievalOptions", "ScorerOptions", "declared", "flag", "option"]
