"""Reading a JSON file headcount needs, or refusing it in one line that names the file.

Where a file is optional or a best guess (a checkpoint's extra config, a Trainer's history),
readers return None instead and stay with their callers; this is the reader for files whose absence
or corruption stops the command. Every reader of a user's JSON (scores, budgets, masks, records,
manifests, jsonl rows) parses with [`parse_json`][headcount.runtime.jsonfile.parse_json], which
refuses what Python's ``json`` would turn into an OverflowError or a RecursionError later:

- an integer of more than 20 digits, longer than any 64-bit integer (``1e400`` written as 401
  digits: ``float()`` of it overflows; past 4,300 digits Python refuses to convert it at all).
  Every count, seed, size and index headcount writes fits in 64 bits; a large number written as a
  float (``1e30``) reads as one;
- nesting deeper than ``MAX_DEPTH`` (headcount's own files nest a few levels deep; 5,000 deep exhausts
  the parser's recursion).

NaN and Infinity read as Python writes them (scores hold NaN for heads that have none); the
readers of budgets and masks refuse them where a number must be whole or 0/1.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from pathlib import Path

from headcount.runtime.errors import HeadcountError

#: the most digits a JSON integer may have (a 64-bit integer has at most 20); longer ones are refused unconverted
MAX_INT_DIGITS = 20
#: how deep objects and arrays may nest (a file nested deeper is refused)
MAX_DEPTH = 100
#: a run of digits longer than any allowed integer: only a text holding one is parsed with the
#: (slower, per-integer) ``parse_int`` hook, which tells an integer from digits inside a string
_LONG_DIGITS = re.compile("[0-9]{%d}" % (MAX_INT_DIGITS + 1))
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a JSON string, escapes included
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class _TooLong(Exception):
    def __init__(self, digits: int):
        self.digits = digits


def _int(text: str) -> int:
    """``parse_int`` hook: the integer, if it has at most ``MAX_INT_DIGITS`` digits (counted before converting)."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise _TooLong(digits)
    return int(text)


def _too_deep(text: str) -> bool:
    """Whether ``text``'s objects and arrays nest deeper than ``MAX_DEPTH``, read from its brackets
    outside strings (exact for valid JSON; measured before parsing, which recurses once per level)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if len(brackets) <= MAX_DEPTH:
        return False
    return max(accumulate(1 if c in "[{" else -1 for c in brackets)) > MAX_DEPTH


def parse_json(text: str | bytes, name: str = "", *, object_pairs_hook=None):
    """``json.loads(text)``, refusing integers of more than ``MAX_INT_DIGITS`` digits and nesting deeper than
    ``MAX_DEPTH`` in one line (HeadcountError) that names ``name`` (the file, in words);
    malformed JSON raises ``json.JSONDecodeError`` (a ValueError) as ``json.loads`` does, for the
    caller to word.

    >>> parse_json('{"seed": 7, "score": NaN}')
    {'seed': 7, 'score': nan}
    >>> parse_json('[' + '1' * 400 + ']', "scores file s.json")
    Traceback (most recent call last):
    headcount.runtime.errors.HeadcountError: scores file s.json holds an integer of 400 digits; headcount reads integers of at most 20 digits (64 bits; a large number is written as a float: 1e30)
    """
    where = name or "the JSON text"
    deep = (f"{where} is nested more than {MAX_DEPTH} deep (objects and arrays inside each other): not a file "
            "headcount reads")
    try:
        if isinstance(text, (bytes, bytearray)):  # as json.loads reads bytes: UTF-8, -16 or -32
            text = bytes(text).decode(json.detect_encoding(text), "surrogatepass")
        if _too_deep(text):
            raise HeadcountError(deep)
        hook = _int if _LONG_DIGITS.search(text) else None  # no long run of digits: no integer to refuse
        data = json.loads(text, parse_int=hook, object_pairs_hook=object_pairs_hook)
    except _TooLong as e:
        raise HeadcountError(f"{where} holds an integer of {e.digits} digits; headcount reads integers of at most "
                             f"{MAX_INT_DIGITS} digits (64 bits; a large number is written as a float: 1e30)") from None
    except RecursionError:  # a safety net: the brackets are counted first, the parser recurses once per level
        raise HeadcountError(deep) from None
    return data


def read_json(path: Path, what: str = "", *, kind: type | None = None, fix: str = ""):
    """The JSON of ``path`` ([`parse_json`][headcount.runtime.jsonfile.parse_json]), or one line
    (HeadcountError) that names it.

    Args:
        path: the file.
        what: what the file is, in words, put before its path in the line (``"scores file"``).
        kind: the JSON type the file must hold (``dict``, ``list``), or None for any.
        fix: what to do about an unreadable or corrupt file, appended to that line.

    >>> read_json("/nonexistent/scores.json", "scores file")
    Traceback (most recent call last):
    headcount.runtime.errors.HeadcountError: scores file /nonexistent/scores.json is missing
    """
    name = f"{what} {path}" if what else str(path)
    try:
        data = parse_json(Path(path).read_text(encoding="utf-8"), name)
    except FileNotFoundError:
        raise HeadcountError(f"{name} is missing") from None
    except (OSError, ValueError) as e:  # ValueError: bad JSON and bad UTF-8 (UnicodeDecodeError) alike
        raise HeadcountError(f"{name} is unreadable or corrupt ({type(e).__name__})" + (f"; {fix}" if fix else "")) from None
    if kind is not None and not isinstance(data, kind):
        raise HeadcountError(f"{name} is corrupt (a JSON {kind.__name__} was expected)")
    return data
