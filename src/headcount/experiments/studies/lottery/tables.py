"""The tables of a lottery report, from saved results: scores per seed, their summary over seeds,
the paper's layout, stability, overlap and pattern tables (pandas DataFrames).

A missing or unfinished job leaves a gap (NaN), never an error: a report of a partial run works.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from headcount.analysis import seed_summary
from headcount.analysis.patterns import CLASSES, pattern_distribution
from headcount.experiments.report.format import nan_runs, seed_cell
from headcount.experiments.studies.extra_eval import extra_job_name, extra_splits, reported_name
from headcount.experiments.studies.lottery.config import LotterySettings
from headcount.experiments.studies.lottery.plan import job_name, lottery_metric, task_name
from headcount.experiments.studies.lottery.published import PAPER_HEADS_KEPT, paper_task, published
from headcount.runtime.errors import HeadcountError

#: Rows of the paper's main table, in order: (experiment, pruning kind).
EXPERIMENTS: tuple[tuple[str, str], ...] = (
    ("full", "none"),
    ("good pruned", "structured"),
    ("good retrained", "structured"),
    ("random retrained", "structured"),
    ("bad retrained", "structured"),
    ("magnitude good retrained", "magnitude"),
    ("magnitude random retrained", "magnitude"),
    ("magnitude bad retrained", "magnitude"),
)

#: Rows of the super-survivor table (retrained from the pre-trained weights).
SUPER_EXPERIMENTS: tuple[str, ...] = ("super-survivors retrained", "super random retrained", "super bad retrained")


def finished(store, name):
    """A finished job's result, or None (a missing or unfinished job leaves a gap, not an error)."""
    try:
        return store.result(name) if store.has(name) else None
    except HeadcountError:
        return None


def _score(r) -> float:
    if r is None:
        return math.nan
    if "final" in r.result:  # a fine-tuning's metrics.json
        return float(r.result["final"].get("score", math.nan))
    if "score" in r.result:  # an evaluation
        return float(r.result["score"])
    if "metric" in r.result:  # a magnitude summary (metric null: no passing mask, or a skipped control)
        return math.nan if r.result["metric"] is None else float(r.result["metric"])
    return math.nan


def seed_scores(store, settings: LotterySettings, prefix: str = ""):
    """One row per (experiment, task, seed): score, metric, size of the subnetwork.

    Returns:
        A pandas DataFrame with columns experiment, pruning, task, seed, metric, score,
        heads_kept, mlps_kept, sparsity, finished, flag (``no_passing_mask``: the magnitude
        search kept no mask, its score is NaN; ``skipped: no_passing_mask``: a control of such
        a run, not trained; else empty). A task with extra dev sets (MNLI mismatched) has its
        scores there as rows of the task ``<name>-<label>`` (``glue/mnli-mm``), right after its own:
        the full, good pruned and retrained models evaluated on that split (the magnitude runs
        are not).

    >>> seed_scores(RunStore("runs/lottery-offline"), config).groupby("experiment")["score"].mean()  # doctest: +SKIP
    """

    s = settings
    rows = []
    names = [task_name(t) for t in s.tasks]
    for task in s.tasks:
        tname = task_name(task)
        extra = extra_splits(task)
        for seed in s.seeds:
            tag = f"seed{seed}"
            full = finished(store, job_name(prefix, "finetune", tname, tag))
            prune = finished(store, job_name(prefix, "prune", tname, tag))
            metric = full.result.get("metric") if full is not None else None
            good_mask = prune.result["mask"] if prune is not None else {}

            extra_rows: list[tuple] = []  # (experiment, pruning, job name, heads, mlps) evaluated on the extra splits

            def row(experiment, pruning, r, heads=None, mlps=None, sparsity=None, name=None):
                rows.append({"experiment": experiment, "pruning": pruning, "task": tname, "seed": seed,
                             "metric": metric, "score": _score(r), "heads_kept": heads, "mlps_kept": mlps,
                             "sparsity": sparsity, "finished": r is not None, "flag": magnitude_flag(r)})
                if name is not None and extra:
                    extra_rows.append((experiment, pruning, name, heads, mlps))

            row("full", "none", full, name=job_name(prefix, "finetune", tname, tag))
            row("good pruned", "structured", finished(store, job_name(prefix, "good-pruned", tname, tag)),
                good_mask.get("n_heads_kept"), good_mask.get("n_mlps_kept"), name=job_name(prefix, "good-pruned", tname, tag))
            for kind in ("good", "random", "bad"):
                r = finished(store, job_name(prefix, "retrain", kind, tname, tag))
                m = (r.result.get("mask") or {}) if r is not None else {}
                row(f"{kind} retrained", "structured", r, m.get("heads_kept"), m.get("mlps_kept"),
                    name=job_name(prefix, "retrain", kind, tname, tag))
            if s.magnitude.enabled:
                for kind in ("good", "random", "bad"):
                    r = finished(store, job_name(prefix, "magnitude", kind, tname, tag))
                    row(f"magnitude {kind} retrained", "magnitude", r,
                        sparsity=r.result.get("sparsity") if r is not None else None)
            if s.super_survivors.enabled and s.super_survivors.retrain and seed in (s.super_survivors.seeds or s.seeds):
                for kind, label in zip(("super", "super-random", "super-bad"), SUPER_EXPERIMENTS):
                    r = finished(store, job_name(prefix, "retrain", kind, tname, tag))
                    m = (r.result.get("mask") or {}) if r is not None else {}
                    row(label, "structured", r, m.get("heads_kept"), m.get("mlps_kept"),
                        name=job_name(prefix, "retrain", kind, tname, tag))
            for label in extra:  # the same models on the extra dev sets (MNLI mismatched), beside the task
                shown = reported_name(tname, label, names)
                for experiment, pruning, name, heads, mlps in extra_rows:
                    r = finished(store, extra_job_name(name, label))
                    rows.append({"experiment": experiment, "pruning": pruning, "task": shown, "seed": seed,
                                 "metric": metric, "score": _score(r), "heads_kept": heads, "mlps_kept": mlps,
                                 "sparsity": None, "finished": r is not None, "flag": ""})
    return pd.DataFrame(rows, columns=["experiment", "pruning", "task", "seed", "metric", "score", "heads_kept",
                                       "mlps_kept", "sparsity", "finished", "flag"])


def magnitude_flag(r) -> str:
    """``no_passing_mask`` for a magnitude run that kept no mask (no pruning step passed the
    threshold), ``skipped: no_passing_mask`` for a control of such a run, else ``""``."""
    if r is None or not r.result.get("no_passing_mask"):
        return ""
    return "skipped: no_passing_mask" if r.result.get("skipped") else "no_passing_mask"


def chance_level(metric: str, labels=None) -> tuple[float, str]:
    """The score of a model that learned nothing, and what it is: ``(value, description)``.

    accuracy: the majority-class rate of ``labels``; f1: the best constant prediction's F1
    (binary: of the positive class; else macro over the classes in ``labels``); mcc and the
    correlations: 0. NaN (unknown) for accuracy and f1 without labels.

    >>> chance_level("accuracy", [0, 1, 1, 1]), chance_level("mcc")
    ((0.75, 'majority-class rate'), (0.0, 'no correlation'))
    """
    if metric in ("accuracy", "f1"):
        y = np.asarray(labels if labels is not None else [], dtype=np.int64).ravel()
        y = y[y >= 0]  # unlabelled rows (-1) do not count
        if y.size == 0:
            return math.nan, "unknown (no dev labels)"
        share = np.bincount(y) / y.size
        if metric == "accuracy":
            return float(share.max()), "majority-class rate"
        k = int((share > 0).sum())
        f1 = 2 * share / (1 + share)  # a constant prediction of class c: F1 2p/(1+p) for c, 0 for the others
        if share.size <= 2:  # binary: F1 of the positive class (1), as the metric
            best = float(f1[1]) if share.size == 2 else 0.0
        else:  # macro over the classes present
            best = float(f1.max() / max(k, 1))
        return best, "F1 of the best constant prediction"
    return 0.0, "no correlation"


def chance_levels(settings: LotterySettings) -> dict[str, tuple[float, str]]:
    """Per reported task (extra dev sets included): [`chance_level`][headcount.experiments.studies.lottery.tables.chance_level] on the dev subset every
    evaluation uses (``train.max_eval_examples`` drawn with ``train.data_seed``). A task whose
    labels cannot be read gets ``(nan, "unknown ...")``, never an error."""
    from headcount.data.tasks import get_task

    names = [task_name(t) for t in settings.tasks]
    out = {}
    for ref in settings.tasks:
        task = get_task(ref)
        splits = {task.name: task.validation_split,
                  **{reported_name(task.name, label, names): split for label, split in extra_splits(ref).items()}}
        metric = lottery_metric(ref, getattr(settings, "metric", "reference"))  # the study's metric (accuracy on MRPC/QQP by default)
        for name, split in splits.items():
            if metric not in ("accuracy", "f1"):
                out[name] = chance_level(metric)
                continue
            try:
                labels = task.load(split, max_examples=settings.train.max_eval_examples,
                                   seed=settings.train.data_seed).labels
            except Exception as e:  # noqa: BLE001  (a report of a run whose data moved still works)
                out[name] = (math.nan, f"unknown (dev labels not readable: {type(e).__name__})")
                continue
            out[name] = chance_level(metric, labels)
    return out


def _why_nan(r) -> str:
    if r.get("flag") == "no_passing_mask":
        return ("no_passing_mask: no magnitude pruning step kept the dev metric >= threshold x the full model's, "
                "so there is no mask (not the full model at sparsity 0)")
    if r.get("flag") == "skipped: no_passing_mask":
        return "skipped: its good magnitude run kept no mask (no_passing_mask), so there is no sparsity to match"
    if not r.get("finished", True):
        return "not finished (missing or failed): see the run's log"
    if r.get("heads_kept") == 0 and r.get("mlps_kept") == 0:
        return "the subnetwork is empty (0 heads, 0 MLPs): the model predicts a constant"
    return "the metric is undefined (e.g. a constant prediction under a correlation metric)"


def nan_table(store, settings: LotterySettings, scores, prefix: str = ""):
    """The runs whose score is NaN (left out of the means over seeds), and the control
    subnetworks drawn empty (the subnetwork job's ``empty`` flag), each with why.

    Returns:
        A DataFrame: experiment, task, seed, what (``NaN score`` | ``drawn empty``), why.
    """
    rows = [{"experiment": r["experiment"], "task": r["task"], "seed": r["seed"], "what": "NaN score", "why": r["why"]}
            for r in nan_runs(scores.to_dict("records"), "score", ["experiment", "task", "seed"], why=_why_nan)]
    for task in settings.tasks:
        tname = task_name(task)
        names = [(f"{kind} subnetwork", seed, job_name(prefix, "subnetwork", kind, tname, f"seed{seed}"))
                 for seed in settings.seeds for kind in ("random", "bad")]
        names += [(f"{kind} subnetwork", None, job_name(prefix, "subnetwork", kind, tname))
                  for kind in ("super", "super-random", "super-bad")]
        names += [("super-random subnetwork", seed, job_name(prefix, "subnetwork", "super-random", tname, f"seed{seed}"))
                  for seed in (settings.super_survivors.seeds or settings.seeds)]  # drawn per retraining seed
        for label, seed, name in names:
            r = finished(store, name)
            if r is not None and r.result.get("empty"):
                rows.append({"experiment": label, "task": tname, "seed": seed, "what": "drawn empty",
                             "why": "0 heads and 0 MLPs kept (a warning in the job's log); retrained, it predicts "
                                    "a constant"})
    return pd.DataFrame(rows, columns=["experiment", "task", "seed", "what", "why"])


def summarize(scores, experiments=None):
    """Mean and sample std over seeds per (experiment, task), in the order of ``experiments``.

    Returns:
        A tidy DataFrame: experiment, pruning, task, metric, mean, std, n (seeds with a score),
        heads_kept / mlps_kept / sparsity means.

    >>> import pandas as pd
    >>> df = pd.DataFrame({"experiment": ["full"] * 2, "pruning": ["none"] * 2, "task": ["t"] * 2, "seed": [1, 2],
    ...                    "metric": ["accuracy"] * 2, "score": [0.8, 0.9], "heads_kept": [None] * 2,
    ...                    "mlps_kept": [None] * 2, "sparsity": [None] * 2})
    >>> round(float(summarize(df)["std"][0]), 4)
    0.0707
    """

    order = list(experiments or dict.fromkeys(scores["experiment"]))
    rows = []
    for exp in order:
        sub = scores[scores["experiment"] == exp]
        for task in dict.fromkeys(scores["task"]):
            t = sub[sub["task"] == task]
            if t.empty:
                continue
            st = seed_summary(t["score"].astype(float).to_numpy())

            def mean_of(col):
                v = pd.to_numeric(t[col], errors="coerce")
                return float(v.mean()) if v.notna().any() else math.nan

            rows.append({"experiment": exp, "pruning": t["pruning"].iloc[0], "task": task, "metric": t["metric"].iloc[0],
                         "mean": st["mean"], "std": st["std"], "n": st["n"], "heads_kept": mean_of("heads_kept"),
                         "mlps_kept": mean_of("mlps_kept"), "sparsity": mean_of("sparsity"),
                         "n_total": int(len(t))})
    return pd.DataFrame(rows, columns=["experiment", "pruning", "task", "metric", "mean", "std", "n", "heads_kept",
                                       "mlps_kept", "sparsity", "n_total"])


def mean_std(mean, std, digits: int = 3) -> str:
    """A ``mean ± std`` cell; just the mean without a finite std; blank without a mean.

    >>> mean_std(0.8, 0.01), mean_std(0.8, float("nan"), digits=2), mean_std(None, None)
    ('0.800 ± 0.010', '0.80', '')
    """
    if mean is None or not math.isfinite(mean):
        return ""
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None and math.isfinite(std) else f"{mean:.{digits}f}"


def wide_table(summary):
    """Experiments x tasks with ``mean ± std`` cells (the paper's layout); blank where a score is missing,
    ``(n=k of m)`` where only k of m seeds gave a number (with the ``n``/``n_total`` of [`summarize`][headcount.experiments.studies.lottery.tables.summarize]).

    >>> wide_table(pd.DataFrame({"experiment": ["full"], "task": ["t"], "mean": [0.8], "std": [0.01]}))["t"][0]
    '0.800 ± 0.010'
    """
    tasks = list(dict.fromkeys(summary["task"]))
    rows = []
    for exp in dict.fromkeys(summary["experiment"]):
        sub = summary[summary["experiment"] == exp]
        row = {"experiment": exp}
        for t in tasks:
            r = sub[sub["task"] == t]
            row[t] = seed_cell(r["mean"].iloc[0], r["std"].iloc[0], n=r.iloc[0].get("n"), n_total=r.iloc[0].get("n_total"),
                               digits=3) if len(r) else ""
        rows.append(row)
    return pd.DataFrame(rows, columns=["experiment", *tasks])


def paper_table(summary, experiments: dict[str, str], heads: bool = False):
    """One of the paper's main tables, one row per task: this run's ``mean ± std`` over seeds
    beside Prasanna et al.'s published mean ([`published`][headcount.experiments.studies.lottery.published]), both to the paper's two decimals
    (the tidy ``main`` table has the full precision).

    Args:
        summary: [`summarize`][headcount.experiments.studies.lottery.tables.summarize] of the run's scores.
        experiments: experiment (a row of ``summary``) -> column header, in order.
        heads: add the good subnetwork's heads kept (mean over seeds), and the paper's.

    Returns:
        Columns ``task``, ``metric``, ``seeds`` (how many seeds have a score: ``n`` or ``min-max``),
        then per experiment its header and ``<header>, paper``; the paper's columns are left out
        when it has none of the run's tasks. Cells are text; missing ones blank.

    >>> s = pd.DataFrame({"experiment": ["full", "good retrained"], "task": ["glue/rte"] * 2, "metric": ["accuracy"] * 2,
    ...                   "mean": [0.65, 0.6], "std": [0.02, 0.03], "n": [3, 3], "heads_kept": [None, 70.0]})
    >>> paper_table(s, {"full": "full", "good retrained": "good"}).iloc[0].tolist()
    ['glue/rte', 'accuracy', '3', '0.65 ± 0.02', '0.63', '0.60 ± 0.03', '0.58']
    """
    tasks = list(dict.fromkeys(summary["task"]))
    with_paper = any(paper_task(t) is not None for t in tasks)
    rows = []
    for task in tasks:
        sub = summary[summary["task"] == task].set_index("experiment")
        ns = [int(sub.loc[e, "n"]) for e in experiments if e in sub.index]
        row = {"task": task, "metric": str(sub["metric"].iloc[0]),
               "seeds": "" if not ns else (str(min(ns)) if min(ns) == max(ns) else f"{min(ns)}-{max(ns)}")}
        for exp, header in experiments.items():
            row[header] = (seed_cell(sub.loc[exp, "mean"], sub.loc[exp, "std"], n=sub.loc[exp].get("n"),
                                     n_total=sub.loc[exp].get("n_total"), digits=2)  # (n=k of m): NaN seeds
                           if exp in sub.index else "")
            if with_paper:
                value = published(exp, task)
                row[f"{header}, paper"] = "" if value is None else f"{value:.2f}"
        if heads:
            good = [e for e in ("good pruned", "good retrained") if e in sub.index]  # the same mask
            kept = float(sub.loc[good[0], "heads_kept"]) if good else math.nan
            row["good heads"] = f"{kept:.1f}" if math.isfinite(kept) else ""
            if with_paper:
                col = paper_task(task)
                row["good heads, paper"] = str(PAPER_HEADS_KEPT[col]) if col in PAPER_HEADS_KEPT else ""
        rows.append(row)
    return pd.DataFrame(rows)


def stability_table(stab: dict[str, dict]):
    """Mask stability across seeds, one row per (task, components): Krippendorff's alpha,
    Cochran's Q, mean pairwise Jaccard, kept per seed, super-survivors (from the stability jobs)."""
    rows = []
    for tname, r in stab.items():
        n_super = {"heads": int(np.sum(r["super_heads"])), "mlps": int(np.sum(r["super_mlps"]))}
        n_super["all"] = n_super["heads"] + n_super["mlps"]
        for comp in ("heads", "mlps", "all"):
            st = r[comp]
            rows.append({"task": tname, "components": comp, "krippendorff_alpha": st["krippendorff_alpha"],
                         "cochran_q": st["cochran_q"], "cochran_df": st["cochran_df"], "cochran_p": st["cochran_p"],
                         "mean_pairwise_jaccard": st["mean_pairwise_jaccard"],
                         "kept_per_seed": " ".join(map(str, st["kept_per_seed"])),
                         "super_survivors": n_super[comp]})
    return pd.DataFrame(rows)


def overlap_table(ov: dict):
    """The overlap job's matrices as rows: task_a, task_b, heads/mlps/super_heads Jaccard."""
    tasks = ov["tasks"]
    return pd.DataFrame([{"task_a": a, "task_b": b, "heads_jaccard": ov["heads_jaccard"][i][j],
                          "mlps_jaccard": ov["mlps_jaccard"][i][j],
                          "super_heads_jaccard": ov["super_heads_jaccard"][i][j]}
                         for i, a in enumerate(tasks) for j, b in enumerate(tasks)])


#: The two views of the pattern tables: (classifier, what a share is counted over, label).
PATTERN_VIEWS: dict[str, tuple[str, str]] = {
    "rules": ("heads", "rule classifier on per-head mean maps (headcount)"),
    "cnn": ("examples x heads", "CNN on per-example maps (Prasanna et al.)"),
}


def _cnn_labels(result: dict) -> np.ndarray | None:
    """The CNN's labels of a patterns job: ``[examples, layers, heads]`` names (per-example maps),
    or ``[layers, heads]`` for results written before (the CNN on mean maps); None without a CNN."""
    if "cnn_example_ids" in result:
        return np.asarray(result["cnn_classes"])[np.asarray(result["cnn_example_ids"], dtype=np.int64)]
    if "cnn_labels" in result:
        return np.asarray(result["cnn_labels"], dtype=str)
    return None


def pattern_tables(store, settings, prefix):
    """(per-head table, distribution table) from the saved pattern jobs and masks.

    Distribution rows: ``task, seed, classifier, group, pattern, fraction`` and, new with the
    CNN on per-example maps, ``counted_over`` (``heads`` for the rule classifier, ``examples x
    heads`` for the CNN, as Prasanna et al. count) and ``view`` ([`PATTERN_VIEWS`][headcount.experiments.studies.lottery.tables.PATTERN_VIEWS]);
    aggregated over seeds into ``mean, std, n``. Per-head rows: the rule class (``pattern``) and
    features; with the CNN, ``pattern_cnn_commonest`` (its commonest class over the examples) and
    ``cnn_share_<class>`` (the share of examples it gives each class).
    """

    s = settings
    heads_rows, dist_rows = [], []
    for task in s.tasks:
        tname = task_name(task)
        sup = finished(store, job_name(prefix, "subnetwork", "super", tname)) if s.super_survivors.enabled else None
        sup_heads = np.asarray(sup.result["mask"]["heads"]) if sup is not None else None
        for seed in s.seeds:
            pt = finished(store, job_name(prefix, "patterns", tname, f"seed{seed}"))
            prune = finished(store, job_name(prefix, "prune", tname, f"seed{seed}"))
            if pt is None:
                continue
            cnn = _cnn_labels(pt.result)
            for source in ("rules", "cnn"):
                labels = np.asarray(pt.result["labels"], dtype=str) if source == "rules" else cnn
                if labels is None:
                    continue
                counted_over, view = PATTERN_VIEWS[source]
                if source == "cnn" and labels.ndim == 2:  # a result written before: the CNN on mean maps
                    counted_over, view = "heads", "CNN on per-head mean maps (earlier headcount results)"
                groups = {"full model": None}
                if prune is not None:
                    groups["good subnetwork"] = np.asarray(prune.result["mask"]["heads"])
                if sup_heads is not None:
                    groups["super-survivors"] = sup_heads
                for group, mask in groups.items():
                    if mask is not None and mask.sum() == 0:
                        continue
                    for cls, frac in pattern_distribution(labels, mask).items():  # a head mask applies to every example
                        dist_rows.append({"task": tname, "seed": seed, "classifier": source, "group": group,
                                          "pattern": cls, "fraction": frac, "counted_over": counted_over,
                                          "view": view})
            good = np.asarray(prune.result["mask"]["heads"]) if prune is not None else None
            labels = np.asarray(pt.result["labels"], dtype=str)
            feats = pt.result.get("features", {})
            for layer in range(labels.shape[0]):
                for head in range(labels.shape[1]):
                    r = {"task": tname, "seed": seed, "layer": layer, "head": head, "pattern": labels[layer, head],
                         "kept_good": int(good[layer, head]) if good is not None else None,
                         "super_survivor": int(sup_heads[layer, head]) if sup_heads is not None else None}
                    if cnn is not None and cnn.ndim == 2:  # an earlier result: the CNN on the mean map
                        r["pattern_cnn"] = cnn[layer, head]
                    elif cnn is not None:
                        shares = pattern_distribution(cnn[:, layer, head])
                        r["pattern_cnn_commonest"] = max(CLASSES, key=lambda c: shares[c])
                        r.update({f"cnn_share_{c}": shares[c] for c in CLASSES})
                    for f, v in feats.items():
                        r[f] = v[layer][head]
                    heads_rows.append(r)
    dist = pd.DataFrame(dist_rows, columns=["task", "seed", "classifier", "group", "pattern", "fraction",
                                            "counted_over", "view"])
    if not dist.empty:
        dist = (dist.groupby(["task", "classifier", "group", "pattern", "counted_over", "view"], sort=False)["fraction"]
                .agg(mean="mean", std="std", n="count").reset_index())
        dist["pattern"] = pd.Categorical(dist["pattern"], CLASSES)
    return pd.DataFrame(heads_rows), dist
