"""Option groups: options several commands take are declared once and added by ``takes``."""

from __future__ import annotations

import inspect

import pytest
import typer
from typer.testing import CliRunner

from headcount.cli.app import app as headcount_app
from headcount.cli.commands.options import TRAINING, OptionGroup, takes


def _toy_app():
    group = OptionGroup("pair", {"a": (int, typer.Option(1, "--a")), "b": (str, typer.Option("x", "--b"))},
                        lambda a, b: (a, b))
    app = typer.Typer()
    seen = {}

    @app.command()
    @takes(group)
    def run(first: int = typer.Option(0, "--first"), pair: tuple = None, last: str = typer.Option("z", "--last")):
        seen.update(first=first, pair=pair, last=last)

    return app, run, seen


def test_a_group_is_built_into_its_parameter_from_the_options_given():
    app, _, seen = _toy_app()
    result = CliRunner().invoke(app, ["--b", "y", "--first", "3"])
    assert result.exit_code == 0, result.output
    assert seen == {"first": 3, "pair": (1, "y"), "last": "z"}


def test_the_group_options_stand_where_its_parameter_stood():
    _, run, _ = _toy_app()
    assert list(inspect.signature(run).parameters) == ["first", "a", "b", "last"]


def test_a_command_without_the_groups_parameter_is_refused_when_declared():
    with pytest.raises(TypeError, match="no parameter 'train'"):
        takes(TRAINING)(lambda out=None: None)


@pytest.mark.parametrize("command", ["finetune", "magnitude"])
def test_both_training_commands_take_every_training_option(command):
    callback = next(c.callback for c in headcount_app.registered_commands if c.callback.__name__ == command)
    assert set(TRAINING.options) <= set(inspect.signature(callback).parameters)
