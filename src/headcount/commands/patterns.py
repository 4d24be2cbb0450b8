"""`headcount patterns ...`: self-attention pattern classes (Kovaleva et al. 2019).

- ``train``: fit the small CNN of Prasanna et al. on user-labelled maps;
- ``synthetic``: write seeded synthetic labelled maps in the same format (to try ``train``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from . import app

patterns_app = typer.Typer(
    name="patterns",
    help="Attention pattern classes (vertical, diagonal, vertical+diagonal, block, heterogeneous).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(patterns_app, name="patterns")

MAPS_HELP = ".safetensors file with a float tensor 'maps' of shape [N, S, S] (S divisible by 4)"
LABELS_HELP = ".csv with a 'label' column, or a .json list; one class name (or 0-4) per map, in order"


@patterns_app.command("train")
def train(
    maps: Path = typer.Option(..., "--maps", help=MAPS_HELP),
    labels: Path = typer.Option(..., "--labels", help=LABELS_HELP),
    out: Path = typer.Option(..., "--out", "-o", help="output directory (CNN + metrics.json)"),
    epochs: int = typer.Option(30, "--epochs", help="passes over the training maps"),
    seed: int = typer.Option(0, "--seed", help="seed for initialisation, split and batch order"),
    holdout: float = typer.Option(0.2, "--holdout", help="fraction of each class held out for evaluation"),
    force: bool = typer.Option(False, "--force", help="replace an earlier run with other settings in --out"),
):
    """Train the pattern CNN on labelled attention maps; write model.safetensors, config.json, metrics.json."""
    from ..analysis.patterns import load_labelled_maps, save_pattern_cnn, train_pattern_cnn
    from ..errors import HeadcountError
    from ..io import atomic_write_json

    if epochs < 1:
        raise HeadcountError(f"--epochs must be >= 1, got {epochs}")
    if not 0 <= holdout <= 0.9:
        raise HeadcountError(f"--holdout must be in [0, 0.9], got {holdout}")
    from ..fingerprint import run_identity
    from ..io import check_out_path, prepare_out

    check_out_path(out)
    x, y = load_labelled_maps(maps, labels)
    if x.shape[1] % 4:
        raise HeadcountError(f"maps must have a side divisible by 4 (e.g. 32), got {x.shape[1]}")
    identity = run_identity({"maps": str(maps), "labels": str(labels), "epochs": epochs, "seed": seed,
                             "holdout": holdout}, files=[maps, labels])
    with prepare_out(out, "patterns train", identity=identity, own=("model.safetensors", "config.json", "metrics.json"),
                     force=force, echo=typer.echo) as guard:
        model, metrics = train_pattern_cnn(x, y, seed=seed, epochs=epochs, holdout=holdout)
        save_pattern_cnn(model, guard.staging())
        metrics = {**metrics, "maps": str(maps), "labels": str(labels), "size": int(x.shape[1])}
        atomic_write_json(guard.staging() / "metrics.json", metrics)
        guard.commit()
    held = metrics["heldout_accuracy"]
    held_txt = "n/a (no held-out maps)" if held is None else f"{held:.3f} on {metrics['n_heldout']} maps"
    typer.echo(f"wrote {out}: train accuracy {metrics['train_accuracy']:.3f} on {metrics['n_train']} maps, "
               f"held-out accuracy {held_txt}")


@patterns_app.command("synthetic")
def synthetic(
    out: Path = typer.Option(..., "--out", "-o", help="output directory (maps.safetensors, labels.csv)"),
    n_per_class: int = typer.Option(40, "--n-per-class", help="maps per class"),
    size: int = typer.Option(32, "--size", help="side of each map"),
    seed: int = typer.Option(0, "--seed", help="generator seed"),
    force: bool = typer.Option(False, "--force", help="replace an earlier run with other settings in --out"),
):
    """Write seeded synthetic labelled maps of the five classes (the format `patterns train` reads)."""
    import numpy as np

    from ..analysis.patterns import CLASSES, classify_patterns, save_labelled_maps, synthetic_attention_maps

    from ..errors import HeadcountError
    from ..io import prepare_out

    if n_per_class < 1 or size < 4:
        raise HeadcountError(f"--n-per-class must be >= 1 and --size >= 4, got {n_per_class} and {size}")
    s = synthetic_attention_maps(n_per_class=n_per_class, size=size, seed=seed)
    identity = {"n_per_class": n_per_class, "size": size, "seed": seed}
    with prepare_out(out, "patterns synthetic", identity=identity, own=("maps.safetensors", "labels.csv"),
                     force=force, echo=typer.echo) as guard:
        save_labelled_maps(s.maps, s.labels, guard.staging() / "maps.safetensors", guard.staging() / "labels.csv")
        guard.commit()
    rules = classify_patterns(s.maps, s.special_positions)
    acc = float(np.mean([CLASSES.index(lab) == y for lab, y in zip(rules.labels.tolist(), s.labels.tolist())]))
    typer.echo(f"wrote {out}: {len(s.labels)} maps {size}x{size} (specials at {list(s.special_positions)}); "
               f"rule-based classifier accuracy {acc:.3f}")
