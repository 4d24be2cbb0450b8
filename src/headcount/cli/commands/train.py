"""`headcount finetune` and `headcount magnitude`."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import typer

from headcount.cli.commands import app, bounded, setting
from headcount.cli.commands.options import MODEL, TASK, TRAINING, takes
from headcount.importance.magnitude import check_sparsity
from headcount.runtime.bounds import SEED
from headcount.runtime.errors import HeadcountError
from headcount.runtime.io import check_out_path, prepare_out
from headcount.runtime.launch import launch_rank
from headcount.train import TrainConfig
from headcount.train import finetune as finetune_model
from headcount.train.magnitude_search import MagnitudeConfig, check_procedure
from headcount.train.magnitude_prune import magnitude_prune

#: what the command writes into --out (an entry of these names that headcount's record does not list is refused)
FINETUNE_FILES = ("model", "metrics.json", "run.json", "checkpoints", "evaluations.json")
MAGNITUDE_FILES = ("weight_mask.safetensors", "trace.csv", "magnitude.json", "magnitude_run.json", "full", "retrain")


def magnitude_files(rounds: int) -> tuple[str, ...]:
    """What ``magnitude`` writes into --out: the fixed names and one ``round_XX/`` per IMP round."""
    return (*MAGNITUDE_FILES, *(f"round_{k:02d}" for k in range(min(int(rounds), 999) + 1)))


def _echo(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command()
@takes(TRAINING)
def finetune(
    model: str = MODEL,
    task: str = TASK,
    mask: Path = typer.Option(None, "--mask", help="mask.json (1 = kept): retrain the subnetwork from these weights"),
    mask_mode: str = setting(finetune_model, "mask_mode", "--mask-mode",
                             help="prune (remove physically) | gate (gates fixed at 0)"),
    weight_mask: Path = typer.Option(None, "--weight-mask", help="weight_mask.safetensors from `headcount magnitude`"),
    seed: int = setting(finetune_model, "seed", help="training seed (head initialisation, data order, dropout)",
                        callback=bounded(SEED)),
    train: TrainConfig = None,
    out: Path = typer.Option(..., "--out", "-o", help="output folder: model/, metrics.json"),
):
    """Fine-tune (or retrain a masked subnetwork) -> model/, metrics.json. Run again to resume."""
    check_out_path(out)
    rank, _ = launch_rank()
    # under torchrun / accelerate launch, rank 0 guards --out (and writes it); the others only train
    guard = prepare_out(out, "finetune", outputs=FINETUNE_FILES, distributed=True, direct=True) if rank == 0 else nullcontext()
    with guard:  # run.json decides resume vs another run
        m = finetune_model(model, task, mask=mask, mask_mode=mask_mode, weight_mask=weight_mask, seed=seed, config=train,
                out_dir=out, progress=_echo if rank == 0 else None)
    if rank:
        return
    kept = ""
    if m.get("mask"):
        kept = f", {m['mask']['heads_kept']}/{m['mask']['heads_total']} heads, {m['mask']['mlps_kept']} MLPs ({m['mask']['mode']})"
    if m.get("weight_mask"):
        kept += f", weight sparsity {m['weight_mask']['sparsity']:.4f}"
    typer.echo(f"wrote {out}/model and {out}/metrics.json: {m['metric']} {m['final']['score']:.4f}{kept}; "
               f"{m['n_params']:,} parameters, {m['tokens_per_s']:,.0f} tokens/s")


@app.command()
@takes(TRAINING)
def magnitude(
    model: str = MODEL,
    task: str = TASK,
    procedure: str = setting(
        MagnitudeConfig, "procedure", help="prasanna (the paper: prune the fine-tuned weights without retraining, stop on the "
                         "un-retrained dev metric, retrain the kept mask once) | imp (retrain every round, Chen et al.)"),
    rounds: int = setting(MagnitudeConfig, "rounds", "--rounds", "--max-steps",
                          help="at most this many pruning steps (imp: rounds)"),
    threshold: float = setting(MagnitudeConfig, "threshold", help="stop when metric < threshold x full metric"),
    rate: float = setting(MagnitudeConfig, "rate", help="fraction of the remaining weights pruned per step"),
    control: str = setting(MagnitudeConfig, "control", help="good (smallest first) | random | bad (largest first); random and bad: "
                                             "one shot, with --match or --sparsity"),
    variant: str = setting(MagnitudeConfig, "variant",
                           help="prasanna (Q,K,V,O,FFN weights+biases) | chen (weights + pooler)"),
    sparsity: float = setting(MagnitudeConfig, "sparsity",
                              help="one shot: prune to exactly this sparsity in [0, 1), retrain once"),
    match: Path = typer.Option(None, "--match", help="a finished magnitude run: one shot at its final sparsity"),
    rewind_step: int = setting(MagnitudeConfig, "rewind_step", "--rewind-step", help="imp: 0 rewinds to pre-trained; N to the full run's step N"),
    at_cap: str = setting(MagnitudeConfig, "at_cap", "--at-cap",
                          help="prasanna: the mask kept when all --max-steps steps pass: reference (the authors' code: "
                               "the step before the last) | last (the last step)"),
    seed: int = setting(magnitude_prune, "seed", callback=bounded(SEED)),
    train: TrainConfig = None,
    out: Path = typer.Option(..., "--out", "-o", help="output folder: weight_mask.safetensors, trace.csv"),
):
    """Magnitude pruning (the paper's search, IMP, or one shot) -> weight_mask.safetensors, trace.csv."""
    check_out_path(out)
    if not 0.0 <= threshold <= 1.0:
        raise HeadcountError(f"--threshold must be in [0, 1] (a fraction of the full model's metric), got {threshold}")
    if sparsity is not None:
        check_sparsity(sparsity)
    config = MagnitudeConfig(procedure=procedure, rounds=rounds, threshold=threshold, rate=rate, control=control,
                             variant=variant, sparsity=sparsity, rewind_step=rewind_step, at_cap=at_cap)
    check_procedure(config, match)
    with prepare_out(out, "magnitude", outputs=magnitude_files(rounds), direct=True):  # magnitude_run.json decides resume vs another run
        r = magnitude_prune(model, task, config=config, train=train, seed=seed, out_dir=out, match=match,
                            progress=_echo)
    one_shot = sparsity is not None or match is not None
    step = "round" if one_shot or config.procedure == "imp" else "step"
    if r.get("skipped"):
        typer.echo(f"skipped: {match} kept no mask (no pruning step passed): no sparsity to match, nothing trained; "
                   f"wrote {out}/magnitude.json")
    elif r.get("no_passing_mask"):
        typer.echo(f"no mask: no {step} kept {r['metric_name']} >= {threshold} x the full model's "
                   f"({r['full_metric']:.4f}), so nothing was kept or retrained (NaN, no_passing_mask); "
                   f"wrote {out}/trace.csv and {out}/magnitude.json")
    else:
        how = "one shot" if one_shot else f"{config.procedure} {step} {r['round']}"
        typer.echo(f"wrote {out}/weight_mask.safetensors and {out}/trace.csv: {how}, sparsity {r['sparsity']:.4f} "
                   f"({r['pruned']:,}/{r['total']:,} weights, {control}), {r['metric_name']} {r['metric']:.4f} "
                   f"retrained (full {r['full_metric']:.4f})")
