"""CLI subcommands, one small module per area; each registers its functions on ``app``."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="headcount",
    help="Which attention heads and MLPs of BERT-family encoders matter: score, prune, retrain, study.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
