"""`headcount score` and `headcount prune`."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import typer

from ..device import DEVICE_HELP, PRECISION_HELP, TOKENS_HELP
from ..fingerprint import run_identity
from ..io import prepare_out
from ..pruning import PruneConfig
from ..scoring import METHODS, NORMALIZE
from ..settings import PRUNE_METHODS, DataConfig, PruneSettings, ScoreSettings, settings_from
from . import app, setting
from .core import MODEL_HELP

SCORE_FILES = ("scores.json", "heads.png")
PRUNE_FILES = ("mask.json", "trace.csv", "curve.png")
TASK_HELP = "a registered task (glue/sst2, offline/movies, ...; see `headcount tasks`) or a task YAML file"
ACCUMULATE_HELP = ("gradient: per-batch (sum of each batch's |gradient|) | cumulative (sum of the |running gradient|, "
                   "as run_bertology and Prasanna et al.); default: the library's (headcount.scoring.DEFAULT_ACCUMULATE)")
ACCUMULATE_HELP = ("gradient: per-batch (sum of each batch's |gradient|) | cumulative (sum of the |running gradient|, "
                   "as run_bertology and Prasanna et al.); default: the library's (headcount.scoring.DEFAULT_ACCUMULATE)")


@app.command()
def score(
    model: str = typer.Option("offline", "--model", "-m", help=MODEL_HELP),
    task: str = typer.Option("offline/movies", "--task", "-t", help=TASK_HELP),
    objective: str = setting(ScoreSettings, "objective", help="task | mlm | embedding (SimCSE: dropout views, "
                                                                  "no labels) | embedding-supervised (text pairs)"),
    split: str = setting(DataConfig, "split", help="split to score on (default: the task's train split)"),
    max_examples: int = setting(DataConfig, "max_examples", help="examples to score on"),
    batch_size: int = setting(DataConfig, "batch_size"),
    max_length: int = setting(DataConfig, "max_length"),
    method: str = setting(ScoreSettings, "method", help=" | ".join(METHODS)),
    normalize: str = setting(ScoreSettings, "normalize", help=" | ".join(NORMALIZE)),
    accumulate: str = typer.Option(None, "--accumulate", help=ACCUMULATE_HELP),
    seed: int = setting(DataConfig, "seed"),
    out: Path = typer.Option(..., "--out", "-o"),
    force: bool = typer.Option(False, "--force", help="replace an earlier score run with other settings in --out"),
    device: str = typer.Option(None, "--device", help=DEVICE_HELP),
    precision: str = typer.Option(None, "--precision", help=PRECISION_HELP),
    tokens_per_batch: int = typer.Option(None, "--tokens-per-batch", help=TOKENS_HELP),
):
    """Importance of every head and MLP -> scores.json, heads.png."""
    from ..api import score_command  # transformers, matplotlib: loaded when a command runs, not for --help

    how = settings_from(ScoreSettings, dict(objective=objective, method=method, normalize=normalize,
                                            accumulate=accumulate))
    data = DataConfig(split=split, max_examples=max_examples, batch_size=batch_size, max_length=max_length, seed=seed)
    settings = {"model": model, "task": task, **asdict(how), **asdict(data)}
    if accumulate is None:  # only when given: earlier runs keep their identity
        del settings["accumulate"]
    identity = run_identity(settings, model, task)
    with prepare_out(out, "score", identity=identity, own=SCORE_FILES, force=force, echo=typer.echo) as guard:
        summary = score_command(model, task, how, data, guard.staging(), echo=typer.echo, device=device,
                                precision=precision, tokens_per_batch=tokens_per_batch)
        guard.commit()
    typer.echo(f"wrote {out}/scores.json and {out}/heads.png ({summary['n_examples']} examples, "
               f"{summary['seconds']:.1f} s)")


@app.command()
def prune(
    model: str = typer.Option("offline", "--model", "-m", help=MODEL_HELP),
    task: str = typer.Option("offline/movies", "--task", "-t", help=TASK_HELP),
    objective: str = setting(PruneSettings, "objective", help="task | mlm (metric: masked-token accuracy) | embedding (retrieval accuracy of "
                                    "the second dropout view) | embedding-supervised (cosine Pearson/Spearman)"),
    threshold: float = setting(PruneConfig, "threshold", help="stop when metric < threshold x unpruned metric"),
    step: float = setting(PruneConfig, "step", help="fraction of heads removed per step"),
    step_of: str = setting(PruneConfig, "step_of", help="remaining | total (the anchors: total)"),
    mlps: bool = typer.Option(False, "--mlps", help="also prune MLPs (Prasanna schedule; default: heads only)"),
    one_shot: bool = setting(PruneConfig, "one_shot", "--one-shot", help="score once instead of at every step"),
    method: str = setting(PruneSettings, "method", help=" | ".join(PRUNE_METHODS)),
    normalize: str = setting(PruneSettings, "normalize", help=" | ".join(NORMALIZE)),
    accumulate: str = typer.Option(None, "--accumulate", help=ACCUMULATE_HELP),
    importance_split: str = setting(PruneSettings, "importance_split", help="default: train (the anchors: validation)"),
    stop_split: str = setting(PruneSettings, "stop_split", help="default: the task's validation split"),
    max_examples: int = setting(DataConfig, "max_examples", help="examples for importance"),
    max_eval_examples: int = setting(DataConfig, "max_examples", "--max-eval-examples",
                                     help="examples for the stop rule"),
    batch_size: int = setting(DataConfig, "batch_size"),
    max_length: int = setting(DataConfig, "max_length"),
    seed: int = setting(DataConfig, "seed"),
    out: Path = typer.Option(..., "--out", "-o"),
    force: bool = typer.Option(False, "--force", help="replace an earlier prune run with other settings in --out"),
    device: str = typer.Option(None, "--device", help=DEVICE_HELP),
    precision: str = typer.Option(None, "--precision", help=PRECISION_HELP),
    tokens_per_batch: int = typer.Option(None, "--tokens-per-batch", help=TOKENS_HELP),
):
    """Iterative pruning to a threshold -> mask.json, trace.csv, curve.png."""
    from ..api import prune_command  # transformers, matplotlib: loaded when a command runs, not for --help

    how = settings_from(PruneSettings, dict(objective=objective, method=method, normalize=normalize,
                                            accumulate=accumulate, importance_split=importance_split,
                                            stop_split=stop_split))
    loop = PruneConfig(threshold=threshold, step=step, step_of=step_of, schedule="prasanna" if mlps else "heads",
                       one_shot=one_shot)
    importance = DataConfig(max_examples=max_examples, batch_size=batch_size, max_length=max_length, seed=seed)
    stop = replace(importance, max_examples=max_eval_examples)
    # the run's identity: the options as given (the same record as earlier versions wrote)
    settings = dict(model=model, task=task, objective=objective, threshold=threshold, step=step, step_of=step_of,
                    mlps=mlps, one_shot=one_shot, method=method, normalize=normalize,
                    importance_split=importance_split, stop_split=stop_split, max_examples=max_examples,
                    max_eval_examples=max_eval_examples, batch_size=batch_size, max_length=max_length, seed=seed)
    if accumulate is not None:  # only when given: earlier runs keep their identity
        settings["accumulate"] = accumulate
    identity = run_identity(settings, model, task)
    with prepare_out(out, "prune", identity=identity, own=PRUNE_FILES, force=force, echo=typer.echo) as guard:
        result = prune_command(model, task, how, loop, importance, stop, guard.staging(), echo=typer.echo,
                               device=device, precision=precision, tokens_per_batch=tokens_per_batch)
        guard.commit()
    typer.echo(f"wrote {out}/mask.json: {result.mask.n_heads_kept} heads and {result.mask.n_mlps_kept} MLPs kept; "
               f"metric {result.mask.meta['metric']:.4f} (unpruned {result.full_metric:.4f})")
