"""The job graph of a lottery study: [`lottery_jobs`][headcount.experiments.studies.lottery.plan.lottery_jobs] (settings -> jobs), pure and cheap.

Job names (``{prefix}finetune/{task}/seed{s}``, ...) and parameters are what a run's store
keys results by: changing a parameter's name or value re-runs that job and everything after it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from headcount.data.tasks import get_task
from headcount.experiments.runner import Job
from headcount.experiments.studies.extra_eval import extra_eval_jobs, extra_splits
from headcount.experiments.studies.lottery.config import LotteryConfig, LotterySettings
from headcount.importance.scores import groups_by_length

#: Module of the lottery job functions and of the shared ones (fine-tune, prune, evaluate).
JOBS_HERE = "headcount.experiments.studies.lottery.jobs"
JOBS = "headcount.experiments.studies.jobs"


def task_name(task: str) -> str:
    """The registered name of a task (its YAML ``name`` for a file), used in job names.

    Builds the task to read it; not the same as the transfer study's
    [`headcount.experiments.studies.transfer.config.task_name`][headcount.experiments.studies.transfer.config.task_name], which returns the reference as written.

    >>> task_name("offline/movies")
    'offline/movies'
    """
    return get_task(task).name


#: the metric the reference's code scores a task by, where it is not the task's declared one:
#: ``find_head_mlp_masks.py`` and ``find_global_weight_mask.py`` use "acc" for every classification
#: task but CoLA (MCC), so accuracy for MRPC and QQP, whose GLUE-official metric (their YAMLs) is F1.
REFERENCE_METRIC: dict[str, str] = {"f1": "accuracy"}


def lottery_metric(task: str, choice: str = "reference") -> str:
    """The dev metric of a lottery study's stop rule and scores on ``task``.

    ``choice``: ``reference`` (the authors' code: accuracy where the task declares F1, i.e. MRPC
    and QQP; any other task's own metric) or ``task`` (the task's declared metric).

    >>> lottery_metric("glue/mrpc"), lottery_metric("glue/mrpc", "task"), lottery_metric("glue/cola")
    ('accuracy', 'f1', 'mcc')
    """
    declared = get_task(task).metric
    if choice == "task":
        return declared
    if choice != "reference":
        raise ValueError(f"unknown lottery metric {choice!r}; use 'reference' or 'task'")
    return REFERENCE_METRIC.get(declared, declared)


def metric_param(task: str, choice: str = "reference") -> dict:
    """``{"metric": m}`` for a job's params when the study scores ``task`` by a metric ``m`` that is
    not its declared one, else ``{}`` (so that every other job keeps its key).

    >>> metric_param("glue/qqp"), metric_param("offline/movies")
    ({'metric': 'accuracy'}, {})
    """
    m = lottery_metric(task, choice)
    return {} if m == get_task(task).metric else {"metric": m}


def _file_digest(path: str) -> str | None:
    p = Path(path)
    if not p.is_file():
        return None
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16]


def _train_params(s: LotterySettings) -> dict:
    return s.train.model_dump(mode="json")


def _eval_data(s: LotterySettings) -> dict:
    """The dev subset every evaluation uses: the one fine-tuning reports on."""
    return {"max_examples": s.train.max_eval_examples, "batch_size": s.train.eval_batch_size,
            "max_length": s.train.max_length, "seed": s.train.data_seed}


def _validation_split(task: str) -> str:
    return get_task(task).validation_split


def job_name(prefix: str, *parts) -> str:
    """The name of a lottery job: ``prefix`` + parts joined with ``/``.

    >>> job_name("lottery/", "prune", "offline/movies", "seed1")
    'lottery/prune/offline/movies/seed1'
    """
    return prefix + "/".join(str(p) for p in parts)


def lottery_jobs(settings: LotterySettings, prefix: str = "") -> list[Job]:
    """The jobs of a lottery study (or of the lottery part of another study).

    Names: ``{prefix}finetune/{task}/seed{s}``, ``{prefix}prune/...``, ``{prefix}good-pruned/...``,
    ``{prefix}subnetwork/{random|bad}/...``, ``{prefix}retrain/{good|random|bad}/...``,
    ``{prefix}magnitude/{good|random|bad}/...``, ``{prefix}patterns/...``,
    ``{prefix}subnetwork/{super|super-bad}/{task}``, ``{prefix}subnetwork/super-random/{task}/seed{s}``
    (the reference's middlings, drawn again for each retraining seed; ``super_survivors.random_draws:
    per-task``: ``{prefix}subnetwork/super-random/{task}``, one draw),
    ``{prefix}retrain/{super|super-random|super-bad}/{task}/seed{s}``,
    ``{prefix}stability/{task}``, ``{prefix}overlap``, ``{prefix}pattern-cnn``.
    A task with extra dev sets ([`extra_eval_splits`][headcount.data.tasks.Task.extra_eval_splits]: MNLI's
    mismatched one) adds ``<name>/eval-<label>`` evaluations of the full fine-tuning, the good
    pruned model and every retrained subnetwork ([`headcount.experiments.studies.extra_eval`][headcount.experiments.studies.extra_eval]); its
    retrained checkpoints are kept (they are evaluated again), so its retrain jobs' keys differ.
    Jobs that run a model are marked ``uses_model`` (a GPU under Ray).
    The full fine-tuning, pruning and evaluation are the shared jobs of
    [`headcount.experiments.studies.jobs`][headcount.experiments.studies.jobs] (same parameters, same keys: another study's identical
    fine-tuning is computed once).

    Args:
        settings: a [`LotterySettings`][headcount.experiments.studies.lottery.config.LotterySettings] (a [`LotteryConfig`][headcount.experiments.studies.lottery.config.LotteryConfig] is one).
        prefix: prepended to every job name (e.g. ``"lottery/"`` inside a demo study).

    Returns:
        The jobs (their dependencies are included by the plan).

    >>> jobs = lottery_jobs(LotterySettings(tasks=["offline/movies"], seeds=[1], magnitude={"enabled": False},
    ...                                     patterns={"enabled": False}, super_survivors={"enabled": False}))
    >>> sorted(j.kind for j in jobs)[:3]
    ['evaluate', 'finetune', 'lottery.retrain']
    """
    s = settings
    train = _train_params(s)
    eval_data = _eval_data(s)
    jobs: list[Job] = []
    prunes: dict[tuple[int, int], Job] = {}
    cnn = None
    if s.patterns.enabled and s.patterns.cnn is not None:
        c = s.patterns.cnn
        cnn = Job(job_name(prefix, "pattern-cnn"), "lottery.pattern-cnn", f"{JOBS_HERE}:pattern_cnn_job",
                  {**c.model_dump(mode="json"), "digests": [_file_digest(c.maps), _file_digest(c.labels)]},
                  uses_model=True)
        jobs.append(cnn)
    for ti, task in enumerate(s.tasks):
        tname = task_name(task)
        val = _validation_split(task)
        extra = extra_splits(task)  # {label: split}: further dev sets every final model is evaluated on
        keep = s.keep_models or bool(extra)  # a retrained model evaluated again is kept for it
        scored = metric_param(task, s.metric)  # {"metric": "accuracy"} on MRPC/QQP by default, else {}
        for si, seed in enumerate(s.seeds):
            tag = f"seed{seed}"
            full = Job(job_name(prefix, "finetune", tname, tag), "finetune", f"{JOBS}:finetune_job",
                       {"model": s.model, "task": task, "seed": seed, "train": train, **scored}, uses_model=True)
            p = s.pruning
            imp_data = {**eval_data, "batch_size": p.batch_size}
            if p.max_examples is not None:
                imp_data["max_examples"] = p.max_examples
            prune_params = {
                "task": task, "objective": "task", "method": p.method, "normalize": p.normalize,
                "accumulate": p.accumulate,
                # resolved, so that the key says it: the dev set in file order for cumulative (the reference's)
                "batch_order": "length" if groups_by_length("auto", p.accumulate) else "file",
                "prune": {"threshold": p.threshold, "step": p.step, "step_of": p.step_of, "schedule": p.schedule,
                          "max_steps": p.max_steps, "shrink": p.shrink,
                          # stated only when not the default, so that earlier runs keep their job keys
                          **({"unit": p.unit} if p.unit != "heads" else {})},
                "data": imp_data, "eval_data": eval_data,
                "importance_split": val if p.importance == "validation" else None, "stop_split": val,
                **scored,
            }
            prune = Job(job_name(prefix, "prune", tname, tag), "prune", f"{JOBS}:prune_job", prune_params,
                        deps={"model": full}, uses_model=True)
            prunes[ti, si] = prune
            good_pruned = Job(job_name(prefix, "good-pruned", tname, tag), "evaluate", f"{JOBS}:evaluate_job",
                              {"task": task, "objective": "task", "split": val, "data": eval_data, **scored},
                              deps={"model": full, "mask": prune}, uses_model=True)
            jobs += [full, prune, good_pruned]
            jobs += extra_eval_jobs(task, eval_data, full, splits=extra)
            jobs += extra_eval_jobs(task, eval_data, full, mask=prune, name=good_pruned.name, splits=extra)
            subnets = {"good": prune}
            for kind in ("random", "bad"):
                subnets[kind] = Job(job_name(prefix, "subnetwork", kind, tname, tag), "lottery.subnetwork",
                                    f"{JOBS_HERE}:subnetwork_job",
                                    {"kind": kind, "seed": seed, **({"mode": s.random} if kind == "random" else {})},
                                    deps={"good": prune})
            for kind, mask_job in subnets.items():
                retrain = Job(job_name(prefix, "retrain", kind, tname, tag), "lottery.retrain", f"{JOBS_HERE}:retrain_job",
                              {"model": s.model, "task": task, "seed": seed, "train": train, "mask_mode": "prune",
                               "keep_model": keep, **scored},
                              deps={"mask": mask_job}, uses_model=True)
                jobs += [retrain, *extra_eval_jobs(task, eval_data, retrain, splits=extra)]
            if s.magnitude.enabled:
                m = s.magnitude
                # every setting the procedure reads, resolved (IMP does not read at_cap)
                mag = m.model_dump(mode="json", exclude={"enabled", *(("at_cap",) if m.procedure == "imp" else ())})
                base = {"model": s.model, "task": task, "seed": seed, "train": train, "magnitude": mag,
                        "keep_models": s.keep_models, **scored}
                good = Job(job_name(prefix, "magnitude", "good", tname, tag), "lottery.magnitude",
                           f"{JOBS_HERE}:magnitude_job", {**base, "control": "good"}, deps={"full": full},
                           uses_model=True)
                jobs.append(good)
                for kind in ("random", "bad"):
                    jobs.append(Job(job_name(prefix, "magnitude", kind, tname, tag), "lottery.magnitude",
                                    f"{JOBS_HERE}:magnitude_job", {**base, "control": kind}, deps={"match": good},
                                    uses_model=True))
            if s.patterns.enabled:
                pt = s.patterns
                jobs.append(Job(job_name(prefix, "patterns", tname, tag), "lottery.patterns", f"{JOBS_HERE}:patterns_job",
                                {"task": task, "split": val, "size": pt.size,
                                 "data": {"max_examples": pt.max_examples, "batch_size": pt.batch_size,
                                          "max_length": pt.max_length or s.train.max_length,
                                          "seed": s.train.data_seed}},
                                deps={"model": full, **({"cnn": cnn} if cnn is not None else {})}, uses_model=True))
        if s.super_survivors.enabled:
            goods = {f"s{si}": prunes[ti, si] for si in range(len(s.seeds))}
            jobs.append(Job(job_name(prefix, "stability", tname), "lottery.stability", f"{JOBS_HERE}:stability_job", {},
                            deps=goods))
            sup = Job(job_name(prefix, "subnetwork", "super", tname), "lottery.subnetwork", f"{JOBS_HERE}:subnetwork_job",
                      {"kind": "super"}, deps=goods)
            masks = {"super": sup}
            # reference: the authors' rule reads every seed's good mask (always pruned, middlings);
            # as-good-mask: the super mask's controls as a good mask's, with the params and keys of before
            reference = s.super_survivors.controls == "reference"
            for kind in ("random", "bad"):
                masks[f"super-{kind}"] = Job(
                    job_name(prefix, "subnetwork", f"super-{kind}", tname), "lottery.subnetwork",
                    f"{JOBS_HERE}:subnetwork_job",
                    {"kind": kind, "seed": s.super_survivors.draw_seed, **({"mode": "uniform"} if kind == "random" else {}),
                     **({"controls": "reference"} if reference else {})},
                    deps=goods if reference else {"good": sup})
            retrain_seeds = s.super_survivors.seeds or s.seeds
            per_seed: dict[int, Job] = {}  # the reference's middlings, drawn again for every retraining seed
            if reference and s.super_survivors.random_draws == "per-seed":
                base = masks.pop("super-random")
                per_seed = {seed: Job(job_name(prefix, "subnetwork", "super-random", tname, f"seed{seed}"),
                                      "lottery.subnetwork", f"{JOBS_HERE}:subnetwork_job",
                                      {**base.params, "draw": seed}, deps=goods) for seed in retrain_seeds}
                jobs += list(per_seed.values())
            jobs += list(masks.values())
            if s.super_survivors.retrain:
                for seed in retrain_seeds:
                    seed_masks = {**masks, **({"super-random": per_seed[seed]} if per_seed else {})}
                    for kind in ("super", "super-random", "super-bad"):
                        mask_job = seed_masks[kind]
                        retrain = Job(job_name(prefix, "retrain", kind, tname, f"seed{seed}"), "lottery.retrain",
                                      f"{JOBS_HERE}:retrain_job",
                                      {"model": s.model, "task": task, "seed": seed, "train": train,
                                       "mask_mode": "prune", "keep_model": keep, **scored},
                                      deps={"mask": mask_job}, uses_model=True)
                        jobs += [retrain, *extra_eval_jobs(task, eval_data, retrain, splits=extra)]
    if len(s.tasks) > 1:
        deps = {f"t{ti}-s{si}": j for (ti, si), j in prunes.items()}
        jobs.append(Job(job_name(prefix, "overlap"), "lottery.overlap", f"{JOBS_HERE}:overlap_job",
                        {"tasks": [task_name(t) for t in s.tasks], "seeds": list(s.seeds)}, deps=deps))
    return jobs


def expand(config: LotteryConfig) -> list[Job]:
    """``expand_fn`` of the ``lottery`` study type: [`lottery_jobs`][headcount.experiments.studies.lottery.plan.lottery_jobs] without a prefix.

    >>> len(expand(LotteryConfig(study="lottery", tasks=["offline/movies"], seeds=[1, 2]))) > 10
    True
    """
    return lottery_jobs(config)
