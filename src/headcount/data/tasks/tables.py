"""Reading local data files (csv, tsv, jsonl, parquet) into columns, with one-line errors.

A [`Table`][headcount.data.tasks.tables.Table] is plain columns (``dict[str, list]``) plus where they came from, so that the
code that turns rows into examples ([`headcount.data.tasks.base.Task.load`][headcount.data.tasks.base.Task.load]) is the same for local
files, the Hugging Face hub and the offline data.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import parse_json

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
    """Read a UTF-8 text file; a one-line [`HeadcountError`][headcount.runtime.errors.HeadcountError] when that is impossible.

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
    converted later where a number is expected. A ``.tsv`` is plain tab-separated text (quotes are
    text, [`read_tsv`][headcount.data.tasks.tables.read_tsv]), a ``.csv`` is CSV (quoted fields may span lines). Every row is read
    or the file is refused: a row with the wrong number of fields, a quote never closed, and a
    count of rows that does not match the file's lines (or a parquet file's metadata).

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
    if sep == "\t":
        header, rows = read_tsv(p, text)
    else:
        header, rows = _read_csv(p, text)
    return Table({name: [row[i] for row in rows] for i, name in enumerate(header)}, str(p))


#: a line ends at ``\r\n``, ``\r`` or ``\n`` (as Python's csv module and GLUE's own loaders read files)
_LINE_END = re.compile(r"\r\n|\r|\n")
TSV_HINT = ("a .tsv is read as plain tab-separated text: every tab separates fields and quotes are part "
            "of the text, so a text may hold neither a tab nor a line break")
CSV_HINT = 'a text with a comma, a quote or a line break is quoted ("a, b"), a quote inside it doubled ("")'


def text_lines(text: str) -> list[str]:
    """The physical lines of ``text``; a final line end starts no further line.

    >>> text_lines('a\\tb\\r\\n"c\\r\\n\\n')
    ['a\\tb', '"c', '']
    """
    lines = _LINE_END.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _blank(line: str, sep: str | None = None) -> bool:
    """A line skipped as blank: only spaces, and no field separator (``\\t`` alone is two empty fields)."""
    return not line.strip() and (sep is None or sep not in line)


def _column_names(p: Path, cells: list[str]) -> tuple[str, ...]:
    names = tuple(c if c else f"Unnamed: {i}" for i, c in enumerate(cells))  # pandas' name for an empty one
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise HeadcountError(f"{p}: the header names the column {name!r} twice; give every column its own name")
        seen.add(name)
    return names


def _width_error(p: Path, lineno: int, got: int, header: tuple[str, ...], header_line: bool, hint: str,
                 span: str = "") -> str:
    has = "the header has" if header_line else "expected"
    return f"{p}, line {lineno}: {got} fields, {has} {len(header)} ({', '.join(header)}){span}; {hint}"


def _check_count(p: Path, rows: int, lines: int, what: str, cause: str) -> None:
    """The last guard against a lost or merged row: the rows read must match the file's own count."""
    if rows != lines:
        raise HeadcountError(f"{p}: read {rows} rows but the file has {lines} {what}; {cause}. "
                             "Refusing rather than losing or merging rows")


def read_tsv(path: str | os.PathLike, text: str | None = None,
             header: tuple[str, ...] | None = None) -> tuple[tuple[str, ...], list[list[str]]]:
    """The column names and rows of a ``.tsv`` file: one row a line, fields split at every tab.

    Quotes are text (``a "quoted word`` is read as written; a ``.tsv`` is not CSV-quoted, as in
    the GLUE download); ``NA``, ``null`` and empty fields stay the strings they are. Line ends may
    be ``\\n``, ``\\r\\n`` or ``\\r``; blank lines are skipped. ``header``: the column names of a
    file without a header line (every line is then a row).

    Raises:
        HeadcountError: unreadable or non-UTF-8 file; a line with another number of fields than
            the header (with its line number); a header naming a column twice.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.tsv"; _ = p.write_text('text\\tlabel\\na "b\\tNA\\n')
    >>> read_tsv(p)
    (('text', 'label'), [['a "b', 'NA']])
    """
    p = Path(path)
    lines = text_lines(read_text(p) if text is None else text)
    numbered = [(i, line) for i, line in enumerate(lines, 1) if not _blank(line, "\t")]
    header_line = header is None
    if header_line:
        if not numbered:
            return (), []
        header = _column_names(p, numbered[0][1].split("\t"))
        numbered = numbered[1:]
    rows = []
    for lineno, line in numbered:
        fields = line.split("\t")
        if len(fields) != len(header):
            raise HeadcountError(_width_error(p, lineno, len(fields), header, header_line, TSV_HINT))
        rows.append(fields)
    # one row a non-blank line, the header aside: counted here apart from the loop above
    _check_count(p, len(rows), sum(not _blank(line, "\t") for line in lines) - header_line,
                 "data lines (non-blank lines after the header)", "a line was skipped or split")
    return tuple(header), rows


def _read_csv(p: Path, text: str) -> tuple[tuple[str, ...], list[list[str]]]:
    """CSV as Python's csv module reads it (``,``, ``"`` quotes, ``""`` a quote inside them), strictly.

    A quoted field may hold line breaks: that is CSV, so a record may span several lines. What
    cannot be told apart from such a text is a quote that opens a field by mistake and closes
    lines later right before a comma; every other stray quote is refused: one that is never
    closed (it would swallow the rest of the file), one followed by more text (strict mode), and
    a record whose fields do not match the header (the usual result of a swallowed line). The
    count check compares the rows with the non-blank lines after the header less the lines that
    continue a multi-line record, both counted from this module's own split of the lines, so
    the csv module and it must agree about every line.
    """
    lines = text_lines(text)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: tuple[str, ...] | None = None
    header_end = 0
    rows: list[list[str]] = []
    continued = 0
    before = 0  # lines consumed before the current record
    limit = csv.field_size_limit()
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # a long text is no error; an unclosed quote is found below
    try:
        for record in reader:
            after = reader.line_num
            first = lines[before] if before < len(lines) else ""
            if after - before == 1 and _blank(first, ","):
                before = after
                continue
            if header is None:
                header, header_end = _column_names(p, record), after
            elif len(record) != len(header):
                span = (f", in one record from line {before + 1} to line {after} (a quote that opens a field "
                        "runs over the line breaks)" if after - before > 1 else "")
                raise HeadcountError(_width_error(p, before + 1, len(record), header, True, CSV_HINT, span))
            else:
                rows.append(record)
                continued += sum(not _blank(line, ",") for line in lines[before + 1:after])
            before = after
    except csv.Error as e:
        if reader.line_num >= len(lines) and "end of data" in str(e):
            raise HeadcountError(
                f"{p}, line {before + 1}: a quote opens a field and is never closed (the rest of the file, "
                f"{len(lines) - before} lines, would be one text); {CSV_HINT}") from None
        raise HeadcountError(f"{p}, line {reader.line_num}: not valid CSV ({e}); {CSV_HINT}") from None
    finally:
        csv.field_size_limit(limit)
    if header is None:
        return (), []
    _check_count(p, len(rows), sum(not _blank(line, ",") for line in lines[header_end:]) - continued,
                 "records (non-blank lines after the header, less those continuing a quoted field)",
                 "the csv reader and the line count disagree about where a line ends")
    return header, rows


def _read_jsonl(p: Path, text: str) -> Table:
    rows = []
    lines = text_lines(text)  # not str.splitlines: a JSON string may hold U+2028 and the like
    for lineno, line in enumerate(lines, 1):
        if _blank(line):
            continue
        try:
            row = parse_json(line, f"{p}, line {lineno}", object_pairs_hook=_no_twice)  # huge integers, deep nesting
        except json.JSONDecodeError as e:
            raise HeadcountError(f"{p}, line {lineno}: not JSON ({e.msg})") from None
        except _Twice as e:
            raise HeadcountError(f"{p}, line {lineno}: the key {e.args[0]!r} appears twice in one object "
                                 "(which value is meant?)") from None
        if not isinstance(row, dict):
            raise HeadcountError(f"{p}, line {lineno}: each line must be a JSON object, got {type(row).__name__}")
        bad = _lone_surrogate(row)
        if bad is not None:
            raise HeadcountError(f"{p}, line {lineno}: {bad} holds a lone surrogate ({_escaped(bad, row)}), "
                                 "which is not text (a \\ud800-\\udfff escape must come in a valid pair)")
        rows.append(row)
    _check_count(p, len(rows), sum(not _blank(line) for line in lines), "non-blank lines",
                 "every non-blank line must be one JSON object")
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    return Table({n: [row.get(n) for row in rows] for n in names}, str(p))


class _Twice(Exception):
    pass


def _no_twice(pairs: list) -> dict:
    """A JSON object's ``object_pairs_hook``: a key given twice is an error, not the last one kept."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Twice(key)
        out[key] = value
    return out


def _lone_surrogate(value, where: str = "the row"):
    """Where ``value`` (a parsed JSON row) holds a string with a lone UTF-16 surrogate (JSON's
    ``"\\ud800"`` parses, but no tokenizer can encode it), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _lone_surrogate(key) is not None:
            return f"a key of {where}"
        found = _lone_surrogate(item, f"field {key!r}" if where == "the row" else f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def _escaped(where: str, row: dict) -> str:
    """The first lone surrogate of ``row``, written as its JSON escape."""
    text = json.dumps(row)
    found = re.search(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}", text)
    return found.group(0) if found else "?"


def _read_parquet(p: Path) -> Table:
    if not p.is_file():
        raise HeadcountError(f"file not found: {p}" if not p.exists() else f"not a file: {p}")
    try:
        table = pq.read_table(p)
        expected = pq.ParquetFile(p).metadata.num_rows
    except (pa.ArrowException, OSError) as e:
        raise HeadcountError(f"cannot read {p}: {str(e).splitlines()[0]}") from None
    _check_count(p, table.num_rows, expected, "rows by its metadata", "the file is damaged or was written in part")
    return Table(table.to_pydict(), str(p))
