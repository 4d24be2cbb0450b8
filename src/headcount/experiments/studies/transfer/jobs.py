"""The transfer study's job functions ``(params, inputs, workdir, progress) -> dict``: orchestration only.

Each validates its params into the model of [`config`][headcount.experiments.studies.transfer.config] that declares them, then calls the
core ([`headcount.data.heads`][headcount.data.heads], [`headcount.importance.scoring`][headcount.importance.scoring], [`headcount.data.evaluation`][headcount.data.evaluation]) and the
analysis ([`headcount.analysis.coherence`][headcount.analysis.coherence], [`headcount.analysis.removal`][headcount.analysis.removal]), and writes
its files atomically. Fine-tuning and task scores use the shared jobs of [`headcount.experiments.studies.jobs`][headcount.experiments.studies.jobs].
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.analysis import layer_mass
from headcount.analysis.coherence import coherence, pair_seed, seed_mean_ci, view_of
from headcount.analysis.removal import removal_mask
from headcount.core.arch import require_decoder
from headcount.core.gates import layout, shared_groups
from headcount.core.models import load_model
from headcount.core.surgery import count_parameters, save_tokenizer
from headcount.data.embedding import SIMILARITY_METRIC, embed, similarity_agreement
from headcount.data.evaluation import LM_METRIC, evaluate_batches, masked_positions_only
from headcount.data.heads import fit_task_head
from headcount.data.mlm_head import evaluate_mlm, mlm_model
from headcount.data.tasks import encode, get_task, make_batches
from headcount.experiments.studies.jobs import (
    load_batched_rows,
    load_per_example,
    model_spec,
    save_per_example,
    scoring_progress,
    step_messages,
)
from headcount.experiments.studies.transfer.params import (
    CoherenceParams,
    CurveParams,
    HeadFitParams,
    LayoutParams,
    MaskParams,
    MlmHeadParams,
    MlmScoreParams,
)
from headcount.importance.pipeline import batches_for, load_for
from headcount.importance.scoring import score
from headcount.runtime.atomic import atomic_write_json, atomic_write_text
from headcount.runtime.device import resolve_runtime
from headcount.train import prepare_model


def _mlm_model(model: str, head: MlmHeadParams, encoder: str | None = None):
    return mlm_model(model, head.corpus, steps=head.steps, max_texts=head.max_texts, seed=head.seed,
                     after=head.after, encoder=encoder)


def _lm_model(model: str, encoder: str | None = None):
    """A decoder's causal LM with its own head (``lm`` in MLM's place) and its tokenizer; with
    ``encoder`` (a fine-tuned checkpoint of the same model, e.g. a classifier) its backbone
    weights go under the pre-trained LM head."""
    from headcount.core.models import load_tokenizer

    lm = load_model(model, head="lm")
    require_decoder(lm, "objectives [lm]", model)
    if encoder is not None:
        lm.base_model.load_state_dict(load_model(encoder, head="base").state_dict())
    return lm.eval(), load_tokenizer(model)


def _grid(result) -> np.ndarray:
    """The ``[n_layers, n_heads]`` head scores of a score job."""
    return np.asarray(result.load_json("scores.json")["heads"], dtype=np.float64)


def per_example_of(result):
    """``(rows, ids)`` of a score job: ``[n_examples, n_layers, n_heads]`` per-example contributions
    and their example ids (None for results saved without ids); ``(None, None)`` without the file."""
    # each row is one example's share of its batch's score: for gradient-token they sum to the grid
    return load_per_example(result.dir / "per_example.safetensors")


def bootstrap_rows(result):
    """``(contributions, ids, replicates)`` of a score job for the coherence bootstrap: the
    ``gradient`` estimator's signed rows (rebuilt on each resample) where they were saved, else the
    per-example rows; ``replicates`` ``proxy`` where those rows do not sum to the grid (``gradient``
    saved without signed rows: its intervals are labelled uncalibrated), else ``estimator``."""
    rows, ids = per_example_of(result)
    d = result.load_json("scores.json")
    batched = load_batched_rows(result.dir / "per_example.safetensors", d.get("accumulate") or "per-batch")
    if batched is not None:
        return batched, ids, "estimator"
    return rows, ids, "proxy" if d.get("method") == "gradient" else "estimator"


def _views(requested, lay: dict) -> list[str]:
    """The requested views the model has (``shared`` only for a model with shared layers)."""
    return [v for v in requested if v == "application" or (v == "shared" and lay["shared"])]


def layout_job(params, inputs, workdir: Path, progress) -> dict:
    """The model's gate grid and shared-layer groups: ``n_layers``, ``n_heads``, ``groups``, ``shared``.

    >>> layout_job({"model": "offline"}, {}, Path("."), print)["n_heads"]   # doctest: +SKIP
    12
    """
    p = LayoutParams.model_validate(params)
    model = load_model(p.model, head="base")
    n_layers, n_heads = layout(model)
    groups = shared_groups(model)
    return {"n_layers": n_layers, "n_heads": n_heads, "groups": groups,
            "shared": any(len(g) > 1 for g in groups), "model_type": str(model.config.model_type),
            "n_params": count_parameters(model)}


def mlm_score_job(params, inputs, workdir: Path, progress) -> dict:
    """Masked-LM importance of the pre-trained model, or of a fine-tuned encoder (input ``encoder``).

    params: [`MlmScoreParams`][headcount.experiments.studies.transfer.params.MlmScoreParams]. Writes ``scores.json`` and
    ``per_example.safetensors`` like the shared ``score_job``.

    >>> mlm_score_job(params, {}, Path("out"), print)["objective"]   # doctest: +SKIP
    'mlm'
    """
    p = MlmScoreParams.model_validate(params)
    rt = resolve_runtime()  # $HEADCOUNT_DEVICE / $HEADCOUNT_PRECISION (set by the runner), once
    task = get_task(p.task)
    encoder = str(inputs["encoder"].path("model")) if "encoder" in inputs else None
    if p.objective == "lm":  # a decoder: its own next-token loss, no head to fit
        model, tokenizer = _lm_model(p.model, encoder)
        batches = batches_for(task, tokenizer, "lm", p.data.config())
        s = score(model, batches, method=p.method, normalize="none", keep_per_example=True,
                  progress=scoring_progress(progress, model, batches, p.method), device=rt)
        s = replace(s, meta={**s.meta, "task": task.name, "objective": "lm", "model": p.model, "encoder": encoder,
                             "head": "checkpoint"})
        s.save(workdir / "scores.json")
        save_per_example(workdir, s, task, tokenizer, "lm", p.data.config())
        return s.to_dict()
    model, tokenizer, info = _mlm_model(p.model, p.mlm_head, encoder=encoder)
    batches = batches_for(task, tokenizer, "mlm", p.data.config())
    with masked_positions_only(model):
        s = score(model, batches, method=p.method, normalize="none",
                  keep_per_example=True, progress=scoring_progress(progress, model, batches, p.method), device=rt)
    head = info["mlm_head"]
    s = replace(s, meta={**s.meta, "task": task.name, "objective": "mlm", "model": p.model,
                         "encoder": encoder, "head": "fitted" if head.get("fitted") else "checkpoint",
                         "mlm_head": {k: head.get(k) for k in ("fitted", "loss", "accuracy", "message")}})
    s.save(workdir / "scores.json")
    save_per_example(workdir, s, task, tokenizer, "mlm", p.data.config())
    return s.to_dict()


def head_fit_job(params, inputs, workdir: Path, progress) -> dict:
    """A task head fitted on the frozen pre-trained encoder ("before fine-tuning" has a task loss).

    params: [`HeadFitParams`][headcount.experiments.studies.transfer.params.HeadFitParams] (``train``: lr, epochs, weight_decay, batch_size,
    max_length, max_train_examples, max_eval_examples, eval_batch_size, data_seed are read).
    Writes ``model/`` (encoder unchanged) and ``metrics.json`` (``final``: validation metrics, as
    ``finetune_job``). Trains and evaluates on the job's device (``$HEADCOUNT_DEVICE``, else auto).

    >>> head_fit_job({"model": "offline", "task": "offline/movies", "seed": 1, "train": {}}, {}, Path("o"), print)  # doctest: +SKIP
    """
    p = HeadFitParams.model_validate(params)
    rt = resolve_runtime()  # $HEADCOUNT_DEVICE / $HEADCOUNT_PRECISION (set by the runner), once
    cfg = p.train.config()
    task = get_task(p.task)
    say = step_messages(progress)
    t0 = time.perf_counter()
    model, tokenizer, info = prepare_model(p.model, task, seed=p.seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def batches(split, n, size):
        data = task.load(split, max_examples=n, seed=cfg.data_seed)
        return make_batches(encode(data, tokenizer, max_length=cfg.max_length), size, shuffle=True, seed=cfg.data_seed,
                            group_by_length=True, pad_token_id=pad)

    train = batches(task.train_split, cfg.max_train_examples, cfg.batch_size)
    fit = fit_task_head(model, train, lr=cfg.lr, epochs=cfg.epochs, weight_decay=cfg.weight_decay, seed=p.seed,
                        progress=say, device=rt.device)
    final = evaluate_batches(model, batches(task.validation_split, cfg.max_eval_examples, cfg.eval_batch_size), task.metric,
                             device=rt)
    model.save_pretrained(workdir / "model", safe_serialization=True)
    save_tokenizer(tokenizer, workdir / "model")  # without the padding/truncation of its last call
    metrics = {"task": task.name, "metric": task.metric, "model": p.model, "seed": p.seed,
               "final": {k: v for k, v in final.items() if isinstance(v, (int, float))}, "frozen_encoder": True,
               **fit, "train_seconds": round(time.perf_counter() - t0, 3), "n_train": sum(len(b["labels"]) for b in train),
               "head": info["head"]}
    atomic_write_json(workdir / "metrics.json", metrics)
    say(f"{task.name}: {task.metric} {final['score']:.4f} with the encoder frozen")
    return metrics


def mask_job(params, inputs, workdir: Path, progress) -> dict:
    """A mask removing ``level`` of the heads: by the upstream ``scores`` or at random (``order: random``).

    params: [`MaskParams`][headcount.experiments.studies.transfer.params.MaskParams]. Writes ``mask.json``.

    >>> mask_job({"level": 0.5, "order": "random", "seed": 0, ...}, {"layout": layout}, Path("o"), print)  # doctest: +SKIP
    """
    p = MaskParams.model_validate(params)
    lay = inputs["layout"].result
    shape = (lay["n_layers"], lay["n_heads"])
    grid = np.random.default_rng([p.seed, 7]).random(shape) if p.order == "random" else _grid(inputs["scores"])
    mask = removal_mask(grid, p.level, view=p.view, groups=lay["groups"], normalize=p.normalize)
    mask = mask.with_meta(order=p.order, level=p.level)
    mask.save(workdir / "mask.json")
    return mask.to_dict()


def curve_job(params, inputs, workdir: Path, progress) -> dict:
    """Prunability curve: the metric of a model with the lowest-ranked heads gated off, level by level.

    params: [`CurveParams`][headcount.experiments.studies.transfer.params.CurveParams] (validation split). Writes ``curve.csv``; returns
    ``full`` and ``rows`` (one per view, order, replicate, level).

    >>> curve_job(params, inputs, Path("out"), print)["rows"][0]["fraction"]   # doctest: +SKIP
    0.0
    """
    p = CurveParams.model_validate(params)
    task = get_task(p.task)
    data = p.eval.config(split=task.validation_split)
    if p.objective == "mlm":
        model, tokenizer, _ = _mlm_model(p.model, p.mlm_head)
        batches = batches_for(task, tokenizer, "mlm", data)
        metric = "mlm_accuracy"

        def evaluate(mask):
            return evaluate_mlm(model, batches, mask)
    elif p.objective == "lm":  # a decoder's next-token accuracy on the texts
        model, tokenizer = _lm_model(p.model)
        batches = batches_for(task, tokenizer, "lm", data)
        metric = LM_METRIC

        def evaluate(mask):
            return evaluate_batches(model, batches, metric, mask=mask)
    elif p.objective == "embedding":  # no labels: agreement with the unpruned encoder's similarities
        model, tokenizer, info = load_for(p.model, task, "embedding", seed=data.seed)
        pooling = info["pooling"]
        batches = batches_for(task, tokenizer, "embedding", data)
        reference = embed(model, batches, pooling)
        metric = SIMILARITY_METRIC

        def evaluate(mask):
            return similarity_agreement(embed(model, batches, pooling, mask), reference)
    else:
        model, tokenizer, _ = load_for(model_spec(params, inputs), task, "task", seed=data.seed)
        batches = batches_for(task, tokenizer, "task", data)
        metric = task.metric

        def evaluate(mask):
            return evaluate_batches(model, batches, metric, mask=mask)

    lay = inputs["layout"].result
    shape = (lay["n_layers"], lay["n_heads"])
    views = _views(p.views, lay)
    orders: list[tuple[str, str, np.ndarray]] = []  # (order, replicate, [n_layers, n_heads] ranking grid)
    for order, reps in p.orders.items():
        for rep, alias in reps.items():
            orders.append((order, str(rep), _grid(inputs[alias])))
    for d in range(p.random_draws):
        orders.append(("random", str(d), np.random.default_rng([p.random_seed, d]).random(shape)))
    total = 1 + len(views) * len(orders) * len(p.levels)
    done = 1
    full = evaluate(None)
    progress(done, total, f"full model: {metric} {full['score']:.4f}")
    keep_keys = ("score", "loss")
    rows = []
    cache: dict[bytes, dict] = {}  # the same mask (e.g. at level 0.9 by two orders) is evaluated once
    for view in views:
        for order, rep, grid in orders:
            rows.append({"view": view, "order": order, "replicate": rep, "fraction": 0.0, "heads_removed": 0,
                         "heads_kept": shape[0] * shape[1], **{k: full[k] for k in keep_keys}})
            for level in p.levels:
                mask = removal_mask(grid, level, view=view, groups=lay["groups"], normalize=p.normalize)
                key = mask.heads.numpy().tobytes()
                if key not in cache:
                    cache[key] = evaluate(mask)
                r = cache[key]
                rows.append({"view": view, "order": order, "replicate": rep, "fraction": level,
                             "heads_removed": shape[0] * shape[1] - mask.n_heads_kept, "heads_kept": mask.n_heads_kept,
                             **{k: r[k] for k in keep_keys}})
                done += 1
                progress(done, total, f"{view}/{order}/{rep} {level:g}: {r['score']:.4f}")
    for r in rows:
        r.update(metric=metric, objective=p.objective)
    atomic_write_text(workdir / "curve.csv", pd.DataFrame(rows).to_csv(index=False))
    return {"task": task.name, "objective": p.objective, "metric": metric, "full": full, "rows": rows,
            "n_evaluations": 1 + len(cache)}


def coherence_job(params, inputs, workdir: Path, progress) -> dict:
    """Coherence of every pair of score grids the study compares, in every view.

    params: [`CoherenceParams`][headcount.experiments.studies.transfer.params.CoherenceParams] (``pairs``: ``a``/``b`` are input names of score
    jobs; ``grids``: what each input is). Writes ``coherence.csv`` (one row per pair, view and
    statistic), ``coherence_seeds.csv`` (the mean over the pairs of each comparison, view and task:
    hierarchical bootstrap interval over seeds and examples) and ``layer_mass.csv``; returns
    their rows (``rows``, ``seed_means``, ``layer_mass``).

    >>> coherence_job(params, inputs, Path("out"), print)["rows"][0]["statistic"]   # doctest: +SKIP
    'spearman'
    """
    p = CoherenceParams.model_validate(params)
    lay = inputs["layout"].result
    views = _views(p.views, lay)
    st = p.stats
    grids = {alias: _grid(inputs[alias]) for alias in p.grids}
    per_example = {alias: bootstrap_rows(inputs[alias]) for alias in p.grids}  # (rows, ids, replicates)
    rows = []
    samples: dict[tuple, list] = {}  # (comparison, view, task, task_b, statistic) -> [(estimate, samples)]
    proxy: set[tuple] = set()  # the keys of samples some of which are a proxy's replicates
    for i, pair in enumerate(p.pairs):
        (ca, ia, ra), (cb, ib, rb) = per_example[pair.a], per_example[pair.b]
        reps = "proxy" if "proxy" in (ra, rb) else "estimator"
        for view in views:
            c = coherence(grids[pair.a], grids[pair.b], (ca, cb), paired=pair.paired, ids=(ia, ib),
                          fractions=st.fractions, n_boot=st.n_boot, n_permutations=st.n_permutations, level=st.level,
                          seed=pair_seed(st.seed, f"{pair.name}/{view}"), view=view, groups=lay["groups"],
                          permutation=st.permutation, keep_samples=True, replicates=reps)
            for stat, v in c.items():
                rows.append({"pair": pair.name, "comparison": pair.comparison, "view": view,
                             "task": pair.task, "task_b": pair.task_b, "seed": pair.seed,
                             "seed_b": pair.seed_b, "a": pair.a, "b": pair.b, "statistic": stat,
                             "estimate": v["estimate"], "low": v["low"], "high": v["high"],
                             "boot_estimate": v.get("boot_estimate"), "p_value": v["p_value"],
                             "chance": v["chance"], "paired": pair.paired, "p_value_global": v["p_value_global"],
                             "grids": v["grids"], "pairing": v["pairing"], "replicates": v.get("replicates")})
                key = (pair.comparison, view, pair.task, pair.task_b, stat)
                samples.setdefault(key, []).append((v["estimate"], v.get("samples")))
                if reps == "proxy":
                    proxy.add(key)
        progress(i + 1, len(p.pairs), pair.name)
    # the mean over seeds (pairs) of each comparison: seeds resampled, then examples within each.
    # Approximate where the pairs share a grid (the MLM grid of every seed, seed-vs-seed pairs).
    seed_means = []
    for key, got in samples.items():
        comparison, view, task, task_b, stat = key
        m = seed_mean_ci([e for e, _ in got], [x for _, x in got], stat, level=st.level,
                         seed=pair_seed(st.seed, f"{comparison}/{view}/{task}/{task_b}/{stat}"),
                         interval=st.seed_interval, examples="shared",
                         replicates="proxy" if key in proxy else "estimator")
        seed_means.append({"comparison": comparison, "view": view, "task": task, "task_b": task_b, "statistic": stat,
                           **m})
    mass = []
    for alias, meta in p.grids.items():
        for view in views:
            m = layer_mass(view_of(grids[alias], view, lay["groups"]))
            mass += [{"grid": alias, **meta.model_dump(), "view": view, "layer": layer, "mass": float(x)}
                     for layer, x in enumerate(m)]
    atomic_write_text(workdir / "coherence.csv", pd.DataFrame(rows).to_csv(index=False))
    atomic_write_text(workdir / "coherence_seeds.csv", pd.DataFrame(seed_means).to_csv(index=False))
    atomic_write_text(workdir / "layer_mass.csv", pd.DataFrame(mass).to_csv(index=False))
    return {"rows": rows, "seed_means": seed_means, "layer_mass": mass, "views": views}
