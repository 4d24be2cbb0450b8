"""Evaluation over prepared batches (no gradient), with an optional mask held as gates."""

from __future__ import annotations

import numpy as np
import torch

from .gates import clear_gates, set_gates

#: the metric name for the masked-LM objective: accuracy over masked tokens
MLM_METRIC = "mlm_accuracy"


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
            out = model(**batch)
            y = batch["labels"]
            if metric == MLM_METRIC:
                sel = y != -100
                n = int(sel.sum())
                correct += int((out.logits.argmax(-1)[sel] == y[sel]).sum())
                total += n
            else:
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
