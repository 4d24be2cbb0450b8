"""headcount: which attention heads, KV groups and MLPs of BERT-family encoders and decoder LLMs matter.

The public API, re-exported (loaded lazily so that the command line starts fast)::

    import headcount as hc
    model = hc.load_model("offline", head="classification", num_labels=2)
    with hc.gated(model, heads=gates):          # head gates [n_layers, n_heads]
        ...
    scores = hc.score(model, batches, method="gradient", normalize="layer+global")
    pruned = hc.shrink(model, hc.Mask.load("mask.json"))
    hc.save_pruned(pruned, "pruned/"); hc.load_pruned("pruned/")
    cache = hc.apply_kv_budget(decoder, hc.KVBudget.load("budget.json"))   # full or sink + window per KV head
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.3"

_EXPORTS = {
    # models and architectures
    "load_model": "core.models", "load_tokenizer": "core.models",
    "get_adapter": "core.arch", "register_adapter": "core.arch", "supported_model_types": "core.arch", "Adapter": "core.arch",
    "Block": "core.arch",
    # gates, attention, surgery, masks
    "gated": "core.gates", "set_gates": "core.gates", "clear_gates": "core.gates", "layout": "core.gates", "clone_model": "core.gates",
    "shared_groups": "core.gates",
    "attention_maps": "core.attention",
    "shrink": "core.surgery", "prune_heads": "core.surgery", "prune_mlps": "core.surgery", "prune_neurons": "core.surgery",
    "save_pruned": "core.surgery", "load_pruned": "core.surgery", "count_parameters": "core.surgery",
    "Mask": "core.masks",
    # KV budgets (decoders): full cache or sink + window per KV head
    "KVBudget": "kv.budget", "apply_kv_budget": "kv.cache", "KVBudgetCache": "kv.cache",
    # importance and pruning
    "score": "importance.scoring", "Scores": "importance.scores", "normalize_scores": "importance.scores",
    "iterative_prune": "importance.pruning", "PruneConfig": "importance.pruning", "select_lowest": "importance.pruning",
    "evaluate_batches": "data.evaluation",
    # tasks and data
    "get_task": "data.tasks", "list_tasks": "data.tasks", "register_task": "data.tasks", "encode": "data.tasks",
    "make_batches": "data.tasks", "compute_metrics": "data.tasks", "mlm_batches": "data.tasks", "fit_mlm_head": "data.mlm_head",
    # training and magnitude pruning
    "finetune": "train", "evaluate": "train", "TrainConfig": "train",
    # studies
    "run_study": "experiments", "register_study": "experiments.runner", "Job": "experiments.runner",
    "build_report": "experiments.report",
    "explore": "experiments.explorer",
    # export
    "export_onnx": "core.export", "export_hf": "core.export",
    "HeadcountError": "runtime.errors",
}


if TYPE_CHECKING:  # what type checkers see (py.typed): the same names, imported eagerly
    from headcount.core.arch import Adapter, Block, get_adapter, register_adapter, supported_model_types
    from headcount.core.attention import attention_maps
    from headcount.core.export import export_hf, export_onnx
    from headcount.core.gates import clear_gates, clone_model, gated, layout, set_gates, shared_groups
    from headcount.core.masks import Mask
    from headcount.core.models import load_model, load_tokenizer
    from headcount.core.surgery import (
        count_parameters,
        load_pruned,
        prune_heads,
        prune_mlps,
        prune_neurons,
        save_pruned,
        shrink,
    )
    from headcount.data.evaluation import evaluate_batches
    from headcount.data.mlm_head import fit_mlm_head
    from headcount.data.tasks import (
        compute_metrics,
        encode,
        get_task,
        list_tasks,
        make_batches,
        mlm_batches,
        register_task,
    )
    from headcount.experiments import run_study
    from headcount.experiments.explorer import explore
    from headcount.experiments.report import build_report
    from headcount.experiments.runner import Job, register_study
    from headcount.importance.pruning import PruneConfig, iterative_prune, select_lowest
    from headcount.importance.scoring import score
    from headcount.importance.scores import Scores, normalize_scores
    from headcount.kv.budget import KVBudget
    from headcount.kv.cache import KVBudgetCache, apply_kv_budget
    from headcount.runtime.errors import HeadcountError
    from headcount.train import TrainConfig, evaluate, finetune


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
