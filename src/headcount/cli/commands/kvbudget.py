"""`headcount kv-budget`: per-KV-head cache budgets under a memory target, by a KV policy.

Reads the model's shape from its config only (no weights are loaded) and, for a policy that ranks
by scores (``scores``, the default), a ``scores.json`` (read once); asks the policy registry
([`headcount.kv.policies`][headcount.kv.policies]) for the budget and writes ``budget.json``
([`headcount.kv.budget.KVBudget`][headcount.kv.budget.KVBudget]) into ``--out`` through
headcount's record, as every command does. ``docs/kv-budgets.md`` describes the file and how to
apply it.
"""

from __future__ import annotations

import math
from pathlib import Path

import typer

from headcount.cli.commands import app, bounded, setting
from headcount.cli.commands.core import MODEL_HELP
from headcount.data.fingerprint import run_identity
from headcount.kv.memory import KVBudgetSettings
from headcount.kv.policies import get_policy, policy_names
from headcount.runtime.bounds import SEED
from headcount.runtime.errors import HeadcountError
from headcount.runtime.io import prepare_out
from headcount.runtime.jsonfile import read_json

BUDGET_FILES = ("budget.json",)
#: the window of the streaming heads when --window is left out (--uniform: sized to --memory)
WINDOW_HELP = (f"tokens a streaming KV head keeps before the current one (default {KVBudgetSettings().window}, "
               "DuoAttention's; --uniform: the widest window --memory allows)")
POLICY_HELP = ("how the budget is chosen: " + ", ".join(policy_names()) + " (default: scores with --scores; "
               "--uniform and --random SEED name the two baselines)")


def _model_shape(spec: str) -> tuple[int, int, int, int, tuple[int | None, ...]]:
    """``(n_layers, n_heads, n_kv_heads, head_dim, model_window)`` of a decoder, from its config
    alone (``model_window``: each layer's own sliding window, None where it caches every token)."""
    import transformers

    from headcount.core.arch import get_adapter
    from headcount.core.gguf import gguf_source
    from headcount.core.layout_check import check_config_layout
    from headcount.core.models import resolve
    from headcount.kv.budget import decoder_config, model_windows

    path, kwargs = gguf_source(resolve(spec), convert=False)  # the config alone: no conversion made for it
    try:
        config = transformers.AutoConfig.from_pretrained(path, **kwargs)
    except Exception as e:  # an unreadable config, an unknown hub id, no network: the input
        raise HeadcountError(f"cannot read the config of model {spec!r}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    check_config_layout(config, spec)  # 4 query heads on 3 KV heads: one line, as load_model says it
    adapter = get_adapter(decoder_config(config, spec))
    n_kv = adapter.num_kv_heads(config)
    assert n_kv is not None  # a decoder's adapter gives its KV heads (decoder_config refused an encoder)
    return int(config.num_hidden_layers), adapter.num_heads(config), n_kv, adapter.head_dim(config), model_windows(config)


def _policy_of(policy: str | None, uniform: bool, random_seed: int | None, seed: int | None) -> tuple[str, int | None]:
    """``(policy name, seed)`` from ``--policy`` / ``--seed`` and their shorthands ``--uniform``
    and ``--random SEED`` (one way to name it)."""
    named = [n for n, on in (("--policy", policy is not None), ("--uniform", uniform),
                             ("--random", random_seed is not None)) if on]
    if uniform and random_seed is not None:
        raise HeadcountError("--uniform and --random are two baselines: give one")
    if len(named) > 1:
        raise HeadcountError(f"{' and '.join(named)} each name the policy: give one")
    if random_seed is not None and seed is not None:
        raise HeadcountError("--random SEED gives the seed already: leave --seed out")
    name = policy or ("uniform" if uniform else "random" if random_seed is not None else "scores")
    takes = get_policy(name).options  # an unknown name: one line with the choices
    if seed is not None and "seed" not in takes:
        raise HeadcountError(f"--seed is for a policy that draws at random; {name} does not: leave --seed out")
    return name, random_seed if random_seed is not None else seed


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
    policy: str = typer.Option(None, "--policy", help=POLICY_HELP),
    seed: int = typer.Option(None, "--seed", help="SEED of a policy that draws at random (--policy random)",
                             callback=bounded(SEED)),
    dtype: str = setting(KVBudgetSettings, "dtype", help="the cache's element type, for the bytes the budget states: "
                                                         "float32 | bfloat16 | float16"),
    out: Path = typer.Option(..., "--out", "-o"),
    force: bool = typer.Option(False, "--force", help="replace an earlier kv-budget output with other inputs in --out"),
):
    """Per-KV-head KV cache budget (full cache or sink + window) under a memory target -> budget.json."""
    from headcount.kv.budget import ELEMENT_SIZES
    from headcount.kv.policies import make_budget
    from headcount.kv.policies.scores import read_kv_scores
    from headcount.kv.policy import BudgetRequest

    mode, drawn = _policy_of(policy, uniform, random_seed, seed)
    chosen = get_policy(mode)
    if chosen.needs_scores and scores is None:
        raise HeadcountError("give --scores scores.json (or --uniform / --random SEED for a baseline)")
    if not chosen.needs_scores and scores is not None:
        flag = f"--{mode}" if mode in ("uniform", "random") and policy is None else f"--policy {mode}"
        raise HeadcountError(f"{flag} chooses without scores: leave --scores out")
    doc = read_json(scores, "scores file") if scores is not None else None  # the one reading of the file
    named = doc.get("model") if isinstance(doc, dict) and isinstance(doc.get("model"), str) else None
    spec = model or named
    if spec is None:
        raise HeadcountError("give --model (the scores file names none)" if scores is not None else "give --model")
    settings = KVBudgetSettings(memory=memory, context=context, sink=sink,
                              window=KVBudgetSettings().window if window is None else window, dtype=dtype)
    n_layers, n_heads, n_kv, head_dim, windows = _model_shape(spec)
    made_from: dict[str, object] = {"model": spec}
    kv_scores = None
    if chosen.needs_scores:
        kv_scores, pooling = read_kv_scores(doc, scores, n_layers, n_heads, n_kv)
        made_from.update({"scores": str(scores), "method": doc.get("method"), "objective": doc.get("objective"),
                          "task": doc.get("task"), "pooling": pooling})
    options = {"seed": drawn, "window": window}
    request = BudgetRequest(n_layers, n_heads, n_kv, head_dim, settings, windows, kv_scores,
                            {k: v for k, v in options.items() if k in chosen.options}, made_from)
    budget = make_budget(mode, request)
    bad = sum(1 for row in kv_scores or [] for v in row if not math.isfinite(v))
    if bad:
        typer.echo(f"warning: {bad} KV-head scores are not finite: they rank last (streaming)")

    identity = run_identity({"model": spec, "mode": mode, "memory": memory, "context": context, "sink": sink,
                             "window": window, "seed": drawn, "dtype": dtype, "scores": str(scores)},
                            spec, files=[scores] if scores is not None else [])
    with prepare_out(out, "kv-budget", identity=identity, outputs=BUDGET_FILES, force=force, echo=typer.echo) as guard:
        budget.save(guard.staging() / "budget.json")
        guard.commit()
    b, made = budget.meta["bytes"], budget.meta["made_from"]
    streaming = budget.meta["n_streaming"]
    shapes = sorted({(s, w) for rs, rw in zip(budget.sink, budget.window) for s, w in zip(rs, rw) if s is not None})
    if "sink" in made and "window" in made:  # the policy's streaming sizes (also when none streams)
        sizes = f"sink {made['sink']} + window {made['window']}"
    else:  # sizes per KV head (a policy of its own)
        sizes = ", ".join(f"sink {s} + window {w}" for s, w in shapes[:3]) + (", ..." if len(shapes) > 3 else "")
    typer.echo(f"wrote {out}/budget.json: {budget.n_full} of {n_layers * n_kv} KV heads keep the full cache, "
               f"{streaming} stream ({sizes}); KV cache at {context:,} tokens {b['budget']:,} of {b['full_cache']:,} "
               f"bytes ({b['ratio']:.3f}, target {memory:g})")
    windowed = [w for w in budget.model_window if w is not None]
    if windowed:  # what the budget could choose: the layers that cache every token
        own = budget.cached(context)
        fixed = sum(own[layer] for layer, w in enumerate(budget.model_window) if w is not None)
        per = budget.full_bytes(context, element_size=ELEMENT_SIZES[dtype]) // max(1, sum(own))  # bytes a cached token
        sizes = "/".join(str(w) for w in sorted(set(windowed)))
        typer.echo(f"{len(windowed)} of {n_layers} layers attend within their own sliding window ({sizes} tokens): they "
                   f"keep it ({per * fixed:,} bytes at {context:,} tokens, fixed); the budget chose among the other "
                   f"{n_layers - len(windowed)} layers' KV heads ({per * (sum(own) - fixed):,} bytes of the full cache)")
