"""The transfer study's summary: one sentence per comparison, no stronger than its table.

Each sentence gives the mean over seeds with its interval and the paired test over seeds
([`headcount.analysis.paired`][headcount.analysis.paired]): a difference is claimed only when its test rejects at
[`ALPHA`][headcount.experiments.studies.transfer.summary.ALPHA] (otherwise "not significant"), and "interval contains chance" marks an interval that
cannot tell the estimate from the chance level; comparisons that rest on a fitted MLM
head carry its mark, ``†`` ([`MARK`][headcount.experiments.studies.transfer.summary.MARK]), and [`transfer_caveats`][headcount.experiments.studies.transfer.summary.transfer_caveats] says once what it stands for
([`mlm_caveat`][headcount.experiments.studies.transfer.summary.mlm_caveat]: the report's box of caveats). Also the cell formats the summary and the report's tables share
([`cell`][headcount.experiments.studies.transfer.summary.cell]: ``mean ± std [low, high]``, ``(n=k of m)`` when seeds gave no number).

A decoder's run (``objectives: [lm]``) is written in its own words
([`objective_words`][headcount.experiments.studies.transfer.tables.objective_words]: next-token LM, not MLM), without the mark: its LM head is the
checkpoint's own, pre-trained with it, so there is no head to caveat.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from headcount.analysis.helpers import LEVEL
from headcount.analysis.paired import at_chance, paired_sign_flip_test, seed_interval
from headcount.experiments.report.format import finite, seed_cell
from headcount.experiments.studies.transfer.config import TransferSettings
from headcount.experiments.studies.transfer.tables import (
    ObjectiveWords,
    fmt,
    objective_words,
    prunability_table,
    stat_rows,
)

#: Significance level of the summary's verdicts.
ALPHA = 0.05

#: The comparisons the summary states: (comparison, label, whether it rests on the MLM head). A label's
#: ``{label}`` and ``{encoder}`` are filled from [`objective_words`][headcount.experiments.studies.transfer.tables.objective_words] (``MLM``/``LM``, ``encoder``/``model``).
SUMMARY_COMPARISONS: tuple[tuple[str, str, bool], ...] = (
    ("mlm-vs-task", "{label} vs task (fine-tuned)", True),
    ("mlm-vs-task-before", "{label} vs task (frozen {encoder})", True),
    ("embedding-vs-task", "Embedding (SimCSE) vs task (fine-tuned)", False),
    ("embedding-vs-task-before", "Embedding (SimCSE) vs task (frozen {encoder})", False),
    ("mlm-vs-embedding", "{label} vs embedding (pre-trained)", True),
    ("task-before-vs-after", "Task importance before vs after fine-tuning", False),
    ("task-vs-task", "Task vs task", False),
    ("seed-vs-seed", "Seed vs seed (same task)", False),
)


#: What the summary's MLM-side sentences carry instead of the whole caveat (said once, in the report's box).
MARK = "†"


def _marked(caveat: str, inside: str = "") -> str:
    """A sentence's tag for ``caveat``: ``†`` alone (the caveat is in the box), or the caveat in brackets.

    >>> _marked(MARK), _marked("† a head"), _marked("")
    ('†', ' († a head)', '')
    """
    if not caveat:
        return ""
    return MARK if caveat == MARK else f" ({inside}{caveat})"


def transfer_caveats(tables: dict) -> list[str]:
    """What the ``†`` of the summary stands for, once: the MLM head the MLM side rests on
    ([`mlm_caveat`][headcount.experiments.studies.transfer.summary.mlm_caveat]), and for a fitted head that it is not evidence about masked-LM pre-training.
    None for a decoder's LM (``tables["objective"]`` ``lm``): its head is its own.

    >>> transfer_caveats({"mlm": pd.DataFrame({"corpus": ["a"], "head": ["fitted"], "head_heldout_accuracy": [0.09]})})[0][-76:]
    'importance for that head, not evidence about masked-LM pre-training as such.'
    >>> transfer_caveats({"mlm": pd.DataFrame({"corpus": ["a"], "head": ["checkpoint"]}), "objective": "lm"})
    []
    """
    if not objective_words(tables).caveat:
        return []
    caveat = mlm_caveat(tables)
    m = tables.get("mlm")
    fitted = m is not None and not m.empty and "head" in m and (m["head"] == "fitted").any()
    return [caveat + (", not evidence about masked-LM pre-training as such." if fitted else ".")]


def mlm_caveat(tables: dict) -> str:
    """The tag every MLM-side sentence carries: which masked-LM head the MLM numbers rest on, and
    its accuracy (the fitted head's held-out masked-token accuracy, from the MLM scoring jobs'
    ``mlm_head``), from ``tables["mlm"]``.

    ``""`` where the objective needs no caveat (a decoder's own LM head,
    [`ObjectiveWords.caveat`][headcount.experiments.studies.transfer.tables.ObjectiveWords.caveat]).

    >>> mlm_caveat({"mlm": pd.DataFrame({"corpus": ["amazon"], "head": ["fitted"], "head_heldout_accuracy": [0.093]})})
    '† MLM head fitted on the frozen encoder, held-out masked-token accuracy 0.09 (amazon): MLM importance is importance for that head'
    """
    if not objective_words(tables).caveat:
        return ""
    m = tables.get("mlm")
    if m is None or m.empty or "head" not in m:
        return "† which MLM head was used is not in this run's tables"
    fitted = m[m["head"] == "fitted"]
    if fitted.empty:
        accs = ", ".join(f"{fmt(r.get('validation_accuracy'))} ({r['corpus']})" for _, r in m.iterrows())
        return f"† the checkpoint's own MLM head, masked-token accuracy {accs}"
    accs = ", ".join(f"{fmt(r.get('head_heldout_accuracy'))} ({r['corpus']})" for _, r in fitted.iterrows())
    return (f"† MLM head fitted on the frozen encoder, held-out masked-token accuracy {accs}: MLM importance is "
            "importance for that head")


def _same_pair(df: pd.DataFrame, row) -> pd.DataFrame:
    """The rows of ``df`` with ``row``'s comparison, statistic, view, task and task_b (None and NaN alike)."""
    d = df[(df["comparison"] == row["comparison"]) & (df["statistic"] == row["statistic"])]
    if "view" in d and "view" in row:
        d = d[d["view"] == row["view"]]
    if "task" in d:
        d = d[d["task"] == row.get("task")]
    if "task_b" in d:
        tb = row.get("task_b")
        d = d[d["task_b"].isna()] if pd_isna(tb) else d[d["task_b"] == tb]
    return d


def coherence_interval(tables: dict, row, level: float = LEVEL) -> tuple[float, float, str]:
    """``(low, high, how)`` of a ``coherence_summary`` row: its interval (``how``: its ``ci``), else
    the t interval over the per-seed estimates of ``tables["coherence"]``; NaN bounds without either."""
    low, high = row.get("low"), row.get("high")
    if _finite(low) and _finite(high):
        ci = row.get("ci")
        return float(low), float(high), ci if isinstance(ci, str) and ci else "bootstrap"
    coh = tables.get("coherence")
    if coh is not None and not coh.empty and {"comparison", "statistic", "estimate"} <= set(coh):
        iv = seed_interval(pd.to_numeric(_same_pair(coh, row)["estimate"], errors="coerce"), level)
        if _finite(iv["low"]):
            return iv["low"], iv["high"], "t interval over seeds"
    return float("nan"), float("nan"), ""


def coherence_phrase(tables: dict, row, level: float = LEVEL, alpha: float = ALPHA) -> str:
    """One task's coherence statistic: ``estimate [low, high] (n=k)``, ``: interval contains
    chance`` when it does, and the permutation verdict (``p <= ... on each of k seeds``
    or ``not significant (largest p over k seeds = ...)``) when the statistic has p-values.

    >>> r = pd.Series({"comparison": "c", "statistic": "jaccard@0.25", "task": "amazon", "task_b": None,
    ...                "estimate": 0.16, "low": 0.07, "high": 0.25, "chance": 0.1429, "n_finite": 3})
    >>> coherence_phrase({}, r)
    'amazon 0.16 [0.07, 0.25] (n=3): interval contains chance (0.14)'
    """
    task, tb = row.get("task"), row.get("task_b")
    name = str(task) if pd_isna(tb) or tb == task else f"{task} / {tb}"
    n = row.get("n_finite", row.get("n"))
    n = int(n) if _finite(n) else None
    low, high, _ = coherence_interval(tables, row, level)
    text = f"{name} {fmt(row.get('estimate'))}"
    text += f" [{low:.2f}, {high:.2f}]" if _finite(low) and _finite(high) else " (no interval)"
    text += f" (n={n})" if n is not None else ""
    chance, stat = row.get("chance"), str(row.get("statistic", ""))
    if not _finite(chance) and stat.startswith(("spearman", "kendall")):  # a table without the column
        chance = 0.0
    if at_chance(low, high, chance):
        text += f": interval contains chance ({float(chance):.2f})"
    p = row.get("p_value_max")
    if _finite(p):
        over = f"each of {n} seeds" if n and n > 1 else "its seed"
        text += (f", p <= {float(p):.3g} on {over}" if float(p) < alpha else
                 f", not significant ({'largest p over ' + str(n) + ' seeds' if n and n > 1 else 'p'} = {float(p):.3g})")
    return text


def coherence_sentence(tables: dict, comparison: str, label: str, settings: TransferSettings,
                       caveat: str = "") -> str:
    """The summary's sentence on one comparison: per task, Spearman with its interval, ``interval contains chance``
    where the interval contains 0, and the permutation verdict; then the top-25% Jaccard with its
    interval and ``interval contains chance`` where it contains the Jaccard chance level. ``""`` without rows.

    Args:
        tables: [`transfer_tables`][headcount.experiments.studies.transfer.tables.transfer_tables] output (``coherence_summary``; ``coherence`` for
            the fallback interval; the application view).
        comparison: a key of [`COMPARISONS`][headcount.experiments.studies.transfer.plan.COMPARISONS].
        label: its name in the text.
        settings: the part's settings (``stats``: level, fractions, permutation).
        caveat: appended to the label (the MLM head's, [`mlm_caveat`][headcount.experiments.studies.transfer.summary.mlm_caveat], for MLM-side comparisons).
    """
    s = tables["coherence_summary"]
    d = stat_rows(s, comparison, "spearman")
    if d.empty:
        return ""
    level = settings.stats.level
    how = {coherence_interval(tables, r, level)[2] for _, r in d.iterrows()} - {""}
    test = ("heads permuted within layers" if settings.stats.permutation == "within-layer" else "heads permuted globally")
    text = (f"{label}{_marked(caveat)}: Spearman, mean over seeds [{level:.0%} interval"
            f"{': ' + ', '.join(sorted(how)) if how else ''}], p: two-sided permutation test, {test}: "
            + "; ".join(coherence_phrase(tables, r, level) for _, r in d.iterrows()) + ".")
    j = stat_rows(s, comparison, "jaccard@0.25") if 0.25 in settings.stats.fractions else d.iloc[0:0]
    if len(j):
        chance = j["chance"].iloc[0] if "chance" in j else None
        text += (f" Top-25% Jaccard (chance {fmt(chance)}): "
                 + "; ".join(coherence_phrase(tables, r.drop(labels=["p_value_max"], errors="ignore"), level)
                             for _, r in j.iterrows()) + ".")
    return text


def _mlm_accuracy(r, words: ObjectiveWords | None = None) -> str:
    """An MLM (or LM: ``words``) accuracy with its binomial (Wilson) 95% interval over the masked
    (predicted) tokens, when counted."""
    tokens = (words or objective_words("mlm")).tokens
    acc, n = r.get("validation_accuracy"), r.get("validation_masked_tokens")
    if not _finite(acc):
        return "n/a"
    if not _finite(n) or int(n) < 1:
        return f"{fmt(acc)} (no interval: {tokens} not counted)"
    from scipy.stats import binomtest

    ci = binomtest(round(float(acc) * int(n)), int(n)).proportion_ci(method="wilson")
    return f"{fmt(acc)} [{ci.low:.2f}, {ci.high:.2f}] (Wilson interval over {int(n):,} {tokens}, approximate: tokens of one text are not independent)"


def _per_seed_removable(tables: dict, task, threshold: float) -> dict[str, list[float]]:
    """Per order: the removable share of each seed's own curve (task objective, application view)."""
    c = tables.get("curves")
    if c is None or c.empty or not {"seed", "objective", "view", "order"} <= set(c):
        return {}
    c = c[(c["task"] == task) & (c["objective"] == "task") & (c["view"] == "application") & c["seed"].notna()]
    out: dict[str, list[float]] = {}
    for _, g in c.groupby("seed", sort=True):
        for _, r in prunability_table(g, threshold).iterrows():
            out.setdefault(r["order"], []).append(float(r["removable_fraction"]))
    return out


def prunability_sentence(tables: dict, settings: TransferSettings, caveat: str = "") -> str:
    """Heads removable at the threshold, per task and order (the mean curve), with the per-seed
    shares' mean ± std (n) when the curves are there. ``""`` without a prunability table."""
    pr = tables["prunability"]
    if pr.empty:
        return ""
    threshold = settings.before_after.threshold
    w = objective_words(settings)
    d = pr[(pr["objective"] == "task") & (pr["view"] == "application")]
    orders = ("task", "mlm", "embedding", "random")
    parts = []
    for t, g in d.groupby("task", sort=False):
        txt = f"{t}: " + ", ".join(f"{w.by(o)} {_share(g[g['order'] == o]['removable_fraction'].iloc[0])}"
                                   for o in orders if (g["order"] == o).any())
        seeds = _per_seed_removable(tables, t, threshold)
        spread = []
        for o in orders:
            iv = seed_interval(seeds.get(o, []))
            if iv["n"] > 1:
                spread.append(f"{w.by(o)} {iv['mean']:.0%} ± {iv['std']:.0%} (n={iv['n']})")
        if spread:
            txt += " (each seed's curve, mean ± std: " + ", ".join(spread) + ")"
        parts.append(txt)
    return (f"Heads removable with >= {threshold:.0%} of the fine-tuned score (no retraining), by order"
            + (f" (the {w.by('mlm')} order{MARK})" if caveat == MARK else _marked(caveat, f"the {w.by('mlm')} order: "))
            + ": " + "; ".join(parts) + ".")


def deduction_sentence(tables: dict, settings: TransferSettings, caveat: str = "") -> str:
    """The acceptable deduction per task, with the pruned-then-fine-tuned score at that level
    (mean ± std, n) against the threshold share of the full score. ``""`` without the table."""
    ad = tables["acceptable_deduction_summary"]
    if ad.empty:
        return ""
    threshold = settings.before_after.threshold
    w = objective_words(settings)
    ba = tables.get("before_after")
    parts = []
    for _, r in ad.iterrows():
        if _no_full_score(r):
            parts.append(f"{r['task']}: {NA}")
            continue
        if r["level"] is None or pd_isna(r["level"]):
            parts.append(f"{r['task']}: none")
            continue
        txt = f"{r['task']}: {r['level']:.0%} of heads, {w.label} loss +{r['mlm_loss_increase']:.2f}"
        if ba is not None and not ba.empty and {"task", "level", "setting", "score"} <= set(ba):
            x = ba[(ba["task"] == r["task"]) & (ba["setting"] == w.setting("before", "mlm"))
                   & np.isclose(ba["level"].astype(float), float(r["level"]))]
            if len(x):
                x = x.iloc[0]
                score = cell(x["score"], x.get("score_std"), n=x.get("n"), n_total=x.get("n_total"))
                n = x.get("n")
                full = r.get("full_score")
                txt += (f" (fine-tuned score there {score}" + (f", n={int(n)}" if _finite(n) else "")
                        + (f", against {threshold:g} x full = {threshold * float(full):.2f}" if _finite(full) else "")
                        + ")")
        parts.append(txt)
    return (f"Acceptable deduction{MARK if caveat == MARK else ''} (prune by {w.label}, then fine-tune, >= {threshold:.0%}"
            + (f"; {caveat}" if caveat and caveat != MARK else "") + "): " + "; ".join(parts) + ".")


def before_after_sentence(tables: dict, caveat: str = "") -> str:
    """Pruning before fine-tuning vs removing the same (MLM-ranked) heads from the fine-tuned
    model, seed by seed: at each level, on how many seeds the pruned-then-fine-tuned model scores
    higher, and the two-sided paired sign-flip test over seeds, or, when the seeds are too few
    for any p below [`ALPHA`][headcount.experiments.studies.transfer.summary.ALPHA] (3 seeds: the smallest two-sided p is 2/2^3 = 0.25), "not
    testable at this n". ``""`` without the per-seed table.

    >>> t = {"before_after_seeds": pd.DataFrame({"task": ["a"] * 3, "level": [0.5] * 3, "seed": [1, 2, 3],
    ...      "prune_mlm_then_finetune": [0.8, 0.7, 0.9], "finetune_then_prune_mlm": [0.6, 0.75, 0.5]})}
    >>> before_after_sentence(t)
    'Pruning before fine-tuning vs removing the same MLM-ranked heads after it (no retraining), seed by seed: a: higher on 2 of 3 seeds at 50%; not testable at this n (with 3 seeds the smallest two-sided sign-flip p is 0.25).'
    """
    d = tables.get("before_after_seeds")
    if d is None or d.empty:
        return ""
    w = objective_words(tables)
    parts, floors = [], []
    for t, g in d.groupby("task", sort=False):
        levels = []
        for level, x in g.groupby("level", sort=True):
            a = pd.to_numeric(x["prune_mlm_then_finetune"], errors="coerce").to_numpy(float)
            b = pd.to_numeric(x["finetune_then_prune_mlm"], errors="coerce").to_numpy(float)
            r = paired_sign_flip_test(a, b)
            floors.append(r.min_p)
            txt = f"higher on {r.n_above} of {r.n} seeds at {float(level):.0%}"
            if r.min_p <= ALPHA:
                txt += f" (p = {r.p_value:.3g})"
            levels.append(txt)
        parts.append(f"{t}: " + ", ".join(levels))
    floor = max(floors) if floors else float("nan")
    tail = ""
    if floors and all(f > ALPHA for f in floors):
        n = int(d.groupby(["task", "level"]).size().max())
        tail = f"; not testable at this n (with {n} seeds the smallest two-sided sign-flip p is {floor:.2g})"
    return (f"Pruning before fine-tuning vs removing the same {w.label}-ranked heads after it (no retraining)"
            + _marked(caveat) + ", seed by seed: " + "; ".join(parts) + tail + ".")


def transfer_summary(tables: dict, settings: TransferSettings, prefix: str = "") -> str:
    """The headline numbers as text (for the report's summary): every estimate with its interval
    (or mean ± std over seeds, n), ``interval contains chance`` wherever an interval contains the chance level,
    ``not significant`` wherever a p-value is >= 0.05, and ``†`` on every sentence that rests on
    the MLM head (what it stands for: [`transfer_caveats`][headcount.experiments.studies.transfer.summary.transfer_caveats], said once in the report's box). A
    decoder's run (``objectives: [lm]``) names its next-token LM and carries no ``†``.

    >>> transfer_summary(transfer_tables(store, config), config)    # doctest: +SKIP
    'Masked LM of the pre-trained model†: ...'
    """
    w = objective_words(settings)
    caveat = MARK if w.caveat else ""
    parts = []
    m = tables.get("mlm")
    if m is not None and not m.empty:
        parts.append(f"{w.name[0].upper()}{w.name[1:]} of the pre-trained model{caveat}: " + "; ".join(
            f"{r['corpus']}: accuracy {_mlm_accuracy(r, w)}, loss {fmt(r.get('validation_loss'))}"
            + ("" if r.get("head") == "fitted" else " (its own head)")
            for _, r in m.iterrows()) + ".")
    for comparison, label, mlm_side in SUMMARY_COMPARISONS:
        label = label.format(label=w.label, encoder=w.encoder)
        txt = coherence_sentence(tables, comparison, label, settings, caveat if mlm_side else "")
        if txt:
            parts.append(txt)
    for txt in (prunability_sentence(tables, settings, caveat), deduction_sentence(tables, settings, caveat),
                before_after_sentence(tables, caveat)):
        if txt:
            parts.append(txt)
    return "\n\n".join(parts)


# =============================================================================================
# cells: the formats the summary and the report's tables share
# =============================================================================================
def _finite(x) -> bool:
    return finite(x) and isinstance(x, (int, float, np.floating, np.integer))


#: What a removable share reads when the full model's metric is undefined (NaN).
NA = "n/a (full score undefined)"


def _share(x) -> str:
    """A removable share as a percentage; [`NA`][headcount.experiments.studies.transfer.summary.NA] when it is NaN (the full metric is undefined).

    >>> _share(0.25), _share(float("nan"))
    ('25%', 'n/a (full score undefined)')
    """
    return f"{float(x):.0%}" if _finite(x) else NA


def _no_full_score(row) -> bool:
    """Whether an acceptable-deduction summary row has no full fine-tuned score (NaN on every seed)."""
    return "full_score" in row and not _finite(row["full_score"])


def cell(mean, std=None, low=None, high=None, digits: int = 2, n=None, n_total=None) -> str:
    """``mean ± std [low, high]`` with the parts that are defined, ``(n=k of m)`` when only k of
    m seeds gave a number ([`headcount.experiments.report.format.seed_cell`][headcount.experiments.report.format.seed_cell]); blank without a mean.

    >>> cell(0.3141, 0.02, 0.2, 0.4), cell(0.5), cell(float("nan")), cell(0.5, float("nan"), None, 0.7)
    ('0.31 ± 0.02 [0.20, 0.40]', '0.50', '', '0.50')
    >>> cell(**_over_seeds(pd.Series([0.345, float("nan")])), digits=3)
    '0.345 (n=1 of 2)'
    """
    return seed_cell(mean, std, low, high, n=n, n_total=n_total, digits=digits)


def _over_seeds(values: pd.Series) -> dict:
    """``mean``, ``std``, ``n`` (finite values) and ``n_total`` over seeds, for ``cell(**...)``; NaN left out, counted."""
    v = pd.to_numeric(values, errors="coerce")
    ok = v.dropna()
    mean = float(ok.mean()) if len(ok) else float("nan")
    std = float(ok.std(ddof=1)) if len(ok) > 1 else float("nan")
    return {"mean": mean, "std": std, "n": len(ok), "n_total": len(v)}

def pd_isna(x) -> bool:
    try:
        return x is None or bool(np.isnan(x))
    except TypeError:
        return False
