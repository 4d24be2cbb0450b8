"""Tasks described by a YAML file over local data files.

```yaml
name: my-task
kind: classification          # or regression
files: {train: train.csv, validation: dev.csv}   # .csv .tsv .jsonl .parquet, relative to this file
text: [sentence]              # one column, or two for sentence pairs
label: label
labels: [negative, positive]  # optional for classification (else the sorted distinct values)
metric: accuracy              # accuracy | f1 | mcc | pearson | spearman | pearson_spearman
```

Optional keys: ``glue: sst2`` takes text, label, labels and metric of that GLUE task (files
in the GLUE schema); ``train_split`` / ``validation_split`` name the splits used by default
(else ``train`` and the first of ``validation``, ``dev``, ``test`` present; a task without
such a split fails when it is loaded, saying how to declare one, no other split takes its
place); ``holdout: {fraction: 0.2, seed: 0}`` makes a ``validation`` split of a seeded fifth of
the train file's rows, the others staying in ``train`` (a [`Holdout`][headcount.data.tasks.base.Holdout], recorded in the
task's description and fingerprint); ``description``. With ``glue:``, the files may also be the
GLUE download's TSVs (``dev.tsv`` with its own columns).
"""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

from headcount.data.tasks.base import (
    KINDS,
    METRICS,
    TASK_KEYS,
    FilesSource,
    Holdout,
    Task,
    distinct_label_names,
    label_name,
)
from headcount.data.tasks.glue import GLUE, glue_task
from headcount.data.tasks.niah import KIND as NIAH_KIND
from headcount.data.tasks.niah import niah_task_yaml
from headcount.data.tasks.tables import SUFFIXES, read_text
from headcount.runtime.errors import HeadcountError
from headcount.runtime.yamlfile import load_yaml_with_lines

KEYS = TASK_KEYS


def load_task_yaml(path: str | os.PathLike) -> Task:
    """Read a task YAML file (see the module docstring) into a [`Task`][headcount.data.tasks.base.Task].

    Raises:
        HeadcountError: unreadable or non-UTF-8 file, not YAML, not a mapping, unknown or bad
            keys, missing data files, labels that cannot be inferred.

    >>> task = load_task_yaml("my-task.yaml")   # doctest: +SKIP
    """
    p = Path(path).expanduser()
    text = read_text(p)
    # the study configs' loader: safe tags only; a duplicated key or an alias bomb refused with its line
    doc, _ = load_yaml_with_lines(text, str(p))
    if not isinstance(doc, dict):
        got = "an empty file" if doc is None else f"a {type(doc).__name__}"
        raise HeadcountError(f"{p}: a task YAML must be a mapping (name, kind, files, text, label, ...), got {got}")
    if doc.get("kind") == NIAH_KIND:  # needle in a haystack: generated, or RULER-style files (its own keys)
        return niah_task_yaml(doc, p)
    unknown = [k for k in doc if k not in KEYS]
    if unknown:
        raise HeadcountError(f"{p}: unknown key {unknown[0]!r}; keys: {', '.join(KEYS)}")
    where = str(p)
    if "hub" in doc or "splits" in doc or "extra_eval" in doc:
        return _hub_task(doc, where)

    files = doc.get("files")
    if not isinstance(files, dict) or not files:
        raise HeadcountError(f"{where}: `files` must map split names to data files, e.g. {{train: train.csv}}")
    resolved = {}
    for split, f in files.items():
        if not isinstance(f, str) or not f:
            raise HeadcountError(f"{where}: files.{split} must be a file path")
        fp = Path(f).expanduser()
        fp = fp if fp.is_absolute() else p.parent / fp
        if fp.suffix.lower() not in SUFFIXES:
            raise HeadcountError(f"{where}: files.{split}: unsupported file type {fp.suffix or '(none)'!r}; use {', '.join(SUFFIXES)}")
        if not fp.exists():
            raise HeadcountError(f"{where}: files.{split}: file not found: {fp}")
        if not fp.is_file():
            raise HeadcountError(f"{where}: files.{split}: not a file: {fp}")
        resolved[str(split)] = fp
    splits = list(resolved)
    holdout = _holdout(doc, splits, where)
    if holdout is not None:
        splits.append(holdout.name)
    # never one split in another's place: a task without them fails when it loads the missing one
    train_split = _split_key(doc, "train_split", splits, where) or "train"
    if holdout is not None:
        if train_split not in resolved:
            raise HeadcountError(f"{where}: `holdout` takes its rows from the train split {train_split!r}, "
                                 f"and files has none (files: {', '.join(resolved)})")
        holdout = Holdout(holdout.fraction, holdout.seed, of=train_split)
    validation_split = _split_key(doc, "validation_split", splits, where) or next(
        (s for s in ("validation", "dev", "test") if s in splits), "validation")
    name = doc.get("name", p.stem)
    if not isinstance(name, str) or not name:
        raise HeadcountError(f"{where}: `name` must be a string")
    description = str(doc.get("description", f"local files ({p.name})"))

    if "glue" in doc:
        config = str(doc["glue"]).removeprefix("glue/")
        if config not in GLUE and config != "mnli-mm":
            raise HeadcountError(f"{where}: glue: {config!r} is not a GLUE task; one of {', '.join(GLUE)}, mnli-mm")
        base = glue_task(config, data_files=resolved, task_name=name)
        overrides = {k: doc[k] for k in ("kind", "text", "label", "labels", "metric") if k in doc}
        if not overrides:
            return Task(**{**_fields(base), "train_split": train_split,
                           "validation_split": _split_key(doc, "validation_split", splits, where) or (
                               holdout.name if holdout is not None else base.validation_split),
                           "description": description, "holdout": holdout})
        doc = {"kind": base.kind, "text": list(base.text_fields), "label": base.label_field,
               "labels": list(base.labels) if base.labels else None, "metric": base.metric, **overrides}

    kind = doc.get("kind", "classification")
    if kind not in KINDS:
        raise HeadcountError(f"{where}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    text = doc.get("text")
    if isinstance(text, str):
        text = [text]
    if not isinstance(text, list) or not 1 <= len(text) <= 2 or not all(isinstance(t, str) and t for t in text):
        raise HeadcountError(f"{where}: `text` must name one column or two (a sentence pair), e.g. text: [sentence]")
    label = doc.get("label", "label")
    if not isinstance(label, str) or not label:
        raise HeadcountError(f"{where}: `label` must name a column")
    metric = doc.get("metric", "accuracy" if kind == "classification" else "pearson_spearman")
    if metric not in METRICS:
        raise HeadcountError(f"{where}: metric must be one of {', '.join(METRICS)}, not {metric!r}")
    source = FilesSource(resolved, declared_in=p)
    labels = doc.get("labels")
    if kind == "regression":
        if labels is not None:
            raise HeadcountError(f"{where}: `labels` is only for classification tasks")
        names = None
    elif labels is not None:
        if not isinstance(labels, list) or len(labels) < 2 or not all(isinstance(x, (str, int, float, bool)) for x in labels):
            raise HeadcountError(f"{where}: `labels` must be a list of at least two label names")
        names = tuple(label_name(x) for x in labels)
        if len(set(names)) != len(names):
            raise HeadcountError(f"{where}: `labels` lists a name twice")
    else:  # the sorted distinct values of the train split
        table = source.read(train_split)
        if label not in table.columns:
            raise HeadcountError(
                f"task {name}, split {train_split} ({table.where}): no column {label!r} "
                f"(columns: {', '.join(map(str, table.columns)) or 'none'})")
        names = distinct_label_names(table.columns[label])
        if len(names) < 2:
            raise HeadcountError(f"{where}: the train split has fewer than two distinct labels; list them under `labels`")
    return Task(name=name, kind=kind, text_fields=tuple(text), labels=names, metric=metric, source=source,
                label_field=label, train_split=train_split, validation_split=validation_split,
                label_ids=bool(doc.get("glue")) and kind == "classification", description=description,
                holdout=holdout)


def _holdout(doc: dict, splits: list[str], where: str) -> Holdout | None:
    """The ``holdout`` key: ``{fraction: F, seed: S}`` (seed optional, 0), a validation split held
    out of the train split; refused beside a ``validation`` file (which would it be?)."""
    value = doc.get("holdout")
    if value is None:
        return None
    example = "e.g. holdout: {fraction: 0.2, seed: 0} (a seeded fifth of the train rows as the validation split)"
    if not isinstance(value, dict) or set(value) - {"fraction", "seed"} or "fraction" not in value:
        raise HeadcountError(f"{where}: `holdout` must be {{fraction: F, seed: S}}, {example}")
    fraction, seed = value["fraction"], value.get("seed", 0)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise HeadcountError(f"{where}: holdout.fraction must be a number between 0 and 1 (exclusive), not {fraction!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise HeadcountError(f"{where}: holdout.seed must be an integer in 0..4294967295, not {seed!r}")
    held = Holdout(float(fraction), seed)
    if held.name in splits:
        raise HeadcountError(f"{where}: files declares a {held.name!r} split and `holdout` would make another; "
                             "keep one of them")
    return held


def _hub_task(doc: dict, where: str) -> Task:
    """A task whose rows come from the Hugging Face hub (``hub: {path, config}``), as the shipped
    GLUE declarations are: ``splits`` names the hub's splits (with their sizes, or null),
    ``extra_eval`` further dev sets every final model of a study is evaluated on."""
    from headcount.data.tasks.glue import HubSource

    hub, splits = doc.get("hub"), doc.get("splits")
    if "holdout" in doc:
        raise HeadcountError(f"{where}: `holdout` splits a local train file (`files`); a hub task names its splits")
    if "files" in doc:
        raise HeadcountError(f"{where}: a task has `files` (local data) or `hub` with `splits`, not both")
    if not isinstance(hub, dict) or not isinstance(hub.get("path"), str) or set(hub) - {"path", "config"}:
        raise HeadcountError(f"{where}: `hub` must be {{path: OWNER/NAME, config: CONFIG}} (config optional)")
    if not isinstance(splits, dict) or not splits or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 or n is None for n in splits.values()):
        raise HeadcountError(f"{where}: `splits` must map the hub's split names to their sizes (or null)")
    names = [str(s) for s in splits]
    extra = doc.get("extra_eval") or {}
    if not isinstance(extra, dict) or any(str(v) not in names for v in extra.values()):
        raise HeadcountError(f"{where}: `extra_eval` must map labels to splits of `splits`")
    kind = doc.get("kind", "classification")
    if kind not in KINDS:
        raise HeadcountError(f"{where}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    text = doc.get("text")
    text = [text] if isinstance(text, str) else text
    if not isinstance(text, list) or not 1 <= len(text) <= 2 or not all(isinstance(t, str) and t for t in text):
        raise HeadcountError(f"{where}: `text` must name one column or two (a sentence pair), e.g. text: [sentence]")
    labels = doc.get("labels")
    if (kind == "classification") != isinstance(labels, list):
        raise HeadcountError(f"{where}: a hub classification task lists its `labels` (a regression task none)")
    metric = doc.get("metric", "accuracy" if kind == "classification" else "pearson_spearman")
    if metric not in METRICS:
        raise HeadcountError(f"{where}: metric must be one of {', '.join(METRICS)}, not {metric!r}")
    validation = _split_key(doc, "validation_split", names, where) or next(
        (s for s in ("validation", "dev", "test") if s in names), "validation")
    hub_config = hub.get("config")
    return Task(name=str(doc.get("name") or hub["path"]), kind=kind, text_fields=tuple(text),
                labels=tuple(label_name(x) for x in labels) if labels else None, metric=metric,
                source=HubSource(hub["path"], None if hub_config is None else str(hub_config), tuple(names)),
                label_field=str(doc.get("label", "label")), train_split=_split_key(doc, "train_split", names, where) or "train",
                validation_split=validation, sizes={s: n for s, n in zip(names, splits.values()) if n is not None} or None,
                label_ids=True,  # the hub's schema stores class ids (-1: unlabelled)
                description=str(doc.get("description", f"{hub['path']} (hub)")),
                extra_eval_splits={str(k): str(v) for k, v in extra.items() if str(v) != validation})


def _split_key(doc: dict, key: str, splits: list[str], where: str) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if value not in splits:
        raise HeadcountError(f"{where}: {key} {value!r} is not one of the files' splits: {', '.join(splits)}")
    return value


def _fields(task: Task) -> dict:
    return {f.name: getattr(task, f.name) for f in fields(task)}
