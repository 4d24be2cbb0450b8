"""The transfer study's job graph: settings -> jobs (pure: nothing is read or run here).

Job names (``<t>`` a task id, ``<s>`` a seed, ``<c>`` the masked-LM text source, ``<p>`` a
pruning level) are made by [`Names`][headcount.experiments.studies.transfer.plan.Names], which the report uses to find the results again.
A job's params are exactly what its job function validates ([`params`][headcount.experiments.studies.transfer.params], ``*Params``); their
JSON is part of the job's key, so these dicts are kept as they are: changing one re-runs the job.
"""

from __future__ import annotations

from headcount.experiments.runner import Job
from headcount.experiments.studies.extra_eval import extra_eval_jobs, extra_splits
from headcount.experiments.studies.transfer.config import TransferConfig, TransferSettings, task_id, task_name

JOBS = "headcount.experiments.studies.transfer.jobs"
SHARED_JOBS = "headcount.experiments.studies.jobs"

#: the comparisons of the coherence table, in the order the report shows them
COMPARISONS = {
    "mlm-vs-task": "MLM (pre-trained) vs task (fine-tuned)",
    "mlm-vs-task-before": "MLM (pre-trained) vs task (pre-trained encoder, fitted head)",
    "task-before-vs-after": "task: pre-trained encoder vs fine-tuned",
    "mlm-before-vs-after": "MLM: pre-trained vs fine-tuned encoder",
    "task-vs-task": "task vs task (fine-tuned, same seed)",
    "seed-vs-seed": "same task, two fine-tuning seeds",
    "mlm-vs-mlm": "MLM on one task's texts vs another's",
    # with ``objectives: [mlm, embedding]``: the second pre-training objective beside MLM
    "embedding-vs-task": "embedding (pre-trained) vs task (fine-tuned)",
    "embedding-vs-task-before": "embedding (pre-trained) vs task (pre-trained encoder, fitted head)",
    "mlm-vs-embedding": "MLM vs embedding (pre-trained, same texts)",
}


def _level(x: float) -> str:
    return f"{x:g}"


class Names:
    """Job names of a transfer part under a prefix (shared by [`transfer_jobs`][headcount.experiments.studies.transfer.plan.transfer_jobs] and the report).

    >>> Names("demo/").finetune("movies", 1)
    'demo/finetune/movies/seed1'
    """

    @staticmethod
    def extra(name: str, label: str) -> str:
        """The evaluation of job ``name``'s model on the extra dev set ``label`` (MNLI mismatched)."""
        from headcount.experiments.studies.extra_eval import extra_job_name

        return extra_job_name(name, label)

    def __init__(self, prefix: str = ""):
        self.prefix = prefix

    def __call__(self, *parts) -> str:
        return self.prefix + "/".join(str(p) for p in parts)

    def layout(self):
        return self("layout")

    def mlm_pre(self, corpus):
        return self("mlm-scores", corpus)

    def embedding_pre(self, corpus):
        return self("embedding-scores", corpus)

    def finetune(self, t, s):
        return self("finetune", t, f"seed{s}")

    def head_fit(self, t, s):
        return self("head-fit", t, f"seed{s}")

    def task_after(self, t, s):
        return self("task-scores", t, f"seed{s}", "fine-tuned")

    def task_before(self, t, s):
        return self("task-scores", t, f"seed{s}", "pre-trained")

    def mlm_after(self, t, s):
        return self("mlm-scores", t, f"seed{s}", "fine-tuned")

    def curve(self, t, s):
        return self("curve", t, f"seed{s}")

    def mlm_curve(self, t):
        return self("curve", t, "mlm")

    def embedding_curve(self, t):
        return self("curve", t, "embedding")

    def mask(self, corpus, order, level):
        return self("mask", corpus, f"{order}-{_level(level)}") if order == "mlm" else self("mask", f"random-{_level(level)}")

    def pruned_finetune(self, t, s, order, level):
        return self("prune-then-finetune", t, f"seed{s}", f"{order}-{_level(level)}")

    def coherence(self):
        return self("coherence")


def plan_of(settings: TransferSettings) -> dict:
    """What the jobs and the report both derive from a config: ids, corpora, levels, seeds.

    >>> plan_of(TransferSettings(tasks=["offline/movies"]))["corpus_of"]
    {'movies': 'movies'}
    """
    tasks = {task_id(t): task_name(t) for t in settings.tasks}
    ids = list(tasks)
    corpus_of = {t: ("corpus" if settings.mlm.corpus else t) for t in ids}
    corpora = {"corpus": settings.mlm.corpus} if settings.mlm.corpus else dict(tasks)
    ba = settings.before_after
    ba_seeds = list(ba.seeds if ba.seeds is not None else settings.seeds) if ba.enabled else []
    ba_levels = list(ba.levels) if ba.enabled else []
    curve_levels = sorted(set(settings.pruning.levels) | set(ba_levels))
    head_corpus = settings.mlm.head_corpus or settings.mlm.corpus or tasks[ids[0]]
    return {"tasks": tasks, "ids": ids, "seeds": list(settings.seeds), "corpus_of": corpus_of, "corpora": corpora,
            "embedding": "embedding" in settings.objectives, "ba_seeds": ba_seeds, "ba_levels": ba_levels, "curve_levels": curve_levels, "head_corpus": head_corpus}


def _pairs(p: dict) -> list[dict]:
    """The comparisons across tasks, seeds and MLM text sources (the per-task ones are made in the loop)."""
    pairs = []
    ids, seeds = p["ids"], p["seeds"]
    for seed in seeds:
        for i, t1 in enumerate(ids):
            for t2 in ids[i + 1:]:
                pairs.append({"name": f"task-vs-task/{t1}/{t2}/{seed}", "comparison": "task-vs-task", "task": t1,
                              "task_b": t2, "seed": seed, "seed_b": seed, "a": f"ft.{t1}.{seed}", "b": f"ft.{t2}.{seed}",
                              "paired": False})
    for t in ids:
        for i, s1 in enumerate(seeds):
            for s2 in seeds[i + 1:]:
                pairs.append({"name": f"seed-vs-seed/{t}/{s1}/{s2}", "comparison": "seed-vs-seed", "task": t,
                              "task_b": t, "seed": s1, "seed_b": s2, "a": f"ft.{t}.{s1}", "b": f"ft.{t}.{s2}",
                              "paired": True})
    corpora = list(p["corpora"])
    for i, c1 in enumerate(corpora):
        for c2 in corpora[i + 1:]:
            pairs.append({"name": f"mlm-vs-mlm/{c1}/{c2}", "comparison": "mlm-vs-mlm", "task": c1, "task_b": c2,
                          "seed": None, "seed_b": None, "a": f"mlm.{c1}", "b": f"mlm.{c2}", "paired": False})
    return pairs


def transfer_jobs(settings: TransferSettings, prefix: str = "") -> list[Job]:
    """The jobs of a transfer part (see the package docstring), named under ``prefix``.

    Args:
        settings: a [`TransferSettings`][headcount.experiments.studies.transfer.config.TransferSettings] (or the whole [`TransferConfig`][headcount.experiments.studies.transfer.config.TransferConfig]).
        prefix: prepended to every job name (``"transfer/"`` inside another study).

    Returns:
        The jobs (upstream jobs are reached through ``deps``).

    >>> jobs = transfer_jobs(TransferSettings(tasks=["offline/movies"]), prefix="t/")
    >>> sorted({j.name.split("/")[1] for j in jobs})[:3]
    ['coherence', 'curve', 'finetune']
    """
    s = settings
    n = Names(prefix)
    p = plan_of(s)
    train = s.train.values()
    head_train = {**train, **s.head_fit.values()}
    data = s.scoring.data.model_dump()
    tc = s.train.config()  # the task curves evaluate as fine-tuning does
    task_eval = {"max_examples": tc.max_eval_examples, "batch_size": tc.eval_batch_size,
                 "max_length": tc.max_length, "seed": tc.data_seed}
    mlm_head = {"corpus": p["head_corpus"], "steps": s.mlm.head_steps, "max_texts": s.mlm.head_max_texts, "seed": 0,
                "after": s.mlm.after_head}
    method = s.scoring.method
    views = list(s.pruning.views)
    lm = {"objective": "lm"} if s.pretrain == "lm" else {}  # a decoder's next-token loss in MLM's place

    layout = Job(n.layout(), "transfer-layout", f"{JOBS}:layout_job", {"model": s.model})
    mlm_pre = {c: Job(n.mlm_pre(c), "transfer-mlm-score", f"{JOBS}:mlm_score_job",
                      {"model": s.model, "task": name, "data": data, "method": method, "mlm_head": mlm_head, **lm},
                      uses_model=True)
               for c, name in p["corpora"].items()}
    jobs: list[Job] = [layout, *mlm_pre.values()]
    grids: dict[str, dict] = {}
    inputs: dict[str, Job] = {"layout": layout}
    for c, job in mlm_pre.items():
        alias = f"mlm.{c}"
        inputs[alias] = job
        grids[alias] = {"kind": "mlm-pre-trained", "task": c, "seed": None}
    # the embedding objective (SimCSE, unsupervised) on the MLM texts: the same examples and ids
    emb_pre = {c: Job(n.embedding_pre(c), "score", f"{SHARED_JOBS}:score_job",
                      {"model": s.model, "task": name, "objective": "embedding", "method": method, "normalize": "none",
                       "data": data}, uses_model=True)
               for c, name in p["corpora"].items()} if p["embedding"] else {}
    jobs += emb_pre.values()
    pairs: list[dict] = []
    for c, job in emb_pre.items():
        inputs[f"emb.{c}"] = job
        grids[f"emb.{c}"] = {"kind": "embedding-pre-trained", "task": c, "seed": None}
        pairs.append({"name": f"mlm-vs-embedding/{c}", "comparison": "mlm-vs-embedding", "task": c, "task_b": None,
                      "seed": None, "seed_b": None, "a": f"mlm.{c}", "b": f"emb.{c}", "paired": True})

    ft: dict[tuple, Job] = {}
    after: dict[tuple, Job] = {}
    for t in p["ids"]:
        name, corpus = p["tasks"][t], p["corpus_of"][t]
        extra = extra_splits(name)  # {label: split}: further dev sets the final models are evaluated on
        for seed in p["seeds"]:
            ft[t, seed] = Job(n.finetune(t, seed), "finetune", f"{SHARED_JOBS}:finetune_job",
                              {"model": s.model, "task": name, "seed": seed, "train": train}, uses_model=True)
            jobs += extra_eval_jobs(name, task_eval, ft[t, seed], splits=extra)
            after[t, seed] = Job(n.task_after(t, seed), "score", f"{SHARED_JOBS}:score_job",
                                 {"task": name, "objective": "task", "method": method, "normalize": "none", "data": data},
                                 deps={"model": ft[t, seed]}, uses_model=True)
            head = Job(n.head_fit(t, seed), "transfer-head-fit", f"{JOBS}:head_fit_job",
                       {"model": s.model, "task": name, "seed": seed, "train": head_train}, uses_model=True)
            before = Job(n.task_before(t, seed), "score", f"{SHARED_JOBS}:score_job",
                         {"task": name, "objective": "task", "method": method, "normalize": "none", "data": data},
                         deps={"model": head}, uses_model=True)
            mlm_after = Job(n.mlm_after(t, seed), "transfer-mlm-score", f"{JOBS}:mlm_score_job",
                            {"model": s.model, "task": p["corpora"][corpus], "data": data, "method": method,
                             "mlm_head": mlm_head, **lm}, deps={"encoder": ft[t, seed]}, uses_model=True)
            orders = {"mlm": {"pre-trained": "mlm"}, "task": {str(seed): "task"}}
            deps = {"model": ft[t, seed], "layout": layout, "mlm": mlm_pre[corpus], "task": after[t, seed]}
            if emb_pre:  # heads ranked by embedding importance too
                orders["embedding"] = {"pre-trained": "embedding"}
                deps["embedding"] = emb_pre[corpus]
            curve = Job(n.curve(t, seed), "transfer-curve", f"{JOBS}:curve_job",
                        {"objective": "task", "task": name, "eval": task_eval, "levels": p["curve_levels"],
                         "normalize": s.pruning.normalize, "views": views, "orders": orders,
                         "random_draws": s.pruning.random_draws, "random_seed": seed},
                        deps=deps, uses_model=True)
            jobs += [ft[t, seed], after[t, seed], head, before, mlm_after, curve]
            for alias, job, kind in ((f"ft.{t}.{seed}", after[t, seed], "task-fine-tuned"),
                                     (f"pre.{t}.{seed}", before, "task-pre-trained"),
                                     (f"mlmft.{t}.{seed}", mlm_after, "mlm-fine-tuned")):
                inputs[alias] = job
                grids[alias] = {"kind": kind, "task": t, "seed": seed}
            base = {"task": t, "seed": seed, "task_b": None, "seed_b": None}
            own = not s.mlm.corpus  # MLM importance on the task's own scoring examples: paired by example id
            pairs += [
                {**base, "name": f"mlm-vs-task/{t}/{seed}", "comparison": "mlm-vs-task", "a": f"mlm.{corpus}",
                 "b": f"ft.{t}.{seed}", "paired": own},
                {**base, "name": f"mlm-vs-task-before/{t}/{seed}", "comparison": "mlm-vs-task-before",
                 "a": f"mlm.{corpus}", "b": f"pre.{t}.{seed}", "paired": own},
                {**base, "name": f"task-before-vs-after/{t}/{seed}", "comparison": "task-before-vs-after",
                 "a": f"pre.{t}.{seed}", "b": f"ft.{t}.{seed}", "paired": True},
                {**base, "name": f"mlm-before-vs-after/{t}/{seed}", "comparison": "mlm-before-vs-after",
                 "a": f"mlm.{corpus}", "b": f"mlmft.{t}.{seed}", "paired": True},
            ]
            if emb_pre:  # paired by example id like MLM's (the same texts; rows: see docs/transfer.md)
                pairs += [
                    {**base, "name": f"embedding-vs-task/{t}/{seed}", "comparison": "embedding-vs-task",
                     "a": f"emb.{corpus}", "b": f"ft.{t}.{seed}", "paired": own},
                    {**base, "name": f"embedding-vs-task-before/{t}/{seed}", "comparison": "embedding-vs-task-before",
                     "a": f"emb.{corpus}", "b": f"pre.{t}.{seed}", "paired": own},
                ]
        # MLM prunability of the pre-trained model on this task's MLM texts
        jobs.append(Job(n.mlm_curve(t), "transfer-curve", f"{JOBS}:curve_job",
                        {"objective": s.pretrain, "task": p["corpora"][corpus], "model": s.model, "mlm_head": mlm_head,
                         "eval": s.mlm.eval.model_dump(), "levels": p["curve_levels"], "normalize": s.pruning.normalize,
                         "views": views, "orders": {"mlm": {"pre-trained": "mlm"},
                                                    "task": {str(seed): f"task.{seed}" for seed in p["seeds"]}},
                         "random_draws": s.pruning.random_draws, "random_seed": 0},
                        deps={"layout": layout, "mlm": mlm_pre[corpus],
                              **{f"task.{seed}": after[t, seed] for seed in p["seeds"]}}, uses_model=True))
        if emb_pre:  # the pre-trained encoder's similarity structure as heads go, by each order
            jobs.append(Job(n.embedding_curve(t), "transfer-curve", f"{JOBS}:curve_job",
                            {"objective": "embedding", "task": p["corpora"][corpus], "model": s.model,
                             "eval": s.mlm.eval.model_dump(), "levels": p["curve_levels"],
                             "normalize": s.pruning.normalize, "views": views,
                             "orders": {"mlm": {"pre-trained": "mlm"}, "embedding": {"pre-trained": "embedding"},
                                        "task": {str(seed): f"task.{seed}" for seed in p["seeds"]}},
                             "random_draws": s.pruning.random_draws, "random_seed": 0},
                            deps={"layout": layout, "mlm": mlm_pre[corpus], "embedding": emb_pre[corpus],
                                  **{f"task.{seed}": after[t, seed] for seed in p["seeds"]}}, uses_model=True))
        # before vs after: prune the pre-trained model, then fine-tune
        for level in p["ba_levels"]:
            orders = {"mlm": Job(n.mask(corpus, "mlm", level), "transfer-mask", f"{JOBS}:mask_job",
                                 {"level": level, "order": "scores", "view": s.before_after.view,
                                  "normalize": s.pruning.normalize}, deps={"layout": layout, "scores": mlm_pre[corpus]})}
            if s.before_after.random_control:
                orders["random"] = Job(n.mask(corpus, "random", level), "transfer-mask", f"{JOBS}:mask_job",
                                       {"level": level, "order": "random", "view": s.before_after.view,
                                        "normalize": s.pruning.normalize, "seed": 0}, deps={"layout": layout})
            for order, mask in orders.items():
                for seed in p["ba_seeds"]:
                    pruned = Job(n.pruned_finetune(t, seed, order, level), "finetune", f"{SHARED_JOBS}:finetune_job",
                                 {"model": s.model, "task": name, "seed": seed, "train": train,
                                  "mask_mode": s.before_after.mask_mode}, deps={"mask": mask}, uses_model=True)
                    jobs += [pruned, *extra_eval_jobs(name, task_eval, pruned, splits=extra)]
    pairs += _pairs(p)
    jobs.append(Job(n.coherence(), "transfer-coherence", f"{JOBS}:coherence_job",
                    {"pairs": pairs, "grids": grids, "stats": s.stats.model_dump(mode="json"), "views": views,
                     "p_rule": "twice-smaller-tail"},
                    deps=inputs))
    return jobs


def expand(config: TransferConfig) -> list[Job]:
    """``expand_fn`` of the ``transfer`` study type: [`transfer_jobs`][headcount.experiments.studies.transfer.plan.transfer_jobs] without a prefix.

    >>> len(expand(TransferConfig(study="transfer", tasks=["offline/movies"]))) > 5
    True
    """
    return transfer_jobs(config)
