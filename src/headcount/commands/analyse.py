"""`headcount score` and `headcount prune`."""

from __future__ import annotations

from pathlib import Path

import typer

from . import app
from .core import MODEL_HELP
from ..device import DEVICE_HELP, PRECISION_HELP, TOKENS_HELP

SCORE_FILES = ("scores.json", "heads.png")
PRUNE_FILES = ("mask.json", "trace.csv", "curve.png")
TASK_HELP = "a registered task (glue/sst2, offline/movies, ...; see `headcount tasks`) or a task YAML file"
ACCUMULATE_HELP = ("gradient: per-batch (sum of each batch's |gradient|) | cumulative (sum of the |running gradient|, "
                   "as run_bertology and Prasanna et al.); default: the library's (headcount.scoring.DEFAULT_ACCUMULATE)")


@app.command()
def score(
    model: str = typer.Option("offline", "--model", "-m", help=MODEL_HELP),
    task: str = typer.Option("offline/movies", "--task", "-t", help=TASK_HELP),
    objective: str = typer.Option("task", help="task | mlm"),
    split: str = typer.Option(None, help="split to score on (default: the task's train split)"),
    max_examples: int = typer.Option(1000, help="examples to score on"),
    batch_size: int = typer.Option(32),
    max_length: int = typer.Option(128),
    method: str = typer.Option("gradient", help="gradient | gradient-token | ablation | entropy | magnitude"),
    normalize: str = typer.Option("none", help="none | layer | layer+global"),
    accumulate: str = typer.Option(None, "--accumulate", help=ACCUMULATE_HELP),
    seed: int = typer.Option(0),
    out: Path = typer.Option(..., "--out", "-o"),
    force: bool = typer.Option(False, "--force", help="replace an earlier score run with other settings in --out"),
    device: str = typer.Option(None, "--device", help=DEVICE_HELP),
    precision: str = typer.Option(None, "--precision", help=PRECISION_HELP),
    tokens_per_batch: int = typer.Option(None, "--tokens-per-batch", help=TOKENS_HELP),
):
    """Importance of every head and MLP -> scores.json, heads.png."""
    from ..api import score_command
    from ..fingerprint import run_identity
    from ..io import prepare_out

    settings = dict(model=model, task=task, objective=objective, split=split, max_examples=max_examples,
                    batch_size=batch_size, max_length=max_length, method=method, normalize=normalize, seed=seed)
    if accumulate is not None:  # only when given: earlier runs keep their identity
        settings["accumulate"] = accumulate
    with prepare_out(out, "score", identity=run_identity(settings, model, task), own=SCORE_FILES, force=force,
                     echo=typer.echo) as guard:
        summary = score_command(**settings, out=guard.staging(), echo=typer.echo, device=device, precision=precision,
                                tokens_per_batch=tokens_per_batch)
        guard.commit()
    typer.echo(f"wrote {out}/scores.json and {out}/heads.png ({summary['n_examples']} examples, "
               f"{summary['seconds']:.1f} s)")


@app.command()
def prune(
    model: str = typer.Option("offline", "--model", "-m", help=MODEL_HELP),
    task: str = typer.Option("offline/movies", "--task", "-t", help=TASK_HELP),
    objective: str = typer.Option("task", help="task | mlm (metric: masked-token accuracy)"),
    threshold: float = typer.Option(0.9, help="stop when metric < threshold x unpruned metric"),
    step: float = typer.Option(0.1, help="fraction of heads removed per step"),
    step_of: str = typer.Option("remaining", help="remaining | total (the anchors: total)"),
    mlps: bool = typer.Option(False, "--mlps", help="also prune MLPs (Prasanna schedule)"),
    one_shot: bool = typer.Option(False, "--one-shot", help="score once instead of at every step"),
    method: str = typer.Option("gradient"),
    normalize: str = typer.Option("layer+global"),
    accumulate: str = typer.Option(None, "--accumulate", help=ACCUMULATE_HELP),
    importance_split: str = typer.Option(None, help="default: train (the anchors: validation)"),
    stop_split: str = typer.Option(None, help="default: the task's validation split"),
    max_examples: int = typer.Option(1000, help="examples for importance"),
    max_eval_examples: int = typer.Option(1000, help="examples for the stop rule"),
    batch_size: int = typer.Option(32),
    max_length: int = typer.Option(128),
    seed: int = typer.Option(0),
    out: Path = typer.Option(..., "--out", "-o"),
    force: bool = typer.Option(False, "--force", help="replace an earlier prune run with other settings in --out"),
    device: str = typer.Option(None, "--device", help=DEVICE_HELP),
    precision: str = typer.Option(None, "--precision", help=PRECISION_HELP),
    tokens_per_batch: int = typer.Option(None, "--tokens-per-batch", help=TOKENS_HELP),
):
    """Iterative pruning to a threshold -> mask.json, trace.csv, curve.png."""
    from ..api import prune_command
    from ..fingerprint import run_identity
    from ..io import prepare_out

    settings = dict(model=model, task=task, objective=objective, threshold=threshold, step=step,
                    step_of=step_of, mlps=mlps, one_shot=one_shot, method=method, normalize=normalize,
                    importance_split=importance_split, stop_split=stop_split, max_examples=max_examples,
                    max_eval_examples=max_eval_examples, batch_size=batch_size, max_length=max_length, seed=seed)
    if accumulate is not None:  # only when given: earlier runs keep their identity
        settings["accumulate"] = accumulate
    with prepare_out(out, "prune", identity=run_identity(settings, model, task), own=PRUNE_FILES, force=force,
                     echo=typer.echo) as guard:
        result = prune_command(**settings, out=guard.staging(), echo=typer.echo, device=device, precision=precision,
                               tokens_per_batch=tokens_per_batch)
        guard.commit()
    typer.echo(f"wrote {out}/mask.json: {result.mask.n_heads_kept} heads and {result.mask.n_mlps_kept} MLPs kept; "
               f"metric {result.mask.meta['metric']:.4f} (unpruned {result.full_metric:.4f})")
