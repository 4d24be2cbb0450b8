"""CLI subcommands, one small module per area; each registers its functions on ``app``."""

from __future__ import annotations

import typer

from headcount.importance.settings import default_of
from headcount.runtime.bounds import Bound

app = typer.Typer(
    name="headcount",
    help="Which attention heads, KV groups and MLPs of BERT-family encoders and decoder LLMs matter: score, prune, retrain, study, budget the KV cache.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def setting(cls, field: str, *names: str, **kwargs):
    """A typer option whose default is the one ``cls`` (a settings dataclass or pydantic model)
    declares for ``field``: the command line never restates a library default. The option
    remembers where its default comes from (``tests/importance/test_settings.py`` checks every option).
    """
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
