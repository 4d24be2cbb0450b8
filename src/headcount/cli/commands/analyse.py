"""`headcount score` and `headcount prune`."""

from __future__ import annotations

import gc
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import typer

from headcount.cli.commands import app, bounded, setting
from headcount.cli.commands.options import IMPORTANCE_DATA, MODEL, SCORER_OPTIONS, SCORING, TASK, WHERE, takes
from headcount.data.fingerprint import run_identity
from headcount.data.tasks import get_task
from headcount.importance.pruning import PruneConfig
from headcount.importance.scoring import scorer_names
from headcount.importance.scores import NORMALIZE
from headcount.importance.settings import (
    DataConfig,
    PruneSettings,
    ScoreSettings,
    prune_methods,
    settings_from,
)
from headcount.runtime.bounds import EXAMPLES
from headcount.runtime.io import ACTIVE_OUTS, check_out_path, prepare_out

SCORE_FILES = ("scores.json", "heads.png")
PRUNE_FILES = ("mask.json", "trace.csv", "curve.png")
UNIT_HELP = ("heads (query heads) | kv-groups (decoders with grouped-query attention: a key/value group and its query "
             "heads, scored as their sum; pruning them whole shrinks the KV cache)")

#: set (to anything but "" or 0) to make ``headcount score`` print one ``timing:`` line of its phases
TIMING_ENV = "HEADCOUNT_TIMING"


def _since_start() -> float | None:
    """Seconds since this process started (Linux: /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def _imported_for_good():
    """Imports that make objects living as long as the process (~10^6 for transformers' modules):
    the cyclic garbage collector is off while they are made (it would walk them again and again),
    and in a process that froze its objects (the console script: [`headcount.cli.app.main`][headcount.cli.app.main]) they
    are frozen too, so that no later collection walks them (~0.7 s of a command on 2 busy cores)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count():
            gc.freeze()
        if enabled:
            gc.enable()


@contextmanager
def _naming_out_on_interrupt(out):
    """A Ctrl-C before ``prepare_out`` has taken ``--out`` names it in its line too (the line of
    [`headcount.cli.app.main`][headcount.cli.app.main] names the last of ``ACTIVE_OUTS``), as it does once the run has it:
    whatever ``--out`` holds is kept, untouched."""
    try:
        yield
    except KeyboardInterrupt:
        if not ACTIVE_OUTS:
            ACTIVE_OUTS.append(Path(out))
        raise


def _heavy_imports():
    """What a command that loads a checkpoint imports: [`headcount.cli.api`][headcount.cli.api] and what loading runs."""
    with _imported_for_good():
        # lazy: transformers, matplotlib: loaded when a command runs, not for --help; and what loading a
        # checkpoint imports (transformers.modeling_utils: torch.distributed, dynamo, ~2 s)
        import transformers.modeling_utils  # noqa: F401

        from headcount.cli import api
    return api


class _Phases:
    """Wall time of a command's phases: ``mark(name)`` ends one (``$HEADCOUNT_TIMING`` shows them)."""

    def __init__(self, start: str):
        self.before = _since_start()  # interpreter start and the CLI's imports, up to the command
        self.start, self.last, self.parts = start, time.perf_counter(), {}

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.parts[name] = self.parts.get(name, 0.0) + now - self.last
        self.last = now

    def line(self) -> str:
        parts = ([(self.start, self.before)] if self.before is not None else []) + list(self.parts.items())
        total = sum(t for _, t in parts)
        return "timing: " + ", ".join(f"{name} {t:.2f} s" for name, t in parts) + f"; total {total:.2f} s"


@app.command()
@takes(IMPORTANCE_DATA, SCORING, SCORER_OPTIONS, WHERE)
def score(
    model: str = MODEL,
    task: str = TASK,
    objective: str = setting(ScoreSettings, "objective", help="task | mlm | embedding (SimCSE: dropout views, "
                                                                  "no labels) | embedding-supervised (text pairs) | "
                                                                  "lm (a decoder's next-token loss)"),
    split: str = setting(DataConfig, "split", help="split to score on (default: the task's train split)"),
    data: DataConfig = None,
    method: str = setting(ScoreSettings, "method", help=" | ".join(scorer_names())),
    normalize: str = setting(ScoreSettings, "normalize", help=" | ".join(NORMALIZE)),
    scoring: dict = None,
    unit: str = setting(ScoreSettings, "unit", help=UNIT_HELP),
    options: dict = None,
    out: Path = typer.Option(..., "--out", "-o"),
    force: bool = typer.Option(False, "--force", help="replace an earlier score run with other settings in --out"),
    where: dict = None,
):
    """Importance of every head and MLP -> scores.json, heads.png."""
    phases = _Phases("start+CLI")
    # the settings are checked before the imports (seconds): a bad value is refused at once
    how = settings_from(ScoreSettings, dict(objective=objective, method=method, normalize=normalize, unit=unit,
                                            options=options, **scoring))
    data = replace(data, split=split)
    score_command = _heavy_imports().score_command
    phases("imports")

    t = get_task(task)  # looked up once: the identity and the command take the Task
    # the run's identity: every setting as resolved (0.x keeps no earlier versions' identities)
    identity = run_identity({"model": model, "task": task, **how.identity(), **asdict(data)}, model, t)
    with prepare_out(out, "score", identity=identity, outputs=SCORE_FILES, force=force, echo=typer.echo) as guard:
        summary = score_command(model, t, how, data, guard.staging(), echo=typer.echo, mark=phases, **where)
        guard.commit()
    typer.echo(f"wrote {out}/scores.json and {out}/heads.png ({summary['n_examples']} examples, "
               f"{summary['seconds']:.1f} s)")
    if os.environ.get(TIMING_ENV, "") not in ("", "0"):
        typer.echo(phases.line())


@app.command()
@takes(IMPORTANCE_DATA, SCORING, WHERE)
def prune(
    model: str = MODEL,
    task: str = TASK,
    objective: str = setting(PruneSettings, "objective", help="task | mlm (metric: masked-token accuracy) | lm (decoders; metric: next-token "
                                    "accuracy) | embedding (retrieval accuracy of "
                                    "the second dropout view) | embedding-supervised (cosine Pearson/Spearman)"),
    threshold: float = setting(PruneConfig, "threshold", help="stop when metric < threshold x unpruned metric"),
    step: float = setting(PruneConfig, "step", help="fraction of heads removed per step"),
    step_of: str = setting(PruneConfig, "step_of", help="remaining | total (the anchors: total)"),
    mlps: bool = typer.Option(False, "--mlps", help="also prune MLPs (Prasanna schedule; default: heads only)"),
    one_shot: bool = setting(PruneConfig, "one_shot", "--one-shot", help="score once instead of at every step"),
    unit: str = setting(PruneConfig, "unit", help=UNIT_HELP),
    method: str = setting(PruneSettings, "method", help=" | ".join(prune_methods())),
    normalize: str = setting(PruneSettings, "normalize", help=" | ".join(NORMALIZE)),
    scoring: dict = None,
    importance_split: str = setting(PruneSettings, "importance_split", help="default: train (the anchors: validation)"),
    stop_split: str = setting(PruneSettings, "stop_split", help="default: the task's validation split"),
    data: DataConfig = None,
    max_eval_examples: int = setting(DataConfig, "max_examples", "--max-eval-examples",
                                     help="examples for the stop rule", callback=bounded(EXAMPLES)),
    out: Path = typer.Option(..., "--out", "-o"),
    force: bool = typer.Option(False, "--force", help="replace an earlier prune run with other settings in --out"),
    where: dict = None,
):
    """Iterative pruning to a threshold -> mask.json, trace.csv, curve.png."""
    check_out_path(out)
    # the settings are checked before the imports (seconds): a bad value is refused at once
    how = settings_from(PruneSettings, dict(objective=objective, method=method, normalize=normalize,
                                            importance_split=importance_split, stop_split=stop_split, **scoring))
    loop = PruneConfig(threshold=threshold, step=step, step_of=step_of, schedule="prasanna" if mlps else "heads",
                       one_shot=one_shot, unit=unit)
    importance = data
    stop = replace(importance, max_examples=max_eval_examples)
    with _naming_out_on_interrupt(out):  # the imports and the fingerprints take seconds before --out is taken
        prune_command = _heavy_imports().prune_command
        t = get_task(task)  # looked up once: the identity and the command take the Task
        # the run's identity: every setting as resolved (0.x keeps no earlier versions' identities)
        identity = run_identity({"model": model, "task": task, **how.identity(), "loop": asdict(loop),
                                 "importance": asdict(importance), "stop": asdict(stop)}, model, t)
    with prepare_out(out, "prune", identity=identity, outputs=PRUNE_FILES, force=force, echo=typer.echo) as guard:
        result = prune_command(model, t, how, loop, importance, stop, guard.staging(), echo=typer.echo, **where)
        guard.commit()
    typer.echo(f"wrote {out}/mask.json: {result.mask.n_heads_kept} heads and {result.mask.n_mlps_kept} MLPs kept; "
               f"metric {result.mask.meta['metric']:.4f} (unpruned {result.full_metric:.4f})")
