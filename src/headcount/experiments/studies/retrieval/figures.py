"""The figures of a retrieval report, drawn from its tables with [`headcount.experiments.report.new_figure`][headcount.experiments.report.new_figure]
(saved results only): the budget curve, the pooled score grids, the stability of the head sets and
the ablation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from headcount.experiments.report import new_figure

#: one colour per budget kind (the full cache: black)
COLORS = {"scores": "#4c72b0", "uniform": "#dd8452", "random": "#8c8c8c", "full": "#000000"}
LABELS = {"scores": "from the scores", "uniform": "uniform sink + window (StreamingLLM)",
          "random": "random full KV heads", "full": "full cache"}


def curve_figure(curve: pd.DataFrame, points: float = 0.05):
    """KV memory (measured bytes, as a share of the full cache) against needle accuracy and against
    LM loss: one line per budget kind (random: the mean over draws, each draw a dot), the full cache
    a star; on the accuracy panel the full cache's accuracy minus ``points`` and half the cache."""
    fig, (acc, loss) = new_figure(1, 2, size=(9.6, 3.8))
    full = curve[curve["kind"] == "full"]
    base = float(full["kv_bytes"].iloc[0]) if len(full) else float(curve["full_cache_bytes"].max())
    for kind in ("scores", "uniform", "random"):
        d = curve[curve["kind"] == kind].copy()
        if d.empty:
            continue
        d["x"] = d["kv_bytes"] / base
        m = d.groupby("memory", sort=True)[["x", "needle_accuracy", "lm_loss"]].mean()
        for ax, col in ((acc, "needle_accuracy"), (loss, "lm_loss")):
            ax.plot(m["x"], m[col], "o-", color=COLORS[kind], label=LABELS[kind], ms=4)
            if kind == "random" and d["draw"].nunique() > 1:
                ax.scatter(d["x"], d[col], color=COLORS[kind], s=8, alpha=0.5)
    if len(full):
        for ax, col in ((acc, "needle_accuracy"), (loss, "lm_loss")):
            ax.plot([1.0], [full[col].iloc[0]], "*", color=COLORS["full"], ms=10, label=LABELS["full"])
        acc.axhline(full["needle_accuracy"].iloc[0] - points, color="k", ls=":", lw=0.8,
                    label=f"full - {points * 100:g} points")
    acc.axvline(0.5, color="#999999", ls="--", lw=0.8)
    loss.axvline(0.5, color="#999999", ls="--", lw=0.8)
    acc.set_xlabel("KV cache, share of the full cache (measured bytes)")
    loss.set_xlabel("KV cache, share of the full cache (measured bytes)")
    acc.set_ylabel("needle accuracy (held-out, answer exact)")
    loss.set_ylabel("LM loss (ordinary text)")
    acc.set_ylim(-0.03, 1.03)
    acc.legend(fontsize=7, loc="lower right")
    ctx = curve["context"].iloc[0] if "context" in curve and len(curve) else None
    fig.suptitle("KV budgets" + (f" at {int(ctx):,} tokens" if ctx is not None and not pd.isna(ctx) else ""),
                 fontsize=10)
    return fig


def _heatmap(ax, fig, grid, title, xlabel="query head", vmax=None):
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=vmax)
    ax.set_title(title, fontsize=9)
    ax.set_xticks(range(grid.shape[1]))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("layer")
    fig.colorbar(im, ax=ax, shrink=0.8)


def scores_figure(pooled: dict, threshold: float = 0.1):
    """The pooled grids: retrieval score per query head (heads above ``threshold`` marked), the
    long-range mass per query head and per KV head."""
    panels = []
    if "retrieval" in pooled:
        panels.append(("retrieval", "heads", f"retrieval score (pooled; * > {threshold:g})"))
    if "long-range" in pooled:
        panels += [("long-range", "heads", "long-range mass per query head"),
                   ("long-range", "kv_groups", "long-range mass per KV head")]
    fig, axes = new_figure(1, max(1, len(panels)), size=(4.0 * max(1, len(panels)), 4.2))
    axes = np.atleast_1d(axes)
    for ax, (method, key, title) in zip(axes, panels):
        grid = np.asarray([[np.nan if v is None else v for v in row] for row in pooled[method][key]], dtype=float)
        _heatmap(ax, fig, grid, title, "KV head" if key == "kv_groups" else "query head")
        if method == "retrieval":
            for layer, head in zip(*np.nonzero(np.nan_to_num(grid) > threshold)):
                ax.text(head, layer, "*", ha="center", va="center", color="w", fontsize=8)
    return fig


def stability_figure(summary: pd.DataFrame):
    """Mean top-k Jaccard (bars, range over pairs as whiskers) against its chance level (black ticks)
    per head set, across haystack seeds, templates and scorers; the scorer of the seed and template
    comparisons is the one each head set is ranked by in the plot's legend."""
    comps = [c for c in ("seeds", "templates", "scorers") if c in set(summary["comparison"])]
    sets = list(dict.fromkeys(summary["head_set"]))
    scorers = [s for s in dict.fromkeys(summary["scorer"]) if " vs " not in s]
    fig, ax = new_figure(1, 1, size=(max(6.0, 0.9 * len(sets) * max(1, len(comps))), 4.0))
    width = 0.8 / max(1, len(comps) * max(1, len(scorers)))
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860"]
    bar = 0
    for ci, comp in enumerate(comps):
        for si, scorer in enumerate(scorers if comp != "scorers" else [None]):
            sel = summary[summary["comparison"] == comp]
            sel = sel if scorer is None else sel[sel["scorer"] == scorer]
            x, y, lo, hi, ch = [], [], [], [], []
            for i, hs in enumerate(sets):
                row = sel[sel["head_set"] == hs]
                if row.empty:
                    continue
                r = row.iloc[0]
                x.append(i - 0.4 + width * (bar + 0.5))
                y.append(r["jaccard"])
                lo.append(max(0.0, r["jaccard"] - r["jaccard_min"]) if not math.isnan(r["jaccard"]) else 0)
                hi.append(max(0.0, r["jaccard_max"] - r["jaccard"]) if not math.isnan(r["jaccard"]) else 0)
                ch.append(r["chance"])
            label = f"{comp}" + (f" ({scorer})" if scorer else f" ({sel['scorer'].iloc[0]})" if len(sel) else "")
            ax.bar(x, y, width=width, yerr=[lo, hi], capsize=2, color=colors[bar % len(colors)], label=label)
            ax.scatter(x, ch, marker="_", color="k", s=60, zorder=3)
            bar += 1
    ax.set_xticks(range(len(sets)))
    ax.set_xticklabels(sets, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("top-k Jaccard (black: chance)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Agreement of the head sets", fontsize=10)
    return fig


def ablation_figure(ab: pd.DataFrame):
    """Needle accuracy on the held-out haystacks: the full model, the top-k units masked, each
    random set of as many (dots, their mean a bar) and Wu et al.'s protocol (theirs), per unit."""
    fig, axes = new_figure(1, max(1, len(ab)), size=(3.6 * max(1, len(ab)), 3.4))
    axes = np.atleast_1d(axes)
    for ax, (_, r) in zip(axes, ab.iterrows()):
        draws = [float(x) for x in str(r["accuracy_random"]).split()] if isinstance(r["accuracy_random"], str) else []
        bars = [r["accuracy_full"], r["accuracy_top"], r["accuracy_random_mean"]]
        names = ["full", f"top {r['fraction']:.0%}", "random sets"]
        if pd.notna(r.get("accuracy_random_theirs")):  # Wu et al.'s protocol: a random set per example
            bars, names = bars + [r["accuracy_random_theirs"]], names + ["theirs"]
        ax.bar(range(len(bars)), bars, color=["#555555", "#c44e52", "#8c8c8c", "#b0b0b0"][:len(bars)])
        ax.scatter([2] * len(draws), draws, color="k", s=10, zorder=3)
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels(names, fontsize=8)
        unit = "query heads" if r["unit"] == "heads" else "KV heads"
        test = (f"head-set p = {r['p_value']:.3g} ({int(r['n_sets'])} sets)" if pd.notna(r.get("n_sets"))
                else "no head-set test")
        ax.set_title(f"{unit} (k = {int(r['k'])}), {test}", fontsize=9)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("needle accuracy")
    return fig
