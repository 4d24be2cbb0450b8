"""The transfer study's tables: saved results -> tidy pandas DataFrames (and small helpers on them).

[`transfer_tables`][headcount.experiments.studies.transfer.tables.transfer_tables] reads every finished job of a transfer part through [`plan.Names`][headcount.experiments.studies.transfer.plan.Names];
the figures ([`figures`][headcount.experiments.studies.transfer.figures]) and the report ([`report`][headcount.experiments.studies.transfer.report]) are drawn from its output only.

[`objective_words`][headcount.experiments.studies.transfer.tables.objective_words] names the objective in MLM's role for every text the figures, the
summary and the report write: masked LM for an encoder, a decoder's next-token LM for ``objectives: [lm]``.
Only labels follow it: the plan's keys (job names, comparisons, score kinds, orders, raw columns such as
``mlm_loss_increase``) keep their ``mlm`` names, so that results keep their identities.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from headcount.analysis.removal import acceptable_deduction
from headcount.analysis.summaries import largest_contiguous_passing
from headcount.experiments.studies.extra_eval import extra_splits
from headcount.experiments.studies.transfer.config import TransferSettings
from headcount.experiments.studies.transfer.plan import COMPARISONS, Names, plan_of


@dataclass(frozen=True)
class ObjectiveWords:
    """How the report names the pre-training objective in MLM's role
    ([`TransferSettings.pretrain`][headcount.experiments.studies.transfer.config.TransferSettings.pretrain]).

    Attributes:
        label: its short name in prose, titles and headers: ``MLM``, ``LM``.
        title: its name in a figure's title: ``MLM``, ``next-token LM``.
        name: the objective in words: ``masked LM``, ``next-token LM``.
        loss: its loss in words: ``masked-LM loss``, ``next-token LM loss``.
        tokens: the tokens its accuracy counts: ``masked tokens``, ``predicted tokens``.
        order: its head order in row labels and legends (``by mlm``, ``prune (mlm) then
            fine-tune``): ``mlm``, ``lm``.
        encoder: what the backbone is called: ``encoder``, ``model``.
        head: where its output head comes from (the ``mlm`` table's caption): fitted or the
            checkpoint's for MLM, the decoder's own for LM.
        caveat: whether its numbers rest on a head the reader must be told about (``†``): an
            encoder's MLM head, fitted on the frozen encoder or the checkpoint's; a decoder's own
            LM head, pre-trained with it, needs none.
    """

    label: str
    title: str
    name: str
    loss: str
    tokens: str
    order: str
    encoder: str
    head: str
    caveat: bool

    def kind(self, kind: str) -> str:
        """A score kind of ``head_scores`` (a key) as a label: ``mlm-...`` named by the objective.

        >>> OBJECTIVE_WORDS["lm"].kind("mlm-pre-trained"), OBJECTIVE_WORDS["lm"].kind("task-fine-tuned")
        ('lm-pre-trained', 'task-fine-tuned')
        """
        return f"{self.order}{kind[3:]}" if kind.startswith("mlm-") else kind

    def by(self, order: str) -> str:
        """A head order (a key: ``task``, ``mlm``, ``embedding``, ``random``) as a label."""
        return self.order if order == "mlm" else order

    def setting(self, when: str, order: str) -> str:
        """A row label of the ``before_after`` table: ``prune (<order>) then fine-tune`` (``when``
        ``before``) or ``fine-tune then prune (<order>)`` (``after``), the order as [`by`][headcount.experiments.studies.transfer.tables.ObjectiveWords.by] names it.

        >>> OBJECTIVE_WORDS["mlm"].setting("before", "mlm"), OBJECTIVE_WORDS["lm"].setting("after", "mlm")
        ('prune (mlm) then fine-tune', 'fine-tune then prune (lm)')
        """
        return f"prune ({self.by(order)}) then fine-tune" if when == "before" else f"fine-tune then prune ({self.by(order)})"

    def comparison(self, comparison: str) -> str:
        """A comparison's label ([`COMPARISONS`][headcount.experiments.studies.transfer.plan.COMPARISONS], written for an encoder's MLM) in these words.

        The plan's labels are the one place that is rewritten rather than written per objective:
        they belong to the plan, whose keys stay.

        >>> OBJECTIVE_WORDS["lm"].comparison("mlm-before-vs-after")
        'LM: pre-trained vs fine-tuned model'
        """
        text = COMPARISONS.get(comparison, comparison)
        if self.order == "mlm":
            return text
        return text.replace("MLM", self.label).replace("encoder", self.encoder)


#: The words of each objective in MLM's role (``mlm``, ``lm``), for [`objective_words`][headcount.experiments.studies.transfer.tables.objective_words].
OBJECTIVE_WORDS: dict[str, ObjectiveWords] = {
    "mlm": ObjectiveWords(label="MLM", title="MLM", name="masked LM", loss="masked-LM loss", tokens="masked tokens",
                          order="mlm", encoder="encoder",
                          head="The masked-LM head (from the checkpoint, or fitted on the frozen encoder: its "
                               "held-out loss/accuracy)", caveat=True),
    "lm": ObjectiveWords(label="LM", title="next-token LM", name="next-token LM", loss="next-token LM loss",
                         tokens="predicted tokens", order="lm", encoder="model",
                         head="The next-token LM head (the decoder's own, pre-trained with it: none is fitted)",
                         caveat=False),
}


def objective_words(of: TransferSettings | Mapping | str) -> ObjectiveWords:
    """The words for the objective in MLM's role: the one helper every label of the report uses.

    Args:
        of: a part's settings (their [`pretrain`][headcount.experiments.studies.transfer.config.TransferSettings.pretrain]), its
            [`transfer_tables`][headcount.experiments.studies.transfer.tables.transfer_tables] (which record it under ``objective``; tables
            without it are an encoder's), or the objective itself (``mlm``, ``lm``).

    >>> objective_words("lm").label, objective_words({}).label
    ('LM', 'MLM')
    """
    if isinstance(of, str):
        name = of
    elif isinstance(of, Mapping):
        name = of.get("objective") or "mlm"
    else:
        name = of.pretrain
    return OBJECTIVE_WORDS[name]


def artifact(prefix: str) -> str:
    """A report-name prefix from a job-name prefix (``"transfer/"`` -> ``"transfer-"``)."""
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in prefix)


def transfer_tables(store, settings: TransferSettings, prefix: str = "") -> dict:
    """The tidy tables of a finished transfer part, read from saved results (pandas DataFrames).

    Keys: ``layout`` (the layout job's result, a dict), ``mlm`` (the MLM head and the
    pre-trained model's MLM quality per text source), ``coherence``, ``coherence_summary``, ``layer_mass``, ``head_scores``, ``finetune``,
    ``curves``, ``prunability``, ``before_after``, ``before_after_seeds`` (per seed: the pruned-
    then-fine-tuned score beside the same seed's fine-tuned model gated at the same level),
    ``acceptable_deduction``, ``acceptable_deduction_summary`` (the last four empty when
    ``before_after`` is off), and ``objective``: the objective in MLM's role (``mlm``, ``lm``: what
    [`objective_words`][headcount.experiments.studies.transfer.tables.objective_words] names; the ``before_after`` rows' ``setting`` labels follow it).
    A task with extra dev sets (MNLI mismatched, label ``mm``) adds ``fine_tuned_<label>`` to
    ``finetune`` (the fine-tuned models on that split) and ``before_after`` rows
    ``prune (<order>) then fine-tune (<label>)`` (the pruned-then-fine-tuned models on it);
    blank (NaN) for the other tasks and for jobs not run.

    >>> tables = transfer_tables(RunStore("runs/transfer-offline"), config)   # doctest: +SKIP
    """
    n, p, words = Names(prefix), plan_of(settings), objective_words(settings)
    coh = store.result(n.coherence())
    coherence_df = pd.DataFrame(coh.result["rows"])
    for col in ("p_value_global", "grids", "pairing"):  # results saved before these columns
        if col not in coherence_df:
            coherence_df[col] = None
    summary = coherence_summary(coherence_df, coh.result.get("seed_means"))

    scores = []

    def add_scores(result, kind, task, seed):
        d = result.load_json("scores.json")
        for layer, row in enumerate(d["heads"]):
            for head, v in enumerate(row):
                scores.append({"kind": kind, "task": task, "seed": seed, "layer": layer, "head": head, "score": v})

    mlm_rows = []
    for c in p["corpora"]:
        job = store.result(n.mlm_pre(c))
        add_scores(job, "mlm-pre-trained", c, None)
        head = job.result.get("mlm_head") or {}
        mlm_rows.append({"corpus": c, "texts": p["corpora"][c], "head": job.result.get("head"),
                         "head_heldout_loss": head.get("loss"), "head_heldout_accuracy": head.get("accuracy")})
        if p["embedding"]:  # the second pre-training objective's grid on the same texts
            add_scores(store.result(n.embedding_pre(c)), "embedding-pre-trained", c, None)
    def extra_score(name: str, label: str) -> float:
        """The score of job ``name``'s model on the extra dev set ``label`` (NaN when not run)."""
        job = n.extra(name, label)
        if not store.has(job):
            return float("nan")
        v = store.result(job).result.get("score")
        return float("nan") if v is None else float(v)

    extras = {t: extra_splits(p["tasks"][t]) for t in p["ids"]}
    ft_rows, curve_rows = [], []
    for t in p["ids"]:
        for seed in p["seeds"]:
            add_scores(store.result(n.task_after(t, seed)), "task-fine-tuned", t, seed)
            add_scores(store.result(n.task_before(t, seed)), "task-pre-trained", t, seed)
            add_scores(store.result(n.mlm_after(t, seed)), "mlm-fine-tuned", t, seed)
            f, h = store.result(n.finetune(t, seed)).result, store.result(n.head_fit(t, seed)).result
            ft_rows.append({"task": t, "seed": seed, "metric": f["metric"], "fine_tuned": f["final"]["score"],
                            "head_only": h["final"]["score"], "train_seconds": f["train_seconds"],
                            "head_fit_seconds": h["train_seconds"], "n_train": f["n_train"], "n_eval": f["n_eval"],
                            **{f"fine_tuned_{label}": extra_score(n.finetune(t, seed), label) for label in extras[t]}})
            cur = store.result(n.curve(t, seed)).result
            curve_rows += [{"task": t, "seed": seed, **r} for r in cur["rows"]]
        if p["embedding"]:
            curve_rows += [{"task": t, "seed": None, **r} for r in store.result(n.embedding_curve(t)).result["rows"]]
        cur = store.result(n.mlm_curve(t)).result
        curve_rows += [{"task": t, "seed": None, **r} for r in cur["rows"]]
        for r in mlm_rows:
            if r["corpus"] == p["corpus_of"][t]:
                r.update(validation_loss=cur["full"]["loss"], validation_accuracy=cur["full"]["score"],
                         validation_masked_tokens=cur["full"].get("n_masked"))
    curves = pd.DataFrame(curve_rows)

    prunability = prunability_table(curves, settings.before_after.threshold)

    ba_rows, ba_seed_rows, ad_rows, ad_summary = [], [], [], []
    if p["ba_levels"]:
        ftd = pd.DataFrame(ft_rows)
        for t in p["ids"]:
            full = float(ftd[(ftd["task"] == t) & ftd["seed"].isin(p["ba_seeds"])]["fine_tuned"].mean())
            c = curves[curves["task"] == t]
            mlm_c = c[(c["objective"].isin(("mlm", "lm"))) & (c["order"] == "mlm") & (c["view"] == settings.before_after.view)]
            if mlm_c.empty:  # a model without shared layers: the application view stands for both
                mlm_c = c[(c["objective"].isin(("mlm", "lm"))) & (c["order"] == "mlm") & (c["view"] == "application")]
            mlm_full = mlm_c[mlm_c["fraction"] == 0].iloc[0]
            task_c = c[(c["objective"] == "task") & (c["view"] == "application")]
            orders = ["mlm"] + (["random"] if settings.before_after.random_control else [])
            for level in p["ba_levels"]:
                pruned_first = {}
                for order in orders:
                    vals = [store.result(n.pruned_finetune(t, seed, order, level)).result["final"]["score"]
                            for seed in p["ba_seeds"]]
                    ok = [v for v in vals if v is not None and math.isfinite(v)]  # a NaN run is counted, not averaged
                    pruned_first[order] = float(np.mean(ok)) if ok else float("nan")
                    ba_rows.append({"task": t, "level": level, "setting": words.setting("before", order),
                                    "score": pruned_first[order], "score_min": float(np.min(ok)) if ok else float("nan"),
                                    "score_max": float(np.max(ok)) if ok else float("nan"), "full": full,
                                    "score_std": _std(ok), "n": len(ok), "n_total": len(vals)})
                    for label in extras[t]:  # the same pruned-then-fine-tuned models on the extra dev set
                        vals = [extra_score(n.pruned_finetune(t, seed, order, level), label) for seed in p["ba_seeds"]]
                        ok = [v for v in vals if math.isfinite(v)]
                        full_x = ftd[(ftd["task"] == t) & ftd["seed"].isin(p["ba_seeds"])][f"fine_tuned_{label}"]
                        ba_rows.append({"task": t, "level": level,
                                        "setting": f"{words.setting('before', order)} ({label})",
                                        "score": float(np.mean(ok)) if ok else float("nan"),
                                        "score_min": float(np.min(ok)) if ok else float("nan"),
                                        "score_max": float(np.max(ok)) if ok else float("nan"),
                                        "full": float(full_x.mean()), "score_std": _std(ok), "n": len(ok),
                                        "n_total": len(vals)})
                for seed in p["ba_seeds"]:  # the same seed's models, paired: the before/after sentence counts these
                    first = store.result(n.pruned_finetune(t, seed, "mlm", level)).result["final"]["score"]
                    at = task_c[(task_c["seed"] == seed) & np.isclose(task_c["fraction"], level)]
                    after = {o: at[at["order"] == o]["score"] for o in ("mlm", "task")}
                    ba_seed_rows.append({"task": t, "level": level, "seed": seed,
                                         "prune_mlm_then_finetune": _number(first),
                                         **{f"finetune_then_prune_{o}": float(v.iloc[0]) if len(v) else float("nan")
                                            for o, v in after.items()}})
                for order in ("task", "mlm"):
                    v = task_c[(task_c["order"] == order) & np.isclose(task_c["fraction"], level)]["score"]
                    ba_rows.append({"task": t, "level": level, "setting": words.setting("after", order),
                                    "score": float(v.mean()), "score_min": float(v.min()), "score_max": float(v.max()),
                                    "full": float(task_c[task_c["fraction"] == 0]["score"].mean()),
                                    "score_std": _std(v.dropna()), "n": int(v.count()), "n_total": len(v)})
                m = mlm_c[np.isclose(mlm_c["fraction"], level)].iloc[0]
                rel = pruned_first["mlm"] / full if full else float("nan")
                ad_rows.append({"task": t, "level": level, "mlm_loss": float(m["loss"]), "mlm_accuracy": float(m["score"]),
                                "mlm_loss_increase": float(m["loss"] - mlm_full["loss"]),
                                "mlm_accuracy_drop": float(mlm_full["score"] - m["score"]),
                                "fine_tuned_score": pruned_first["mlm"], "full_score": full, "relative_score": rel,
                                # n/a (blank), not False, when a score is undefined
                                "acceptable": bool(rel >= settings.before_after.threshold) if math.isfinite(rel) else None})
            best = acceptable_deduction([r for r in ad_rows if r["task"] == t], threshold=settings.before_after.threshold)
            # full_score NaN (no seed's full metric defined): the deduction is n/a, not "none acceptable"
            ad_summary.append({"task": t, "threshold": settings.before_after.threshold, **best, "full_score": full})
    return {"layout": store.result(n.layout()).result, "mlm": pd.DataFrame(mlm_rows), "coherence": coherence_df,
            "coherence_summary": summary, "layer_mass": pd.DataFrame(coh.result["layer_mass"]),
            "head_scores": pd.DataFrame(scores), "finetune": pd.DataFrame(ft_rows), "curves": curves,
            "prunability": prunability, "before_after": pd.DataFrame(ba_rows),
            "before_after_seeds": pd.DataFrame(ba_seed_rows),
            "acceptable_deduction": pd.DataFrame(ad_rows), "acceptable_deduction_summary": pd.DataFrame(ad_summary),
            "objective": settings.pretrain}


def _number(x) -> float:
    """A job's score as a float (None, a failed metric, reads NaN)."""
    return float(x) if x is not None else float("nan")


def prunability_table(curves: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Per curve (task, objective, view, order): how much can be removed, the score at 50%, the area.

    ``removable_fraction``: the largest level such that at it and every lower level the mean
    score over replicates stays at or above ``threshold`` x the full model's
    ([`largest_contiguous_passing`][headcount.analysis.summaries.largest_contiguous_passing]; 0 when the lowest level fails);
    ``removable_fraction_raw``: the largest passing level, ignoring failures below it. Both are NaN
    (n/a) when the full model's metric is (e.g. a correlation metric on constant labels): nothing
    can be compared with it, which is not "nothing removable".

    >>> c = pd.DataFrame({"task": "t", "objective": "task", "view": "application", "order": "mlm",
    ...                   "fraction": [0.0, 0.2, 0.4, 0.6], "score": [1.0, 0.95, 0.5, 0.92]})
    >>> prunability_table(c, 0.9)[["removable_fraction", "removable_fraction_raw"]].iloc[0].tolist()
    [0.2, 0.6]
    """
    prun = []
    for (t, objective, view, order), g in curves.groupby(["task", "objective", "view", "order"], sort=False):
        full = g[g["fraction"] == 0]["score"].mean()
        mean = g.groupby("fraction")["score"].mean()
        passes = [bool(v >= threshold * full) for v in mean.values]
        ok = [float(f) for f, good in zip(mean.index, passes) if good]
        # the largest level such that it and every lower one pass; the raw curve's maximum beside it
        removable = largest_contiguous_passing(list(mean.index), passes)
        removable, raw = (removable if removable is not None else 0.0), (max(ok) if ok else 0.0)
        if not math.isfinite(full):  # no full metric (e.g. constant labels under Pearson): n/a, not "0% removable"
            removable = raw = math.nan
        prun.append({"task": t, "objective": objective, "view": view, "order": order, "full": full,
                     "removable_fraction": removable, "removable_fraction_raw": raw,
                     "score_at_50": float(mean.get(0.5, np.nan)), "auc": float(np.trapezoid(mean.values, mean.index))})
    return pd.DataFrame(prun)


KEYS = ["comparison", "view", "task", "task_b", "statistic"]


def coherence_summary(rows: pd.DataFrame, seed_means: list | None) -> pd.DataFrame:
    """Coherence over the pairs (seeds) of each comparison, view and task.

    ``estimate``: the mean over the pairs with a finite estimate (``n_finite`` of ``n``);
    ``estimate_min``/``_max`` their range; ``low``/``high``: the hierarchical bootstrap interval
    over seeds and examples of the coherence job (``seed_means``; for results saved before it,
    each pair's bounds averaged: ``ci`` says which); ``p_value_max`` and ``p_value_global_max``:
    the largest within-layer (default test) and global permutation p-value over the pairs.
    """
    num = rows.assign(estimate=pd.to_numeric(rows["estimate"], errors="coerce"),
                      p_value=pd.to_numeric(rows["p_value"], errors="coerce"),
                      p_value_global=pd.to_numeric(rows["p_value_global"], errors="coerce"),
                      low=pd.to_numeric(rows["low"], errors="coerce"), high=pd.to_numeric(rows["high"], errors="coerce"))
    summary = (num.groupby(KEYS, dropna=False, sort=False)
               .agg(estimate=("estimate", "mean"), estimate_min=("estimate", "min"), estimate_max=("estimate", "max"),
                    low=("low", "mean"), high=("high", "mean"), p_value_max=("p_value", "max"),
                    p_value_global_max=("p_value_global", "max"), chance=("chance", "first"),
                    n=("estimate", "size"), n_finite=("estimate", "count"), grids=("grids", "first"))
               .reset_index())
    summary["ci"] = "each pair's bounds averaged"
    if seed_means:
        h = pd.DataFrame(seed_means)
        h = h.assign(_key=_keys(h))[["_key", "low", "high", "interval"]]
        summary = summary.drop(columns=["low", "high"]).assign(_key=_keys(summary)).merge(h, on="_key", how="left")
        summary = summary.drop(columns=["_key"])
        summary["ci"] = np.where(summary["interval"].notna(),
                                 "hierarchical bootstrap (" + summary["interval"].astype(str) + ")", "")
        summary = summary.drop(columns=["interval"])
    return summary


def _keys(df: pd.DataFrame) -> pd.Series:
    """One text key per row from the [`KEYS`][headcount.experiments.studies.transfer.tables.KEYS] columns (None and NaN alike: no task_b)."""
    def text(v) -> str:
        return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)

    return df[KEYS].apply(lambda r: "\x1f".join(text(v) for v in r), axis=1)


def _std(values) -> float:
    """Sample standard deviation over seeds (NaN with fewer than two)."""
    v = np.asarray(values, dtype=np.float64)
    return float(np.std(v, ddof=1)) if v.size > 1 else float("nan")


def rank01(grid) -> np.ndarray:
    """Percentile ranks in [0, 1] (the scale every coherence statistic sees)."""
    g = np.asarray(grid, dtype=np.float64)
    r = rankdata(g.ravel())
    return ((r - 1) / max(r.size - 1, 1)).reshape(g.shape)


def grid_of(scores, kind, task, seed=None) -> np.ndarray:
    """The ``[n_layers, n_heads]`` percentile-rank grid of one kind of score (mean over seeds) from ``head_scores``."""
    d = scores[(scores["kind"] == kind) & (scores["task"] == task)]
    if seed is not None:
        d = d[d["seed"] == seed]
    if d.empty:
        return np.zeros((0, 0))
    grids = [g.pivot(index="layer", columns="head", values="score").to_numpy()
             for _, g in d.groupby("seed", dropna=False)]
    return np.mean([rank01(g) for g in grids], axis=0)


def stat_rows(summary, comparison, statistic, view="application", **where):
    """The rows of ``coherence_summary`` for one comparison and statistic (optionally filtered further)."""
    d = summary[(summary["comparison"] == comparison) & (summary["statistic"] == statistic) & (summary["view"] == view)]
    for k, v in where.items():
        d = d[d[k] == v]
    return d


def fmt(x, digits=2) -> str:
    """A number for text: ``digits`` decimals, ``n/a`` for None or non-finite."""
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"
