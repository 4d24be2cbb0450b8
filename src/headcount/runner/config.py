"""Study configs: YAML files validated by the pydantic model of their study type.

A config file names its type under ``study:``; the rest is the type's own settings::

    study: transfer          # a registered study type (or "package.module:type" to import one)
    name: my first study     # optional, the report's title
    ...                      # the type's settings

Files are read with ``yaml.SafeLoader`` only. Errors are one line that names the file, the line
and the key: ``study.yaml, line 7: 'tasks[1].seed': Input should be a valid integer (got 'x')``;
unknown keys, wrong types, missing keys and duplicated keys are all refused.
"""

from __future__ import annotations

import difflib
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import HeadcountError
from ..tasks import resolve_task_ref
from .jobs import stable_hash
from .registry import StudyType, get_study_type
from .schema import SEED_FIELDS, ConfigSection, StudyConfig

__all__ = ["SEED_FIELDS", "ConfigSection", "LoadedConfig", "StudyConfig", "config_hash", "format_validation_error",
           "load_study_config", "load_yaml_with_lines", "parse_study_config", "task_ref"]

# -------------------------------------------------------------------------------------------
# YAML with line numbers
# -------------------------------------------------------------------------------------------
def _walk(node: yaml.Node, path: tuple, lines: dict[tuple, int], where: str) -> None:
    """Record the (1-based) line of every mapping key and sequence item; refuse duplicate keys."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            if key in seen:
                raise HeadcountError(f"{where}, line {line}: key {_dotted(path + (key,))!r} appears twice "
                                     f"(first on line {seen[key]})")
            seen[key] = line
            lines[path + (key,)] = line
            _walk(value_node, path + (key,), lines, where)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), lines, where)


def load_yaml_with_lines(text: str, where: str = "<config>") -> tuple[Any, dict[tuple, int]]:
    """Parse YAML safely and return ``(data, lines)``; ``lines[("a", 0, "b")]`` is a key's line.

    Raises:
        HeadcountError: a syntax error (with its line) or a duplicated key.

    >>> data, lines = load_yaml_with_lines("a: 1\\nb:\\n  - c: 2\\n")
    >>> data, lines[("b", 0, "c")]
    ({'a': 1, 'b': [{'c': 2}]}, 3)
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        lines: dict[tuple, int] = {(): node.start_mark.line + 1}
        _walk(node, (), lines, where)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f", line {mark.line + 1}" if mark is not None else ""
        problem = e.problem or e.context or "invalid YAML"
        raise HeadcountError(f"{where}{line}: {problem}") from None
    except yaml.YAMLError as e:
        raise HeadcountError(f"{where}: invalid YAML: {str(e).splitlines()[0]}") from None
    finally:
        loader.dispose()
    return data, lines


def _dotted(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


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
    """Validate a study config given as YAML text (see :func:`load_study_config`).

    >>> parse_study_config("study: nonesuch\\n")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.errors.HeadcountError: <config>, line 1: unknown study type 'nonesuch'...
    """
    data, lines = load_yaml_with_lines(text, where)
    if not isinstance(data, dict):
        raise HeadcountError(f"{where}: a study config is a mapping with a 'study:' key (got {type(data).__name__})")
    if "study" not in data:
        raise HeadcountError(f"{where}, line 1: missing key 'study' (the study type)")
    if not isinstance(data["study"], str):
        raise HeadcountError(f"{where}, line {lines[('study',)]}: 'study' must be a study type name")
    try:
        study_type = get_study_type(data["study"])
    except HeadcountError as e:
        raise HeadcountError(f"{where}, line {lines[('study',)]}: {e}") from None
    model = study_type.config_model
    context = {"base_dir": Path(base_dir) if base_dir is not None else Path.cwd()}
    try:
        config = model.model_validate(data, context=context)
    except ValidationError as e:
        raise HeadcountError(format_validation_error(e, data, lines, where, model)) from None
    return LoadedConfig(study_type, config, text, None, config_hash(config))


def load_study_config(path: str | os.PathLike) -> LoadedConfig:
    """Read and validate a study config file.

    The study type's model validates the mapping with a pydantic context
    ``{"base_dir": <the file's directory>}``, so validators can resolve relative paths.

    Args:
        path: a YAML file whose ``study:`` key names a registered study type.

    Returns:
        A :class:`LoadedConfig` (type, frozen config model, text, hash).

    Raises:
        HeadcountError: unreadable file, bad YAML, unknown study type, or a validation error,
            as one line naming the file, the line and the key.

    >>> load_study_config("/nonexistent.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.errors.HeadcountError: cannot read /nonexistent.yaml: ...
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

    The rule of :func:`headcount.tasks.resolve_task_ref` (a registered name wins; a path ends in
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
