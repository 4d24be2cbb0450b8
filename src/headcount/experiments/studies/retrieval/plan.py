"""The retrieval study's job graph: settings -> jobs (pure: nothing is read or run here).

Job names (``<t>`` a template, ``<s>`` a haystack seed, ``<m>`` a memory target, ``<d>`` a
random draw) are made by [`Names`][headcount.experiments.studies.retrieval.plan.Names], which the
report uses to find the results again::

    scores/retrieval/<t>/seed<s>     Wu et al.'s retrieval score per query head (+ interval)
    scores/long-range/<t>/seed<s>    attention mass outside sink + window (+ per KV head)
    pooled/retrieval                 every (t, s) example pooled: the ranking, the share > 0.1
    pooled/long-range                the same for the long-range mass
    stability                        head sets across seeds, templates and scorers
    ablation/heads                   top 5% query heads vs random ones gated, held-out needles
    ablation/kv-groups               top 5% KV heads (whole groups) vs random ones
    budget/full, budget/<m>/<kind>   budget.json: full cache; scores, uniform, random<d> at <m>
    curve/full, curve/<m>/<kind>     each budget's measured KV bytes, needle accuracy, LM loss

A job's params are exactly what its job function validates (``*Params`` of
[`config`][headcount.experiments.studies.retrieval.config]); their JSON is part of the job's key.
"""

from __future__ import annotations

from headcount.experiments.runner import Job
from headcount.experiments.studies.retrieval.config import (
    RetrievalConfig,
    RetrievalSettings,
)

JOBS = "headcount.experiments.studies.retrieval.jobs"
STABILITY = "headcount.experiments.studies.retrieval.stability"


def _memory(m: float) -> str:
    return f"{m:g}"


class Names:
    """Job names of a retrieval part under a prefix (shared by [`retrieval_jobs`][headcount.experiments.studies.retrieval.plan.retrieval_jobs] and the report).

    >>> Names().score("retrieval", "passkey", 2), Names("r/").curve(0.5, "random", 1)
    ('scores/retrieval/passkey/seed2', 'r/curve/0.5/random1')
    """

    def __init__(self, prefix: str = ""):
        self.prefix = prefix

    def __call__(self, *parts) -> str:
        return self.prefix + "/".join(str(p) for p in parts)

    def score(self, method: str, template: str, seed: int) -> str:
        return self("scores", method, template, f"seed{seed}")

    def pooled(self, method: str) -> str:
        return self("pooled", method)

    def stability(self) -> str:
        return self("stability")

    def ablation(self, unit: str) -> str:
        return self("ablation", unit)

    @staticmethod
    def _budget(memory: float | None, kind: str, draw: int | None) -> tuple:
        if kind == "full":
            return ("full",)
        return (_memory(memory), f"{kind}{draw}" if kind == "random" else kind)

    def budget(self, memory: float | None, kind: str, draw: int | None = None) -> str:
        return self("budget", *self._budget(memory, kind, draw))

    def curve(self, memory: float | None, kind: str, draw: int | None = None) -> str:
        return self("curve", *self._budget(memory, kind, draw))


def budgets_of(settings: RetrievalSettings) -> list[tuple[float | None, str, int | None]]:
    """``(memory, kind, draw)`` of every budget of the curve: the full cache first, then per target
    the kinds in order (``random`` once per draw).

    >>> budgets_of(RetrievalSettings(budgets={"memory": [0.5], "random_draws": 2}))
    [(None, 'full', None), (0.5, 'scores', None), (0.5, 'uniform', None), (0.5, 'random', 0), (0.5, 'random', 1)]
    """
    b = settings.budgets
    out: list[tuple[float | None, str, int | None]] = [(None, "full", None)]
    for m in b.memory:
        for kind in b.kinds:
            if kind == "random":
                out += [(m, kind, d) for d in range(b.random_draws)]
            else:
                out.append((m, kind, None))
    return out


def _ranked(pooled: dict[str, Job], ranking: str) -> dict[str, Job]:
    """The inputs of a ranking: its pooled scores, and for ``retrieval`` the pooled long-range
    mass that breaks its ties."""
    return {"scores": pooled[ranking], **({"ties": pooled["long-range"]} if ranking == "retrieval" else {})}


def retrieval_jobs(settings: RetrievalSettings, prefix: str = "") -> list[Job]:
    """The jobs of a retrieval part (see the module docstring), named under ``prefix``.

    Args:
        settings: a [`RetrievalSettings`][headcount.experiments.studies.retrieval.config.RetrievalSettings] (or the whole [`RetrievalConfig`][headcount.experiments.studies.retrieval.config.RetrievalConfig]).
        prefix: prepended to every job name.

    Returns:
        The jobs (upstream jobs are reached through ``deps``).

    >>> jobs = retrieval_jobs(RetrievalSettings(seeds=[1, 2], templates=["passkey"]))
    >>> sorted({j.name.split("/")[0] for j in jobs})
    ['ablation', 'budget', 'curve', 'pooled', 'scores', 'stability']
    """
    s = settings
    n = Names(prefix)
    sc, b, h = s.scoring, s.budgets, s.held_out
    stats = {"n_boot": sc.n_boot, "level": sc.level, "threshold": sc.threshold}
    jobs: list[Job] = []
    runs: dict[str, dict[str, Job]] = {"retrieval": {}, "long-range": {}}
    meta: dict[str, dict] = {}
    for method, done in runs.items():
        options = sc.options(method)  # the fields of the scorer's options class
        for template in s.templates:
            for seed in s.seeds:
                niah = {**s.niah.spec(seed, template), "split": s.niah.split}
                job = Job(n.score(method, template, seed), "retrieval.score", f"{JOBS}:score_job",
                          {"model": s.model, "method": method, "niah": niah, "options": options, **stats},
                          uses_model=True)
                alias = f"{method}.{template}.{seed}"
                done[alias] = job
                meta[alias] = {"method": method, "template": template, "seed": seed}
                jobs.append(job)
    pooled = {method: Job(n.pooled(method), "retrieval.pool", f"{JOBS}:pool_job",
                          {"method": method, "runs": list(deps), **stats}, deps=dict(deps))
              for method, deps in runs.items()}
    jobs += pooled.values()
    jobs.append(Job(n.stability(), "retrieval.stability", f"{STABILITY}:stability_job",
                    {"runs": meta, "fractions": list(s.stability.fractions), "memory": list(b.memory),
                     "context": b.context, "sink": b.sink, "window": b.window, "dtype": b.dtype, "ranking": b.ranking},
                    deps={alias: job for deps in runs.values() for alias, job in deps.items()}))
    depths = h.depths if h.depths is not None else s.niah.depths

    def held_out(length: int) -> dict:
        return {**s.niah.spec(h.seed, h.template, lengths=(length,), examples=h.examples, depths=depths),
                "split": h.split}

    if s.ablation.enabled:
        a = s.ablation
        for unit in a.units:
            ranking = "retrieval" if unit == "heads" else b.ranking
            jobs.append(Job(n.ablation(unit), "retrieval.ablation", f"{JOBS}:ablation_job",
                            {"model": s.model, "unit": unit, "ranking": ranking, "niah": held_out(s.ablation_length),
                             "fraction": a.fraction, "draws": a.draws, "seed": a.seed, "mask": a.mask,
                             "theirs": a.theirs, "max_new_tokens": a.max_new_tokens},
                            deps=_ranked(pooled, ranking), uses_model=True))
    if b.enabled:
        curve = {"model": s.model, "niah": held_out(b.context), "max_new_tokens": b.max_new_tokens,
                 "lm_texts": b.lm_texts, "lm_split": b.lm_split, "lm_seed": h.seed}
        for memory, kind, draw in budgets_of(s):
            params = {"kind": kind, "memory": memory, "context": b.context, "sink": b.sink, "window": b.window,
                      "dtype": b.dtype, "ranking": b.ranking if kind == "scores" else None,
                      "seed": draw if kind == "random" else None}
            deps = _ranked(pooled, b.ranking) if kind == "scores" else {"shape": pooled["long-range"]}
            budget = Job(n.budget(memory, kind, draw), "retrieval.budget", f"{JOBS}:budget_job", params, deps=deps)
            jobs += [budget, Job(n.curve(memory, kind, draw), "retrieval.curve", f"{JOBS}:curve_job", curve,
                                 deps={"budget": budget}, uses_model=True)]
    return jobs


def expand(config: RetrievalConfig) -> list[Job]:
    """``expand_fn`` of the ``retrieval`` study type: [`retrieval_jobs`][headcount.experiments.studies.retrieval.plan.retrieval_jobs] without a prefix.

    >>> len(expand(RetrievalConfig(study="retrieval")))    # 12 scores, 2 pooled, stability, 2 ablations, 10 budgets x 2
    37
    """
    return retrieval_jobs(config)
