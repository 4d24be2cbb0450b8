"""The task registry: names -> task factories; YAML paths; closest-name suggestions."""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path
from typing import Callable

from ..errors import HeadcountError
from .base import Task

#: registered name -> a function that builds the task (cheap: no data is read)
_REGISTRY: dict[str, Callable[..., Task]] = {}


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Register a task factory under ``name`` (later registrations win).

    >>> register_task("my/sst2", lambda **kw: get_task("glue/sst2", **kw))
    >>> get_task("my/sst2").text_fields
    ('sentence',)
    >>> _ = _REGISTRY.pop("my/sst2")
    """
    _REGISTRY[name] = factory


def list_tasks() -> list[str]:
    """Registered task names (GLUE first, then the offline tasks, then any added later).

    >>> list_tasks()[:2]
    ['glue/cola', 'glue/sst2']
    """
    return list(_REGISTRY)


def get_task(name_or_yaml_path, *, data_dir=None, data_files=None) -> Task:
    """A task by registered name (``glue/sst2``, ``offline/movies``) or task YAML path.

    Args:
        name_or_yaml_path: a name from :func:`list_tasks`, a path to a task YAML, or a Task.
        data_dir: for GLUE tasks: a folder of local files in the GLUE schema
            (``<split>.parquet|jsonl|csv|tsv``) instead of the hub.
        data_files: for GLUE tasks: ``{split: path}`` in the GLUE schema.

    Raises:
        HeadcountError: unknown name (with the closest registered name), missing YAML file.

    >>> get_task("glue/sst2").labels
    ('negative', 'positive')
    """
    if isinstance(name_or_yaml_path, Task):
        return name_or_yaml_path
    name = str(name_or_yaml_path)
    if name in _REGISTRY:
        kwargs = {k: v for k, v in (("data_dir", data_dir), ("data_files", data_files)) if v is not None}
        factory = _REGISTRY[name]
        if kwargs:
            params = inspect.signature(factory).parameters
            if not all(k in params for k in kwargs):
                raise HeadcountError(f"task {name} does not take data_dir / data_files (GLUE tasks do)")
        return factory(**kwargs)
    p = Path(name).expanduser()
    if p.suffix.lower() in (".yaml", ".yml") or p.is_file():
        if not p.exists():
            raise HeadcountError(f"task file not found: {name}")
        from .local import load_task_yaml

        return load_task_yaml(p)
    raise HeadcountError(f"unknown task {name!r}{_suggestion(name)}: `headcount tasks` lists them (a task YAML path also works)")


def _suggestion(name: str) -> str:
    names = list_tasks()
    best = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    if not best:  # a bare name: compare with the part after the slash
        tails = {n.split("/", 1)[-1]: n for n in names}
        near = difflib.get_close_matches(name.split("/")[-1].lower(), list(tails), n=1, cutoff=0.6)
        best = [tails[near[0]]] if near else []
    return f" (did you mean {best[0]!r}?)" if best else ""


def _register_builtin() -> None:
    from functools import partial

    from .glue import GLUE_TASKS, glue_task
    from .offline import OFFLINE_TASKS, offline_task

    for name in GLUE_TASKS:
        register_task(name, partial(glue_task, name))
    for name in OFFLINE_TASKS:
        register_task(name, partial(offline_task, name))


_register_builtin()
__all__ = ["get_task", "list_tasks", "register_task"]
