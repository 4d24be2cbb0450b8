"""Tasks as data: a [`Task`][headcount.data.tasks.base.Task] says which columns hold text and label and how to score; a
*source* says where the rows come from (local files, the Hugging Face hub, fetched offline data).

Turning rows into examples (checking columns, mapping labels, choosing a subset) happens in one
place, [`Task.load`][headcount.data.tasks.base.Task.load], whatever the source.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import numpy as np

from headcount.data.tasks.tables import Table, read_table
from headcount.runtime.errors import HeadcountError

KINDS = ("classification", "regression")
#: the keys of a task YAML file (users' tasks and the shipped GLUE declarations alike; docs/tasks.md)
TASK_KEYS = ("name", "kind", "files", "hub", "splits", "text", "label", "labels", "metric", "glue", "train_split",
             "validation_split", "holdout", "extra_eval", "description")
CLASSIFICATION_METRICS = ("accuracy", "f1", "mcc")
REGRESSION_METRICS = ("pearson", "spearman", "pearson_spearman")
METRICS = CLASSIFICATION_METRICS + REGRESSION_METRICS

#: the label of an unlabelled example (GLUE test splits)
NO_LABEL = -1
#: the label of positions a loss ignores (torch's ``cross_entropy`` ``ignore_index``): padding in
#: batches, every position but the masked ones in masked-LM batches
IGNORE = -100


# --------------------------------------------------------------------------- sources
class Source:
    """Where a task's rows come from. Subclasses implement ``splits`` and ``read``."""

    def splits(self) -> list[str]:
        raise NotImplementedError

    def read(self, split: str) -> Table:
        raise NotImplementedError

    def cache_key(self, split: str) -> tuple:
        """Identifies the rows of ``split``; equal keys mean equal rows (in-process cache)."""
        return (id(self), split)

    def unlabelled(self, split: str) -> bool:
        """Whether ``split`` may carry the no-label marker ``-1`` (GLUE test splits)."""
        return False

    def missing_split_hint(self, split: str) -> str:
        """How to give the task the split ``split`` it lacks (appended to the error; "" when
        nothing general can be said)."""
        return ""


class FilesSource(Source):
    """One local file per split: ``{"train": "train.csv", "validation": "dev.jsonl"}``."""

    def __init__(self, files: Mapping[str, str | os.PathLike], unlabelled_prefix: str | None = None,
                 declared_in: str | os.PathLike | None = None):
        self.files = {str(k): Path(v) for k, v in files.items()}
        self.unlabelled_prefix = unlabelled_prefix
        self.declared_in = declared_in  # the task YAML that lists the files (its errors say how to add a split)

    def splits(self) -> list[str]:
        return list(self.files)

    def read(self, split: str) -> Table:
        return read_table(self.files[split])

    def cache_key(self, split: str) -> tuple:
        p = self.files[split]
        try:
            st = p.stat()
            return ("files", str(p.resolve()), st.st_mtime_ns, st.st_size)
        except OSError:
            return ("files", str(p), None, None)

    def unlabelled(self, split: str) -> bool:
        return bool(self.unlabelled_prefix) and split.startswith(self.unlabelled_prefix)

    def missing_split_hint(self, split: str) -> str:
        if self.declared_in is None:
            return ""
        listed = ", ".join(f"{k}: {v.name}" for k, v in self.files.items())
        held = (", or hold out part of train: `holdout: {fraction: 0.2, seed: 0}`" if split == "validation"
                and "train" in self.files else "")
        return f"; declare it in {self.declared_in}: `files: {{{listed}, {split}: FILE}}`{held} (docs/tasks.md)"

    def __repr__(self) -> str:
        return f"FilesSource({ {k: str(v) for k, v in self.files.items()} })"


# --------------------------------------------------------------------------- held-out split
@dataclass(frozen=True)
class Holdout:
    """A split held out of another: a seeded ``fraction`` of the rows of ``of`` become the split
    ``name``, the other rows stay in ``of`` (a task YAML's ``holdout: {fraction: 0.2, seed: 0}``:
    a validation split out of a single training file).

    The rows are chosen by [`holdout_indices`][headcount.data.tasks.base.holdout_indices] from the
    number of rows alone: the same file, fraction and seed give the same split on every machine.
    """

    fraction: float
    seed: int = 0
    of: str = "train"
    name: str = "validation"

    def describe(self) -> dict:
        """What a task's description (and so its fingerprint) records of it."""
        return {"split": self.name, "of": self.of, "fraction": self.fraction, "seed": self.seed}


def holdout_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, held)``: sorted row indices of ``n`` rows, ``round(fraction * n)`` of them held out,
    drawn by a permutation seeded with ``seed`` (numpy's ``default_rng``); disjoint, together
    every row.

    Raises:
        HeadcountError: a fraction that would leave either part empty.

    >>> kept, held = holdout_indices(10, 0.2, seed=0)
    >>> len(kept), len(held), sorted(kept.tolist() + held.tolist()) == list(range(10))
    (8, 2, True)
    """
    k = int(round(float(fraction) * n))
    if n < 2:
        raise HeadcountError(f"cannot hold out part of a split of {n} row{'' if n == 1 else 's'}")
    if not 1 <= k <= n - 1:
        left = "no row held out" if k < 1 else "no row to train on"
        raise HeadcountError(f"holding out {fraction:g} of {n} rows leaves {left}; "
                             f"choose a fraction between {1 / n:.3g} and {(n - 1) / n:.3g}")
    order = np.random.default_rng(int(seed)).permutation(n)
    return np.sort(order[k:]), np.sort(order[:k])


# --------------------------------------------------------------------------- data
@dataclass
class TaskData:
    """The examples of one split.

    Attributes:
        task: the task they belong to.
        split: the split name.
        texts: one tuple per example (one string, or two for sentence pairs).
        labels: int64 class ids (``-1`` = unlabelled) or float32 values for regression.
    """

    task: "Task"
    split: str
    texts: list[tuple[str, ...]]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        return f"TaskData({self.task.name!r}, {self.split!r}, {len(self)} examples)"


@dataclass(frozen=True, eq=False)
class Task:
    """A task: text columns, label column and set, primary metric, and where the rows are.

    Attributes:
        name: registered name (``glue/sst2``) or the YAML's ``name``.
        kind: ``"classification"`` or ``"regression"``.
        text_fields: one column, or two for sentence pairs.
        labels: class names (index = class id); ``None`` for regression.
        metric: primary metric (see [`headcount.data.tasks.compute_metrics`][headcount.data.tasks.compute_metrics]).
        source: where the rows come from.
        label_field: the label column.
        train_split / validation_split: the splits training and evaluation use by default.
        sizes: documented split sizes (``None`` when unknown); shown by ``headcount tasks``.
        label_ids: whether the label column may hold class ids (0..n-1) instead of names.
        description: one line for ``headcount tasks``.
        extra_eval_splits: ``{label: split}``: further dev sets the studies evaluate every final
            model on, besides ``validation_split``, and report as the task ``<name>-<label>``
            (``glue/mnli``: ``{"mm": "validation_mismatched"}``, reported as ``glue/mnli-mm``).
        holdout: a split held out of another ([`Holdout`][headcount.data.tasks.base.Holdout]), or None.
    """

    name: str
    kind: str
    text_fields: tuple[str, ...]
    labels: tuple[str, ...] | None
    metric: str
    source: Source
    label_field: str = "label"
    train_split: str = "train"
    validation_split: str = "validation"
    sizes: Mapping[str, int] | None = None
    label_ids: bool = False
    description: str = ""
    extra: Mapping = field(default_factory=dict)
    extra_eval_splits: Mapping[str, str] = field(default_factory=dict)
    holdout: Holdout | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise HeadcountError(f"task {self.name}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        allowed = CLASSIFICATION_METRICS if self.kind == "classification" else REGRESSION_METRICS
        if self.metric not in allowed:
            raise HeadcountError(
                f"task {self.name}: metric {self.metric!r} does not fit a {self.kind} task; use one of {', '.join(allowed)}"
            )
        if not 1 <= len(self.text_fields) <= 2:
            raise HeadcountError(f"task {self.name}: text must name one or two columns, not {len(self.text_fields)}")
        if self.kind == "classification" and (not self.labels or len(self.labels) < 2):
            raise HeadcountError(f"task {self.name}: a classification task needs at least two labels")

    @property
    def num_labels(self) -> int:
        """Number of classes (1 for regression)."""
        return 1 if self.kind == "regression" else len(self.labels or ())

    @property
    def is_pair(self) -> bool:
        return len(self.text_fields) == 2

    def splits(self) -> list[str]:
        """Split names, e.g. ``["train", "validation", "test"]`` (a held-out split included)."""
        names = self.source.splits()
        if self.holdout is not None and self.holdout.name not in names:
            names = [*names, self.holdout.name]
        return names

    def check_split(self, split: str) -> None:
        """Refuse a split the task does not have, saying which it has and, for a task YAML, how
        to declare the missing one (never another split in its place).

        Raises:
            HeadcountError: ``split`` is not one of [`splits`][headcount.data.tasks.base.Task.splits].
        """
        available = self.splits()
        if split in available:
            return
        role = (" (the split it is evaluated on)" if split == self.validation_split else
                " (the split it is trained on)" if split == self.train_split else "")
        raise HeadcountError(f"task {self.name} has no split {split!r}{role}; splits: {', '.join(available) or 'none'}"
                             f"{self.source.missing_split_hint(split)}")

    def load(self, split: str | None = None, max_examples: int | None = None, seed: int = 0) -> TaskData:
        """The examples of ``split`` (default: the validation split).

        Args:
            split: a name from ``splits``.
            max_examples: keep a seeded random subset of this many (in the original order).
            seed: seed of that subset.

        Returns:
            A [`TaskData`][headcount.data.tasks.base.TaskData].

        Raises:
            HeadcountError: unknown split, missing column, label outside the label set, empty split.

        >>> from headcount.data.tasks import get_task
        >>> get_task("offline/movies").load("validation", max_examples=8).labels.shape  # doctest: +SKIP
        (8,)
        """
        split = self.validation_split if split is None else split
        self.check_split(split)  # never another split in its place
        texts, labels = _load_cached(self, split)
        idx = subset_indices(len(texts), max_examples, seed)
        if idx is not None:
            texts = [texts[i] for i in idx]
            labels = labels[idx]
        else:
            texts = list(texts)
            labels = labels.copy()
        return TaskData(self, split, texts, labels)

    def describe(self) -> dict:
        """A row for ``headcount tasks`` (and what a task's fingerprint hashes, with its files):
        a held-out split's fraction and seed included."""
        row = {"name": self.name, "kind": self.kind, "metric": self.metric,
               "labels": list(self.labels) if self.labels else None,
               "text": list(self.text_fields), "sizes": dict(self.sizes) if self.sizes else None,
               "description": self.description}
        if self.holdout is not None:
            row["holdout"] = self.holdout.describe()
        return row

    def __repr__(self) -> str:
        return f"Task({self.name!r}, {self.kind}, text={self.text_fields}, metric={self.metric})"


# --------------------------------------------------------------------------- helpers
def subset_indices(n: int, max_examples: int | None, seed: int) -> np.ndarray | None:
    """Sorted indices of a seeded random subset of ``max_examples`` out of ``n`` (``None``: all).

    >>> subset_indices(10, 3, seed=0).tolist() == subset_indices(10, 3, seed=0).tolist()
    True
    """
    if max_examples is None:
        return None
    if int(max_examples) < 1:
        raise HeadcountError(f"max_examples must be at least 1, not {max_examples}")
    if max_examples >= n:
        return None
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=int(max_examples), replace=False))


_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 16


def _load_cached(task: Task, split: str) -> tuple[list[tuple[str, ...]], np.ndarray]:
    held = task.holdout
    if held is not None and split in (held.name, held.of):
        # the whole file is checked (row numbers in errors are the file's), then cut in two
        texts, labels = _load_cached(replace(task, holdout=None), held.of)
        kept, out = holdout_indices(len(texts), held.fraction, held.seed)
        idx = out if split == held.name else kept
        return [texts[i] for i in idx], labels[idx]
    key = (task.name, task.kind, task.text_fields, task.label_field, task.labels, task.label_ids,
           task.source.cache_key(split))
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    table = task.source.read(split)
    value = build_examples(task, split, table)
    _CACHE[key] = value
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def build_examples(task: Task, split: str, table: Table) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """Check a table against the task and turn it into (texts, labels)."""
    where = f"task {task.name}, split {split} ({table.where})"
    n = len(table)
    if n == 0:
        raise HeadcountError(f"{where}: the split is empty")
    columns = table.columns
    for col in (*task.text_fields, task.label_field):
        if col not in columns:
            raise HeadcountError(f"{where}: no column {col!r} (columns: {', '.join(map(str, columns)) or 'none'})")
    fields = [columns[c] for c in task.text_fields]
    for col, values in zip(task.text_fields, fields):
        for i, v in enumerate(values):
            if not isinstance(v, str):
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    raise HeadcountError(f"{where}: row {i + 1} has no text in column {col!r}")
                raise HeadcountError(f"{where}: row {i + 1}, column {col!r}: expected text, got {v!r}")
    texts = list(zip(*fields))
    raw = columns[task.label_field]
    if task.kind == "regression":
        labels = _regression_labels(raw, where, task.source.unlabelled(split))
    else:
        names = task.labels
        if table.label_names is not None and len(table.label_names) != len(names):  # ids would mean other classes
            raise HeadcountError(f"{where}: the source declares labels {list(table.label_names)}, the task {list(names)}")
        labels = class_ids(raw, names, where, allow_ids=task.label_ids,
                           allow_unlabelled=task.source.unlabelled(split))
    return texts, labels


def _is_int_like(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, np.integer)):
        return True
    if isinstance(v, (float, np.floating)):
        return math.isfinite(v) and float(v).is_integer()
    if isinstance(v, str):
        s = v.strip()
        digits = s.lstrip("+-")
        return bool(digits) and digits.isascii() and digits.isdigit()  # "²" is a digit int() refuses
    return False


def label_name(v) -> str:
    """The name a raw label value stands for (``1``, ``1.0`` and ``"1"`` all give ``"1"``)."""
    if isinstance(v, str):
        return v.strip()
    if _is_int_like(v):
        return str(int(v))
    return str(v)


def class_ids(values, names, where: str, allow_ids: bool = False, allow_unlabelled: bool = False) -> np.ndarray:
    """Map raw label values to class ids.

    A value maps by name (``"positive"``); with ``allow_ids`` an integer value ``0..n-1`` is taken
    as the id itself (the GLUE schema stores ids). ``-1`` is accepted as "no label" only where
    ``allow_unlabelled``.

    >>> class_ids(["neg", "pos", "pos"], ("neg", "pos"), "example").tolist()
    [0, 1, 1]
    """
    index = {n: i for i, n in enumerate(names)}
    ids_ok = allow_ids and not any(_is_int_like(n) for n in names)
    memo: dict = {}
    out = np.empty(len(values), dtype=np.int64)
    for row, v in enumerate(values):
        key = (type(v), v) if not (isinstance(v, float) and math.isnan(v)) else ("nan",)
        got = memo.get(key)
        if got is None:
            got = _one_class_id(v, index, names, ids_ok, allow_unlabelled)
            if got is None:
                shown = "nothing" if v is None or key == ("nan",) or v == "" else repr(v)
                also = f" (or a class id 0..{len(names) - 1})" if ids_ok else ""
                raise HeadcountError(f"{where}: row {row + 1}: label {shown} is not one of: {', '.join(names)}{also}")
            memo[key] = got
        out[row] = got
    return out


def _one_class_id(v, index, names, ids_ok, allow_unlabelled):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    name = label_name(v)
    if name in index:
        return index[name]
    if _is_int_like(v):
        i = int(float(v)) if not isinstance(v, str) else int(v.strip())
        if allow_unlabelled and i == NO_LABEL:
            return NO_LABEL
        if ids_ok and 0 <= i < len(names):
            return i
    return None


def _regression_labels(values, where: str, allow_unlabelled: bool) -> np.ndarray:
    out = np.empty(len(values), dtype=np.float32)
    for row, v in enumerate(values):
        try:
            x = float(v) if not isinstance(v, bool) else float("nan")
        except (TypeError, ValueError):
            x = float("nan")
        if not math.isfinite(x):
            shown = "nothing" if v is None or v == "" else repr(v)
            raise HeadcountError(f"{where}: row {row + 1}: label {shown} is not a number")
        out[row] = x
    return out


def distinct_label_names(values) -> tuple[str, ...]:
    """Sorted distinct label names (numerically when every value is an integer).

    >>> distinct_label_names(["b", "a", "b"]), distinct_label_names([10, 2, 2])
    (('a', 'b'), ('2', '10'))
    """
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)) and v != ""]
    if present and all(_is_int_like(v) for v in present):
        return tuple(str(x) for x in sorted({int(float(v)) if not isinstance(v, str) else int(v.strip()) for v in present}))
    return tuple(sorted({label_name(v) for v in present}))
