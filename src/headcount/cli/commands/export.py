"""`headcount export`: a (pruned) model as an ONNX file or a plain transformers checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from headcount.cli.commands import app, bounded, setting
from headcount.cli.commands.core import MODEL_HELP, SHRINK_FILES
from headcount.core.export import FORMATS, ExportSettings, check_opset
from headcount.data.fingerprint import run_identity
from headcount.core.export import TOLERANCE
from headcount.core.export_gguf import GGUF_TYPES, GgufSettings
from headcount.runtime.atomic import atomic_write_bytes
from headcount.runtime.errors import HeadcountError
from headcount.runtime.io import check_file_out, one_file_out, prepare_out
from headcount.runtime.record import SEAL_PLACEHOLDER, seal_bytes

FORMAT_HELP = ("onnx: one .onnx file (onnxruntime) | hf: a plain transformers checkpoint directory (when one can "
               "describe the model) | gguf: one .gguf file for llama.cpp (decoders)")
OUT_HELP = "the .onnx file (--format onnx), the checkpoint directory (--format hf) or the .gguf file (--format gguf)"


def _check_onnx_out(out: Path, identity: dict, force: bool, echo=typer.echo) -> Path:
    """Refuse an --out that is a directory, or a file headcount did not write, or (without
    ``--force``) an earlier export of other settings."""
    from headcount.core.export import onnx_marker

    return check_file_out(out, "export", onnx_marker, identity, force, echo, example="model.onnx")


def _load(model_spec: str, mask: Path | None):
    """The model to export: as saved (its head included), shrunk by ``mask`` first when one is
    given (``shrink``'s own code path, in memory: as ``shrink`` then ``export`` of its output)."""
    from headcount.core.export import load_for_export

    if mask is None:
        return load_for_export(model_spec)
    from headcount.cli.api import shrunk_model  # transformers, matplotlib: loaded when the command runs

    return shrunk_model(model_spec, mask, load_for_export)


def _identity(settings: dict, model_spec: str, mask: Path | None) -> dict:
    """The run's identity; a mask is part of it (its path and content) only when one is given."""
    if mask is None:
        return run_identity(settings, model_spec)
    return run_identity({**settings, "mask": str(mask)}, model_spec, files=[mask])


def _export_onnx(model_spec: str, out: Path, opset: int, tolerance: float, force: bool,
                 mask: Path | None = None) -> None:
    import json

    from headcount.core.export import export_onnx, output_name, require_onnx

    require_onnx()
    identity = _identity({"model": model_spec, "format": "onnx", "opset": opset}, model_spec, mask)
    path = _check_onnx_out(out, identity, force)
    with one_file_out(path, "export"):
        model = _load(model_spec, mask)
        marker = json.dumps({"command": "export", "identity": identity, "seal": SEAL_PLACEHOLDER})
        data, rows = export_onnx(model, opset=opset, tolerance=tolerance, metadata={"headcount": marker})
        data = seal_bytes(data)  # a later run replaces the file only while it is byte for byte this one
        _check_onnx_out(out, identity, force=True, echo=None)  # nobody put another file there meanwhile
        atomic_write_bytes(path, data)
    from headcount.core.export import input_names
    from headcount.core.surgery import pruning_record

    record = pruning_record(model)
    what = "unpruned" if not record else (
        f"pruned: {sum(len(r) for r in record['removed_heads'])} heads, "
        f"{sum(len(r) for r in record['removed_neurons'])} feed-forward neurons, "
        f"{len(record['removed_mlps'])} MLPs removed")
    typer.echo(f"wrote {out}: ONNX opset {opset}, {len(data) / 1e6:.1f} MB, {what}; "
               f"inputs {', '.join(input_names(model))} [batch, sequence] -> {output_name(model)}")
    diffs = ", ".join(f"{r['max_abs_diff']:.2e} (batch {r['batch']} x {r['sequence']})" for r in rows)
    typer.echo(f"onnxruntime vs PyTorch: max abs diff {diffs}; tolerance {tolerance:g}")


def _export_hf(model_spec: str, out: Path, force: bool, mask: Path | None = None) -> None:
    from headcount.core.export import export_hf, native_config
    from headcount.core.models import load_tokenizer

    model = _load(model_spec, mask)
    try:
        native_config(model)  # refuses (saying why) before --out is touched
    except HeadcountError as e:  # ONNX describes any pruned model: say so in the same line
        onnx_out = out.with_suffix(".onnx") if out.suffix else out.parent / f"{out.name or 'model'}.onnx"
        again = f"--model {model_spec}" + (f" --mask {mask}" if mask is not None else "")
        raise HeadcountError(f"{e}; export it as ONNX instead, which runs any pruned model without headcount: "
                             f"headcount export {again} --out {onnx_out}") from None
    try:
        tokenizer = load_tokenizer(model_spec)
    except Exception:  # a checkpoint without a tokenizer: the weights alone
        tokenizer = None
    identity = _identity({"model": model_spec, "format": "hf"}, model_spec, mask)
    with prepare_out(out, "export", identity=identity, outputs=SHRINK_FILES, force=force, echo=typer.echo) as guard:
        staged = guard.staging() / "checkpoint"
        _, diff = export_hf(model, staged, tokenizer)
        umask = os.umask(0)
        os.umask(umask)
        for f in staged.iterdir():  # safetensors writes 0600; results get the umask's mode like other files
            os.chmod(f, 0o666 & ~umask)
        guard.commit(staged)
    typer.echo(f"wrote {out}: a plain transformers checkpoint ({type(model).__name__}.from_pretrained loads it); "
               f"max abs diff to the headcount model {diff:.2e}")


@app.command()
def export(
    model: str = typer.Option("offline", "--model", "-m", help=MODEL_HELP),
    format: str = setting(ExportSettings, "format", "--format", help=FORMAT_HELP),
    out: Path = typer.Option(..., "--out", "-o", help=OUT_HELP),
    opset: int = setting(ExportSettings, "opset", "--opset", help="ONNX opset (17..20)"),
    tolerance: float = setting(ExportSettings, "tolerance", "--tolerance",
                               help="max |onnxruntime - PyTorch| accepted (fp32, random inputs of two shapes)",
                               callback=bounded(TOLERANCE)),
    force: bool = typer.Option(False, "--force", help="replace an earlier export of another model or settings"),
    mask: Path = typer.Option(None, "--mask", help="mask.json (1 = kept): shrink the model by it first, as "
                                                     "`headcount shrink` does, then export (nothing else is written)"),
    gguf_type: str = setting(GgufSettings, "type", "--gguf-type",
                             help=f"--format gguf: what weights are stored as ({' | '.join(GGUF_TYPES)}; norms stay f32)"),
):
    """A pruned (or unpruned) model, task head included, that runs without headcount: ONNX, plain transformers or GGUF."""
    if format not in FORMATS:
        raise HeadcountError(f"unknown --format {format!r}; choose one of {', '.join(FORMATS)}")
    check_opset(opset)
    if not tolerance > 0:
        raise HeadcountError(f"--tolerance must be a positive number (got {tolerance})")
    if mask is not None:
        from headcount.core.masks import Mask

        Mask.load(mask)  # a bad mask file is refused before anything loads or --out is touched
    if format == "onnx":
        _export_onnx(model, out, opset, tolerance, force, mask)
    elif format == "gguf":
        from headcount.cli.commands.export_gguf import export_gguf_file

        export_gguf_file(model, out, gguf_type, tolerance, force, mask, _load, _identity)
    else:
        _export_hf(model, out, force, mask)
