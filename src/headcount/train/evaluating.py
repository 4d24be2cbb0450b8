"""Validation metrics of a model on a task, a split or prepared batches (no gradient, dynamic padding)."""

from __future__ import annotations

from pathlib import Path

import torch

from headcount.core.masks import Mask
from headcount.data.evaluation import evaluate_batches
from headcount.runtime.errors import HeadcountError
from headcount.train.data import _as_task, _tasks


def evaluate(model, task_or_data, *, tokenizer=None, split: str | None = None, metric: str | None = None,
             batch_size: int = 64, max_length: int = 128, max_examples: int | None = None, seed: int = 0,
             mask: Mask | None = None, device=None, precision=None, tokens_per_batch: int | None = None) -> dict:
    """Validation metrics of ``model`` (no gradient, dynamic padding, batches grouped by length).

    Args:
        model: a model that returns ``loss`` and ``logits`` for batches with ``labels``.
        task_or_data: a task (name, YAML path or object: its ``split``, default the validation
            split, is loaded), a ``TaskData`` (encoded with ``tokenizer``), an encoded split
            (``headcount.data.tasks.encode`` output; ``metric`` needed), or a list of prepared batches.
        tokenizer: needed for a task or ``TaskData``; default: loaded from ``model.name_or_path``.
        split: which split of a task.
        metric: the metric name (default: the task's).
        batch_size: examples per batch.
        max_length: tokens per example.
        max_examples: a subset of the split, drawn with ``seed``.
        seed: the subset's seed.
        mask: a head/MLP mask applied as gates during the evaluation.
        device / precision / tokens_per_batch: where and how it runs (``headcount.runtime.device``;
            default: where the model is, auto precision, the device's token budget).

    Returns:
        ``{"score": primary metric, "loss": mean loss, ...metric parts, "n_examples": n}``.

    >>> evaluate(model, "offline/movies", tokenizer=tok)["score"]      # doctest: +SKIP
    0.84
    """
    T = _tasks()
    if isinstance(task_or_data, list) and task_or_data and isinstance(task_or_data[0], dict) \
            and torch.is_tensor(task_or_data[0].get("input_ids")):
        batches = task_or_data
    else:
        encoded = task_or_data
        if isinstance(task_or_data, (str, Path)) or hasattr(task_or_data, "load"):
            task = _as_task(task_or_data)
            encoded = task.load(split or task.validation_split, max_examples=max_examples, seed=seed)
        if hasattr(encoded, "texts") and hasattr(encoded, "task"):  # TaskData
            metric = metric or encoded.task.metric
            if tokenizer is None:
                from headcount.core.models import load_tokenizer

                tokenizer = load_tokenizer(getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", ""))
            encoded = T.encode(encoded, tokenizer, max_length=max_length)
        pad = 0
        if tokenizer is not None and tokenizer.pad_token_id is not None:
            pad = tokenizer.pad_token_id
        batches = T.make_batches(encoded, batch_size, shuffle=False, group_by_length=True, pad_token_id=pad)
    if metric is None:
        raise HeadcountError("evaluate() needs metric= for encoded data or prepared batches")
    return evaluate_batches(model, batches, metric, mask=mask, device=device, precision=precision,
                            tokens_per_batch=tokens_per_batch)

