"""Cells of the studies' main tables: a mean over seeds that says when some seeds gave no number.

A result that is NaN (a control drawn empty, a constant prediction, a constant score grid) drops
out of a mean over seeds, and the cell would show the other seeds' value as if it were the
whole story. [`seed_cell`][headcount.experiments.report.format.seed_cell] writes ``0.345 (n=1 of 2)`` then, and [`nan_runs`][headcount.experiments.report.format.nan_runs] lists the
runs behind such gaps, with the reason where one is known, for the report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

_NUMERIC = re.compile(r"^\s*([-+]?(\d|\.\d)|n/a\b)")

__all__ = ["display_cell", "display_frame", "finite", "looks_numeric", "nan_runs", "seed_cell"]


def finite(x) -> bool:
    """Whether ``x`` is a finite number (None, NaN, inf and non-numbers are not).

    >>> finite(0.3), finite(None), finite(float("nan")), finite("0.3")
    (True, False, False, False)
    """
    if x is None or isinstance(x, (str, bytes, bool)):
        return False
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def seed_cell(mean, std=None, low=None, high=None, *, n=None, n_total=None, digits: int = 2) -> str:
    """``mean ± std [low, high]`` over seeds, with ``(n=k of m)`` when only k of m seeds gave a number.

    Args:
        mean: the mean over the seeds with a finite value.
        std: their sample standard deviation (left out when not finite, e.g. one seed).
        low: lower bound of an interval (both bounds needed).
        high: upper bound.
        n: how many seeds gave a finite value.
        n_total: how many seeds there were (runs that finished, NaN or not).
        digits: decimals.

    Returns:
        The cell text; ``n/a (n=0 of m)`` when no seed gave a number, blank when there was
        nothing to average at all.

    >>> seed_cell(0.345, float("nan"), n=1, n_total=2, digits=3)
    '0.345 (n=1 of 2)'
    >>> seed_cell(0.3141, 0.02, 0.2, 0.4, n=2, n_total=2), seed_cell(float("nan"), n=0, n_total=2), seed_cell(None)
    ('0.31 ± 0.02 [0.20, 0.40]', 'n/a (n=0 of 2)', '')
    """
    short = finite(n) and finite(n_total) and int(n) < int(n_total)
    if not finite(mean):
        return f"n/a (n=0 of {int(n_total)})" if finite(n_total) and int(n_total) > 0 else ""
    out = f"{float(mean):.{digits}f}"
    if finite(std):
        out += f" ± {float(std):.{digits}f}"
    if finite(low) and finite(high):
        out += f" [{float(low):.{digits}f}, {float(high):.{digits}f}]"
    if short:
        out += f" (n={int(n)} of {int(n_total)})"
    return out


def display_cell(x) -> str:
    """A table cell as the report shows it (HTML and terminal alike): missing values blank.

    None, NaN and pandas' NA/NaT are blank (never ``None``/``nan``); floats to 4 significant
    digits; everything else ``str``.

    >>> [display_cell(x) for x in (None, float("nan"), 0.123456, 3, "0.31 ± 0.02", True)]
    ['', '', '0.1235', '3', '0.31 ± 0.02', 'True']
    """
    if x is None or isinstance(x, str):
        return x or ""
    try:
        import pandas as pd  # lazy: pandas costs ~0.2 s to import, and headcount --help loads this module

        if pd.api.types.is_scalar(x) and pd.isna(x):
            return ""
    except (TypeError, ValueError):
        pass
    if isinstance(x, float) or type(x).__name__.startswith("float"):
        return f"{float(x):.4g}"
    return str(x)


def looks_numeric(text: str) -> bool:
    """Whether a cell's text is a number (``0.31 ± 0.02 [...]``, ``40%``, ``n/a (n=0 of 2)``): set
    right-aligned, unlike labels.

    >>> [looks_numeric(t) for t in ("0.31 ± 0.02", "-1e-3", "40%", "n/a (n=0 of 2)", "glue/rte", "")]
    [True, True, True, True, False, False]
    """
    return bool(_NUMERIC.match(text))


def display_frame(df):
    """The DataFrame with every cell as [`display_cell`][headcount.experiments.report.format.display_cell] text (same columns and index).

    >>> import pandas as pd
    >>> display_frame(pd.DataFrame({"a": [1.0, None], "b": ["x", None]})).values.tolist()
    [['1', 'x'], ['', '']]
    """
    return df.astype(object).apply(lambda col: col.map(display_cell))


def nan_runs(rows: Iterable[Mapping], value: str, keys: Sequence[str], why=None) -> list[dict]:
    """The rows whose ``value`` is not a finite number: ``keys`` of each, and why (when known).

    Args:
        rows: records (dicts, or a DataFrame's ``to_dict("records")``).
        value: the column that should hold a number.
        keys: the columns that name the run (task, seed, experiment, ...).
        why: optional ``f(row) -> str``: the reason for one row ("" when unknown).

    Returns:
        ``[{key: ..., "value": value, "why": ...}]`` (``why`` only with ``why``).

    >>> nan_runs([{"task": "t", "seed": 1, "score": 0.5}, {"task": "t", "seed": 2, "score": float("nan")}],
    ...          "score", ["task", "seed"], why=lambda r: "constant prediction")
    [{'task': 't', 'seed': 2, 'value': 'score', 'why': 'constant prediction'}]
    """
    out = []
    for r in rows:
        if not finite(r.get(value)):
            item = {k: r.get(k) for k in keys}
            item["value"] = value
            if why is not None:
                item["why"] = why(r) or ""
            out.append(item)
    return out
