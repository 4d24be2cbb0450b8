"""Options that several commands take, each declared once, and the decorator that adds them.

typer builds a command's options from its function's signature, so two commands that take the
same options would each list them. Instead a command names the groups it takes:

    @app.command()
    @takes(TRAINING)
    def finetune(model: str = MODEL, ..., train: TrainConfig = None):
        ...                       # `train` is the TrainConfig built from the group's options

[`takes`][headcount.cli.commands.options.takes] puts the group's options into the signature typer
reads (``__signature__``, in the place of the parameter the group is built into) and, when the
command runs, builds that parameter from their values. The options themselves (``typer.Option``
values, or [`setting`][headcount.cli.commands.setting] ones whose default is the library's) are
module constants here: a command that takes one alone uses the constant (``model: str = MODEL``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from headcount.cli.commands import bounded, setting
from headcount.cli.commands.core import MODEL_HELP
from headcount.importance.scorer_options import declared, flag
from headcount.importance.scoring import get_scorer, scorer_names
from headcount.importance.settings import DataConfig, ScoreSettings
from headcount.runtime.bounds import TOKENS_PER_BATCH, Bound
from headcount.runtime.device import DEVICE_HELP, PRECISION_HELP, TOKENS_HELP, trainer_settings
from headcount.train import TrainConfig

TASK_HELP = "a registered task (glue/sst2, offline/movies, ...; see `headcount tasks`) or a task YAML file"
BATCH_ORDER_HELP = ("order of the importance batches: auto (file for --accumulate cumulative, as run_bertology and "
                    "Prasanna et al.; length otherwise) | file (the split's order, fixed-size batches) | length "
                    "(grouped by length, longest first: less padding)")
ACCUMULATE_HELP = ("gradient: per-batch (sum of each batch's |gradient|) | cumulative (sum of the |running gradient|, "
                   "as run_bertology and Prasanna et al.); default: the library's (headcount.importance.scores.DEFAULT_ACCUMULATE)")

# --- single options -------------------------------------------------------------------------------
MODEL = typer.Option("offline", "--model", "-m", help=MODEL_HELP)
TASK = typer.Option("offline/movies", "--task", "-t", help=TASK_HELP)
DEVICE = typer.Option(None, "--device", help=DEVICE_HELP)
PRECISION = typer.Option(None, "--precision", help=PRECISION_HELP)


@dataclass(frozen=True)
class OptionGroup:
    """Options taken together, built into one parameter of the command.

    Attributes:
        into: the command's parameter that receives ``build(**values)``; the group's options
            appear where it stands in the command's signature.
        options: option name -> ``(annotation, typer option)``, in the order ``--help`` lists them.
        build: the options' values (by name) -> the value of ``into``.
    """

    into: str
    options: dict[str, tuple[Any, Any]]
    build: Callable[..., Any]


def takes(*groups: OptionGroup):
    """Adds the options of ``groups`` to a command (see the module's docstring).

    The command keeps its own parameters; each group's ``into`` parameter is replaced, in the
    signature typer reads, by the group's options, and filled when the command runs.
    """

    def decorate(fn):
        own = inspect.signature(fn, eval_str=True)
        params: list[inspect.Parameter] = []
        for p in own.parameters.values():
            group = next((g for g in groups if g.into == p.name), None)
            if group is None:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            else:
                params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=ann)
                           for name, (ann, option) in group.options.items()]
        missing = [g.into for g in groups if g.into not in own.parameters]
        if missing:
            raise TypeError(f"{fn.__name__} has no parameter {missing[0]!r} to build an option group into")

        @functools.wraps(fn)
        def command(**values):
            for g in groups:
                values[g.into] = g.build(**{name: values.pop(name) for name in g.options})
            return fn(**values)

        command.__signature__ = own.replace(parameters=params)  # what typer (inspect.signature) reads
        command.__annotations__ = {p.name: p.annotation for p in params}  # typing.get_type_hints
        del command.__wrapped__  # inspect.signature stops at __signature__; nothing should unwrap past it
        return command

    return decorate


def _train_config(device=None, precision=None, **values) -> TrainConfig:
    return TrainConfig(**values, **trainer_settings(device, precision))  # use_cpu, bf16; cuda:N -> the only visible GPU


#: what training commands (``finetune``, ``magnitude``) take: their TrainConfig and where it runs
TRAINING = OptionGroup("train", {
    "epochs": (float, setting(TrainConfig, "epochs")),
    "lr": (float, setting(TrainConfig, "lr", "--lr")),
    "batch_size": (int, setting(TrainConfig, "batch_size", "--batch-size")),
    "max_length": (int, setting(TrainConfig, "max_length", "--max-length")),
    "max_train_examples": (int, setting(TrainConfig, "max_train_examples", "--max-train-examples")),
    "max_eval_examples": (int, setting(TrainConfig, "max_eval_examples", "--max-eval-examples")),
    "save_steps": (int, setting(TrainConfig, "save_steps", "--save-steps",
                                help="checkpoint interval (what an interrupted run resumes from)")),
    "device": (str, DEVICE),
    "precision": (str, PRECISION),
}, _train_config)

#: the importance data of ``score`` and ``prune`` (``split``: each command's own)
IMPORTANCE_DATA = OptionGroup("data", {
    "max_examples": (int, setting(DataConfig, "max_examples", help="examples to score importance on")),
    "batch_size": (int, setting(DataConfig, "batch_size")),
    "max_length": (int, setting(DataConfig, "max_length")),
    "seed": (int, setting(DataConfig, "seed")),
}, DataConfig)

#: how ``score`` and ``prune`` sum gradients over batches (merged into their settings; ``--normalize``
#: is each command's own: their defaults differ)
SCORING = OptionGroup("scoring", {
    "accumulate": (str, typer.Option(None, "--accumulate", help=ACCUMULATE_HELP)),
    "batch_order": (str, setting(ScoreSettings, "batch_order", "--batch-order", help=BATCH_ORDER_HELP)),
}, dict)

#: where ``score`` and ``prune`` run: passed on as keyword arguments of their API call
WHERE = OptionGroup("where", {
    "device": (str, DEVICE),
    "precision": (str, PRECISION),
    "tokens_per_batch": (int, typer.Option(None, "--tokens-per-batch", help=TOKENS_HELP,
                                           callback=bounded(TOKENS_PER_BATCH))),
}, dict)


def _scorer_options() -> OptionGroup:
    """One flag per field of every registered scorer's options class (``Scorer.options``), in the
    registry's order: its default, help (``retrieval: ...``) and range read from the declaration
    ([`headcount.importance.scorer_options`][headcount.importance.scorer_options]). The group builds the
    ``options`` of [`ScoreSettings`][headcount.importance.settings.ScoreSettings]: the flags whose value
    is not their default (a flag left out is not passed, so a method is never handed another
    scorer's option; one given to a method that does not take it is refused there). A name two
    scorers declare is one flag, with the first one's default and help."""
    flags: dict[str, tuple[Any, Any]] = {}
    defaults: dict[str, Any] = {}
    for method in scorer_names():
        cls = get_scorer(method).options
        for name, (kind, default, check, help) in declared(cls).items():
            if name in flags:
                continue
            callback = bounded(check) if isinstance(check, Bound) else None  # refused while the line is read
            flags[name] = (kind, setting(cls, name, flag(name), help=f"{method}: {help}", callback=callback))
            defaults[name] = default

    def given(**values) -> dict:
        return {k: v for k, v in values.items() if v != defaults[k]}

    return OptionGroup("options", flags, given)


#: the scorers' own options of ``score`` (``--max-new-tokens``, ``--sink``, ...): a dict of the given ones
SCORER_OPTIONS = _scorer_options()
