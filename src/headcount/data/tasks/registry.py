"""The task registry: names -> task factories; task references (a name or a YAML path); closest-name suggestions.

How a string names a task is decided in one place, ``resolve_task_ref``: a registered name
wins; a path is a path only when it ends in ``.yaml`` / ``.yml`` or starts with ``./``, ``../``,
``/`` or ``~``. So ``glue/mnli`` stays the GLUE task even beside a ``glue/mnli`` data folder.
"""

from __future__ import annotations

import difflib
import inspect
import os
from functools import partial
from pathlib import Path
from typing import Callable

from headcount.data.tasks.base import Task
from headcount.data.tasks.glue import GLUE_TASKS, glue_task
from headcount.data.tasks.local import load_task_yaml
from headcount.data.tasks.niah import niah_task
from headcount.data.tasks.offline import OFFLINE_TASKS, offline_task
from headcount.runtime.errors import HeadcountError

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


#: how a path starts (the rule of ``resolve_task_ref``); a bare name never is one
_PATH_STARTS = tuple({f".{os.sep}", f"..{os.sep}", os.sep, "./", "../", "/", "~"})


def is_task_path(value: str) -> bool:
    """Whether ``value`` is read as a task YAML path rather than a name (registered names aside).

    >>> is_task_path("glue/mnli"), is_task_path("tasks/mine.yaml"), is_task_path("./mine")
    (False, True, True)
    """
    return value.lower().endswith((".yaml", ".yml")) or value.startswith(_PATH_STARTS)


def resolve_task_ref(value, base_dir: str | os.PathLike | None = None, *, check: bool = False) -> str:
    """The task ``value`` refers to: a registered name, or the absolute path of a task YAML.

    The rule, the same everywhere (configs, CLI, API): a registered name wins; otherwise a
    string that ends in ``.yaml`` / ``.yml`` or starts with ``./``, ``../``, ``/`` or ``~`` is
    a path, relative to ``base_dir`` (a config's folder; default: the working directory), and
    must be an existing file; anything else is an unknown name. A folder that happens to be
    called like a task (``glue/mnli`` beside a config) changes nothing.

    Args:
        value: a name from ``list_tasks`` or a task YAML path.
        base_dir: what relative paths are relative to.
        check: also build the task ([`get_task`][headcount.data.tasks.registry.get_task]), so that a bad task YAML or a GLUE folder
            without its evaluation split fails here, e.g. while a study config is validated.

    Returns:
        The registered name unchanged, or the file's absolute path.

    Raises:
        HeadcountError: unknown name (with the closest registered one), missing file, and with
            ``check`` whatever building the task refuses.

    >>> resolve_task_ref("glue/mnli", base_dir="/anywhere")
    'glue/mnli'
    """
    name = str(value)
    if name in _REGISTRY:
        ref = name
    elif is_task_path(name):
        p = Path(name).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = Path(base_dir).expanduser() / p
        if not p.exists():
            raise HeadcountError(f"task file not found: {p}")
        if not p.is_file():
            raise HeadcountError(f"not a task YAML file: {p} (a folder)")
        ref = str(p.resolve())
    else:
        raise HeadcountError(f"unknown task {name!r}{_suggestion(name)}: `headcount tasks` lists them "
                             "(a task YAML path also works: it ends in .yaml or starts with ./ or /)")
    if check:
        get_task(ref)
    return ref


def get_task(name_or_yaml_path, *, data_dir=None, data_files=None) -> Task:
    """A task by registered name (``glue/sst2``, ``offline/movies``) or task YAML path.

    Which one a string is follows ``resolve_task_ref`` (relative paths: from the working
    directory).

    Args:
        name_or_yaml_path: a name from ``list_tasks``, a path to a task YAML, or a Task.
        data_dir: for GLUE tasks: a folder of local files, in the hub's layout
            (``<split>.parquet|jsonl|csv|tsv``) or the GLUE download's (``train.tsv``, ``dev.tsv``).
        data_files: for GLUE tasks: ``{split: path}`` in either schema.

    Raises:
        HeadcountError: unknown name (with the closest registered name), missing YAML file.

    >>> get_task("glue/sst2").labels
    ('negative', 'positive')
    """
    if isinstance(name_or_yaml_path, Task):
        return name_or_yaml_path
    name = resolve_task_ref(name_or_yaml_path)
    if name in _REGISTRY:
        kwargs = {k: v for k, v in (("data_dir", data_dir), ("data_files", data_files)) if v is not None}
        factory = _REGISTRY[name]
        if kwargs:
            params = inspect.signature(factory).parameters
            if not all(k in params for k in kwargs):
                raise HeadcountError(f"task {name} does not take data_dir / data_files (GLUE tasks do)")
        return factory(**kwargs)
    return load_task_yaml(name)


def _suggestion(name: str) -> str:
    names = list_tasks()
    best = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    if not best:  # a bare name: compare with the part after the slash
        tails = {n.split("/", 1)[-1]: n for n in names}
        near = difflib.get_close_matches(name.split("/")[-1].lower(), list(tails), n=1, cutoff=0.6)
        best = [tails[near[0]]] if near else []
    return f" (did you mean {best[0]!r}?)" if best else ""


def _register_builtin() -> None:
    for name in GLUE_TASKS:
        register_task(name, partial(glue_task, name))
    for name in OFFLINE_TASKS:
        register_task(name, partial(offline_task, name))
    register_task("offline/niah", niah_task)  # needle in a haystack over the offline texts


_register_builtin()
__all__ = ["get_task", "list_tasks", "register_task", "resolve_task_ref", "is_task_path"]
