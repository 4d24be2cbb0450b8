"""`headcount explore`: one self-contained HTML page to explore heads (importance, survival,
pattern class, attention) of a run directory, or of a model on a task."""

from __future__ import annotations

from pathlib import Path

import typer

from headcount.cli.commands import app, bounded
from headcount.cli.commands.core import MODEL_HELP
from headcount.experiments.explorer.data import DEFAULT_EXAMPLES, EXAMPLES_SHOWN
from headcount.runtime.device import DEVICE_HELP
from headcount.runtime.errors import HeadcountError

TASK_HELP = "with --model: a registered task or a task YAML file (the attention is shown on its dev examples)"


@app.command()
def explore(
    run: Path = typer.Argument(None, help="a study's run directory (transfer or lottery)", show_default=False),
    model: str = typer.Option(None, "--model", "-m", help=f"instead of RUN: {MODEL_HELP}"),
    task: str = typer.Option(None, "--task", "-t", help=TASK_HELP),
    scores: list[Path] = typer.Option(None, "--scores", help="with --model: a scores.json to show (repeatable)"),
    mask: list[Path] = typer.Option(None, "--mask", help="with --model: a mask.json to show (repeatable)"),
    text: list[str] = typer.Option(None, "--text", help="with --model: your own example text instead of the task's "
                                                          "dev examples (repeatable, at most 16; without --task: "
                                                          "the attention on them alone)"),
    examples: int = typer.Option(DEFAULT_EXAMPLES, "--examples", "-n", callback=bounded(EXAMPLES_SHOWN),
                                 help="dev examples whose attention the page holds (each cut to 128 tokens)"),
    job: str = typer.Option(None, "--job", help="with RUN: the finetune job whose model gives the attention "
                                                "(default: the first finished one that kept its model)"),
    out: Path = typer.Option(..., "--out", "-o", help="the HTML file to write (e.g. explore.html)"),
    force: bool = typer.Option(False, "--force", help="replace an explorer page of another run or settings"),
    device: str = typer.Option(None, "--device", help=DEVICE_HELP),
):
    """An interactive page of the heads: score grids, masks, survival, pattern classes, attention -> one HTML file."""
    from headcount.experiments.explorer import explore as make
    from headcount.experiments.explorer.output import check_out

    if run is not None and model is not None:
        raise HeadcountError("give a run directory or --model, not both")
    if run is None and model is None:
        raise HeadcountError("give a run directory (headcount explore RUN --out explore.html) or --model with --task "
                             "or --text")
    check_out(out, None, force)  # a directory or a foreign file is refused before anything loads
    explorer = make(run, model=model, task=task, scores=scores or (), masks=mask or (),
                    texts=list(text) if text else None, examples=examples, job=job, device=device)
    from headcount.experiments.explorer.output import write_page

    text_ = explorer.html()
    path = write_page(out, text_, explorer.identity, force=force, echo=typer.echo)
    page = explorer.page
    attention = page.get("attention")
    shown = (f"attention of {attention['label']}" if attention else "no attention examples")
    typer.echo(f"wrote {path}: {page['layers']} layers x {page['heads']} heads, {len(page['quantities'])} quantities, "
               f"{shown}; {len(text_.encode()) / 1e6:.2f} MB")
