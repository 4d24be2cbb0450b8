"""Study configs: YAML files validated by the pydantic model of their study type.

A config file names its type under ``study:``; the rest is the type's own settings::

    study: transfer          # a registered study type (or "package.module:type" to import one)
    name: my first study     # optional, the report's title
    ...                      # the type's settings

Files are read by [`headcount.runtime.yamlfile.load_yaml_with_lines`][headcount.runtime.yamlfile.load_yaml_with_lines] (``yaml.SafeLoader``; task YAML
files too). Errors are one line that names the file, the line and the key: ``study.yaml, line 7:
'tasks[1].seed': Input should be a valid integer (got 'x')``; unknown keys, wrong types, missing
keys, duplicated keys, alias bombs, numbers that are not finite and booleans where a number belongs
are all refused, and so are model paths and tasks that do not exist: every value and path is
checked before the first job runs.
"""

from __future__ import annotations

import difflib
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from headcount.data.tasks import resolve_task_ref
from headcount.experiments.runner.jobs import stable_hash
from headcount.experiments.runner.registry import StudyType, get_study_type
from headcount.experiments.runner.schema import SEED_FIELDS, ConfigSection, StudyConfig
from headcount.runtime.bounds import SEED
from headcount.runtime.errors import HeadcountError
from headcount.runtime.yamlfile import dotted as _dotted
from headcount.runtime.yamlfile import load_yaml_with_lines

__all__ = ["SEED_FIELDS", "ConfigSection", "LoadedConfig", "StudyConfig", "config_hash", "format_validation_error",
           "load_study_config", "load_yaml_with_lines", "model_ref", "parse_study_config", "task_ref"]


# -------------------------------------------------------------------------------------------
# pydantic errors -> one line with key and line number
# -------------------------------------------------------------------------------------------
def _model_at(model: type[BaseModel] | None, path: tuple) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``path`` (best effort, for suggestions)."""

    def unwrap(tp, rest):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return _model_at(tp, rest)
        args = [a for a in typing.get_args(tp) if a is not type(None) and a is not Ellipsis]
        if not rest:
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            return models[0] if len(models) == 1 else None
        origin = typing.get_origin(tp)
        if origin in (list, tuple, set, frozenset, typing.Union) or str(origin) == "types.UnionType":
            step = rest[1:] if isinstance(rest[0], int) and origin is not typing.Union else rest
            for a in args:
                found = unwrap(a, step)
                if found is not None:
                    return found
        if origin is dict and len(args) == 2:
            return unwrap(args[1], rest[1:])
        return None

    if model is None:
        return None
    if not path:
        return model
    field = model.model_fields.get(path[0]) if isinstance(path[0], str) else None
    return unwrap(field.annotation, path[1:]) if field is not None else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_validation_error(err: ValidationError, data: Any, lines: dict[tuple, int], where: str,
                            model: type[BaseModel] | None = None) -> str:
    """One line for the first error of a pydantic ``ValidationError``, with key and line."""
    errors = err.errors(include_url=False)
    first = errors[0]
    # keep the loc elements that exist in the data (drop union tags and validator names)
    path: tuple = ()
    cur = data
    missing = None
    loc = tuple(first.get("loc", ()))
    for i, el in enumerate(loc):
        if isinstance(cur, dict) and el in cur:
            path, cur = path + (el,), cur[el]
        elif isinstance(cur, list) and isinstance(el, int) and 0 <= el < len(cur):
            path, cur = path + (el,), cur[el]
        elif first["type"] == "missing" and i == len(loc) - 1:
            missing = el
    line = lines.get(path)
    probe = path
    while line is None and probe:
        probe = probe[:-1]
        line = lines.get(probe)
    at = f"{where}, line {line}" if line else where
    if first["type"] == "extra_forbidden":
        key = path[-1] if path else loc[-1]
        sub = _model_at(model, path[:-1])
        allowed = sorted(sub.model_fields) if sub is not None else []
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (f" (allowed here: {', '.join(allowed)})" if allowed else "")
        msg = f"{at}: unknown key {_dotted(path)!r}{hint}"
    elif missing is not None:
        msg = f"{at}: missing key {_dotted(path + (missing,))!r}"
    else:
        msg = f"{at}: {_dotted(path)!r}: {first['msg']}"
        if "input" in first and first["type"] not in ("missing",):
            msg += f" (got {_short(first['input'])})"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return msg


# -------------------------------------------------------------------------------------------
# loading a study config
# -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedConfig:
    """A validated study config and where it came from.

    Attributes:
        study_type: the registered study type.
        config: the validated (frozen) config model.
        text: the file's text, as given (copied to ``RUN/study.yaml``).
        path: the file, or None for a config given as text or a model.
        hash: identity of the config (study type + validated settings), stored in the manifest.
    """

    study_type: StudyType
    config: StudyConfig
    text: str
    path: Path | None
    hash: str


#: settings that do not change what a study computes (left out of its hash)
_NOT_IDENTITY = {"device", "precision"}


def config_hash(config: StudyConfig) -> str:
    """Identity of a validated config: equal settings, equal hash (formatting and comments aside).

    >>> class Toy(StudyConfig):
    ...     steps: int = 3
    >>> config_hash(Toy(study="toy")) == config_hash(Toy(study="toy", steps=3))
    True
    """
    return stable_hash({"config": config.model_dump(mode="json", exclude=_NOT_IDENTITY)}, 16)


def parse_study_config(text: str, where: str = "<config>", base_dir: str | os.PathLike | None = None) -> LoadedConfig:
    """Validate a study config given as YAML text (see [`load_study_config`][headcount.experiments.runner.config.load_study_config]).

    >>> parse_study_config("study: nonesuch\\n")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: <config>, line 1: unknown study type 'nonesuch'...
    """
    data, lines = load_yaml_with_lines(text, where)
    if not isinstance(data, dict):
        raise HeadcountError(f"{where}: a study config is a mapping with a 'study:' key (got {type(data).__name__})")
    if "study" not in data:
        raise HeadcountError(f"{where}, line 1: missing key 'study' (the study type)")
    if not isinstance(data["study"], str):
        raise HeadcountError(f"{where}, line {lines[('study',)]}: 'study' must be a study type name")
    try:
        study_type = get_study_type(data["study"], base_dir)  # a module beside the config is found
    except HeadcountError as e:
        raise HeadcountError(f"{where}, line {lines[('study',)]}: {e}") from None
    model = study_type.config_model
    _finite_numbers(data, lines, where)
    context = {"base_dir": Path(base_dir) if base_dir is not None else Path.cwd()}
    try:
        config = model.model_validate(data, context=context)
    except ValidationError as e:
        raise HeadcountError(format_validation_error(e, data, lines, where, model)) from None
    dumped = config.model_dump()
    _no_booleans_as_numbers(data, dumped, lines, where)
    _seeds_in_range(dumped, lines, where)
    return LoadedConfig(study_type, config, text, None, config_hash(config))


# -------------------------------------------------------------------------------------------
# checks every study type gets: numbers that are numbers, seeds that numpy and torch take
# -------------------------------------------------------------------------------------------
def _at(lines: dict[tuple, int], path: tuple, where: str) -> str:
    """``where, line N`` of the nearest key on ``path`` that has a line."""
    while path and path not in lines:
        path = path[:-1]
    line = lines.get(path)
    return f"{where}, line {line}" if line else where


def _items(value):
    if isinstance(value, dict):
        return value.items()
    if isinstance(value, (list, tuple)):
        return enumerate(value)
    return ()


def _finite_numbers(data: Any, lines: dict[tuple, int], where: str, path: tuple = ()) -> None:
    """Refuse ``.inf`` and ``.nan`` wherever they are: no setting of any study takes them."""
    if isinstance(data, float) and not math.isfinite(data):
        raise HeadcountError(f"{_at(lines, path, where)}: {_dotted(path)!r} must be a finite number (got {data})")
    for key, value in _items(data):
        _finite_numbers(value, lines, where, path + (key,))


def _no_booleans_as_numbers(data: Any, dumped: Any, lines: dict[tuple, int], where: str, path: tuple = ()) -> None:
    """Refuse a ``true``/``false`` that validated into a number (pydantic reads ``seeds: [true]`` as
    ``[1]``): ``data`` as written, ``dumped`` the validated config at the same place."""
    if isinstance(data, bool):
        if isinstance(dumped, (int, float)) and not isinstance(dumped, bool):
            raise HeadcountError(f"{_at(lines, path, where)}: {_dotted(path)!r} must be a number, not "
                                 f"{str(data).lower()}")
        return
    if isinstance(data, dict) and isinstance(dumped, dict):
        for key, value in data.items():
            if key in dumped:
                _no_booleans_as_numbers(value, dumped[key], lines, where, path + (key,))
    elif isinstance(data, list) and isinstance(dumped, (list, tuple)) and len(data) == len(dumped):
        for i, value in enumerate(data):
            _no_booleans_as_numbers(value, dumped[i], lines, where, path + (i,))


def _seeds_in_range(dumped: Any, lines: dict[tuple, int], where: str, path: tuple = ()) -> None:
    """Every seed ([`SEED_FIELDS`][headcount.experiments.runner.config.SEED_FIELDS], at any depth) in [`headcount.runtime.bounds.SEED`][headcount.runtime.bounds.SEED]'s range."""
    for key, value in _items(dumped):
        here = path + (key,)
        if key in SEED_FIELDS and value is not None:
            for i, seed in (_items(value) if isinstance(value, (list, tuple)) else [(None, value)]):
                at = here if i is None else here + (i,)
                if not SEED.contains(seed):
                    raise HeadcountError(f"{_at(lines, at, where)}: {_dotted(at)!r} must be {SEED}, got {seed}")
        else:
            _seeds_in_range(value, lines, where, here)


def load_study_config(path: str | os.PathLike) -> LoadedConfig:
    """Read and validate a study config file.

    The study type's model validates the mapping with a pydantic context
    ``{"base_dir": <the file's directory>}``, so validators can resolve relative paths.

    Args:
        path: a YAML file whose ``study:`` key names a registered study type.

    Returns:
        A [`LoadedConfig`][headcount.experiments.runner.config.LoadedConfig] (type, frozen config model, text, hash).

    Raises:
        HeadcountError: unreadable file, bad YAML, unknown study type, or a validation error,
            as one line naming the file, the line and the key.

    >>> load_study_config("/nonexistent.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: cannot read /nonexistent.yaml: ...
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise HeadcountError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    loaded = parse_study_config(text, where=path.name, base_dir=path.resolve().parent)
    return LoadedConfig(loaded.study_type, loaded.config, text, path, loaded.hash)


def task_ref(value: Any, info: Any) -> Any:
    """A task named in a study config, resolved and checked: call it from a field validator.

    The rule of [`headcount.data.tasks.resolve_task_ref`][headcount.data.tasks.resolve_task_ref] (a registered name wins; a path ends in
    ``.yaml``/``.yml`` or starts with ``./``, ``../``, ``/``; relative to the config's folder,
    ``info.context["base_dir"]``), and the task is built, so that an unknown name, a missing
    file or a bad task YAML fails while the config is validated, before any job runs.
    Non-strings pass through (the field's type refuses them).

    >>> task_ref("glue/sst2", None)
    'glue/sst2'
    """
    if not isinstance(value, str):
        return value
    base = (getattr(info, "context", None) or {}).get("base_dir")
    try:
        return resolve_task_ref(value, base, check=True)
    except HeadcountError as e:  # pydantic reports a ValueError with the file, line and key
        raise ValueError(str(e)) from None


def model_ref(value: Any, info: Any = None) -> Any:
    """A model named in a study config, checked: call it from a field validator (after resolving
    a path relative to the config's folder), so that a checkpoint that is not there fails while the
    config is validated, before any job runs.

    The rule of [`headcount.core.model_spec.resolve`][headcount.core.model_spec.resolve]: ``offline`` and hub ids (``roberta-base``,
    ``org/name``) pass as they are, without the network; a value that looks like a path (it starts
    with ``/``, ``./``, ``../`` or ``~``, or exists) must be a checkpoint directory whose files can
    be loaded. Non-strings pass through (the field's type refuses them).

    >>> model_ref("roberta-base"), model_ref("offline")
    ('roberta-base', 'offline')
    >>> model_ref("/nonexistent")
    Traceback (most recent call last):
    ...
    ValueError: checkpoint directory not found: /nonexistent
    """
    if not isinstance(value, str) or value == "offline":
        return value
    from headcount.core.model_spec import (
        resolve,  # transformers: what the study command loads to run jobs anyway
    )

    try:
        resolve(value)
    except HeadcountError as e:  # pydantic reports a ValueError with the file, line and key
        raise ValueError(str(e)) from None
    return value
