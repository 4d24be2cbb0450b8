"""Evaluation over prepared batches (no gradient), with an optional mask held as gates."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from headcount.core.gates import clear_gates, set_gates
from headcount.data.tasks.base import (
    IGNORE,  # the label of positions a loss ignores (declared there, once)
)
from headcount.data.tasks.batching import pack_batches, padding_id
from headcount.data.tasks.metrics import compute_metrics
from headcount.runtime.device import runtime, to_device
from headcount.runtime.errors import HeadcountError

#: the metric name for the masked-LM objective: accuracy over masked tokens
MLM_METRIC = "mlm_accuracy"
#: the metric name for a decoder's causal-LM objective: next-token accuracy (greedy top-1) over the
#: predicted positions (labels shifted by one; padding and the first position never count)
LM_METRIC = "lm_accuracy"


@contextmanager
def masked_positions_only(model):
    """Inside the block, ``model(**batch)`` decodes only the positions the loss reads.

    The encoder runs on the whole batch; the MLM head (the vocabulary projection, the costly
    part) then runs on the hidden states of the masked positions only, packed as one sequence
    ``[1, n_masked, hidden]``. The loss is the same mean over masked tokens, so losses and gate
    gradients equal the full model's; ``logits`` come back as ``[1, n_masked, vocab]``.

    >>> with masked_positions_only(model):          # doctest: +SKIP
    ...     loss = model(**mlm_batch).loss
    """
    # lazy: transformers costs ~0.7 s to import, and headcount --help loads this module
    from transformers.modeling_outputs import BaseModelOutput

    base = model.base_model
    head_forward = model.forward  # the class's forward, bound
    holder: dict = {}

    def given_hidden(*args, **kwargs):
        return BaseModelOutput(last_hidden_state=holder.pop("h"))

    def forward(input_ids=None, attention_mask=None, labels=None, **kwargs):
        if labels is None:
            raise HeadcountError("masked_positions_only needs batches with labels")
        hidden = base(input_ids=input_ids, attention_mask=attention_mask, **kwargs)[0]  # [batch, seq, hidden]
        where = labels != IGNORE
        holder["h"] = hidden[where][None]  # [1, n_masked, hidden]
        target = labels[where][None]  # [1, n_masked]
        base.forward = given_hidden
        try:
            return head_forward(input_ids=target, labels=target)
        finally:
            del base.forward

    model.forward = forward
    try:
        yield model
    finally:
        del model.forward


@torch.no_grad()
def evaluate_batches(model, batches, metric: str, mask=None, *, device=None, precision=None,
                     tokens_per_batch: int | None = None) -> dict:
    """Loss and metric of ``model`` on ``batches`` (dicts with ``labels``).

    Args:
        model: a model returning ``loss`` and ``logits``.
        batches: prepared batches (dynamic padding).
        metric: a task metric name (see ``headcount.data.tasks.compute_metrics``), ``"mlm_accuracy"``
            or ``"lm_accuracy"`` (a causal LM: the top-1 prediction at t against the token at t + 1;
            the result also has ``perplexity``, exp of the mean next-token loss).
        mask: optional [`Mask`][headcount.core.masks.Mask] applied as gates.
        device / precision / tokens_per_batch: see ``headcount.runtime.device`` (None: the model's
            device or ``$HEADCOUNT_DEVICE``; auto precision; the device's token budget). Batches
            are merged up to the budget: the loss (weighted per example, or per masked token)
            and the metric do not depend on how examples are batched.

    Returns:
        ``{"score": primary metric, "loss": mean loss, ...metric parts, "device", "precision"}``.

    >>> evaluate_batches(model, batches, "accuracy")["score"]     # doctest: +SKIP
    0.87
    """
    was_training = model.training
    model.eval()
    rt = runtime(model, device, precision, tokens_per_batch)
    fixed = (set_gates(model, heads=mask.heads.to(rt.device), mlps=mask.mlps.to(rt.device))
             if mask is not None else None)
    try:
        # sums stay on the device: no host sync per batch; one copy back at the end
        loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
        correct = torch.zeros((), dtype=torch.long, device=rt.device)
        weight, total, logits, labels = 0, 0, [], []
        for batch, _ in pack_batches(batches, rt.tokens_per_batch, rt.pad_multiple, padding_id(model)):
            y = batch["labels"]
            # on the CPU batch; lm: lm_batches ignore the first position, so this counts the predictions
            n = int((y != IGNORE).sum()) if metric in (MLM_METRIC, LM_METRIC) else int(y.shape[0])
            batch = to_device(batch, rt.device)
            y = batch["labels"]
            if metric == MLM_METRIC:
                with masked_positions_only(model), rt.autocast():  # decode only the masked tokens
                    out = model(**batch)
                y = y[y != IGNORE]
                correct += (out.logits[0].argmax(-1) == y).sum()
                total += n
            elif metric == LM_METRIC:  # the model shifts: the logits at t predict the label at t + 1
                with rt.autocast():
                    out = model(**batch)
                target = y[:, 1:]
                correct += ((out.logits[:, :-1].argmax(-1) == target) & (target != IGNORE)).sum()
                total += n
            else:
                with rt.autocast():
                    out = model(**batch)
                logits.append(out.logits.float())
                labels.append(y)
            loss_sum += out.loss.double() * n
            weight += n
    finally:
        if fixed is not None:
            clear_gates(model, fixed)
        model.train(was_training)
    loss_sum = float(loss_sum)
    where = {"device": str(rt.device), "precision": rt.precision}
    loss = loss_sum / max(weight, 1)
    if metric == MLM_METRIC:
        acc = int(correct) / max(total, 1)
        return {"score": acc, "accuracy": acc, "loss": loss, "n_masked": total, **where}
    if metric == LM_METRIC:
        acc = int(correct) / max(total, 1)
        return {"score": acc, "accuracy": acc, "loss": loss, "perplexity": float(np.exp(min(loss, 700.0))),
                "n_tokens": total, **where}
    preds = torch.cat(logits).cpu().numpy()
    labels = [torch.cat(labels).cpu()] if labels else []
    if preds.ndim == 2 and preds.shape[1] == 1:
        preds = preds[:, 0]
    result = compute_metrics(metric, preds, torch.cat(labels).numpy())
    return {**{k: float(v) for k, v in result.items()}, "loss": loss,
            "n_examples": int(np.sum([len(x) for x in labels])), **where}
