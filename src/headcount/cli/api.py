"""Functions behind the CLI that are not a single module's verb.

A command (``headcount.cli.commands``) builds the settings objects from its options (each option's
default read from the object that declares it) and calls one function here with them.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from headcount.analysis import plots
from headcount.analysis.retrieval import with_retrieval_interval
from headcount.core.arch import get_adapter, is_decoder, require_kv_groups
from headcount.core.gates import layout
from headcount.core.masks import Mask
from headcount.core.gguf import is_gguf
from headcount.core.model_spec import resolve
from headcount.core.models import checkpoint_head, load_model, load_tokenizer
from headcount.core.surgery import count_parameters, kv_summary, pruning_record, save_pruned, shrink
from headcount.data.tasks import get_task
from headcount.importance.pipeline import (
    DataConfig,
    PruneSettings,
    ScoreSettings,
    batches_for,
    decoding,
    load_for,
    metric_for,
    prune_model,
)
from headcount.importance.pruning import PruneConfig, PruneResult
from headcount.importance.scorers import count_examples
from headcount.importance.scores import kv_pool
from headcount.importance.scoring import score
from headcount.runtime.atomic import atomic_write_text
from headcount.runtime.device import device_name, resolve_device, resolve_precision, resolve_runtime
from headcount.runtime.errors import HeadcountError
from headcount.runtime.progress import Progress


def describe(model_spec: str) -> dict:
    """What ``headcount info`` prints: sizes, parameters and what is pruned (the model loaded with
    the head it was saved with: the parameters are counted with that head, and without it)."""
    model = load_model(model_spec)
    grid = layout(model)
    n_layers, n_heads = grid
    rec = pruning_record(model) or {}
    removed_heads = sum(len(x) for x in rec.get("removed_heads", []))
    return {
        "model": model_spec,
        "type": model.config.model_type,
        "adapter": type(get_adapter(model)).__name__,
        "layers": n_layers,
        "heads": f"{n_heads} per layer, head size {grid.head_dim}",
        "shared layers": (f"yes: {len(grid.groups)} physical layer(s) for {n_layers} applications" if grid.shared
                          else "no"),
        "parameters": parameters_line(model, checkpoint_head(model_spec)),
        "heads kept": f"{n_layers * n_heads - removed_heads}/{n_layers * n_heads}",
        "MLPs kept": f"{n_layers - len(rec.get('removed_mlps', []))}/{n_layers}",
        "residual gates": "yes" if rec.get("gates") else "no",
        **_decoder_lines(model_spec, model),
        "device": _where(),
    }


#: how ``info`` and ``shrink`` name a model's output head (core.models.checkpoint_head's names)
HEAD_WORDS = {"classification": "task head", "regression": "task head", "mlm": "masked-LM head", "lm": "LM head"}


def parameter_counts(model) -> tuple[int, int]:
    """``(all, body)``: the parameters of ``model`` (shared tensors once) and of its encoder or
    decoder alone (``base_model``: what ``head="base"`` loads), the output head being the
    difference (0 for an LM head tied to the embeddings)."""
    return count_parameters(model), count_parameters(model.base_model)


def parameters_line(model, head: str) -> str:
    """What the parameter count counts, in words: ``22,713,986 with the task head (encoder
    alone: 22,713,216)``; a bare encoder's count is the encoder's.

    ``head``: the head the model was loaded with (``headcount.core.models.checkpoint_head``'s names)."""
    total, body = parameter_counts(model)
    part = "decoder" if is_decoder(model) else "encoder"
    if head not in HEAD_WORDS:
        return f"{total:,} (the {part} alone, no output head)"
    tied = ", tied to the embeddings" if total == body else ""
    return f"{total:,} with the {HEAD_WORDS[head]}{tied} ({part} alone: {body:,})"


def _decoder_lines(model_spec: str, model) -> dict:
    """``info``'s extra lines for a decoder: key/value heads (what the KV cache holds) and, for a
    GGUF file, that its weights are dequantised. None for encoders."""
    if not is_decoder(model):
        return {}
    grid = layout(model)
    kv = kv_summary(model)
    lines = {"key/value heads": f"{grid.n_kv_heads} per layer ({grid.group_size} query heads each); "
                                f"{kv['kv_heads_kept']}/{kv['kv_heads_total']} kept"
                                + (f", {kv['kv_heads_repeated']} of them repeated" if kv["kv_heads_repeated"] else "")}
    if is_gguf(resolve(model_spec)):
        lines["weights"] = "dequantised to float32 from a quantised GGUF file (not the original weights)"
    return lines


def _on(meta: dict) -> str:
    """``cpu, fp32`` or ``cuda:0 (NVIDIA H200), bf16`` from a result's device metadata."""
    name = meta.get("device_name", "cpu")
    return f"{meta['device']}{f' ({name})' if name != 'cpu' else ''}, {meta['precision']}"


def _where() -> str:
    """The device and precision commands would run on here (the device rule, ``headcount.runtime.device``)."""
    dev = resolve_device(None)
    name = device_name(dev)
    return f"{dev}{f' ({name})' if name != 'cpu' else ''}, {resolve_precision(None, dev)}"


def shrink_checkpoint(model_spec: str, mask_path, out) -> dict:
    """Load a model with the head it was saved with, physically remove what the mask removes,
    save a reloadable checkpoint. Returns its ``headcount.json`` summary: ``parameters`` (with the
    head, as ``parameters_before``) and ``body_parameters`` (the encoder or decoder alone, as
    ``body_parameters_before``), ``head`` (the head's name)."""
    model = shrunk_model(model_spec, mask_path, load_model)
    try:
        tokenizer = load_tokenizer(model_spec)
    except HeadcountError:
        tokenizer = None
    extra = {**model.headcount_shrunk, "mask": str(mask_path)}
    del model.headcount_shrunk
    save_pruned(model, out, tokenizer=tokenizer, extra=extra)
    return json.loads((Path(out) / "headcount.json").read_text())


def shrunk_model(model_spec: str, mask_path, loader):
    """``loader(model_spec)`` (the model with its saved head) with what the mask at ``mask_path``
    removes physically removed: the one path of ``shrink`` and ``export --mask``. The counts
    before and after are left on the model as ``headcount_shrunk`` (``parameters_before``,
    ``body_parameters``, ``body_parameters_before``, ``head``)."""
    mask = Mask.load(mask_path)
    model = loader(model_spec)
    mask.check_model(model)
    before, body_before = parameter_counts(model)
    shrink(model, mask)
    object.__setattr__(model, "headcount_shrunk", {
        "parameters_before": before, "body_parameters_before": body_before,
        "body_parameters": parameter_counts(model)[1], "head": checkpoint_head(model_spec)})
    return model


def _kv_group_meta(model, s, unit: str) -> dict:
    """``--unit kv-groups``: each key/value group's score (its query heads' summed; with one KV head per
    layer behind a post-norm, the attention gate's score, ``s.attention``); refused for a
    model without grouped-query attention (checked before scoring: ``s`` None). Nothing for
    ``--unit heads`` (scores.json as before)."""
    if unit == "heads":
        return {}
    grid = require_kv_groups(model)
    if s is None:
        return {}
    own = s.meta.get("kv_groups")  # a scorer's own per-KV-head score (long-range: its neediest query head) wins
    n_kv = grid.n_kv_heads
    assert n_kv is not None  # require_kv_groups refused a model without KV heads
    return {"unit": unit, "kv_groups": own if own is not None else kv_pool(s, n_kv, "sum").tolist()}


def _head_seed(info: dict) -> dict:
    """``{"head_seed": N}`` for a task head drawn new (what ``load_for`` seeded it with), else nothing."""
    return {"head_seed": info["head_seed"]} if "head_seed" in info else {}


def _echo_none(*args, **kwargs):
    pass


def score_command(model: str, task, settings: ScoreSettings, data: DataConfig, out, *, echo=_echo_none,
                  device=None, precision=None, tokens_per_batch=None, mark=_echo_none) -> dict:
    """``headcount score``: load, batch, score, write ``scores.json`` and ``heads.png``.

    ``task``: a ``Task`` (or its name); ``settings`` and ``data`` are
    validated when built (a bad method is refused before any load; ``settings.scorer`` is the scorer);
    ``device`` / ``precision`` / ``tokens_per_batch``: where it runs (``headcount.runtime.device``),
    resolved here once into a ``Runtime`` that every verb is handed.
    ``mark(phase)`` is called at the end of each phase (``load``, ``data``, ``score``, ``write``):
    the command's ``HEADCOUNT_TIMING`` line.
    """
    rt = resolve_runtime(device, precision, tokens_per_batch)  # an unavailable one: refused before loading
    objective, method, scorer = settings.objective, settings.method, settings.scorer
    t = get_task(task)  # a Task as it is
    m, tok, info = load_for(model, t, objective, seed=data.seed, device=rt)
    _kv_group_meta(m, None, settings.unit)  # refused before scoring
    data = fit_positions(data, tok, model, echo)
    if info["head"] == "new":
        echo(f"note: {model} has no trained head for {t.name}; "
             + (f"scoring with a new, untrained task head (drawn with --seed {info['head_seed']}; fine-tune first "
                "for task importance)" if scorer.needs_loss
                else f"a new, untrained task head was created ({method} scores do not read it)"))
    if info["head"] == "fitted":
        r = info["mlm_head"]
        echo(f"note: {model} has no masked-LM head; fitted one on the frozen encoder "
             f"(MLM loss {r.get('loss', float('nan')):.3f}, accuracy {r.get('accuracy', float('nan')):.3f})")
    if "contrastive" in info:
        echo(f"note: {objective} objective: {info['pooling']} pooling, SimCSE loss"
             + (" with the pairs as positives" if info["contrastive"].supervised
                else f", dropout views seeded by --seed {data.seed}"))
    mark("load")
    batches = [] if not scorer.needs_data else batches_for(t, tok, objective, data, group_by_length=settings.grouped)
    mark("data")
    with decoding(m, metric_for(t, objective)), scoring_progress(m, scorer, batches) as bar:
        s = score(m, batches, method=scorer, normalize=settings.normalize, device=rt, progress=bar,
                  accumulate=settings.accumulate, contrastive=info.get("contrastive"), options=settings.options)
    if "retrieval" in s.meta:  # Wu et al.'s score: its bootstrap interval over examples
        s = with_retrieval_interval(s)
        r = s.meta["retrieval"]
        echo(f"retrieval: {r['n_counted']} of {s.n_examples} examples count ({r['success']}); needle accuracy "
             f"{r['needle_accuracy']:.2f}" + ("; no example counts: every score is 0" if not r["n_counted"] else ""))
    mark("score")
    echo(f"scored on {_on(s.meta)}")
    meta = {"objective": objective, "task": t.name, "model": model, "split": data.split or t.train_split,
            "head": info["head"], **_head_seed(info), **_kv_group_meta(m, s, settings.unit)}
    if "mlm_head" in info:
        meta["mlm_head"] = info["mlm_head"]
    bad = non_finite_scores(s, pruning_record(m) or {}, scorer.scores_mlps)
    if bad:
        meta["non_finite_scores"] = bad
        first = (f"layer {bad['heads'][0][0]} head {bad['heads'][0][1]}" if bad["heads"]
                 else f"the MLP of layer {bad['mlps'][0]}")
        echo(f"warning: {len(bad['heads'])} head and {len(bad['mlps'])} MLP scores are not finite (NaN or inf; "
             f"first: {first}): the model's weights or outputs are not finite; scores.json lists them")
    s = replace(s, meta={**s.meta, **meta})
    out = Path(out)
    s.save(out / "scores.json")
    plots.head_heatmap(s.to_dict(), out / "heads.png", title=f"{method} importance, {objective}: {t.name}")
    mark("write")
    return {**s.to_dict(), "seconds": s.meta.get("seconds", 0.0)}


def scoring_progress(model, scorer, batches):
    """The stderr progress of scoring ``batches`` with ``scorer`` (examples, or heads for a scorer
    whose ``progress_unit`` is ``heads``); a no-op context for a scorer that reads no data."""
    if not scorer.needs_data:
        return nullcontext()
    grid = layout(model)
    total = grid[0] * grid[1] if scorer.progress_unit == "heads" else count_examples(batches)
    return Progress(total, f"scoring ({scorer.name})", unit=scorer.progress_unit)


def fit_positions(data: DataConfig, tokenizer, model: str, echo=_echo_none) -> DataConfig:
    """``data`` with ``max_length`` cut to the model's positions (``load_tokenizer`` sets them as
    ``model_max_length``; tokenizing truncates to them in any case), said in one line."""
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 2 <= limit < data.max_length:
        echo(f"note: --max-length {data.max_length} is more than the {limit} positions of {model}: "
             f"inputs are cut to {limit} tokens")
        return replace(data, max_length=limit)
    return data


def non_finite_scores(s, record: dict, scores_mlps: bool = True) -> dict:
    """The scores that are NaN or infinite where a number was due: ``{"heads": [[layer, head], ...],
    "mlps": [layer, ...]}``, empty when there are none. A head or MLP the model no longer has
    (``record``: its pruning record) has no score by design, nor has an MLP for a method that
    scores none (``scores_mlps`` False: ``entropy``)."""
    gone = {(layer, head) for layer, heads in enumerate(record.get("removed_heads", [])) for head in heads}
    heads = [[layer, head] for layer, row in enumerate(s.heads.tolist()) for head, v in enumerate(row)
             if (layer, head) not in gone and not math.isfinite(v)]
    values = s.mlps.tolist()
    gone_mlps = set(record.get("removed_mlps", []))
    mlps = ([layer for layer, v in enumerate(values) if layer not in gone_mlps and not math.isfinite(v)]
            if scores_mlps else [])
    return {"heads": heads, "mlps": mlps} if heads or mlps else {}


def prune_command(model: str, task, settings: PruneSettings, loop: PruneConfig, importance: DataConfig,
                  stop: DataConfig, out, *, echo=_echo_none, device=None, precision=None,
                  tokens_per_batch=None) -> PruneResult:
    """``headcount prune``: iterative pruning; writes ``mask.json``, ``trace.csv``, ``curve.png``.

    ``importance`` / ``stop``: the examples importance and the stop rule are computed on (their
    splits: ``settings.importance_split`` / ``settings.stop_split``, else train / validation).
    ``task``, ``device`` / ``precision`` / ``tokens_per_batch``: as [`score_command`][headcount.cli.api.score_command].
    """
    rt = resolve_runtime(device, precision, tokens_per_batch)  # an unavailable one: refused before loading
    objective, method = settings.objective, settings.method
    t = get_task(task)  # a Task as it is
    m, tok, info = load_for(model, t, objective, seed=importance.seed, device=rt)
    importance = fit_positions(importance, tok, model, echo)
    stop = fit_positions(stop, tok, model, _echo_none)  # one note is enough
    if info["head"] == "new":
        echo(f"note: {model} has no trained head for {t.name}: the metric is that of an untrained head, drawn with "
             f"--seed {info['head_seed']} (fine-tune first: `headcount finetune`)")
    imp_batches = ([] if not settings.scorer.needs_data
                   else batches_for(t, tok, objective, importance, split=settings.importance_split,
                                    group_by_length=settings.grouped))
    stop_batches = batches_for(t, tok, objective, stop, split=settings.stop_split or t.validation_split)
    metric = metric_for(t, objective)

    bar = Progress(None, "pruning", unit="steps")

    def progress(row):
        bar.update(row["step"], detail=f"{row['heads_kept']} heads, {row['mlps_kept']} MLPs kept")
        echo(f"step {row['step']:>3} {row['phase']:<6} heads {row['heads_kept']:>4} mlps {row['mlps_kept']:>3} "
             f"{metric} {row['metric']:.4f} {'ok' if row['accepted'] else 'below threshold'}")

    with bar:
        result = prune_model(m, imp_batches, stop_batches, metric, settings=settings, config=loop, progress=progress,
                             device=rt, contrastive=info.get("contrastive"))
    echo(f"pruned on {_on(result.meta)}")
    out = Path(out)
    mask = result.mask.with_meta(model=model, task=t.name, objective=objective, metric_name=metric, method=method,
                                 normalize=settings.normalize, head=info["head"], **_head_seed(info))
    mask.save(out / "mask.json")
    atomic_write_text(out / "trace.csv", result.trace_csv())
    plots.prune_curve(result.trace, loop.threshold * result.full_metric, out / "curve.png",
                title=f"{t.name} ({objective}): {metric} vs heads kept")
    result.mask = mask
    return result
