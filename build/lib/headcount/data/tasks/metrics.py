"""Task metrics (the GLUE ones), computed with numpy/scipy and checked against scikit-learn.

- ``accuracy``
- ``f1``: F1 of class 1 for two classes (MRPC, QQP), macro F1 for more; reports accuracy too.
- ``mcc``: Matthews correlation (multi-class form, as scikit-learn); reports accuracy too.
- ``pearson`` / ``spearman`` / ``pearson_spearman``: correlations for regression; every
  regression metric reports both; ``pearson_spearman`` scores their mean (the GLUE STS-B number).

Every result has ``"score"``, the primary metric value.
"""

from __future__ import annotations

import warnings

import numpy as np

from headcount.data.tasks.base import CLASSIFICATION_METRICS, METRICS, REGRESSION_METRICS
from headcount.runtime.errors import HeadcountError


def compute_metrics(metric: str, predictions, labels) -> dict[str, float]:
    """Score predictions against labels.

    Args:
        metric: ``accuracy | f1 | mcc | pearson | spearman | pearson_spearman``.
        predictions: logits ``[n, num_labels]``, class ids ``[n]``, or regression values
            ``[n]`` / ``[n, 1]``.
        labels: class ids ``[n]`` or regression targets ``[n]``.

    Returns:
        ``{"score": primary value, <metric parts>...}`` as plain floats.

    >>> compute_metrics("f1", [[0.1, 0.9], [2.0, -1.0], [0.0, 1.0]], [1, 0, 0])
    {'score': 0.6666666666666666, 'f1': 0.6666666666666666, 'accuracy': 0.6666666666666666}
    """
    if metric not in METRICS:
        raise HeadcountError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    preds = np.asarray(predictions)
    y = np.asarray(labels)
    if y.ndim != 1:
        y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if y.ndim != 1:
        raise HeadcountError(f"labels must be one value per example, got shape {tuple(y.shape)}")
    if len(y) == 0:
        raise HeadcountError("cannot compute a metric on zero examples")
    if len(preds) != len(y):
        raise HeadcountError(f"{len(preds)} predictions for {len(y)} labels")
    if metric in REGRESSION_METRICS:
        return _regression(metric, preds, y)
    return _classification(metric, _class_ids(preds), _class_ids(y, labels=True))


def _class_ids(a: np.ndarray, labels: bool = False) -> np.ndarray:
    if a.ndim == 2 and a.shape[1] > 1 and not labels:
        return a.argmax(axis=1).astype(np.int64)
    if a.ndim == 2 and a.shape[1] == 1:
        raise HeadcountError("a classification metric needs logits [n, num_labels] or class ids [n], got one value per example")
    if a.ndim != 1:
        raise HeadcountError(f"expected class ids [n] or logits [n, k], got shape {tuple(a.shape)}")
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise HeadcountError("class ids must be whole numbers (pass logits [n, k] for scores)")
    elif a.dtype.kind not in "iub":
        raise HeadcountError(f"class ids must be numbers, got dtype {a.dtype}")
    ids = a.astype(np.int64)
    if ids.min() < 0:
        raise HeadcountError("labels contain -1 (an unlabelled split, such as a GLUE test set, cannot be scored)"
                             if labels else "class ids must not be negative")
    return ids


def _confusion(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    k = int(max(pred.max(), y.max())) + 1
    c = np.zeros((k, k), dtype=np.float64)  # [true, predicted]
    np.add.at(c, (y, pred), 1)
    return c


def _classification(metric: str, pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    accuracy = float(np.mean(pred == y))
    if metric == "accuracy":
        return {"score": accuracy, "accuracy": accuracy}
    c = _confusion(pred, y)
    if metric == "f1":
        tp = np.diag(c)
        fp = c.sum(axis=0) - tp
        fn = c.sum(axis=1) - tp
        denom = 2 * tp + fp + fn
        per_class = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
        if c.shape[0] <= 2:  # binary: F1 of the positive class (1)
            f1 = float(per_class[1]) if c.shape[0] == 2 else 0.0
        else:  # macro over the classes present in labels or predictions
            present = (c.sum(axis=0) + c.sum(axis=1)) > 0
            f1 = float(per_class[present].mean())
        return {"score": f1, "f1": f1, "accuracy": accuracy}
    assert metric == "mcc" and metric in CLASSIFICATION_METRICS
    t = c.sum(axis=1)
    p = c.sum(axis=0)
    s = c.sum()
    correct = np.trace(c)
    denom = np.sqrt((s * s - p @ p) * (s * s - t @ t))
    mcc = float((correct * s - t @ p) / denom) if denom > 0 else 0.0
    return {"score": mcc, "mcc": mcc, "accuracy": accuracy}


def _regression(metric: str, preds: np.ndarray, y: np.ndarray) -> dict[str, float]:
    from scipy import stats

    if preds.ndim == 2 and preds.shape[1] == 1:
        preds = preds[:, 0]
    if preds.ndim != 1:
        raise HeadcountError(f"a regression metric needs one value per example, got shape {tuple(preds.shape)}")
    x = preds.astype(np.float64)
    t = y.astype(np.float64)
    if len(x) < 2:
        raise HeadcountError("a correlation needs at least two examples")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: nan, said by the value itself
        pearson = float(stats.pearsonr(x, t)[0])
        spearman = float(stats.spearmanr(x, t)[0])
    score = {"pearson": pearson, "spearman": spearman, "pearson_spearman": (pearson + spearman) / 2}[metric]
    return {"score": score, "pearson": pearson, "spearman": spearman}
