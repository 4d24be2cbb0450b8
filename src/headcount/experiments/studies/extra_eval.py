"""Extra dev sets (MNLI mismatched): every final model of a study evaluated on them too.

A task may declare further evaluation splits besides the one it is tuned and pruned on
([`headcount.data.tasks.Task.extra_eval_splits`][headcount.data.tasks.Task.extra_eval_splits], ``{label: split}``; ``glue/mnli``:
``{"mm": "validation_mismatched"}``). The studies then add, for each final model (a fine-tuned,
retrained or pruned one) and each extra split, one evaluation job ([`extra_eval_jobs`][headcount.experiments.studies.extra_eval.extra_eval_jobs]) of
the same model directory (and mask) on that split, with the same dev subset settings, and
report its score beside the matched one as the task ``<name>-<label>`` ([`reported_name`][headcount.experiments.studies.extra_eval.reported_name]).
Tasks without extra splits get no extra job: their job names and keys are unchanged.
"""

from __future__ import annotations

from headcount.data.tasks import get_task
from headcount.experiments.runner import Job

#: the shared evaluation job (same function and kind as every other evaluation)
EVALUATE_FN = "headcount.experiments.studies.jobs:evaluate_job"


def extra_splits(task: str) -> dict[str, str]:
    """``{label: split}`` of the extra dev sets of a task reference (empty for most tasks).

    >>> extra_splits("offline/movies")
    {}
    """
    return dict(get_task(task).extra_eval_splits)


def reported_name(name: str, label: str, taken=()) -> str:
    """How a task's score on an extra split is reported: ``<name>-<label>`` (``glue/mnli-mm``);
    ``<name> (<label>)`` when a task of the study already has that name.

    >>> reported_name("glue/mnli", "mm"), reported_name("glue/mnli", "mm", taken=["glue/mnli-mm"])
    ('glue/mnli-mm', 'glue/mnli (mm)')
    """
    out = f"{name}-{label}"
    return f"{name} ({label})" if out in set(taken) else out


def extra_job_name(name: str, label: str) -> str:
    """The name of the extra evaluation of the job ``name``: ``<name>/eval-<label>``.

    >>> extra_job_name("finetune/glue/mnli/seed1", "mm")
    'finetune/glue/mnli/seed1/eval-mm'
    """
    return f"{name}/eval-{label}"


def extra_eval_jobs(task: str, data: dict, model: Job, mask: Job | None = None, name: str | None = None,
                    splits: dict[str, str] | None = None) -> list[Job]:
    """One evaluation job per extra split of ``task``: the ``model`` job's ``model/`` directory
    (with the ``mask`` job's ``mask.json`` as gates, when given) on that split.

    Args:
        task: the task reference (as the model's own jobs have it).
        data: the dev subset settings ([`DataConfig`][headcount.importance.pipeline.DataConfig] fields) of the
            matched evaluation, so that both numbers come from subsets drawn alike.
        model: the job whose checkpoint is evaluated.
        mask: a job whose ``mask.json`` is applied (a pruned model without retraining).
        name: the job the evaluation stands beside (default ``model.name``); the extra job is
            named [`extra_job_name`][headcount.experiments.studies.extra_eval.extra_job_name] of it.
        splits: ``{label: split}`` (default [`extra_splits`][headcount.experiments.studies.extra_eval.extra_splits] of ``task``).

    Returns:
        The jobs, none for a task without extra splits.
    """
    splits = extra_splits(task) if splits is None else splits
    deps = {"model": model, **({"mask": mask} if mask is not None else {})}
    return [Job(extra_job_name(name or model.name, label), "evaluate", EVALUATE_FN,
                {"task": task, "objective": "task", "split": split, "data": data}, deps=deps, uses_model=True)
            for label, split in splits.items()]
