"""The retrieval study's job functions (orchestration only: the maths is in
[`headcount.importance.retrieval`][headcount.importance.retrieval] (the scorers),
[`headcount.analysis.retrieval`][headcount.analysis.retrieval] (the interval),
[`headcount.analysis.ablation`][headcount.analysis.ablation] (the causal test),
[`headcount.kv.policies`][headcount.kv.policies] and [`headcount.kv.cache`][headcount.kv.cache]
(budgets and the cache that applies them) and [`headcount.analysis.correlation`][headcount.analysis.correlation] /
[`headcount.analysis.agreement`][headcount.analysis.agreement] (stability)).

Each has the runner's signature ``(params, inputs, workdir, progress) -> dict``, validates its
params into a ``*Params`` model of [`config`][headcount.experiments.studies.retrieval.config] and is
deterministic given them. Files each writes:

- ``score_job``: ``scores.json`` (``heads [L, H]``; retrieval: ``interval`` and
  ``retrieval.share_above_threshold``; long-range: ``kv_groups [L, n_kv]``), retrieval also
  ``per_example.safetensors`` (``heads [n_examples, L, H]``, each example's copies; 0 for the
  examples that do not count);
- ``pool_job``: ``scores.json`` of every example of one scorer at once (``kv_groups`` too);
- ``stability_job`` ([`stability`][headcount.experiments.studies.retrieval.stability]): ``stability.csv`` (one row per pair of head sets);
- ``ablation_job``: ``ablation.json`` ([`AblationResult`][headcount.analysis.ablation.AblationResult]);
- ``budget_job``: ``budget.json`` ([`KVBudget`][headcount.kv.budget.KVBudget]);
- ``curve_job``: ``curve.json`` (measured KV bytes, needle answers, LM losses).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from headcount.analysis.retrieval import with_retrieval_interval
from headcount.data.tasks.niah import niah_batches, niah_task
from headcount.experiments.studies.jobs import job_params, load_per_example
from headcount.experiments.studies.retrieval.config import (
    AblationParams,
    BudgetParams,
    CurveParams,
    NiahParams,
    PoolParams,
    ScoreParams,
)
from headcount.importance.pipeline import load_for
from headcount.importance.retrieval import mean_over_counted
from headcount.importance.scores import Scores, kv_pool
from headcount.importance.scoring import score
from headcount.kv.budget import KVBudget
from headcount.kv.measure import lm_chunks, measure_kv_budget
from headcount.kv.memory import KVBudgetSettings
from headcount.kv.policies import get_policy, make_budget
from headcount.kv.policies.scores import kv_scores
from headcount.kv.policy import BudgetRequest
from headcount.runtime.atomic import atomic_path, atomic_write_json
from headcount.runtime.device import resolve_runtime
from headcount.runtime.errors import HeadcountError


# --------------------------------------------------------------------------- helpers
def niah_of(p: NiahParams):
    """The generated task of a job's ``niah`` params (named by its template: the seed is in the job's name)."""
    return niah_task(f"niah-{p.template}", p.spec())


def _model(spec: str, task, rt):
    """The decoder with its language-model head on the job's device, in eval mode, and its tokenizer."""
    model, tokenizer, _ = load_for(spec, task, "lm", device=rt)
    model.eval()
    return model, tokenizer


def shape_of(model) -> dict:
    """``n_layers``, ``n_heads``, ``n_kv_heads``, ``head_dim`` of a decoder (what budgets are made for)."""
    from headcount.core.gates import layout

    g = layout(model)
    return {"n_layers": int(g.n_layers), "n_heads": int(g.n_heads), "n_kv_heads": int(g.n_kv_heads),
            "head_dim": int(g.head_dim)}


def _counter(progress, total: int, what: str):
    """A ``progress(i)`` callback of an inner loop that reports ``done + i`` of ``total`` (call ``.next(n)`` between passes)."""
    state = {"base": 0}

    def call(i):
        progress(state["base"] + i, total, what)

    def advance(n):
        state["base"] += n

    call.next = advance  # type: ignore[attr-defined]
    return call


def kv_grid(scores: dict) -> list[list[float]]:
    """A scores file's per-KV-head grid: its ``kv_groups`` (long-range's own), else the max over
    each group's query heads (the budgets' rule, [`kv_scores`][headcount.kv.policies.scores.kv_scores])."""
    return kv_scores(Scores.from_dict(scores, torch.float64), int(scores["layout"]["n_kv_heads"]))[0]


def grid_of(values) -> np.ndarray:
    """A JSON grid (``null`` for NaN) as a float64 array."""
    return np.asarray([[np.nan if v is None else v for v in row] for row in values], dtype=np.float64)


def lexicographic(primary: np.ndarray, ties: np.ndarray | None) -> np.ndarray:
    """A grid whose order is ``primary``'s (higher first), its ties broken by ``ties`` (higher
    first), then by position: each unit's rank from the last (n for the first, 1 for the last),
    NaN where ``primary`` is NaN (never chosen). ``ties`` None: ``primary`` as it is.

    A retrieval grid is mostly 0: the top units of a budget or an ablation beyond its retrieval
    heads are then the ones that read farthest back, not the first ones by position.

    >>> lexicographic(np.array([[0.5, 0.0, 0.0]]), np.array([[0.1, 0.2, 0.9]])).tolist()
    [[3.0, 1.0, 2.0]]
    """
    if ties is None:
        return primary
    p = np.nan_to_num(primary.ravel(), nan=-np.inf)
    t = np.nan_to_num(ties.ravel(), nan=-np.inf)
    order = np.lexsort((np.arange(p.size), -t, -p))  # the last key sorts first
    ranks = np.empty(p.size)
    ranks[order] = np.arange(p.size, 0, -1)
    return np.where(np.isnan(primary), np.nan, ranks.reshape(primary.shape))


def ranking_grid(inputs, unit: str) -> tuple[np.ndarray, np.ndarray]:
    """``(grid to rank by, primary scores)`` of a job's ``scores`` input (per query head for
    ``unit`` heads, per KV head for kv-groups), ties broken by its ``ties`` input when there is one."""
    doc = inputs["scores"].load_json("scores.json")
    ties = inputs["ties"].load_json("scores.json") if "ties" in inputs else None

    def of(d):
        return grid_of(d["heads"]) if unit == "heads" else np.asarray(kv_grid(d), dtype=np.float64)

    primary = of(doc)
    return lexicographic(primary, None if ties is None else of(ties)), primary


# --------------------------------------------------------------------------- scores
def score_job(params, inputs, workdir: Path, progress) -> dict:
    """One scorer (``retrieval`` or ``long-range``) on the examples of one template and haystack seed.

    params: [`ScoreParams`][headcount.experiments.studies.retrieval.config.ScoreParams]. Writes
    ``scores.json`` (and, for ``retrieval``, ``per_example.safetensors``); returns the scores'
    dict with ``layout`` (the model's shape).

    >>> score_job(params, {}, Path("out"), print)["method"]   # doctest: +SKIP
    'retrieval'
    """
    p = job_params(ScoreParams, params)
    rt = resolve_runtime()  # $HEADCOUNT_DEVICE / $HEADCOUNT_PRECISION (set by the runner), once
    task = niah_of(p.niah)
    model, tokenizer = _model(p.model, task, rt)
    batches = niah_batches(task, tokenizer, split=p.niah.split, batch_size=1)
    n = sum(len(b.examples) for b in batches)
    s = score(model, batches, method=p.method, device=rt, options=p.options,
              progress=lambda i: progress(i, n, f"{p.method}: {p.niah.template}, seed {p.niah.seed}"))
    shape = shape_of(model)
    if p.method == "retrieval":
        if p.n_boot:
            s = with_retrieval_interval(s, n_boot=p.n_boot, level=p.level, seed=p.niah.seed, threshold=p.threshold)
        else:  # no resamples: the share without its interval
            share = float((s.heads[torch.isfinite(s.heads)] > p.threshold).double().mean())
            s = replace(s, meta={**s.meta, "retrieval": {**s.meta["retrieval"], "share_above_threshold": {
                "threshold": p.threshold, "estimate": share, "low": math.nan, "high": math.nan}}})
        with atomic_path(workdir / "per_example.safetensors") as tmp:
            save_file({"heads": s.per_example.contiguous()}, str(tmp))
    s = replace(s, meta={**s.meta, "task": task.name, "model": p.model, "template": p.niah.template,
                         "haystack_seed": p.niah.seed, "split": p.niah.split, "layout": shape})
    s.save(workdir / "scores.json")
    return s.to_dict()


def pool_job(params, inputs, workdir: Path, progress) -> dict:
    """Every (template, seed) run of one scorer as one grid: ``retrieval``: the mean of each head's
    copies over the counted examples of all runs (as if scored at once) with its bootstrap
    interval over those examples; ``long-range``: the mass over all runs' query positions (each
    run's mean weighted by its queries), ``kv_groups`` reduced from it as the scorer does.

    params: [`PoolParams`][headcount.experiments.studies.retrieval.config.PoolParams]; inputs: the
    runs' score jobs. Writes ``scores.json`` (``kv_groups`` for both scorers: retrieval's is the
    max over each group's query heads, the budgets' rule).
    """
    p = job_params(PoolParams, params)
    runs = [inputs[name] for name in p.runs]
    docs = [r.load_json("scores.json") for r in runs]
    shape = docs[0]["layout"]
    n_kv = shape["n_kv_heads"]
    if p.method == "retrieval":
        rows = np.concatenate([load_per_example(r.dir / "per_example.safetensors")[0] for r in runs])  # [n, L, H]
        records = [e for d in docs for e in d["retrieval"]["examples"]]
        counted = [bool(e["counted"]) for e in records]
        per = torch.as_tensor(rows)
        heads = mean_over_counted(per, counted).float()
        s = Scores(heads=heads, mlps=torch.full((heads.shape[0],), math.nan), method="retrieval",
                   n_examples=len(records), n_tokens=sum(int(d["n_tokens"]) for d in docs),
                   meta={"retrieval": {"success": docs[0]["retrieval"]["success"], "n_counted": int(sum(counted)),
                                       "needle_accuracy": float(np.mean([bool(e["exact"]) for e in records])),
                                       "examples": records}},
                   per_example=per.float())
        if p.n_boot:
            s = with_retrieval_interval(s, n_boot=p.n_boot, level=p.level, seed=0, threshold=p.threshold)
        kv = kv_scores(replace(s, meta={}), n_kv)[0]  # the budgets' rule: the max over each group's query heads
        s = replace(s, per_example=None)
    else:
        weights = np.asarray([float(d["n_queries"]) for d in docs])
        grids = np.stack([grid_of(d["heads"]) for d in docs])  # [runs, L, H]
        heads = torch.as_tensor((grids * weights[:, None, None]).sum(0) / weights.sum())
        kv = kv_pool(heads, n_kv, docs[0]["kv_reduce"]).tolist()  # as the scorer reduces its own
        s = Scores(heads=heads.float(), mlps=torch.full((heads.shape[0],), math.nan), method="long-range",
                   n_examples=sum(int(d["n_examples"]) for d in docs), n_tokens=sum(int(d["n_tokens"]) for d in docs),
                   meta={k: docs[0][k] for k in ("sink", "window", "kv_reduce")} | {"n_queries": int(weights.sum())})
    s = replace(s, meta={**s.meta, "kv_groups": kv, "layout": shape, "pooled": list(p.runs), "model": docs[0]["model"],
                         "task": "niah (pooled over templates and seeds)"})
    s.save(workdir / "scores.json")
    out = {"method": p.method, "layout": shape, "n_runs": len(runs), "n_examples": s.n_examples}
    if p.method == "retrieval":
        out["share_above_threshold"] = s.meta["retrieval"].get("share_above_threshold")
        out["needle_accuracy"] = s.meta["retrieval"]["needle_accuracy"]
        out["n_counted"] = s.meta["retrieval"]["n_counted"]
    return out


# --------------------------------------------------------------------------- ablation
def ablation_job(params, inputs, workdir: Path, progress) -> dict:
    """The causal test of one ranking on the held-out haystacks: the top ``fraction`` of query heads
    (``unit: heads``, the pooled retrieval score) or of KV heads (``kv-groups``, the budgets'
    ranking) masked (``mask``) vs ``draws`` random sets of as many from the other units, the top
    set ranked among them, and Wu et al.'s protocol beside it (``theirs``:
    [`ablation_test`][headcount.analysis.ablation.ablation_test]).

    params: [`AblationParams`][headcount.experiments.studies.retrieval.config.AblationParams];
    inputs ``scores``: the pooled scores of the ranking, ``ties`` (retrieval): the pooled long-range
    mass that breaks its ties ([`lexicographic`][headcount.experiments.studies.retrieval.jobs.lexicographic]). Writes ``ablation.json``.
    """
    from headcount.analysis.ablation import ablation_test

    p = job_params(AblationParams, params)
    rt = resolve_runtime()
    grid, primary = ranking_grid(inputs, p.unit)
    task = niah_of(p.niah)
    model, tokenizer = _model(p.model, task, rt)
    batches = niah_batches(task, tokenizer, split=p.niah.split, batch_size=1)
    n = sum(len(b.examples) for b in batches)
    count = _counter(progress, n * (2 + p.draws + int(p.theirs)), f"ablation ({p.unit})")

    def step(i):
        count(i)
        if i == n:
            count.next(n)

    r = ablation_test(model, batches, torch.as_tensor(grid), fraction=p.fraction, draws=p.draws, seed=p.seed,
                      unit=p.unit, mask=p.mask, theirs=p.theirs, max_new_tokens=p.max_new_tokens, rt=rt,
                      progress=step)
    out = {**r.to_dict(), "ranking": p.ranking, "n_positive": int((np.nan_to_num(primary) > 0).sum()),
           "ties": "long-range" if "ties" in inputs else None,
           "length": p.niah.lengths[0], "template": p.niah.template, "haystack_seed": p.niah.seed, **rt.meta()}
    atomic_write_json(workdir / "ablation.json", out)
    return out


# --------------------------------------------------------------------------- budgets and the curve
def budget_job(params, inputs, workdir: Path, progress) -> dict:
    """One budget of the curve: ``full`` (every KV head keeps the full cache), ``scores`` (the KV
    heads the upstream pooled scores rank highest keep it, as many as the target allows; the
    ``ties`` input breaks their ties, [`lexicographic`][headcount.experiments.studies.retrieval.jobs.lexicographic]: ``made_from.kv_scores``
    are then ranks, ``ranked_scores`` the scores),
    ``uniform`` (every KV head streams, the widest window the target allows: StreamingLLM) or
    ``random`` (as many full KV heads as ``scores``, drawn with ``seed``).

    params: [`BudgetParams`][headcount.experiments.studies.retrieval.config.BudgetParams]; inputs
    ``scores`` and ``ties`` (kind ``scores``) or ``shape`` (any pooled scores: the model's shape). Writes
    ``budget.json``.
    """
    p = job_params(BudgetParams, params)
    policy = get_policy(p.kind)
    doc = inputs["scores" if policy.needs_scores else "shape"].load_json("scores.json")
    shape = doc["layout"]
    L, H, K, D = shape["n_layers"], shape["n_heads"], shape["n_kv_heads"], shape["head_dim"]
    made = {"model": doc.get("model"), "study": "retrieval"}
    grid = None
    if policy.needs_scores:
        ranked, primary = ranking_grid(inputs, "kv-groups")
        grid = ranked.tolist()
        made = {**made, "ranking": p.ranking, "ties": "long-range" if "ties" in inputs else None,
                "ranked_scores": primary.tolist()}
    s = KVBudgetSettings(memory=1.0 if p.memory is None else p.memory, context=p.context, sink=p.sink,
                         window=p.window, dtype=p.dtype)  # memory None: the full cache, its own target
    options = {"seed": None if p.seed is None else int(p.seed)}
    b = make_budget(p.kind, BudgetRequest(L, H, K, D, s, kv_scores=grid, meta=made,
                                          options={k: v for k, v in options.items() if k in policy.options}))
    b.save(workdir / "budget.json")
    return {"kind": p.kind, "memory": p.memory, "seed": p.seed, "n_full": b.n_full, "n_kv": L * K,
            "sink": sorted({x for row in b.sink for x in row if x is not None}),
            "window": sorted({x for row in b.window for x in row if x is not None}),
            "bytes": b.meta["bytes"], "full": [[int(x) for x in row] for row in b.full]}


def curve_job(params, inputs, workdir: Path, progress) -> dict:
    """One budget (upstream ``budget``) applied with [`apply_kv_budget`][headcount.kv.cache.apply_kv_budget],
    measured by [`measure_kv_budget`][headcount.kv.measure.measure_kv_budget] (what `headcount kv-eval` runs):

    - the KV cache's measured bytes (``cache.nbytes()``) after a prefill of exactly the context
      length (the first LM text), beside what the budget predicts;
    - needle accuracy on the held-out haystacks at the context length: greedy ``generate`` with a
      fresh budget cache per prompt, the answer cut at the first line break (or end of sequence),
      success when the needle's answer appears verbatim;
    - the LM loss (mean next-token cross-entropy) on ``lm_texts`` ordinary texts of the context
      length, the budget's attention applied in the forward pass (a fresh cache per text).

    params: [`CurveParams`][headcount.experiments.studies.retrieval.config.CurveParams]. Writes ``curve.json``.
    """
    p = job_params(CurveParams, params)
    rt = resolve_runtime()
    budget = KVBudget.load(inputs["budget"].path("budget.json"))
    task = niah_of(p.niah)
    model, tokenizer = _model(p.model, task, rt)
    budget.check_model(model)
    context = int(budget.meta["bytes"]["context"])
    examples = task.examples(p.niah.split, tokenizer)
    chunks = lm_chunks(task, tokenizer, p.lm_split, p.lm_texts, context, p.lm_seed)
    limit = getattr(tokenizer, "model_max_length", None)
    longest = max(len(e.input_ids) for e in examples) + p.max_new_tokens
    if isinstance(limit, int) and limit < 10**8 and max(longest, context) > limit:
        raise HeadcountError(f"the budget curve needs {max(longest, context)} positions, the model has {limit}: "
                             "lower budgets.context")
    m = measure_kv_budget(model, tokenizer, budget, examples, chunks, max_new_tokens=p.max_new_tokens,
                          device=rt.device, autocast=rt.autocast, progress=progress)
    answers, losses, measured, element = m["answers"], m["losses"], m["kv_bytes"], m["element_size"]
    predicted = budget.kv_bytes(context, element_size=element)
    full = budget.full_bytes(context, element_size=element)
    made = budget.meta.get("made_from", {})
    result = {"kind": made.get("mode"), "memory": made.get("memory"), "context": context, "n_full": budget.n_full,
              "n_kv": budget.n_layers * budget.n_kv_heads, "kv_bytes": measured, "kv_bytes_predicted": predicted,
              "full_cache_bytes": full, "kv_ratio": measured / full, "element_size": element,
              "needle_accuracy": float(np.mean([a["exact"] for a in answers])), "n_needles": len(answers),
              "successes": [int(a["exact"]) for a in answers], "answers": answers,
              "lm_loss": float(np.mean(losses)), "lm_losses": losses, "lm_tokens": context, **rt.meta()}
    atomic_write_json(workdir / "curve.json", result)
    return result
