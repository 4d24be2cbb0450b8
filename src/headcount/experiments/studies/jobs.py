"""Job functions shared by the study types: fine-tune, score, prune, evaluate.

Each has the runner's signature ``(params, inputs, workdir, progress) -> dict`` and is
deterministic given its params. A model comes either from ``params["model"]`` (hub id,
directory, ``offline``) or from an upstream job named ``"model"`` (its ``model/`` directory).
A mask comes from an upstream job named ``"mask"`` (its ``mask.json``) or ``params["mask"]``.
Every study type's job functions first validate their ``params`` into the study's pydantic model
for that job ([`job_params`][headcount.experiments.studies.jobs.job_params]).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from pydantic import BaseModel, ValidationError
from safetensors import safe_open
from safetensors.torch import save_file

from headcount.core.masks import Mask
from headcount.core.offline_models import OFFLINE
from headcount.data.evaluation import evaluate_batches
from headcount.data.tasks import get_task
from headcount.experiments.runner.config import format_validation_error
from headcount.importance.pipeline import (
    DataConfig,
    PruneSettings,
    ScoreSettings,
    batches_for,
    decoding,
    example_order,
    load_for,
    metric_for,
    prune_model,
    settings_from,
)
from headcount.importance.pruning import PruneConfig
from headcount.importance.scorers import count_examples
from headcount.importance.scoring import score
from headcount.importance.settings import check_objective, default_of
from headcount.runtime.atomic import atomic_path, atomic_write_text
from headcount.runtime.device import resolve_runtime
from headcount.runtime.errors import HeadcountError
from headcount.train import TrainConfig, finetune


def job_params(model: type[BaseModel], params: dict):
    """``params`` validated into ``model``; a [`HeadcountError`][headcount.runtime.errors.HeadcountError] (one line) when they do not fit.

    >>> class SeedsParams(BaseModel):
    ...     seeds: list[int]
    >>> job_params(SeedsParams, {"seeds": ["x"]})
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: SeedsParams params: 'seeds[0]': Input should be a valid integer, unable to parse string as an integer (got 'x')
    """
    try:
        return model.model_validate(params)
    except ValidationError as e:
        raise HeadcountError(format_validation_error(e, params, {}, f"{model.__name__} params", model)) from None


def model_spec(params: dict, inputs: dict) -> str:
    """The model a job works on: the upstream ``model`` job's checkpoint, else ``params["model"]``."""
    if "model" in inputs:
        return str(inputs["model"].path("model"))
    return params.get("model", OFFLINE)


def input_mask(params: dict, inputs: dict) -> Mask | None:
    """The mask a job applies: from an upstream ``mask`` job, or ``params["mask"]`` (a dict)."""
    if "mask" in inputs:
        return Mask.load(inputs["mask"].path("mask.json"))
    if params.get("mask"):
        return Mask.from_dict(params["mask"])
    return None


def job_task(params: dict):
    """The task of a job: ``params["task"]``, scored by ``params["metric"]`` when given (a study's
    metric that is not the task's own, e.g. the lottery study's accuracy on MRPC and QQP, whose
    task YAMLs declare F1; [`headcount.experiments.studies.lottery.plan.lottery_metric`][headcount.experiments.studies.lottery.plan.lottery_metric]).

    >>> job_task({"task": "glue/mrpc", "metric": "accuracy"}).metric, job_task({"task": "glue/mrpc"}).metric
    ('accuracy', 'f1')
    """
    task = get_task(params["task"])
    metric = params.get("metric")
    return task if not metric or metric == task.metric else replace(task, metric=metric)


def step_messages(progress):
    """Adapt the runner's ``progress(step, total, message)`` to a ``say(message)`` callback."""
    state = {"n": 0}

    def say(message: str) -> None:
        state["n"] += 1
        progress(state["n"], None, message)

    return say


def finetune_job(params, inputs, workdir: Path, progress) -> dict:
    """Fine-tune (or retrain with a mask from the pre-trained weights).

    params: model, task, seed, train (TrainConfig fields), mask_mode ("prune" | "gate"), metric
    (optional: the score's metric when not the task's, [`job_task`][headcount.experiments.studies.jobs.job_task]),
    optional weight_mask from an upstream ``weight_mask`` job (its weight_mask.safetensors).
    Unset ones take [`headcount.train.finetune`][headcount.train.finetune]'s defaults. Writes ``model/`` and ``metrics.json``.
    """
    weight_mask = inputs["weight_mask"].path("weight_mask.safetensors") if "weight_mask" in inputs else None
    given = {k: params[k] for k in ("mask_mode", "seed") if params.get(k) is not None}
    metrics = finetune(
        model_spec(params, inputs), job_task(params), mask=input_mask(params, inputs), weight_mask=weight_mask,
        config=TrainConfig(**params.get("train", {})), out_dir=workdir, progress=step_messages(progress), **given,
    )
    return metrics


def _data(params: dict, key: str = "data") -> DataConfig:
    return DataConfig(**params.get(key, {}))


def _objective(params: dict) -> str:
    """The job's objective: ``params["objective"]``, else the default of [`ScoreSettings`][headcount.importance.settings.ScoreSettings]."""
    return check_objective(params.get("objective") or default_of(ScoreSettings, "objective"))


def scoring_progress(progress, model, batches, scorer):
    """The scorer's ``progress(done)`` as the runner's ``progress(done, total, message)``: ``total``
    what the scorer counts, its examples or (ablation) the model's heads."""
    from headcount.core.gates import layout
    from headcount.importance.scorers import Scorer, get_scorer

    scorer = scorer if isinstance(scorer, Scorer) else get_scorer(scorer)
    if scorer.progress_unit == "heads":
        n_layers, n_heads = layout(model)
        total = n_layers * n_heads
    else:
        total = count_examples(batches)
    return lambda i: progress(i, total, f"scoring ({scorer.progress_unit})")


def score_job(params, inputs, workdir: Path, progress) -> dict:
    """Importance scores of a model for an objective; writes ``scores.json`` (+ per-example
    contributions ``per_example.safetensors`` for bootstrap statistics).

    params: model, task, and the fields of [`ScoreSettings`][headcount.importance.settings.ScoreSettings] (objective,
    method, normalize, accumulate; unset ones take its defaults), data (DataConfig fields).
    """
    how = settings_from(ScoreSettings, params)
    task = get_task(params["task"])
    data = _data(params)
    rt = resolve_runtime()  # $HEADCOUNT_DEVICE / $HEADCOUNT_PRECISION (set by the runner), once
    model, tokenizer, info = load_for(model_spec(params, inputs), task, how.objective, seed=data.seed, device=rt)
    scorer = how.scorer
    batches = [] if not scorer.needs_data else batches_for(task, tokenizer, how.objective, data,
                                                               group_by_length=how.grouped)
    with decoding(model, metric_for(task, how.objective)):
        s = score(model, batches, method=scorer, normalize=how.normalize, device=rt,
                  mask=input_mask(params, inputs), keep_per_example=scorer.per_example,
                  accumulate=how.accumulate, progress=scoring_progress(progress, model, batches, scorer),
                  contrastive=info.get("contrastive"))
    s = replace(s, meta={**s.meta, "task": task.name, "objective": how.objective,
                         "head": info["head"], **({"mlm_head": info["mlm_head"]} if "mlm_head" in info else {})})
    s.save(workdir / "scores.json")
    save_per_example(workdir, s, task, tokenizer, how.objective, data, group_by_length=how.grouped)
    return s.to_dict()


def save_per_example(workdir: Path, s, task, tokenizer, objective: str, data, group_by_length: bool = True) -> None:
    """Write ``per_example.safetensors`` (when ``s`` kept per-example contributions): ``heads``
    ``[n_examples, n_layers, n_heads]`` and ``example_ids`` ``[n_examples]`` (each row's position in
    its split; the metadata ``example_source`` names the task and split), so that two score jobs
    of the same examples can be paired by id ([`load_per_example`][headcount.experiments.studies.jobs.load_per_example]);
    for ``gradient``, also ``signed``, ``batch`` and ``labels``: what its estimator is rebuilt from
    ([`load_batched_rows`][headcount.experiments.studies.jobs.load_batched_rows])."""
    if s.per_example is None:
        return
    tensors = {"heads": s.per_example.contiguous()}
    if s.per_example_signed is not None:
        tensors.update(signed=s.per_example_signed.contiguous(), batch=s.example_batches.contiguous(),
                       labels=s.example_labels.contiguous())
    source, index = example_order(task, tokenizer, objective, data, group_by_length=group_by_length)
    meta = None
    if len(index) == s.per_example.shape[0]:  # else (never expected): rows without ids, unpaired later
        tensors["example_ids"] = torch.from_numpy(index.copy())
        meta = {"example_source": source}
    with atomic_path(workdir / "per_example.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata=meta)


def load_per_example(path) -> tuple:
    """``(rows [n_examples, n_layers, n_heads] float64, ids)`` of a ``per_example.safetensors``;
    ``ids`` is a list of ``"<task>/<split>/<index>"`` strings, or None for files written before
    example ids were saved. ``(None, None)`` when there is no file."""
    path = Path(path)
    if not path.is_file():
        return None, None
    with safe_open(str(path), framework="pt") as f:
        rows = f.get_tensor("heads").double().numpy()
        meta = f.metadata() or {}
        ids = None
        if "example_ids" in f.keys() and "example_source" in meta:
            ids = [f"{meta['example_source']}/{int(i)}" for i in f.get_tensor("example_ids").tolist()]
    return rows, ids


def load_batched_rows(path, accumulate: str = "per-batch"):
    """The ``gradient`` estimator's rows of a ``per_example.safetensors``
    (``headcount.analysis.batched.BatchedRows``, rows in the file's order, like
    [`load_per_example`][headcount.experiments.studies.jobs.load_per_example]'s), or None where
    the file has no signed rows (another scorer, or saved before they were)."""
    from headcount.analysis.batched import BatchedRows

    path = Path(path)
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        if "signed" not in f.keys():
            return None
        return BatchedRows(f.get_tensor("signed").double().numpy(), f.get_tensor("batch").numpy(),
                           f.get_tensor("labels").double().numpy(), accumulate)


def prune_job(params, inputs, workdir: Path, progress) -> dict:
    """Iterative pruning of a model to a threshold; writes ``mask.json`` and ``trace.csv``.

    params: model, task, the fields of [`PruneSettings`][headcount.importance.settings.PruneSettings] (objective,
    method, normalize, accumulate, importance_split, stop_split; unset ones take its defaults),
    prune (PruneConfig fields), data (importance examples), eval_data (stop-rule examples; default:
    the same as data).
    """
    how = settings_from(PruneSettings, params)
    objective = how.objective
    task = job_task(params)
    data = _data(params)
    eval_data = _data(params, "eval_data" if "eval_data" in params else "data")
    rt = resolve_runtime()  # $HEADCOUNT_DEVICE / $HEADCOUNT_PRECISION (set by the runner), once
    model, tokenizer, info = load_for(model_spec(params, inputs), task, objective, seed=data.seed, device=rt)
    imp = batches_for(task, tokenizer, objective, data, split=how.importance_split or task.train_split,
                      group_by_length=how.grouped)
    stop = batches_for(task, tokenizer, objective, eval_data, split=how.stop_split or task.validation_split)
    metric = metric_for(task, objective)

    def report(row):
        progress(row["step"], None, f"{row['phase']}: {row['heads_kept']} heads, {metric} {row['metric']:.3f}")

    result = prune_model(model, imp, stop, metric, settings=how, config=PruneConfig(**params.get("prune", {})),
                         progress=report, device=rt)
    mask = result.mask.with_meta(task=task.name, objective=objective, metric_name=metric, head=info["head"])
    mask.save(workdir / "mask.json")
    atomic_write_text(workdir / "trace.csv", result.trace_csv())
    return {"mask": mask.to_dict(), "full_metric": result.full_metric, "trace": result.trace, "metric_name": metric}


def evaluate_job(params, inputs, workdir: Path, progress) -> dict:
    """Evaluate a model (optionally with a head/MLP mask as gates) on a split of a task.

    params: model, task, objective, split, data (DataConfig fields).
    """
    task = job_task(params)
    objective = _objective(params)
    data = _data(params)
    rt = resolve_runtime()  # $HEADCOUNT_DEVICE / $HEADCOUNT_PRECISION (set by the runner), once
    model, tokenizer, info = load_for(model_spec(params, inputs), task, objective, seed=data.seed, device=rt)
    batches = batches_for(task, tokenizer, objective, data, split=params.get("split") or task.validation_split)
    mask = input_mask(params, inputs)
    r = evaluate_batches(model, batches, metric_for(task, objective), mask=mask, device=rt)
    return {**r, "metric_name": metric_for(task, objective), "head": info["head"],
            "heads_kept": mask.n_heads_kept if mask is not None else None,
            "mlps_kept": mask.n_mlps_kept if mask is not None else None}
