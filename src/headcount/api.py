"""Functions behind the CLI that are not a single module's verb."""

from __future__ import annotations

from pathlib import Path

from .errors import HeadcountError


def describe(model_spec: str) -> dict:
    """What ``headcount info`` prints: sizes, parameters and what is pruned."""
    from .arch import get_adapter
    from .gates import layout, shared_groups
    from .models import load_model
    from .surgery import count_parameters, pruning_record

    model = load_model(model_spec, head="base")
    n_layers, n_heads = layout(model)
    rec = pruning_record(model) or {}
    removed_heads = sum(len(x) for x in rec.get("removed_heads", []))
    groups = shared_groups(model)
    return {
        "model": model_spec,
        "type": model.config.model_type,
        "adapter": type(get_adapter(model)).__name__,
        "layers": n_layers,
        "heads": f"{n_heads} per layer, head size {get_adapter(model).head_dim(model.config)}",
        "shared layers": "no" if len(groups) == n_layers else f"yes: {len(groups)} physical layer(s) for {n_layers} applications",
        "parameters": f"{count_parameters(model):,}",
        "heads kept": f"{n_layers * n_heads - removed_heads}/{n_layers * n_heads}",
        "MLPs kept": f"{n_layers - len(rec.get('removed_mlps', []))}/{n_layers}",
        "residual gates": "yes" if rec.get("gates") else "no",
    }


def shrink_checkpoint(model_spec: str, mask_path, out) -> dict:
    """Load a model, physically remove what the mask removes, save a reloadable checkpoint."""
    from .masks import Mask
    from .models import load_model, load_tokenizer
    from .surgery import count_parameters, save_pruned, shrink

    mask = Mask.load(mask_path)
    model = load_model(model_spec, head="base" if not _has_task_head(model_spec) else "classification")
    mask.check_model(model)
    before = count_parameters(model)
    shrink(model, mask)
    try:
        tokenizer = load_tokenizer(model_spec)
    except HeadcountError:
        tokenizer = None
    save_pruned(model, out, tokenizer=tokenizer, extra={"parameters_before": before, "mask": str(mask_path)})
    import json

    return json.loads((Path(out) / "headcount.json").read_text())


def _has_task_head(model_spec: str) -> bool:
    """Whether a checkpoint carries a sequence-classification head (keep it when shrinking)."""
    import transformers

    from .models import resolve

    try:
        cfg = transformers.AutoConfig.from_pretrained(resolve(model_spec))
    except OSError:
        return False
    return any(a.endswith("ForSequenceClassification") for a in (cfg.architectures or []))
