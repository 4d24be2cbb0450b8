"""The transfer study's figures, drawn from [`tables.transfer_tables`][headcount.experiments.studies.transfer.tables.transfer_tables] (nothing is recomputed).

Titles, axis labels, legends and captions name the objective in MLM's role as
[`tables.objective_words`][headcount.experiments.studies.transfer.tables.objective_words] does (a decoder's next-token LM with ``objectives: [lm]``).
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import TwoSlopeNorm

from headcount.analysis.coherence import shared_view
from headcount.experiments.report import new_figure
from headcount.experiments.studies.transfer.config import TransferSettings
from headcount.experiments.studies.transfer.tables import fmt, grid_of, objective_words, rank01, stat_rows


def figures(tables: dict, settings: TransferSettings, p: dict, art: str) -> dict:
    """Every figure of the report, drawn from the tables: ``{name: (figure, caption)}``.

    ``p`` is [`plan.plan_of`][headcount.experiments.studies.transfer.plan.plan_of]'s output, ``art`` the name prefix of the part ([`tables.artifact`][headcount.experiments.studies.transfer.tables.artifact]).
    """
    figs = {}
    scores, summary, curves = tables["head_scores"], tables["coherence_summary"], tables["curves"]
    ids = p["ids"]
    w = objective_words(settings)  # MLM, or a decoder's next-token LM

    # --- heatmaps: MLM | (embedding |) task before | task after, one row per task (percentile ranks)
    emb = bool(p.get("embedding"))
    fig, axes = new_figure(len(ids), 3 + emb, size=(10 + 3.3 * emb, 2.6 * len(ids)))
    axes = np.atleast_2d(axes)
    for i, t in enumerate(ids):
        c = p["corpus_of"][t]
        panels = [("mlm-pre-trained", c, f"{w.label} ({c} texts), pre-trained")]
        if emb:  # the second pre-training objective beside MLM
            panels.append(("embedding-pre-trained", c, f"embedding ({c} texts), pre-trained"))
        panels += [("task-pre-trained", t, f"{t}: pre-trained {w.encoder}"), ("task-fine-tuned", t, f"{t}: fine-tuned")]
        for j, (kind, task, label) in enumerate(panels):
            ax = axes[i, j]
            g = grid_of(scores, kind, task)
            im = ax.imshow(g, aspect="auto", cmap="viridis", vmin=0, vmax=1)
            ax.set_title(label, fontsize=8)
            ax.set_xlabel("head", fontsize=7)
            ax.set_ylabel("layer", fontsize=7)
            ax.set_xticks(range(g.shape[1]))
            ax.set_yticks(range(g.shape[0]))
            ax.tick_params(labelsize=6)
    fig.colorbar(im, ax=axes, shrink=0.6, label="importance percentile")
    figs[f"{art}heatmaps"] = (fig, f"Head importance as percentile ranks (1 = most important): {w.label} "
                                   + ("and the embedding (SimCSE) objective " if emb else "")
                                   + f"on the pre-trained model beside the task, before (frozen {w.encoder} + fitted "
                                   "head) and after fine-tuning (mean over seeds).")

    # --- scatter MLM vs task per head
    fig, axes = new_figure(1, len(ids), size=(3.4 * len(ids), 3.2))
    axes = np.atleast_1d(axes)
    for ax, t in zip(axes, ids):
        x = grid_of(scores, "mlm-pre-trained", p["corpus_of"][t])
        y = grid_of(scores, "task-fine-tuned", t)
        layers = np.repeat(np.arange(x.shape[0]), x.shape[1])
        sc = ax.scatter(x.ravel(), y.ravel(), c=layers, cmap="plasma", s=14, alpha=0.8)
        rho = stat_rows(summary, "mlm-vs-task", "spearman", task=t)["estimate"]
        ax.set_title(f"{t}: Spearman {fmt(float(rho.mean()) if len(rho) else None)}", fontsize=9)
        ax.set_xlabel(f"{w.label} importance (percentile)", fontsize=8)
        ax.set_ylabel("task importance (percentile)", fontsize=8)
        ax.plot([0, 1], [0, 1], ls=":", color="0.5", lw=0.8)
    fig.colorbar(sc, ax=axes, label="layer", shrink=0.8)
    figs[f"{art}scatter"] = (fig, f"Each head's {w.label} importance (pre-trained) against its task importance "
                                  "(fine-tuned), as percentile ranks; colour = layer.")

    # --- shared layers: importance per shared head (summed over the depths that run it)
    lay = tables.get("layout") or {}
    if lay.get("shared"):
        fig, axes = new_figure(len(ids), 1, size=(max(6.0, 0.35 * lay["n_heads"] * len(lay["groups"])), 2.4 * len(ids)))
        axes = np.atleast_1d(axes)
        for ax, t in zip(axes, ids):
            for k, (kind, task, label) in enumerate((("mlm-pre-trained", p["corpus_of"][t], f"{w.label} (pre-trained)"),
                                                      ("task-fine-tuned", t, f"{t} (fine-tuned)"))):
                d = scores[(scores["kind"] == kind) & (scores["task"] == task)]
                grids = [rank01(shared_view(g.pivot(index="layer", columns="head", values="score").to_numpy(),
                                             lay["groups"])) for _, g in d.groupby("seed", dropna=False)]
                v = np.mean(grids, axis=0).ravel()
                ax.bar(np.arange(v.size) + (k - 0.5) * 0.4, v, width=0.4, label=label)
            ax.set_xlabel("shared head (group x head)", fontsize=8)
            ax.set_ylabel("percentile", fontsize=8)
            ax.legend(fontsize=7)
        figs[f"{art}shared-heads"] = (fig, "Shared-layer model: importance per shared head (summed over the depths "
                                           "that run the shared layer), as percentile ranks.")

    # --- correlation matrix: MLM grids and tasks; task diagonal = seed-vs-seed agreement
    labels = [f"{w.label}:{c}" for c in p["corpora"]] + ids
    mat = np.full((len(labels), len(labels)), np.nan)
    idx = {lab: i for i, lab in enumerate(labels)}
    for lab in labels:
        mat[idx[lab], idx[lab]] = 1.0
    for _, r in summary[(summary["statistic"] == "spearman") & (summary["view"] == "application")].iterrows():
        comp = r["comparison"]
        if comp == "mlm-vs-task":
            a, b = f"{w.label}:{p['corpus_of'][r['task']]}", r["task"]
        elif comp == "task-vs-task":
            a, b = r["task"], r["task_b"]
        elif comp == "mlm-vs-mlm":
            a, b = f"{w.label}:{r['task']}", f"{w.label}:{r['task_b']}"
        elif comp == "seed-vs-seed":
            a = b = r["task"]
        else:
            continue
        mat[idx[a], idx[b]] = mat[idx[b], idx[a]] = r["estimate"]
    fig, ax = new_figure(size=(1.0 * len(labels) + 2.5, 0.9 * len(labels) + 1.8))
    im = ax.imshow(mat, cmap="RdBu_r", norm=TwoSlopeNorm(0, -1, 1))
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    for i in range(len(labels)):
        for j in range(len(labels)):
            if np.isfinite(mat[i, j]):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="Spearman (mean over seeds)")
    figs[f"{art}correlation-matrix"] = (fig, "Spearman correlation of head importance between objectives (fine-tuned "
                                             "tasks); a task's diagonal cell is the agreement of two fine-tuning seeds "
                                             "(1 with one seed); blank: not compared.")

    # --- layer mass
    lm = tables["layer_mass"]
    lm = lm[lm["view"] == "application"]
    fig, axes = new_figure(1, len(ids), size=(3.4 * len(ids), 3.0))
    axes = np.atleast_1d(axes)
    for ax, t in zip(axes, ids):
        for kind, style in (("mlm-pre-trained", "-"), ("task-pre-trained", "--"), ("task-fine-tuned", "-."),
                            ("mlm-fine-tuned", ":")):
            task = p["corpus_of"][t] if kind == "mlm-pre-trained" else t
            d = lm[(lm["kind"] == kind) & (lm["task"] == task)].groupby("layer")["mass"].mean()
            if len(d):
                ax.plot(d.index, d.values, style, marker="o", ms=3, label=w.kind(kind))
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("layer", fontsize=8)
        ax.set_ylabel("share of importance", fontsize=8)
    axes[0].legend(fontsize=6)
    figs[f"{art}layer-mass"] = (fig, "Share of the total head importance in each layer.")

    # --- prunability curves
    views = sorted(curves["view"].unique(), key=lambda v: v != "application")
    pre = settings.pretrain  # the curve of the objective in MLM's role: mlm, or a decoder's lm
    objectives = ("task", pre, "embedding") if emb else ("task", pre)
    fig, axes = new_figure(len(objectives), len(ids), size=(3.6 * len(ids), 3.0 * len(objectives)))
    axes = np.asarray(axes).reshape(len(objectives), len(ids))
    colors = {"mlm": "C0", "task": "C1", "embedding": "C2", "random": "0.45"}
    for col, t in enumerate(ids):
        for row, objective in enumerate(objectives):
            ax = axes[row, col]
            d = curves[(curves["task"] == t) & (curves["objective"] == objective)]
            for view in views:
                ls = "-" if view == "application" else "--"
                for order in ("mlm", "task", "embedding", "random"):  # embedding: with objectives [mlm, embedding]
                    g = d[(d["view"] == view) & (d["order"] == order)]
                    if g.empty:
                        continue
                    agg = g.groupby("fraction")["score"].agg(["mean", "min", "max"])
                    label = f"by {w.by(order)}" + ("" if view == "application" else " (shared heads)")
                    ax.plot(agg.index, agg["mean"], ls, color=colors[order], marker="o", ms=2.5, label=label)
                    ax.fill_between(agg.index, agg["min"], agg["max"], color=colors[order], alpha=0.15)
            if not d.empty:
                full = d[d["fraction"] == 0]["score"].mean()
                ax.axhline(settings.before_after.threshold * full, ls=":", color="C3", lw=0.8)
            title = {"task": "task (fine-tuned)", pre: f"{w.title} (pre-trained)", "embedding": "embedding (pre-trained)"}
            ax.set_title(f"{t}: {title[objective]}", fontsize=9)
            ax.set_xlabel("fraction of heads removed", fontsize=8)
            ax.set_ylabel(d["metric"].iloc[0] if len(d) else "", fontsize=8)
    axes[0, 0].legend(fontsize=6)
    figs[f"{art}prunability"] = (fig, "Metric vs fraction of heads removed (gates, no retraining): heads removed by "
                                      f"{w.label} importance, by the task's own importance, or at random; lines = means, "
                                      "bands = min-max over seeds and random draws; dotted = 90% of the full model."
                                 + (" With the embedding objective: heads removed by its importance too, and a row "
                                    "for the pre-trained encoder's similarity structure (Spearman of its pairwise "
                                    "cosine similarities with the unpruned encoder's)." if emb else ""))

    # --- before / after and acceptable deduction
    ba, ad = tables["before_after"], tables["acceptable_deduction"]
    if not ba.empty:
        fig, axes = new_figure(1, len(ids), size=(3.6 * len(ids), 3.2))
        axes = np.atleast_1d(axes)
        for ax, t in zip(axes, ids):
            d = ba[ba["task"] == t]
            for k, (setting, g) in enumerate(d.groupby("setting", sort=False)):
                # the mean of equal scores can sit an ulp outside [min, max] (np.mean([0.1] * 3) > 0.1): clip
                bars = np.clip([g["score"] - g["score_min"], g["score_max"] - g["score"]], 0, None)
                ax.errorbar(g["level"], g["score"], yerr=bars,
                            marker="os^v"[k % 4], ms=4, capsize=2, label=setting)
            full = d["full"].iloc[0]
            ax.axhline(full, color="k", lw=0.8, label="full fine-tuned")
            ax.axhline(settings.before_after.threshold * full, color="C3", ls=":", lw=0.8)
            ax.set_title(t, fontsize=9)
            ax.set_xlabel("fraction of heads removed", fontsize=8)
        axes[0].legend(fontsize=6)
        figs[f"{art}before-after"] = (fig, f"Downstream score when heads are removed before fine-tuning (by {w.label} "
                                           "importance of the pre-trained model, then fine-tuned) vs after "
                                           f"(fine-tuned model pruned by task or {w.label} importance, not retrained).")
        fig, ax = new_figure(size=(5.0, 3.4))
        for k, t in enumerate(ids):
            d = ad[ad["task"] == t].sort_values("mlm_loss_increase")
            ax.plot(d["mlm_loss_increase"], d["relative_score"], marker="o", color=f"C{k}", label=t)
            for _, r in d.iterrows():
                ax.annotate(f"{r['level']:g}", (r["mlm_loss_increase"], r["relative_score"]), fontsize=6,
                            xytext=(2, 2), textcoords="offset points")
            best = tables["acceptable_deduction_summary"]
            b = best[best["task"] == t]
            if len(b) and b["mlm_loss_increase"].notna().all():
                ax.axvline(float(b["mlm_loss_increase"].iloc[0]), color=f"C{k}", ls="--", lw=0.8)
        ax.axhline(settings.before_after.threshold, color="C3", ls=":", lw=0.8)
        ax.set_xlabel(f"{w.label} loss increase of the pruned pre-trained model (nats)", fontsize=8)
        ax.set_ylabel("fine-tuned score / full fine-tuned score", fontsize=8)
        ax.legend(fontsize=7)
        figs[f"{art}acceptable-deduction"] = (fig, "Downstream score after fine-tuning a pruned pre-trained model "
                                                   f"against the {w.label} loss the pruning cost (labels: fraction removed); "
                                                   "dashed: the acceptable deduction of each task.")
    return figs
