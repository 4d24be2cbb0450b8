"""`headcount kv-budget`: per-KV-head cache budgets from head scores, under a memory target.

Reads the model's shape from its config only (no weights are loaded) and, unless ``--uniform``
or ``--random`` is given, a ``scores.json``; writes ``budget.json``
([`headcount.core.kvbudget.KVBudget`][headcount.core.kvbudget.KVBudget]) into ``--out`` through headcount's record, as
every command does. ``docs/kv-budgets.md`` describes the file and how to apply it.
"""

from __future__ import annotations

import math
from pathlib import Path

import typer

from headcount.cli.commands import app, bounded, setting
from headcount.cli.commands.core import MODEL_HELP
from headcount.data.fingerprint import run_identity
from headcount.importance.budgets import KVBudgetSettings
from headcount.runtime.bounds import SEED
from headcount.runtime.errors import HeadcountError
from headcount.runtime.io import prepare_out
from headcount.runtime.jsonfile import read_json

BUDGET_FILES = ("budget.json",)
#: the window of the streaming heads when --window is left out (--uniform: sized to --memory)
WINDOW_HELP = (f"tokens a streaming KV head keeps before the current one (default {KVBudgetSettings().window}, "
               "DuoAttention's; --uniform: the widest window --memory allows)")


def _model_shape(spec: str) -> tuple[int, int, int, int, tuple[int | None, ...]]:
    """``(n_layers, n_heads, n_kv_heads, head_dim, model_window)`` of a decoder, from its config
    alone (``model_window``: each layer's own sliding window, None where it caches every token)."""
    import transformers

    from headcount.core.arch import get_adapter
    from headcount.core.gguf import gguf_source
    from headcount.core.layout_check import check_config_layout
    from headcount.core.kvbudget import model_windows
    from headcount.core.models import resolve

    path, kwargs = gguf_source(resolve(spec), convert=False)  # the config alone: no conversion made for it
    try:
        config = transformers.AutoConfig.from_pretrained(path, **kwargs)
    except Exception as e:  # an unreadable config, an unknown hub id, no network: the input
        raise HeadcountError(f"cannot read the config of model {spec!r}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    check_config_layout(config, spec)  # 4 query heads on 3 KV heads: one line, as load_model says it
    adapter = get_adapter(config)
    n_kv = adapter.num_kv_heads(config)
    if n_kv is None:
        raise HeadcountError(f"{spec} is an encoder: a KV budget needs a decoder (a model with a key/value cache)")
    return (int(config.num_hidden_layers), adapter.num_heads(config), n_kv, adapter.head_dim(config),
            model_windows(config))


def _scores_model(scores: Path | None) -> str | None:
    """The model a scores file names (``"model"``); a file that cannot be read (missing, corrupt,
    an integer beyond 64 bits, nesting too deep) is refused here in read_json's line, not as "give
    --model", which would hide what is wrong with it."""
    d = read_json(scores, "scores file") if scores is not None else None
    return d.get("model") if isinstance(d, dict) and isinstance(d.get("model"), str) else None


@app.command("kv-budget")
def kv_budget(
    scores: Path = typer.Option(None, "--scores", help="scores.json of `headcount score` (heads [L, H]; "
                                                        "kv_groups [L, n_kv] when present); not with --uniform / --random"),
    model: str = typer.Option(None, "--model", "-m", help=MODEL_HELP + "; default: the model the scores name"),
    memory: float = setting(KVBudgetSettings, "memory", help="the KV cache's target: a fraction of the full cache at "
                                                             "--context tokens", callback=bounded(KVBudgetSettings.BOUNDS["memory"])),
    context: int = setting(KVBudgetSettings, "context", help="tokens (prompt + generation) the target is computed at",
                           callback=bounded(KVBudgetSettings.BOUNDS["context"])),
    sink: int = setting(KVBudgetSettings, "sink", help="tokens a streaming KV head keeps from the start",
                        callback=bounded(KVBudgetSettings.BOUNDS["sink"])),
    window: int = typer.Option(None, "--window", help=WINDOW_HELP, callback=bounded(KVBudgetSettings.BOUNDS["window"])),
    uniform: bool = typer.Option(False, "--uniform", help="every KV head streams (StreamingLLM), its window as wide as "
                                                          "--memory allows: a baseline"),
    random_seed: int = typer.Option(None, "--random", help="SEED: as many full KV heads as the scores would get, "
                                                           "chosen at random: a baseline", callback=bounded(SEED)),
    dtype: str = setting(KVBudgetSettings, "dtype", help="the cache's element type, for the bytes the budget states: "
                                                         "float32 | bfloat16 | float16"),
    out: Path = typer.Option(..., "--out", "-o"),
    force: bool = typer.Option(False, "--force", help="replace an earlier kv-budget output with other inputs in --out"),
):
    """Per-KV-head KV cache budget (full cache or sink + window) under a memory target -> budget.json."""
    from headcount.core.kvbudget import check_no_windows
    from headcount.importance.budgets import (
        budget_from_scores,
        random_budget,
        read_scores,
        uniform_budget,
    )

    if uniform and random_seed is not None:
        raise HeadcountError("--uniform and --random are two baselines: give one")
    mode = "uniform" if uniform else "random" if random_seed is not None else "scores"
    if mode == "scores" and scores is None:
        raise HeadcountError("give --scores scores.json (or --uniform / --random SEED for a baseline)")
    if mode != "scores" and scores is not None:
        raise HeadcountError(f"--{'uniform' if uniform else 'random'} chooses without scores: leave --scores out")
    spec = model or _scores_model(scores)
    if spec is None:
        raise HeadcountError("give --model (the scores file names none)" if scores is not None else "give --model")
    settings = KVBudgetSettings(memory=memory, context=context, sink=sink,
                              window=KVBudgetSettings().window if window is None else window, dtype=dtype)
    n_layers, n_heads, n_kv, head_dim, windows = _model_shape(spec)
    try:  # refused here, not at the budget's first forward: the budget attention runs no sliding window yet
        check_no_windows(windows, context)
    except HeadcountError as e:
        raise HeadcountError(f"{spec}: {e}") from None
    made_from: dict[str, object] = {"model": spec}
    if mode == "scores":
        kv_scores, doc, pooling = read_scores(scores, n_layers, n_heads, n_kv)
        made_from.update({"scores": str(scores), "method": doc.get("method"), "objective": doc.get("objective"),
                          "task": doc.get("task"), "pooling": pooling})
        budget = budget_from_scores(kv_scores, n_heads, head_dim, settings, made_from, model_window=windows)
        bad = sum(1 for row in kv_scores for v in row if not math.isfinite(v))
        if bad:
            typer.echo(f"warning: {bad} KV-head scores are not finite: they rank last (streaming)")
    elif mode == "random":
        budget = random_budget(n_layers, n_heads, n_kv, head_dim, settings, random_seed, made_from,
                               model_window=windows)
    else:
        budget = uniform_budget(n_layers, n_heads, n_kv, head_dim, settings, window, made_from, model_window=windows)

    identity = run_identity({"model": spec, "mode": mode, "memory": memory, "context": context, "sink": sink,
                             "window": window, "seed": random_seed, "dtype": dtype, "scores": str(scores)},
                            spec, files=[scores] if scores is not None else [])
    with prepare_out(out, "kv-budget", identity=identity, outputs=BUDGET_FILES, force=force, echo=typer.echo) as guard:
        budget.save(guard.staging() / "budget.json")
        guard.commit()
    b = budget.meta["bytes"]
    streaming = budget.meta["n_streaming"]
    sizes = f"sink {budget.meta['made_from']['sink']} + window {budget.meta['made_from']['window']}"
    typer.echo(f"wrote {out}/budget.json: {budget.n_full} of {n_layers * n_kv} KV heads keep the full cache, "
               f"{streaming} stream ({sizes}); KV cache at {context:,} tokens {b['budget']:,} of {b['full_cache']:,} "
               f"bytes ({b['ratio']:.3f}, target {memory:g})")
