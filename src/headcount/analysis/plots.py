"""Figures drawn from saved results (never from models), written atomically as PNG."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from headcount.analysis.figtext import literal_texts  # noqa: E402
from headcount.runtime.atomic import atomic_path  # noqa: E402


def _save(fig, path) -> None:
    literal_texts(fig)  # a task name with two "$" is text, not mathtext
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=150, bbox_inches="tight", format="png")
    plt.close(fig)


def head_heatmap(scores: dict, path=None, title: str | None = None):
    """Layer x head heatmap of ``scores["heads"]`` with the MLP scores in a column beside it.

    Args:
        scores: a ``scores.json`` dict (``heads`` [L][H], ``mlps`` [L], ``method``, ...).
        path: PNG path; None returns the figure.
    """
    heads = np.asarray(scores["heads"], dtype=float)
    mlps = np.asarray(scores.get("mlps") or [np.nan] * heads.shape[0], dtype=float)
    n_layers, n_heads = heads.shape
    fig, (ax, axm) = plt.subplots(1, 2, figsize=(0.45 * n_heads + 2.6, 0.4 * n_layers + 1.6),
                                  gridspec_kw={"width_ratios": [n_heads, 1.2], "wspace": 0.35})
    im = ax.imshow(heads, aspect="auto", cmap="viridis")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_heads))
    ax.set_yticks(range(n_layers))
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    ax.set_title(title or f"{scores.get('method', '')} importance ({scores.get('normalize', 'none')})", fontsize=9)
    axm.imshow(mlps[:, None], aspect="auto", cmap="magma")
    axm.set_xticks([0])
    axm.set_xticklabels(["MLP"])
    axm.set_yticks(range(n_layers))
    axm.set_yticklabels([])
    for i, v in enumerate(mlps):
        if np.isfinite(v):
            axm.text(0, i, f"{v:.2g}", ha="center", va="center", fontsize=6, color="w")
    if path is None:
        return fig
    _save(fig, path)


def prune_curve(trace: list[dict], threshold_metric: float | None = None, path=None, title: str | None = None):
    """Metric vs heads kept along a pruning trace (accepted steps solid, the rejected one open)."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    kept = [r["heads_kept"] for r in trace]
    metric = [r["metric"] for r in trace]
    ax.plot(kept, metric, "-", color="0.6", lw=1)
    acc = [r for r in trace if r.get("accepted", True) in (True, "True", 1)]
    rej = [r for r in trace if r not in acc]
    ax.plot([r["heads_kept"] for r in acc], [r["metric"] for r in acc], "o", color="C0", label="kept")
    if rej:
        ax.plot([r["heads_kept"] for r in rej], [r["metric"] for r in rej], "o", mfc="none", color="C3", label="below threshold")
    if threshold_metric is not None:
        ax.axhline(threshold_metric, ls="--", color="C3", lw=1, label="threshold")
    ax.invert_xaxis()
    ax.set_xlabel("heads kept")
    ax.set_ylabel("metric")
    ax.set_title(title or "pruning curve", fontsize=9)
    ax.legend(fontsize=7)
    if path is None:
        return fig
    _save(fig, path)
