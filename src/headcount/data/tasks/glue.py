"""The nine GLUE tasks, as data: text fields, label names, official metric, splits, sizes.

Rows come from ``datasets.load_dataset("nyu-mll/glue", config)`` (users with a network or a
filled Hugging Face cache) or from local files: in the hub's schema (the columns of that dataset:
e.g. ``sentence, label`` for SST-2, ``premise, hypothesis, label`` for MNLI; the label a class id
or a class name; ``-1`` = unlabelled on test splits) or as in the original GLUE download
(``train.tsv``, ``dev.tsv``, ``dev_matched.tsv`` ... with each task's own columns; see
[`glue_local`][headcount.data.tasks.glue_local]). Local files are found by ``get_task("glue/sst2", data_dir=DIR)``, by
``data_files={"train": ...}``, by a task YAML with ``glue: sst2``, or for every GLUE task at once
by the environment variable ``HEADCOUNT_GLUE_DIR`` (``$HEADCOUNT_GLUE_DIR/sst2/`` or ``.../SST-2/``).
A task trains on ``train`` and evaluates on ``validation`` (MNLI: ``validation_matched``;
``glue/mnli-mm``: ``validation_mismatched``), never on another split in their place: a folder
without the evaluation split is refused. ``glue/mnli`` also declares the mismatched dev set as an
extra evaluation split ([`Task.extra_eval_splits`][headcount.data.tasks.base.Task.extra_eval_splits] ``{"mm": "validation_mismatched"}``, when
its source has that split): the studies evaluate each final model on both and report both.
Whichever the source, the same [`Task.load`][headcount.data.tasks.base.Task.load] checks the rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from headcount.data.tasks.base import TASK_KEYS, Source, Task
from headcount.data.tasks.glue_local import (
    DOWNLOAD_NAMES,
    GlueFilesSource,
    expected_files,
    find_glue_files,
    glue_folder,
    other_files,
    raw_files_hint,
)
from headcount.data.tasks.tables import Table
from headcount.runtime.errors import HeadcountError

HUB_ID = "nyu-mll/glue"
#: where the shipped task declarations are (package data)
SPECS = Path(__file__).resolve().parent / "specs"
#: the order ``headcount tasks`` lists them in (the GLUE paper's)
GLUE_ORDER = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")


@dataclass(frozen=True)
class GlueSpec:
    config: str
    text: tuple[str, ...]
    labels: tuple[str, ...] | None  # None = regression
    metric: str
    splits: tuple[str, ...] = ("train", "validation", "test")
    validation: str = "validation"
    sizes: tuple[int, ...] = ()
    description: str = ""
    #: further dev sets every final model of a study is evaluated on: ``((label, split), ...)``
    extra_eval: tuple[tuple[str, str], ...] = ()


def _spec(path: Path) -> GlueSpec:
    """A GLUE task from its declaration (``tasks/specs/glue-*.yaml``, the task YAML format)."""
    from headcount.runtime.yamlfile import load_yaml_with_lines

    doc, _ = load_yaml_with_lines(path.read_text(encoding="utf-8"), str(path))
    unknown = sorted(set(doc) - set(TASK_KEYS))
    if unknown:  # the shipped declarations use the users' format, nothing more
        raise HeadcountError(f"{path}: unknown key {unknown[0]!r}; keys: {', '.join(TASK_KEYS)}")
    return GlueSpec(config=doc["hub"]["config"], text=tuple(doc["text"]),
                    labels=tuple(doc["labels"]) if doc.get("labels") else None, metric=doc["metric"],
                    splits=tuple(doc["splits"]), validation=doc["validation_split"],
                    sizes=tuple(int(n) for n in doc["splits"].values()), description=doc.get("description", ""),
                    extra_eval=tuple((str(k), str(v)) for k, v in (doc.get("extra_eval") or {}).items()))


#: the nine GLUE tasks, declared as data in the task YAML format (``tasks/specs/glue-<config>.yaml``:
#: fields, labels, metric, the hub's splits with their official sizes)
GLUE: dict[str, GlueSpec] = {spec.config: spec for spec in map(_spec, sorted(SPECS.glob("glue-*.yaml"),
                                                                             key=lambda p: GLUE_ORDER.index(p.stem[5:])))}

#: registered name -> (GLUE config, validation split); mnli-mm evaluates on the mismatched set
GLUE_TASKS: dict[str, tuple[str, str]] = {f"glue/{c}": (c, s.validation) for c, s in GLUE.items()}
GLUE_TASKS["glue/mnli-mm"] = ("mnli", "validation_mismatched")


class HubSource(Source):
    """Rows from ``datasets.load_dataset(path, config, split=...)``."""

    def __init__(self, path: str, config: str | None, splits: tuple[str, ...]):
        self.path, self.config, self._splits = path, config, tuple(splits)

    def splits(self) -> list[str]:
        return list(self._splits)

    def cache_key(self, split: str) -> tuple:
        return ("hub", self.path, self.config, split)

    def unlabelled(self, split: str) -> bool:
        return split.startswith("test")

    def read(self, split: str) -> Table:
        try:
            import datasets
        except ImportError:  # pragma: no cover - a dependency
            raise HeadcountError("the `datasets` package is needed for hub data: pip install datasets") from None
        where = f"{self.path}/{self.config}" if self.config else self.path
        try:
            ds = datasets.load_dataset(self.path, self.config, split=split)
        except Exception as e:  # network, missing cache, unknown config: one line for the user
            raise HeadcountError(
                f"cannot load {where} split {split} through `datasets` ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:160] if str(e) else ''}); without a network use local files "
                "(data_dir=..., HEADCOUNT_GLUE_DIR, or a task YAML)"
            ) from None
        return table_from_dataset(ds, where)


def table_from_dataset(ds, where: str) -> Table:
    """Columns of a ``datasets.Dataset`` (class names from a ClassLabel ``label`` feature)."""
    label_names = None
    feature = getattr(ds, "features", {}).get("label") if hasattr(ds, "features") else None
    if feature is not None and hasattr(feature, "names"):
        label_names = tuple(feature.names)
    columns = {name: ds[name] for name in ds.column_names}
    columns = {k: list(v) for k, v in columns.items()}
    return Table(columns, where, label_names=label_names)


def glue_task(name: str, data_dir=None, data_files: Mapping[str, str | os.PathLike] | None = None,
              task_name: str | None = None) -> Task:
    """The GLUE task ``name`` (``glue/sst2`` or ``sst2``), from the hub or from local files.

    Args:
        name: registered name (``glue/mnli-mm`` evaluates on the mismatched dev set).
        data_dir: a folder of local files, in the hub's layout (``<split>.parquet|jsonl|csv|tsv``)
            or the GLUE download's (``train.tsv``, ``dev.tsv``...); it must hold the split the
            task evaluates on.
        data_files: ``{split: path}`` in either schema (overrides ``data_dir``).
        task_name: the name the task reports (default ``name``).

    Raises:
        HeadcountError: unknown name; a folder without the evaluation split, with two files for
            one split, or (MNLI) with an unsplit dev set.

    >>> task = glue_task("glue/mrpc")
    >>> task.text_fields, task.labels, task.metric
    (('sentence1', 'sentence2'), ('not_equivalent', 'equivalent'), 'f1')
    """
    key = name if name.startswith("glue/") else f"glue/{name}"
    if key not in GLUE_TASKS:
        raise HeadcountError(f"unknown GLUE task {name!r}; GLUE tasks: {', '.join(GLUE_TASKS)}")
    config, validation = GLUE_TASKS[key]
    spec = GLUE[config]
    if data_dir is None and data_files is None and os.environ.get("HEADCOUNT_GLUE_DIR"):
        data_dir = glue_folder(os.environ["HEADCOUNT_GLUE_DIR"], config)
    if data_files is not None:  # the splits the caller names; a missing one fails when loaded
        unknown = [s for s in data_files if s not in spec.splits]
        if unknown:
            hub = DOWNLOAD_NAMES.get(unknown[0])
            hint = f" (the GLUE download's {unknown[0]}.tsv is the {hub} split)" if hub in spec.splits else ""
            raise HeadcountError(f"GLUE {config} has no split {unknown[0]!r}{hint}; splits: {', '.join(spec.splits)}")
        source: Source = GlueFilesSource(data_files, config, spec.text)
        sizes = None
    elif data_dir is not None:
        files = find_glue_files(data_dir, config, spec.splits)
        if validation not in files:
            found = ", ".join(p.name for p in files.values()) or "no data files" + other_files(data_dir)
            also = (" (glue/mnli evaluates on the matched dev set, glue/mnli-mm on the mismatched one)"
                    if config == "mnli" else "")
            raise HeadcountError(f"no {validation} split for {key} in {data_dir}: expected "
                                 f"{expected_files(validation)}; found {found}{also}{raw_files_hint(data_dir, config)}")
        source = GlueFilesSource(files, config, spec.text)
        sizes = None
    else:
        source = HubSource(HUB_ID, config, spec.splits)
        sizes = dict(zip(spec.splits, spec.sizes))
    # extra dev sets of the task itself (not of a variant such as glue/mnli-mm), where the source has them
    available = set(source.splits())
    extra = {label: split for label, split in spec.extra_eval
             if key == f"glue/{config}" and split != validation and split in available}
    return Task(
        name=task_name or key,
        kind="classification" if spec.labels else "regression",
        text_fields=spec.text,
        labels=spec.labels,
        metric=spec.metric,
        source=source,
        label_field="label",
        train_split="train",  # never another split in its place (a missing one fails when loaded)
        validation_split=validation,
        sizes=sizes,
        label_ids=True,
        description=spec.description,
        extra_eval_splits=extra,
    )
