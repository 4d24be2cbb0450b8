"""Evaluation over prepared batches (no gradient), with an optional mask held as gates."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from .gates import clear_gates, set_gates

#: the metric name for the masked-LM objective: accuracy over masked tokens
MLM_METRIC = "mlm_accuracy"
IGNORE = -100  # label of positions the masked-LM loss ignores


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
    from transformers.modeling_outputs import BaseModelOutput

    from .errors import HeadcountError

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
def evaluate_batches(model, batches, metric: str, mask=None) -> dict:
    """Loss and metric of ``model`` on ``batches`` (dicts with ``labels``).

    Args:
        model: a model returning ``loss`` and ``logits``.
        batches: prepared batches (dynamic padding).
        metric: a task metric name (see ``headcount.tasks.compute_metrics``) or ``"mlm_accuracy"``.
        mask: optional :class:`~headcount.masks.Mask` applied as gates.

    Returns:
        ``{"score": primary metric, "loss": mean loss, ...metric parts}``.

    >>> evaluate_batches(model, batches, "accuracy")["score"]     # doctest: +SKIP
    0.87
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    fixed = set_gates(model, heads=mask.heads, mlps=mask.mlps) if mask is not None else None
    try:
        loss_sum, weight, logits, labels = 0.0, 0, [], []
        correct = total = 0
        for batch in batches:
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            y = batch["labels"]
            if metric == MLM_METRIC:
                with masked_positions_only(model):  # decode only the masked tokens
                    out = model(**batch)
                y = y[y != IGNORE]
                n = int(y.numel())
                correct += int((out.logits[0].argmax(-1) == y).sum())
                total += n
            else:
                out = model(**batch)
                n = int(y.shape[0])
                logits.append(out.logits.float().cpu())
                labels.append(y.cpu())
            loss_sum += float(out.loss) * n
            weight += n
    finally:
        if fixed is not None:
            clear_gates(model, fixed)
        model.train(was_training)
    loss = loss_sum / max(weight, 1)
    if metric == MLM_METRIC:
        acc = correct / max(total, 1)
        return {"score": acc, "accuracy": acc, "loss": loss, "n_masked": total}
    from .tasks import compute_metrics

    preds = torch.cat(logits).numpy()
    if preds.ndim == 2 and preds.shape[1] == 1:
        preds = preds[:, 0]
    result = compute_metrics(metric, preds, torch.cat(labels).numpy())
    return {**{k: float(v) for k, v in result.items()}, "loss": loss, "n_examples": int(np.sum([len(x) for x in labels]))}
