"""The registry of study types.

A study type is a config model (a [`StudyConfig`][headcount.experiments.runner.config.StudyConfig] subclass), an
``expand_fn(config) -> list[Job]`` that turns a config into jobs (cheap and pure: no models are
loaded here), and optionally a ``report_fn(store, config) -> ReportContent`` that draws the
report from saved results.

Types are found, in order: already registered; ``"package.module:name"`` (the module is imported
and must register ``name``; a module beside the config is found without ``PYTHONPATH``: the
config's folder is appended to ``sys.path``, which the Ray executor sends its nodes); an entry
point of the group ``headcount.studies`` named ``name`` (a module to import, which registers the
type, or a callable to call). The built-in types
(``transfer``, ``lottery``, ``demo``) are entry points of headcount itself (``pyproject.toml``):
the registry knows no study by name, and a plugin package is found the same way.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from headcount.experiments.runner.schema import StudyConfig
from headcount.runtime.errors import HeadcountError

#: the entry-point group that study types (built-in ones too) are declared in
ENTRY_POINT_GROUP = "headcount.studies"

_REGISTRY: dict[str, "StudyType"] = {}


@dataclass(frozen=True)
class StudyType:
    """A registered study type.

    Attributes:
        name: what configs write under ``study:``.
        config_model: the pydantic model that validates the config.
        expand: ``expand_fn(config) -> list[Job]``.
        report: ``report_fn(store, config) -> ReportContent`` or None (a generic report).
        description: one line for listings.
    """

    name: str
    config_model: type[StudyConfig]
    expand: Callable[[Any], list]
    report: Callable[[Any, Any], Any] | None = None
    description: str = ""


def _origin(fn: Callable | None) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}" if fn else ""


def register_study(
    name: str,
    config_model: type[StudyConfig],
    expand_fn: Callable[[Any], list],
    report_fn: Callable[[Any, Any], Any] | None = None,
    *,
    description: str = "",
    replace: bool = False,
) -> StudyType:
    """Register a study type (typically at import time of the module that defines it).

    Registering the same functions again (a module imported twice) is harmless; registering other
    functions under a taken name needs ``replace=True``.

    Args:
        name: the type name configs use (``study: name``).
        config_model: a [`StudyConfig`][headcount.experiments.runner.schema.StudyConfig] subclass.
        expand_fn: config -> list of [`Job`][headcount.experiments.runner.jobs.Job].
        report_fn: (store, config) -> [`ReportContent`][headcount.experiments.report.ReportContent]; may be added
            later with [`register_report`][headcount.experiments.runner.registry.register_report].
        description: one line.
        replace: allow replacing a different registration.

    Returns:
        The [`StudyType`][headcount.experiments.runner.registry.StudyType].

    >>> class Cfg(StudyConfig):
    ...     n: int = 1
    >>> register_study("doc-example", Cfg, lambda c: []).name
    'doc-example'
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise HeadcountError(f"a study type name must be a non-empty string without ':' (got {name!r})")
    if not (isinstance(config_model, type) and issubclass(config_model, StudyConfig)):
        raise HeadcountError(f"study type {name!r}: config_model must subclass headcount.experiments.runner.StudyConfig")
    if not callable(expand_fn) or (report_fn is not None and not callable(report_fn)):
        raise HeadcountError(f"study type {name!r}: expand_fn and report_fn must be callable")
    old = _REGISTRY.get(name)
    if old is not None and not replace:
        same = (_origin(old.expand) == _origin(expand_fn)
                and f"{old.config_model.__module__}.{old.config_model.__qualname__}"
                == f"{config_model.__module__}.{config_model.__qualname__}")
        if not same:
            raise HeadcountError(f"study type {name!r} is already registered by {_origin(old.expand)}")
        report_fn = report_fn or old.report
    st = StudyType(name, config_model, expand_fn, report_fn, description)
    _REGISTRY[name] = st
    return st


def register_report(name: str, report_fn: Callable[[Any, Any], Any]) -> StudyType:
    """Attach (or replace) the report function of a registered study type.

    >>> class Cfg(StudyConfig):
    ...     pass
    >>> _ = register_study("doc-report", Cfg, lambda c: [])
    >>> register_report("doc-report", lambda store, config: None).report is not None
    True
    """
    st = get_study_type(name)
    new = StudyType(st.name, st.config_model, st.expand, report_fn, st.description)
    _REGISTRY[st.name] = new
    return new


def _entry_points() -> dict:
    """``{name: entry point}`` of the group ``headcount.studies`` (installed packages' metadata)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _import_study_module(module: str, folder: str | os.PathLike | None) -> None:
    """Import ``module``; when it is not found and ``folder`` (the config's) holds it, append
    ``folder`` to ``sys.path`` and import it from there. Appended, not prepended: a file in the
    config's folder never shadows an installed package (a ``yaml.py`` beside a config is not imported)."""
    top = module.split(".", 1)[0]
    where = Path(folder).resolve() if folder is not None else None
    try:
        importlib.import_module(module)
        return
    except ModuleNotFoundError as e:
        if where is None or e.name != top or not ((where / f"{top}.py").is_file() or (where / top).is_dir()):
            raise HeadcountError(f"cannot import study module {module!r}: {e}") from None
    except ImportError as e:
        raise HeadcountError(f"cannot import study module {module!r}: {e}") from None
    if str(where) not in sys.path:
        sys.path.append(str(where))
    importlib.invalidate_caches()
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise HeadcountError(f"cannot import study module {module!r} (from {where}): {e}") from None


def _discover(name: str, folder: str | os.PathLike | None = None) -> None:
    """Import what may register ``name``: the module of ``module:name`` (also from ``folder``,
    the config's), or its entry point."""
    if ":" in name:
        _import_study_module(name.split(":", 1)[0], folder)
        return
    ep = _entry_points().get(name)
    if ep is None:
        return
    try:
        obj = ep.load()
        if callable(obj) and not isinstance(obj, ModuleType):
            obj()
    except HeadcountError:
        raise
    except Exception as e:  # a broken plugin (or a built-in type whose module fails to import)
        raise HeadcountError(f"study type {name!r} failed to load ({ep.value}): {type(e).__name__}: {e}") from None


def study_types() -> list[str]:
    """Names of the registered study types and of the installed ones (entry points).

    >>> {"transfer", "lottery", "demo"} <= set(study_types())
    True
    """
    return sorted(set(_REGISTRY) | set(_entry_points()))


def get_study_type(name: str, folder: str | os.PathLike | None = None) -> StudyType:
    """The study type ``name`` (``"transfer"``, or ``"package.module:type"``), importing it if needed;
    ``folder``: the config's, where a module not found otherwise is looked for (see the module docstring).

    Raises:
        HeadcountError: unknown type, with the closest known names.

    >>> get_study_type("nonesuch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: unknown study type 'nonesuch'...
    """
    lookup = name.split(":", 1)[1] if ":" in name else name
    if lookup not in _REGISTRY:
        _discover(name, folder)
    if lookup not in _REGISTRY:
        known = study_types()
        close = difflib.get_close_matches(lookup, known, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else (f" (known: {', '.join(known)})" if known else "")
        raise HeadcountError(f"unknown study type {name!r}{hint}")
    return _REGISTRY[lookup]
