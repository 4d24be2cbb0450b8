"""Local GLUE folders in either layout: the hub's, or the original GLUE download's.

*Hub layout*: ``<split>.parquet|jsonl|csv|tsv`` with the columns of ``nyu-mll/glue``
(``train``, ``validation``, ``test``; for MNLI ``validation_matched``, ``validation_mismatched``,
``test_matched``, ``test_mismatched``).

*Download layout* (``download_glue_data.py``, folders ``CoLA``, ``SST-2``, ...): ``train.tsv``,
``dev.tsv``, ``test.tsv`` (MNLI: ``dev_matched.tsv``, ``dev_mismatched.tsv``,
``test_matched.tsv``, ``test_mismatched.tsv``), each task with its own columns (CoLA's labelled
files have no header). Those files are read as GLUE's own loaders read them: fields split at tabs,
quotes kept as text (the files are not CSV-quoted); their columns are renamed to the hub's and
their labels (``entailment``, ``1``, ``4.250``) mapped to the hub's label order by name or id.

A ``.tsv`` is taken for a download file by its first line ([`download_header`][headcount.data.tasks.glue_local.download_header]), so both
layouts may also be mixed, or named one by one with ``data_files``. A folder must hold the
split the task is evaluated on; nothing falls back to another split.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from headcount.data.tasks.base import FilesSource
from headcount.data.tasks.tables import SUFFIXES, Table, read_table, read_tsv
from headcount.runtime.errors import HeadcountError

#: file stem in the GLUE download -> the hub's split name
DOWNLOAD_NAMES = {"train": "train", "dev": "validation", "test": "test",
                  "dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched",
                  "test_matched": "test_matched", "test_mismatched": "test_mismatched"}

#: the folder of each task in the GLUE download (``$HEADCOUNT_GLUE_DIR`` accepts either name)
DOWNLOAD_FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B",
                    "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


@dataclass(frozen=True)
class DownloadFormat:
    """The columns of one task's TSV files in the GLUE download.

    Attributes:
        text: the text columns, in the order of the hub's text fields.
        label: the label column (absent from test files).
        no_header: column names of labelled files that have no header line (CoLA), else ().
    """

    text: tuple[str, ...]
    label: str
    no_header: tuple[str, ...] = ()


#: as written by GLUE's download_glue_data.py (test files: an ``index`` column, no label)
DOWNLOAD_FORMATS = {
    # labelled: source, label 0/1, the author's judgement mark, sentence; test: index, sentence
    "cola": DownloadFormat(("sentence",), "label", no_header=("source", "label", "judgement", "sentence")),
    "sst2": DownloadFormat(("sentence",), "label"),                       # sentence, label
    "mrpc": DownloadFormat(("#1 String", "#2 String"), "Quality"),        # Quality, #1 ID, #2 ID, #1 String, #2 String
    "qqp": DownloadFormat(("question1", "question2"), "is_duplicate"),   # id, qid1, qid2, question1, question2, is_duplicate
    "stsb": DownloadFormat(("sentence1", "sentence2"), "score"),         # index, genre, ..., sentence1, sentence2, score
    "mnli": DownloadFormat(("sentence1", "sentence2"), "gold_label"),    # index, ..., sentence1, sentence2, label1, ..., gold_label
    "qnli": DownloadFormat(("question", "sentence"), "label"),           # index, question, sentence, label (names)
    "rte": DownloadFormat(("sentence1", "sentence2"), "label"),          # index, sentence1, sentence2, label (names)
    "wnli": DownloadFormat(("sentence1", "sentence2"), "label"),         # index, sentence1, sentence2, label 0/1
}


def _first_line(path: Path, sep: str = "\t") -> list[str]:
    """The fields of the first non-blank line (split at every tab; CSV-parsed for ``sep=","``)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            for line in f:
                line = line.rstrip("\r\n")
                if line.strip() or sep in line:
                    break
            else:
                return []
    except UnicodeDecodeError:
        return []  # read_table reports it, with the offset
    except OSError as e:
        raise HeadcountError(f"cannot read {path}: {e.strerror or e}") from None
    if sep == "\t":
        return line.split("\t")
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return []  # read_table reports it, with the line


def download_header(path: str | os.PathLike, config: str, hub_text: tuple[str, ...]) -> tuple[str, ...] | None:
    """The column names if ``path`` is a TSV of the GLUE download for ``config``, else None.

    A download file: CoLA's labelled files (no header, 4 fields, a 0/1 label second), or a header
    with an ``index`` / ``id`` column or a column the hub's schema never has (``Quality``,
    ``gold_label``, ``score``...), or exactly the download's text and label columns (SST-2's
    ``sentence, label``: the hub's files carry ``idx`` too).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "dev.tsv"; _ = p.write_text("index\\tquestion\\tsentence\\tlabel\\n")
    >>> download_header(p, "qnli", ("question", "sentence"))
    ('index', 'question', 'sentence', 'label')
    """
    p = Path(path)
    if p.suffix.lower() != ".tsv":
        return None
    fmt = DOWNLOAD_FORMATS[config]
    first = _first_line(p)
    if fmt.no_header and len(first) == len(fmt.no_header) and first[1].strip() in ("0", "1") \
            and not set(hub_text) & set(first):
        return fmt.no_header
    hub_only = set(hub_text) | {"label", "idx"}
    own = (set(fmt.text) | {fmt.label}) - hub_only
    if "idx" not in first and ({"index", "id"} & set(first) or own & set(first)
                               or first == [*fmt.text, fmt.label]):
        return tuple(first)
    return None


def read_download_tsv(path: str | os.PathLike, config: str, hub_text: tuple[str, ...], unlabelled: bool) -> Table:
    """One TSV of the GLUE download as a table in the hub's schema (text fields, ``label``).

    Rows must have as many fields as the header; a test file (``unlabelled``) without a label
    column gets ``-1`` (no label) for every row.
    """
    p = Path(path)
    fmt = DOWNLOAD_FORMATS[config]
    header = download_header(p, config, hub_text)
    if header is None:  # pragma: no cover - callers check first
        raise HeadcountError(f"{p}: not a file of the GLUE download for {config}")
    missing = [c for c in fmt.text if c not in header]
    if missing:
        raise HeadcountError(f"{p}: no column {missing[0]!r} (columns: {', '.join(header)}); "
                             f"the GLUE download's {config} files have {', '.join(fmt.text)} and {fmt.label}")
    has_label = fmt.label in header
    if not has_label and not unlabelled:
        raise HeadcountError(f"{p}: no label column {fmt.label!r} (columns: {', '.join(header)}); "
                             "only test splits may come without labels")
    wanted = [header.index(c) for c in fmt.text] + ([header.index(fmt.label)] if has_label else [])
    headerless = bool(fmt.no_header) and header == fmt.no_header  # CoLA's labelled files
    _, rows = read_tsv(p, header=header if headerless else None)  # every row, or a one-line error
    cols: list[list[str]] = [[row[i] for row in rows] for i in wanted]
    columns = dict(zip(hub_text, cols))
    n = len(cols[0])
    columns["label"] = cols[len(hub_text)] if has_label else [-1] * n
    return Table(columns, str(p))


class GlueFilesSource(FilesSource):
    """Local files of one GLUE task, in the hub's schema or the GLUE download's (per file)."""

    def __init__(self, files, config: str, hub_text: tuple[str, ...]):
        super().__init__(files, unlabelled_prefix="test")
        self.config, self.hub_text = config, tuple(hub_text)

    def read(self, split: str) -> Table:
        p = self.files[split]
        if download_header(p, self.config, self.hub_text) is not None:
            return read_download_tsv(p, self.config, self.hub_text, unlabelled=self.unlabelled(split))
        check_header(p, self.config, self.hub_text)
        return read_table(p)


def check_header(path: str | os.PathLike, config: str, hub_text: tuple[str, ...]) -> None:
    """Refuse a ``.tsv`` / ``.csv`` whose first line names none of the columns of either layout.

    Such a first line is most likely a row of data (a download file without its header line):
    read as a header, it would make every later message about columns wrong.
    """
    p = Path(path)
    if p.suffix.lower() not in (".tsv", ".csv"):
        return
    first = _first_line(p, "\t" if p.suffix.lower() == ".tsv" else ",")
    fmt = DOWNLOAD_FORMATS[config]
    known = {*hub_text, "label", "idx", *fmt.text, fmt.label, "index", "id"}
    if not first or known & {c.strip() for c in first}:
        return
    shown = "\t".join(first)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    folder = DOWNLOAD_FOLDERS[config]
    raise HeadcountError(
        f"{p}: the header line is missing (the first line, {shown!r}, names none of the columns): a "
        f"file of the GLUE download's {folder} folder starts with a tab-separated header naming "
        f"{', '.join(fmt.text)} and {fmt.label} (test files: no label), one in the hub layout "
        f"names {', '.join(hub_text)} and label; add the header line")


#: the original MRPC files (Microsoft's corpus) that GLUE's download script turns into its TSVs
MRPC_RAW = ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt")


def raw_files_hint(data_dir: str | os.PathLike, config: str) -> str:
    """What to do with a folder that holds source files rather than the split files, else ''."""
    d = Path(data_dir).expanduser()
    raw = [n for n in MRPC_RAW if (d / n).is_file()]
    if config != "mrpc" or not raw:
        return ""
    return (f"; {' and '.join(raw)} are MRPC's original files, not the GLUE download's: make train.tsv, dev.tsv "
            f"and test.tsv from them with GLUE's download_glue_data.py --data_dir OUT --tasks MRPC "
            f"--path_to_mrpc {d} (it splits dev.tsv off the train file by GLUE's dev ids), then use OUT/MRPC")


def other_files(data_dir: str | os.PathLike, limit: int = 5) -> str:
    """``(the folder holds: a.txt, b.json)`` for a message, or ``(the folder is empty)``."""
    try:
        names = sorted(e.name for e in Path(data_dir).expanduser().iterdir() if not e.name.startswith("."))
    except OSError:
        return ""
    if not names:
        return " (the folder is empty)"
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return f" (the folder holds: {', '.join(names[:limit])}{more})"


def glue_folder(root: str | os.PathLike, config: str) -> Path:
    """The folder of ``config`` under ``root`` (``$HEADCOUNT_GLUE_DIR``): ``root/sst2`` or ``root/SST-2``."""
    r = Path(root).expanduser()
    names = [config, DOWNLOAD_FOLDERS[config]]
    found = [r / n for n in names if (r / n).is_dir()]
    if len(found) > 1 and found[0].resolve() != found[1].resolve():
        raise HeadcountError(f"both {found[0]} and {found[1]} exist under HEADCOUNT_GLUE_DIR: keep one")
    if not found:
        raise HeadcountError(f"no GLUE {config} folder in HEADCOUNT_GLUE_DIR={r} (expected {names[0]}/ or {names[1]}/)")
    return found[0]


def find_glue_files(data_dir: str | os.PathLike, config: str, splits: tuple[str, ...]) -> dict[str, Path]:
    """``{split: file}`` for the splits of ``config`` that have a file in ``data_dir``, either layout.

    Raises:
        HeadcountError: no such folder; two files for one split (``validation.csv`` and ``dev.tsv``);
            an MNLI folder with an unsplit dev set (``validation.*`` / ``dev.tsv``).
    """
    d = Path(data_dir).expanduser()
    if not d.is_dir():
        raise HeadcountError(f"data directory not found: {d}")
    candidates: dict[str, list[Path]] = {}
    for split in splits:
        for suffix in SUFFIXES:
            if (d / f"{split}{suffix}").is_file():
                candidates.setdefault(split, []).append(d / f"{split}{suffix}")
    for stem, split in DOWNLOAD_NAMES.items():
        p = d / f"{stem}.tsv"
        if split in splits and p.is_file() and p not in candidates.get(split, []):
            candidates.setdefault(split, []).append(p)
    for split, paths in candidates.items():
        if len(paths) > 1:
            raise HeadcountError(f"two files for the {split} split of GLUE {config} in {d} "
                                 f"({', '.join(p.name for p in paths)}): keep one")
    if "validation" not in splits:  # MNLI: a plain dev set would be ignored; say so
        plain = [d / f"validation{s}" for s in SUFFIXES] + [d / "dev.tsv"]
        stray = [p for p in plain if p.is_file()]
        if stray:
            raise HeadcountError(
                f"{stray[0]}: GLUE {config} has a matched and a mismatched dev set; name the files "
                f"{' / '.join(s for s in splits if s.startswith('validation'))}.<suffix> "
                "(or dev_matched.tsv / dev_mismatched.tsv as in the GLUE download)")
    return {split: candidates[split][0] for split in splits if split in candidates}


def expected_files(split: str) -> str:
    """The file names that hold ``split`` in either layout, for error messages.

    >>> expected_files("validation_matched")
    'validation_matched.parquet|.jsonl|.csv|.tsv (hub layout) or dev_matched.tsv (GLUE download)'
    """
    stem = next((s for s, h in DOWNLOAD_NAMES.items() if h == split), None)
    hub = f"{split}{'|'.join(SUFFIXES)}"
    return hub + " (hub layout)" + (f" or {stem}.tsv (GLUE download)" if stem else "")
