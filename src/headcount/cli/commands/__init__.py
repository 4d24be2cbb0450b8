"""CLI subcommands, one small module per area; each registers its functions on ``app`` when imported.

The modules are imported lazily: ``headcount --help`` lists [`COMMANDS`][headcount.cli.commands.COMMANDS]
without importing any (they import torch, scipy, transformers: seconds of CPU), and a command's
module is imported when the command line names it ([`LazyGroup`][headcount.cli.commands.LazyGroup]).
"""

from __future__ import annotations

import importlib

import typer
from typer.core import TyperCommand, TyperGroup

from headcount.runtime.bounds import Bound

#: every command: the module that registers it and its one-line help, in the order ``--help``
#: lists them (``tests/cli/test_help.py`` checks both against the registered commands)
COMMANDS = {
    "info": ("core", "Layers, heads, parameters, and what is pruned."),
    "shrink": ("core", "Physically remove the heads and MLPs a mask removes; write a reloadable checkpoint."),
    "finetune": ("train", "Fine-tune (or retrain a masked subnetwork) -> model/, metrics.json. Run again to resume."),
    "magnitude": ("train", "Magnitude pruning (the paper's search, IMP, or one shot) -> weight_mask.safetensors, "
                           "trace.csv."),
    "tasks": ("data", "Registered tasks: name, kind, metric, split sizes (documented; offline ones need `data fetch`)."),
    "study": ("study", "Run a study (resumable): every job of the config, then the report."),
    "report": ("study", "Redraw report.html, results/*.csv and figures/ of a run from its saved results."),
    "score": ("analyse", "Importance of every head and MLP -> scores.json, heads.png."),
    "prune": ("analyse", "Iterative pruning to a threshold -> mask.json, trace.csv, curve.png."),
    "demo": ("demo", "Run the demo study on the offline default model and data; print where the report is."),
    "export": ("export", "A pruned (or unpruned) model, task head included, that runs without headcount: ONNX, "
                         "plain transformers or GGUF."),
    "explore": ("explore", "An interactive page of the heads: score grids, masks, survival, pattern classes, "
                           "attention -> one HTML file."),
    "kv-budget": ("kvbudget", "Per-KV-head KV cache budget (full cache or sink + window) under a memory target -> "
                              "budget.json."),
    "kv-eval": ("kveval", "Measure a KV budget beside the full cache, the uniform window and random heads -> "
                          "kv-eval.csv, kv-eval.png."),
    "data": ("data", "Offline data: fetch the real-text sets behind the offline/* tasks."),
    "patterns": ("patterns", "Attention pattern classes (vertical, diagonal, vertical+diagonal, block, heterogeneous)."),
}


def load_commands(names=None) -> None:
    """Import the modules that register ``names`` (default: every command)."""
    for module in dict.fromkeys(COMMANDS[n][0] for n in (COMMANDS if names is None else names)):
        importlib.import_module(f"headcount.cli.commands.{module}")


class LazyGroup(TyperGroup):
    """The top-level group: lists [`COMMANDS`][headcount.cli.commands.COMMANDS] as stubs (name and help)
    for ``--help``; the command the line names is imported and built when it is resolved."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name in self.commands or name not in COMMANDS:
            return super().get_command(ctx, name)
        return TyperCommand(name, help=COMMANDS[name][1])  # what --help shows; resolve_command runs the real one

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name in COMMANDS and name not in self.commands:
            load_commands([name])
            real = typer.main.get_group(app).commands.get(name)
            if real is not None:
                self.add_command(real, name)
        return super().resolve_command(ctx, args)


app = typer.Typer(
    cls=LazyGroup,
    name="headcount",
    help="Which attention heads, KV groups and MLPs of BERT-family encoders and decoder LLMs matter: score, prune, retrain, study, budget the KV cache.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    """(A group callback: typer builds the group before any command module has registered a command.)"""


def setting(cls, field: str, *names: str, **kwargs):
    """A typer option whose default is the one ``cls`` (a settings dataclass or pydantic model)
    declares for ``field``: the command line never restates a library default. The option
    remembers where its default comes from (``tests/importance/test_settings.py`` checks every option).
    """
    from headcount.importance.settings import default_of  # (imports torch: only when a command module loads)

    option = typer.Option(default_of(cls, field), *names, **kwargs)
    option.headcount_setting = (cls, field)
    return option


def bounded(bound: Bound):
    """The ``callback=`` of a numeric option that no settings class checks: a value outside
    ``bound`` (a [`Bound`][headcount.runtime.bounds.Bound]) is refused while the command line is read, before the
    command runs, in one line that names the option (``--seed must be an integer in 0..4294967295,
    got -1``). None (an option left out) passes.
    """

    def check(param: typer.CallbackParam, value):
        if value is None:
            return value
        name = next((o for o in param.opts if o.startswith("--")), f"--{param.name}")
        return bound.check(value, name)

    return check
