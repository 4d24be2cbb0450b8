"""Studies as resumable graphs of jobs: keys, a results store, local and Ray executors.

A study type registers a config model, an ``expand_fn`` (config -> jobs) and a ``report_fn``;
``run_study`` runs the jobs that have not finished into a run directory and calls the report
function it is given ([`headcount.experiments.run_study`][headcount.experiments.run_study] gives it ``headcount.experiments.report.build_report``).
See ``headcount.experiments.runner.jobs`` for the job function signature.
"""

from headcount.experiments.runner.config import (
    ConfigSection,
    LoadedConfig,
    StudyConfig,
    load_study_config,
    parse_study_config,
)
from headcount.experiments.runner.execution import Executor
from headcount.experiments.runner.executors import make_executor
from headcount.experiments.runner.jobs import (
    Job,
    JobResult,
    Plan,
    Resources,
    canonical_json,
    headcount_version,
    no_progress,
    resolve_function,
)
from headcount.experiments.runner.local import LocalExecutor
from headcount.experiments.runner.ray_executor import RayExecutor
from headcount.experiments.runner.registry import (
    StudyType,
    get_study_type,
    register_report,
    register_study,
    study_types,
)
from headcount.experiments.runner.store import RunStore
from headcount.experiments.runner.study import JobsFailed, RunSummary, run_study, versions

__all__ = [
    "ConfigSection",
    "Executor",
    "Job",
    "JobResult",
    "JobsFailed",
    "LoadedConfig",
    "LocalExecutor",
    "Plan",
    "RayExecutor",
    "Resources",
    "RunStore",
    "RunSummary",
    "StudyConfig",
    "StudyType",
    "canonical_json",
    "get_study_type",
    "headcount_version",
    "load_study_config",
    "make_executor",
    "no_progress",
    "parse_study_config",
    "register_report",
    "register_study",
    "resolve_function",
    "run_study",
    "study_types",
    "versions",
]
