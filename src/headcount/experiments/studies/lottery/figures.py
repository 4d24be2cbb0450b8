"""The figures of a lottery report (matplotlib Figures drawn with [`headcount.experiments.report.new_figure`][headcount.experiments.report.new_figure])."""

from __future__ import annotations

import math

import matplotlib.patches as mpatches
import numpy as np
from matplotlib.colors import ListedColormap

from headcount.analysis.patterns import CLASSES
from headcount.experiments.report import new_figure
from headcount.experiments.studies.lottery.plan import job_name, task_name
from headcount.experiments.studies.lottery.tables import finished


def scores_figure(summary, experiments, title, threshold: float):
    """Mean ± std per experiment and task, with a line at ``threshold`` x the full model's mean
    (the structured pruning's stop rule, ``pruning.threshold``)."""

    tasks = list(dict.fromkeys(summary["task"]))
    fig, axes = new_figure(1, len(tasks), size=(max(4.0, 3.6 * len(tasks)), 3.6))
    axes = np.atleast_1d(axes)
    colors = {"none": "#555555", "structured": "#4c72b0", "magnitude": "#dd8452"}
    for ax, task in zip(axes, tasks):
        sub = summary[summary["task"] == task].set_index("experiment")
        exps = [e for e in experiments if e in sub.index]
        means = [sub.loc[e, "mean"] for e in exps]
        stds = [0.0 if not math.isfinite(sub.loc[e, "std"]) else sub.loc[e, "std"] for e in exps]
        ax.bar(range(len(exps)), means, yerr=stds, capsize=3,
               color=[colors.get(sub.loc[e, "pruning"], "#8172b2") for e in exps])
        if "full" in sub.index and math.isfinite(sub.loc["full", "mean"]):
            ax.axhline(threshold * sub.loc["full", "mean"], color="k", ls="--", lw=0.8, label=f"{threshold:g} x full")
            ax.legend(fontsize=7, loc="lower left")
        ax.set_xticks(range(len(exps)))
        ax.set_xticklabels(exps, rotation=60, ha="right", fontsize=7)
        ax.set_title(task, fontsize=9)
        ax.set_ylabel(str(sub["metric"].iloc[0]) if len(sub) else "")
    fig.suptitle(title, fontsize=10)
    return fig


def survivor_figure(stab: dict[str, dict]):

    tasks = list(stab)
    fig, axes = new_figure(1, len(tasks), size=(max(4.0, 3.8 * len(tasks)), 3.4))
    axes = np.atleast_1d(axes)
    im = None
    for ax, task in zip(axes, tasks):
        r = stab[task]
        surv = np.asarray(r["head_survival"], dtype=float)
        mlp = np.asarray(r["mlp_survival"], dtype=float)[:, None]
        grid = np.concatenate([surv, np.full_like(mlp, np.nan), mlp], axis=1)  # heads | gap | MLP
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        sup_h = np.asarray(r["super_heads"])
        for (l, h) in zip(*np.nonzero(sup_h)):
            ax.text(h, l, "*", ha="center", va="center", color="w", fontsize=8)
        for l in np.nonzero(np.asarray(r["super_mlps"]))[0]:
            ax.text(grid.shape[1] - 1, l, "*", ha="center", va="center", color="w", fontsize=8)
        n_heads = surv.shape[1]
        ax.set_xticks(list(range(n_heads)) + [n_heads + 1])
        ax.set_xticklabels([str(h) for h in range(n_heads)] + ["MLP"], fontsize=6)
        ax.set_yticks(range(surv.shape[0]))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{task}: kept in fraction of seeds", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=list(axes), shrink=0.8)
    return fig


def overlap_figure(ov: dict):

    tasks = ov["tasks"]
    fig, axes = new_figure(1, 2, size=(8.0, 3.6))
    for ax, key, title in ((axes[0], "heads_jaccard", "good heads (mean over seed pairs)"),
                           (axes[1], "super_heads_jaccard", "super-survivor heads")):
        m = np.array([[np.nan if v is None else v for v in row] for row in ov[key]], dtype=float)
        im = ax.imshow(m, vmin=0, vmax=1, cmap="magma")
        for i in range(len(tasks)):
            for j in range(len(tasks)):
                if math.isfinite(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", color="c", fontsize=7)
        ax.set_xticks(range(len(tasks)))
        ax.set_xticklabels(tasks, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(tasks)))
        ax.set_yticklabels(tasks, fontsize=7)
        ax.set_title(f"Jaccard: {title}", fontsize=8)
    fig.colorbar(im, ax=list(axes), shrink=0.8)
    return fig


def pattern_mix_figure(dist):
    """Stacked class shares per group: one row per view present (the rule classifier on per-head
    mean maps, shares of heads; the CNN on per-example maps, shares of examples x heads), one
    column per task."""

    views = [c for c in ("rules", "cnn") if (dist["classifier"] == c).any()]
    tasks = list(dict.fromkeys(dist["task"]))
    fig, axes = new_figure(len(views), len(tasks), size=(max(4.0, 3.4 * len(tasks)), 3.2 * len(views)))
    axes = np.asarray(axes, dtype=object).reshape(len(views), len(tasks))
    colors = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#bbbbbb"]
    for row, view in zip(axes, views):
        d = dist[dist["classifier"] == view]
        label = d["view"].iloc[0] if "view" in d and len(d) else view
        unit = d["counted_over"].iloc[0] if "counted_over" in d and len(d) else "heads"
        for ax, task in zip(row, tasks):
            t = d[d["task"] == task]
            groups = list(dict.fromkeys(t["group"]))
            bottom = np.zeros(len(groups))
            for cls, color in zip(CLASSES, colors):
                vals = np.array([float(t[(t["group"] == g) & (t["pattern"] == cls)]["mean"].sum()) for g in groups])
                vals = np.nan_to_num(vals)
                ax.bar(range(len(groups)), vals, bottom=bottom, color=color, label=cls)
                bottom += vals
            ax.set_xticks(range(len(groups)))
            ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=7)
            ax.set_ylim(0, 1)
            ax.set_title(f"{task}\n{label}", fontsize=7)
            ax.set_ylabel(f"fraction of {unit}", fontsize=7)
    axes[0, -1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def pattern_grid_figure(heads_table, settings):

    tasks = list(dict.fromkeys(heads_table["task"]))
    fig, axes = new_figure(1, len(tasks), size=(max(4.0, 3.8 * len(tasks)), 3.4))
    axes = np.atleast_1d(axes)
    cmap = ListedColormap(["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#bbbbbb"])
    for ax, task in zip(axes, tasks):
        t = heads_table[heads_table["task"] == task]
        seed = t["seed"].iloc[0]
        t = t[t["seed"] == seed]
        n_layers, n_heads = int(t["layer"].max()) + 1, int(t["head"].max()) + 1
        grid = np.zeros((n_layers, n_heads))
        for _, r in t.iterrows():
            grid[int(r["layer"]), int(r["head"])] = CLASSES.index(r["pattern"])
            mark = "*" if r.get("super_survivor") == 1 else ("o" if r.get("kept_good") == 1 else "")
            if mark:
                ax.text(int(r["head"]), int(r["layer"]), mark, ha="center", va="center", color="w", fontsize=7)
        ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(CLASSES) - 0.5, aspect="auto")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.tick_params(labelsize=6)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{task} (seed {seed}); o good, * super-survivor", fontsize=7)

    handles = [mpatches.Patch(color=cmap(i), label=c) for i, c in enumerate(CLASSES)]
    axes[-1].legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def trace_figure(store, settings, prefix):

    s = settings
    tasks = [task_name(t) for t in s.tasks]
    fig, axes = new_figure(1, len(tasks), size=(max(4.0, 3.6 * len(tasks)), 3.0))
    axes = np.atleast_1d(axes)
    for ax, tname in zip(axes, tasks):
        for seed in s.seeds:
            r = finished(store, job_name(prefix, "prune", tname, f"seed{seed}"))
            if r is None:
                continue
            tr = r.result["trace"]
            ax.plot([x["heads_kept"] for x in tr], [x["metric"] for x in tr], marker=".", lw=1, label=f"seed {seed}")
            ax.axhline(s.pruning.threshold * r.result["full_metric"], color="grey", ls=":", lw=0.6)
        ax.invert_xaxis()
        ax.set_xlabel("heads kept")
        ax.set_ylabel("dev metric")
        ax.set_title(tname, fontsize=9)
        ax.legend(fontsize=6)
    return fig
