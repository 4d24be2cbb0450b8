"""The ``stability`` job of the retrieval study: the agreement of every head set the study writes
across haystack seeds, prompt templates and scorers (orchestration of
[`headcount.analysis.correlation`][headcount.analysis.correlation] and
[`headcount.analysis.agreement`][headcount.analysis.agreement]; the grids and the budgets' order come from
[`jobs`][headcount.experiments.studies.retrieval.jobs]).
"""

from __future__ import annotations

import math
from itertools import combinations
from pathlib import Path

import numpy as np

from headcount.analysis.agreement import expected_jaccard
from headcount.analysis.correlation import jaccard, spearman, top_k_mask
from headcount.experiments.studies.jobs import job_params
from headcount.experiments.studies.retrieval.config import StabilityParams
from headcount.experiments.studies.retrieval.jobs import grid_of, kv_grid, lexicographic
from headcount.kv.memory import KVBudgetSettings
from headcount.kv.policies.scores import budget_from_scores
from headcount.runtime.atomic import atomic_write_text


def head_set(grid: np.ndarray, fraction: float) -> np.ndarray:
    """The top ``fraction`` of a grid's units ([`top_k_mask`][headcount.analysis.correlation.top_k_mask])
    among those that score above 0: a retrieval grid is mostly 0, and the heads a tie at 0 would
    add (the first ones by position) are the same in every grid, which would pass for agreement.

    >>> head_set(np.array([[0.3, 0.0], [0.0, 0.0]]), 0.5).astype(int).tolist()
    [[1, 0], [0, 0]]
    """
    return top_k_mask(grid, fraction) & (np.nan_to_num(grid, nan=0.0) > 0)


def tied(grid: np.ndarray, chosen: np.ndarray) -> int:
    """How many members of a set were chosen among equal scores at its cut (the set's lowest score
    equals the highest score left out): a tie is broken by position, the same in every grid, so
    agreement on those members says nothing.

    >>> tied(np.array([0.5, 0.0, 0.0, 0.0]), np.array([True, True, False, False]))
    1
    """
    g = np.nan_to_num(np.asarray(grid, dtype=np.float64), nan=-np.inf)
    chosen = np.asarray(chosen, dtype=bool)
    if not chosen.any() or chosen.all():
        return 0
    cut = g[~chosen].max()
    return int((chosen & (g == cut)).sum())


def agreement_row(a: np.ndarray, b: np.ndarray, set_a: np.ndarray, set_b: np.ndarray) -> dict:
    """Top-k Jaccard of two head sets, its chance level (two random sets of their sizes among the
    units both grids score, [`expected_jaccard`][headcount.analysis.agreement.expected_jaccard]), the Spearman of the grids, and
    the members chosen among ties ([`tied`][headcount.experiments.studies.retrieval.stability.tied])."""
    n = int((np.isfinite(a) & np.isfinite(b)).sum())
    ka, kb = int(set_a.sum()), int(set_b.sum())
    return {"n": n, "k_a": ka, "k_b": kb, "jaccard": jaccard(set_a, set_b),
            "chance": expected_jaccard(ka, kb, n) if ka <= n and kb <= n else math.nan, "spearman": spearman(a, b),
            "tied": tied(a, set_a) + tied(b, set_b)}


def stability_job(params, inputs, workdir: Path, progress) -> dict:
    """The agreement of every head set the study writes across haystack seeds (same template and
    scorer), prompt templates (same seed and scorer) and scorers (same run): the top fractions of
    query heads and of KV heads by each scorer ([`head_set`][headcount.experiments.studies.retrieval.stability.head_set]), and the full KV heads of
    the budget each run's ranking gives at every memory target (a retrieval ranking's ties broken
    by the same run's long-range mass, as the study's budgets; the grid of the Spearman and the
    ties is that order).

    params: [`StabilityParams`][headcount.experiments.studies.retrieval.config.StabilityParams];
    inputs: every score job, named as in ``runs``. Writes ``stability.csv``; returns ``rows``.
    """
    import pandas as pd

    p = job_params(StabilityParams, params)
    docs = {alias: inputs[alias].load_json("scores.json") for alias in p.runs}
    shape = next(iter(docs.values()))["layout"]
    grids: dict[tuple, dict[str, np.ndarray]] = {}  # (method, template, seed) -> unit -> grid
    for alias, m in p.runs.items():
        d = docs[alias]
        grids[m["method"], m["template"], int(m["seed"])] = {"query heads": grid_of(d["heads"]),
                                                              "KV heads": np.asarray(kv_grid(d), dtype=np.float64)}
    budget_sets: dict[tuple, np.ndarray] = {}  # (method, template, seed, memory) -> full [L, n_kv]
    for key, g in grids.items():
        # as the study's budgets: a retrieval ranking's ties broken by the same run's long-range mass
        ties = grids.get(("long-range", *key[1:])) if key[0] == "retrieval" else None
        g["budget"] = lexicographic(g["KV heads"], None if ties is None else ties["KV heads"])
        for memory in p.memory:
            s = KVBudgetSettings(memory=memory, context=p.context, sink=p.sink, window=p.window, dtype=p.dtype)
            b = budget_from_scores(g["budget"].tolist(), shape["n_heads"], shape["head_dim"], s)
            budget_sets[(*key, memory)] = np.asarray(b.full, dtype=bool)

    def sets(method, template, seed):
        g = grids[method, template, seed]
        for unit in ("query heads", "KV heads"):
            for f in p.fractions:
                yield f"top {f:.0%} {unit}", unit, f, None, g[unit], head_set(g[unit], f)
        for memory in p.memory:
            yield (f"full KV heads, memory {memory:g}", "KV heads", None, memory, g["budget"],
                   budget_sets[method, template, seed, memory])

    templates = list(dict.fromkeys(k[1] for k in grids))
    seeds = list(dict.fromkeys(k[2] for k in grids))
    methods = list(dict.fromkeys(k[0] for k in grids))
    pairs = []  # (comparison, scorer label, run a, run b)
    for method in methods:
        for t in templates:
            pairs += [("seeds", method, (method, t, s1), (method, t, s2)) for s1, s2 in combinations(seeds, 2)]
        for s in seeds:
            pairs += [("templates", method, (method, t1, s), (method, t2, s)) for t1, t2 in combinations(templates, 2)]
    if len(methods) == 2:
        for t in templates:
            for s in seeds:
                pairs.append(("scorers", f"{methods[0]} vs {methods[1]}", (methods[0], t, s), (methods[1], t, s)))
    rows = []
    for comparison, scorer, a, b in pairs:
        for (name, unit, f, memory, ga, sa), (_, _, _, _, gb, sb) in zip(sets(*a), sets(*b)):
            rows.append({"head_set": name, "unit": unit, "fraction": f, "memory": memory, "comparison": comparison,
                         "scorer": scorer, "template_a": a[1], "seed_a": a[2], "template_b": b[1], "seed_b": b[2],
                         **agreement_row(ga, gb, sa, sb)})
    atomic_write_text(workdir / "stability.csv", pd.DataFrame(rows).to_csv(index=False))
    return {"rows": rows, "ranking": p.ranking}
