"""`headcount patterns ...`: self-attention pattern classes (Kovaleva et al. 2019).

- ``train``: fit the CNN of Prasanna et al. on user-labelled maps (their net and recipe by default);
- ``synthetic``: write seeded synthetic labelled maps in the same format (to try ``train``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer

from headcount.cli.commands import app, bounded
from headcount.data.fingerprint import run_identity
from headcount.analysis.patterns import CNN_EPOCHS, MAP_SIDE, MAPS_PER_CLASS
from headcount.runtime.bounds import BATCH_SIZE, LEARNING_RATE, SEED
from headcount.runtime.atomic import atomic_write_json
from headcount.runtime.device import DEVICE_HELP, resolve_runtime
from headcount.runtime.errors import HeadcountError
from headcount.runtime.io import check_out_path, prepare_out

patterns_app = typer.Typer(
    name="patterns",
    help="Attention pattern classes (vertical, diagonal, vertical+diagonal, block, heterogeneous).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(patterns_app, name="patterns")

MAPS_HELP = (".safetensors file with a float tensor 'maps' [N, S, S] (one map per example and head; shorter maps "
             "zero-padded, centred, or top-left with an int tensor 'lengths' [N])")
LABELS_HELP = ".csv with a 'label' column, or a .json list; one class name (or 0-4) per map, in order"


@patterns_app.command("train")
def train(
    maps: Path = typer.Option(..., "--maps", help=MAPS_HELP),
    labels: Path = typer.Option(..., "--labels", help=LABELS_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="output directory (CNN + metrics.json)"),
    epochs: int | None = typer.Option(None, "--epochs", help="passes over the training maps (default 200, the paper's)",
                                      callback=bounded(CNN_EPOCHS)),
    seed: int = typer.Option(0, "--seed", help="seed for initialisation, split and batch order", callback=bounded(SEED)),
    holdout: float | None = typer.Option(
        None, "--holdout", help="fraction of each class held out; the best held-out epoch is kept (default 0.2)"),
    batch_size: int | None = typer.Option(None, "--batch-size", help="mini-batch size (default 64, the paper's)",
                                          callback=bounded(BATCH_SIZE)),
    lr: float | None = typer.Option(None, "--lr", help="Adam learning rate (default 1e-3, the paper's)",
                                    callback=bounded(LEARNING_RATE)),
    architecture: str | None = typer.Option(
        None, "--architecture", help="prasanna (default: the paper's six-convolution net) | small (headcount's earlier net)"),
    size: int | None = typer.Option(
        None, "--size", help="side maps are centre-padded to (longer ones cropped); default the largest map's, at least 32",
        callback=bounded(MAP_SIDE)),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
    force: bool = typer.Option(False, "--force", help="replace an earlier run with other settings in --out"),
):
    """Train the pattern CNN of Prasanna et al. on labelled attention maps; write model.safetensors, config.json, metrics.json.

    Defaults are the paper's recipe (their net, Adam 1e-3, batch 64, 200 epochs, stratified 20% held out, best held-out checkpoint); options left out take them from the library. On the CPU a seed gives the same CNN every time.
    """
    # scipy and the CNN (2.7 s): loaded when the command runs, not for --help
    from headcount.analysis.patterns import (
        ARCHITECTURES,
        load_labelled_maps,
        save_pattern_cnn,
        train_pattern_cnn,
    )

    if epochs is not None and epochs < 1:
        raise HeadcountError(f"--epochs must be >= 1, got {epochs}")
    if holdout is not None and not 0 <= holdout <= 0.9:
        raise HeadcountError(f"--holdout must be in [0, 0.9], got {holdout}")
    if batch_size is not None and batch_size < 1:
        raise HeadcountError(f"--batch-size must be >= 1, got {batch_size}")
    if lr is not None and not lr > 0:
        raise HeadcountError(f"--lr must be > 0, got {lr}")
    if architecture is not None and architecture not in ARCHITECTURES:
        raise HeadcountError(f"--architecture must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}")
    if size is not None and size < 4:
        raise HeadcountError(f"--size must be >= 4, got {size}")
    dev = resolve_runtime(device).device
    check_out_path(out)
    x, y = load_labelled_maps(maps, labels)
    given = {"epochs": epochs, "holdout": holdout, "batch_size": batch_size, "lr": lr, "architecture": architecture,
             "size": size}
    kwargs = {k: v for k, v in given.items() if v is not None}
    identity = run_identity({"maps": str(maps), "labels": str(labels), "seed": seed, **given, "device": dev.type},
                            files=[maps, labels])
    with prepare_out(out, "patterns train", identity=identity, outputs=("model.safetensors", "config.json", "metrics.json"),
                     force=force, echo=typer.echo) as guard:
        model, metrics = train_pattern_cnn(x, y, seed=seed, device=dev, **kwargs)
        save_pattern_cnn(model, guard.staging())
        metrics = {**metrics, "maps": str(maps), "labels": str(labels), "input_size": int(x.shape[1])}
        atomic_write_json(guard.staging() / "metrics.json", metrics)
        guard.commit()
    held = metrics["heldout_accuracy"]
    held_txt = ("n/a (no held-out maps)" if held is None
                else f"{held:.3f} on {metrics['n_heldout']} maps (best epoch {metrics['best_epoch']})")
    typer.echo(f"wrote {out}: {metrics['architecture']} CNN on {metrics['size']}x{metrics['size']} maps, "
               f"train accuracy {metrics['train_accuracy']:.3f} on {metrics['n_train']} maps, held-out accuracy {held_txt}")


@patterns_app.command("synthetic")
def synthetic(
    out: Path = typer.Option(..., "--out", "-o", help="output directory (maps.safetensors, labels.csv)"),
    n_per_class: int = typer.Option(40, "--n-per-class", help="maps per class", callback=bounded(MAPS_PER_CLASS)),
    size: int = typer.Option(32, "--size", help="side of each map", callback=bounded(MAP_SIDE)),
    seed: int = typer.Option(0, "--seed", help="generator seed", callback=bounded(SEED)),
    force: bool = typer.Option(False, "--force", help="replace an earlier run with other settings in --out"),
):
    """Write seeded synthetic labelled maps of the five classes (the format `patterns train` reads)."""
    # scipy (2.7 s): loaded when the command runs, not for --help
    from headcount.analysis.patterns import (
        CLASSES,
        classify_patterns,
        save_labelled_maps,
        synthetic_attention_maps,
    )

    if n_per_class < 1 or size < 4:
        raise HeadcountError(f"--n-per-class must be >= 1 and --size >= 4, got {n_per_class} and {size}")
    s = synthetic_attention_maps(n_per_class=n_per_class, size=size, seed=seed)
    identity = {"n_per_class": n_per_class, "size": size, "seed": seed}
    with prepare_out(out, "patterns synthetic", identity=identity, outputs=("maps.safetensors", "labels.csv"),
                     force=force, echo=typer.echo) as guard:
        save_labelled_maps(s.maps, s.labels, guard.staging() / "maps.safetensors", guard.staging() / "labels.csv")
        guard.commit()
    rules = classify_patterns(s.maps, s.special_positions)
    acc = float(np.mean([CLASSES.index(lab) == y for lab, y in zip(rules.labels.tolist(), s.labels.tolist())]))
    typer.echo(f"wrote {out}: {len(s.labels)} maps {size}x{size} (specials at {list(s.special_positions)}); "
               f"rule-based classifier accuracy {acc:.3f}")
