"""`headcount export --format gguf`: a (pruned) decoder as one GGUF file for llama.cpp (the
command itself is ``headcount.cli.commands.export``; this is its GGUF branch)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from headcount.runtime.errors import HeadcountError
from headcount.runtime.record import SEAL_PLACEHOLDER, seal_file

def export_gguf_file(model_spec: str, out: Path, gguf_type: str, tolerance: float, force: bool,
                     mask: Path | None, load, identity_of) -> None:
    """Write ``--out`` (one file, atomically, sealed) from the model ``load(model_spec, mask)``
    gives; ``identity_of(settings, model_spec, mask)``: the run's identity."""
    from headcount.core.export_gguf import _check_type, export_gguf, gguf_marker
    from headcount.core.gguf import is_gguf
    from headcount.core.model_spec import resolve
    from headcount.runtime.atomic import atomic_path
    from headcount.runtime.io import check_file_out, one_file_out

    _check_type(gguf_type)
    identity = identity_of({"model": model_spec, "format": "gguf", "gguf_type": gguf_type}, model_spec, mask)
    path = check_file_out(out, "export", gguf_marker, identity, force, typer.echo, example="model.gguf")
    resolved = resolve(model_spec)
    source = Path(resolved) if is_gguf(resolved) else None  # its tokenizer is copied as it is
    with one_file_out(path, "export"):
        model = load(model_spec, mask)
        tokenizer = None
        if source is None:
            from headcount.core.models import load_tokenizer

            try:
                tokenizer = load_tokenizer(model_spec)
            except Exception:
                raise HeadcountError(f"--format gguf: --model {model_spec} has no tokenizer to write into the "
                                     "file, and llama.cpp refuses a GGUF file without one") from None
        marker = json.dumps({"command": "export", "identity": identity, "seal": SEAL_PLACEHOLDER})
        with atomic_path(path) as tmp:
            plan, check = export_gguf(model, tmp, gguf_type, tolerance, tokenizer=tokenizer, source=source,
                                      marker=marker)
            seal_file(tmp)  # a later run replaces the file only while it is byte for byte this one
            check_file_out(out, "export", gguf_marker, identity, force=True)  # nobody put another file there meanwhile
        size = path.stat().st_size
    kv = sum(plan.n_head_kv)
    typer.echo(f"wrote {out}: GGUF ({plan.arch}, {gguf_type}), {size / 1e6:.1f} MB, {len(plan.n_head)} layers; "
               f"query heads per layer {plan.n_head}, KV heads {plan.n_head_kv} ({kv} in all), MLP widths {plan.n_ff}"
               + (f"; removed MLPs written as width 1 of zeros (layers {plan.placeholder_mlps})" if plan.placeholder_mlps else "")
               + ("; layer 0's removed heads written as one head of zeros" if plan.placeholder_heads else ""))
    typer.echo(f"read back vs PyTorch: max abs diff {check['max_abs_diff']:.2e} (tolerance {tolerance:g})"
               + (f"; {gguf_type} rounding moves the logits by up to {check['type_diff']:.2e} "
                  f"(largest |logit| {check['scale']:.2f})" if gguf_type != "f32" else ""))
