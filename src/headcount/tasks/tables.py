"""Reading local data files (csv, tsv, jsonl, parquet) into columns, with one-line errors.

A :class:`Table` is plain columns (``dict[str, list]``) plus where they came from, so that the
code that turns rows into examples (:meth:`headcount.tasks.base.Task.load`) is the same for local
files, the Hugging Face hub and the offline data.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import HeadcountError

#: file suffixes a task can read, in the order a folder is searched
SUFFIXES = (".parquet", ".jsonl", ".csv", ".tsv")


@dataclass
class Table:
    """Columns of one split.

    Attributes:
        columns: column name -> values (one per row, all columns the same length).
        where: a short description for error messages (a file path, a hub id).
        label_names: class names when the source declares them (a ``datasets`` ClassLabel).
    """

    columns: dict[str, list]
    where: str
    label_names: tuple[str, ...] | None = None
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


def read_text(path: str | os.PathLike) -> str:
    """Read a UTF-8 text file; a one-line :class:`HeadcountError` when that is impossible.

    >>> read_text(__file__).startswith("Reading", 3)
    True
    """
    p = Path(path)
    if not p.exists():
        raise HeadcountError(f"file not found: {p}")
    if not p.is_file():
        raise HeadcountError(f"not a file: {p}")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise HeadcountError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeadcountError(
            f"{p} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); re-save it as UTF-8"
        ) from None
    return text[1:] if text.startswith("\ufeff") else text  # drop a byte-order mark


def read_table(path: str | os.PathLike) -> Table:
    """Read a ``.csv``, ``.tsv``, ``.jsonl`` or ``.parquet`` file into columns.

    CSV/TSV cells are read as strings exactly as written (no ``NA`` guessing); numbers are
    converted later where a number is expected.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.csv"; _ = p.write_text("text,label\\nhi,1\\n")
    >>> read_table(p).columns
    {'text': ['hi'], 'label': ['1']}
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise HeadcountError(f"unsupported file type {p.suffix or '(none)'!r} for {p}; use one of {', '.join(SUFFIXES)}")
    if suffix == ".parquet":
        return _read_parquet(p)
    text = read_text(p)
    if suffix == ".jsonl":
        return _read_jsonl(p, text)
    return _read_delimited(p, text, "\t" if suffix == ".tsv" else ",")


def _read_delimited(p: Path, text: str, sep: str) -> Table:
    import pandas as pd

    if not text.strip():
        return Table({}, str(p))
    try:
        df = pd.read_csv(io.StringIO(text), sep=sep, dtype=str, keep_default_na=False, na_filter=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as e:
        raise HeadcountError(f"cannot read {p}: {str(e).splitlines()[0]}") from None
    return Table({str(c): df[c].tolist() for c in df.columns}, str(p))


def _read_jsonl(p: Path, text: str) -> Table:
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise HeadcountError(f"{p}, line {lineno}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise HeadcountError(f"{p}, line {lineno}: each line must be a JSON object, got {type(row).__name__}")
        rows.append(row)
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    return Table({n: [row.get(n) for row in rows] for n in names}, str(p))


def _read_parquet(p: Path) -> Table:
    if not p.is_file():
        raise HeadcountError(f"file not found: {p}" if not p.exists() else f"not a file: {p}")
    try:
        table = pq.read_table(p)
    except (pa.ArrowException, OSError) as e:
        raise HeadcountError(f"cannot read {p}: {str(e).splitlines()[0]}") from None
    return Table(table.to_pydict(), str(p))
