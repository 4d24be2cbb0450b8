"""headcount: which attention heads and MLPs of BERT-family encoders matter.

The public API, re-exported (loaded lazily so that the command line starts fast)::

    import headcount as hc
    model = hc.load_model("offline", head="classification", num_labels=2)
    with hc.gated(model, heads=gates):          # head gates [n_layers, n_heads]
        ...
    scores = hc.score(model, batches, method="gradient", normalize="layer+global")
    pruned = hc.shrink(model, hc.Mask.load("mask.json"))
    hc.save_pruned(pruned, "pruned/"); hc.load_pruned("pruned/")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    # models and architectures
    "load_model": "models", "load_tokenizer": "models",
    "get_adapter": "arch", "register_adapter": "arch", "supported_model_types": "arch", "Adapter": "arch",
    "Block": "arch",
    # gates, attention, surgery, masks
    "gated": "gates", "set_gates": "gates", "clear_gates": "gates", "layout": "gates", "clone_model": "gates",
    "shared_groups": "gates",
    "attention_maps": "attention",
    "shrink": "surgery", "prune_heads": "surgery", "prune_mlps": "surgery", "prune_neurons": "surgery",
    "save_pruned": "surgery", "load_pruned": "surgery", "count_parameters": "surgery",
    "Mask": "masks",
    # importance and pruning
    "score": "scoring", "Scores": "scoring", "normalize_scores": "scoring",
    "iterative_prune": "pruning", "PruneConfig": "pruning", "select_lowest": "pruning",
    "evaluate_batches": "evaluation",
    # tasks and data
    "get_task": "tasks", "list_tasks": "tasks", "register_task": "tasks", "encode": "tasks",
    "make_batches": "tasks", "compute_metrics": "tasks", "mlm_batches": "tasks", "fit_mlm_head": "heads",
    # training and magnitude pruning
    "finetune": "train", "evaluate": "train", "TrainConfig": "train",
    # studies
    "run_study": "api", "register_study": "runner", "Job": "runner",
    "build_report": "report",
    "explore": "explorer",
    "HeadcountError": "errors",
}


if TYPE_CHECKING:  # what type checkers see (py.typed): the same names, imported eagerly
    from .api import run_study
    from .arch import Adapter, Block, get_adapter, register_adapter, supported_model_types
    from .attention import attention_maps
    from .errors import HeadcountError
    from .evaluation import evaluate_batches
    from .explorer import explore
    from .gates import clear_gates, clone_model, gated, layout, set_gates, shared_groups
    from .masks import Mask
    from .models import load_model, load_tokenizer
    from .pruning import PruneConfig, iterative_prune, select_lowest
    from .report import build_report
    from .runner import Job, register_study
    from .scoring import Scores, normalize_scores, score
    from .surgery import count_parameters, load_pruned, prune_heads, prune_mlps, prune_neurons, save_pruned, shrink
    from .heads import fit_mlm_head
    from .tasks import compute_metrics, encode, get_task, list_tasks, make_batches, mlm_batches, register_task
    from .train import TrainConfig, evaluate, finetune


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'headcount' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = sorted(_EXPORTS)
