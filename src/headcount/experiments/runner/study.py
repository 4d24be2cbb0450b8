"""Run a study's jobs: config -> plan of jobs -> run directory (resumable).

``run_study`` runs the jobs; the page is drawn by the ``report`` function it is given, called
once every job has finished (the runner does not know how reports look: ``headcount.experiments.report``
builds on the runner, not the other way round). [`headcount.experiments.run_study`][headcount.experiments.run_study] is the two
together, what ``headcount study CONFIG.yaml --out RUN`` calls. Running it again with the
same config continues where it stopped: finished jobs (``RUN/jobs/<key>/DONE``) are reused, the
temporary directories of jobs that were interrupted are removed, and the rest runs.

A run directory belongs to one config (``manifest.json`` holds its hash). With another config
the run is refused, unless ``force=True``: then the old ``study.yaml``, ``manifest.json``,
``plan.json`` and report move to ``RUN/history/<n>-<old hash>/``, the new config takes the
directory over, and every finished job is kept in ``jobs/``: those whose key the new config
still produces are reused, the others stay on disk untouched (nothing is deleted).
"""

from __future__ import annotations

import os
import platform
import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from headcount.experiments.runner.config import LoadedConfig, StudyConfig, config_hash, load_study_config
from headcount.experiments.runner.execution import Executor
from headcount.experiments.runner.executors import make_executor
from headcount.experiments.runner.jobs import Plan, headcount_version, resolve_function
from headcount.experiments.runner.progress import Reporter
from headcount.experiments.runner.registry import get_study_type
from headcount.experiments.runner.store import (
    CONFIG,
    FORMAT,
    MANIFEST,
    PLAN,
    RunStore,
    check_run_dir,
    is_report_file,
    utcnow,
)
from headcount.runtime.atomic import atomic_write_json, atomic_write_text
from headcount.runtime.errors import HeadcountError
from headcount.runtime.lock import lock_holder

#: what draws a finished run's report: ``(run_dir, *, loaded, store) -> path of the page``
ReportFn = Callable[..., "Path | None"]


class JobsFailed(HeadcountError):
    """Some jobs raised; their tracebacks are in ``RUN/logs/``. Finished jobs are kept."""


def versions() -> dict[str, str]:
    """Versions of Python, the platform and the packages results depend on (without importing them).

    >>> "python" in versions() and "headcount" in versions()
    True
    """
    out = {"python": platform.python_version(), "platform": platform.platform(terse=True)}
    for pkg in ("headcount", "torch", "transformers", "numpy", "pandas", "scipy", "matplotlib", "pydantic", "ray"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "-"
    return out


@dataclass
class RunSummary:
    """What [`run_study`][headcount.experiments.runner.study.run_study] did.

    Attributes:
        run_dir: the run directory.
        jobs: number of jobs in the plan.
        reused: jobs already finished before this call.
        ran: names of the jobs run now.
        failed: ``{name: one-line reason}``.
        skipped: jobs not run because an input failed.
        report: path of ``report.html`` (None when not written).
        cleaned: temporary directories of interrupted jobs removed.
    """

    run_dir: Path
    jobs: int
    reused: int
    ran: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    report: Path | None = None
    cleaned: int = 0
    seconds: float = 0.0  # wall time of this call: the jobs run now and the report


def _coerce_config(config) -> LoadedConfig:
    if isinstance(config, LoadedConfig):
        return config
    if isinstance(config, StudyConfig):
        st = get_study_type(config.study)
        text = yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
        return LoadedConfig(st, config, text, None, config_hash(config))
    return load_study_config(config)


def _check_out_dir(out: Path) -> None:
    """Refuse a folder that is not a run directory before anything connects or is touched.

    (Checked again under the lock by [`RunStore.lock`][headcount.experiments.runner.store.RunStore.lock].) This check takes no
    lock, so it may see another study that has just begun there (its record half-written): a
    folder whose lock another process holds is refused as in use, not as someone else's folder.
    """
    try:
        check_run_dir(out)
    except HeadcountError:
        holder = lock_holder(out)
        if holder is not None:
            raise HeadcountError(f"{out} is in use by another headcount process ({holder})") from None
        raise


def _archive(store: RunStore, old: dict) -> Path:
    """Move the old config, plan and report into ``history/`` (results in jobs/ stay).

    Only what the run directory's record lists as headcount's moves: a file the user put under
    ``results/`` or ``figures/`` stays where it is.
    """
    rec = store.record
    hist = store.root / "history"
    hist.mkdir(exist_ok=True)
    n = 1 + sum(1 for _ in hist.iterdir())
    dest = hist / f"{n:03d}-{old.get('config_hash', 'unknown')}"
    dest.mkdir()
    report_files = [k for k in rec.files if is_report_file(k)]
    # only files the record lists and nobody changed since move (RunStore.lock refused an edited
    # study.yaml, plan.json or manifest.json before anything was written); they stay listed, in history/
    for name in (CONFIG, PLAN, *sorted(report_files)):
        src = store.root / name
        if src.is_file() and not src.is_symlink() and rec.owns(name):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest / name)
            if name in report_files:
                rec.forget(name)
            else:
                rec.claim([name], rewrite=True)  # the new config's, written next
            rec.claim([f"history/{dest.name}/{name}"])
    shutil.copy2(store.root / MANIFEST, dest / MANIFEST)  # replaced atomically by the caller
    rec.claim([f"history/{dest.name}/{MANIFEST}"])
    rec.seal([k for k in rec.files if k.startswith(f"history/{dest.name}/")])
    rec.write()
    return dest


def _new_manifest(loaded: LoadedConfig, now: str, previous: str | None = None) -> dict:
    manifest = {"format": FORMAT, "study": loaded.config.study, "config_hash": loaded.hash,
                "config_file": str(loaded.path.resolve()) if loaded.path else None,
                "created": now, "created_with": headcount_version()}
    if previous:
        manifest["previous_config_hash"] = previous
    return manifest


def _fresh_estimate(exe: Executor, pending: list):
    """The fresh-run estimate's line for ``pending``, computed when the Reporter prints it: the matmul
    probe runs on the local executor's first device (the jobs' own); elsewhere (a Ray cluster's
    workers) this process's speed says nothing, so None."""
    if exe.name != "local":
        return None

    def line() -> str:
        from headcount.experiments.runner.estimate import plan_estimate
        from headcount.runtime.device import pool_devices

        return plan_estimate(pending, device=pool_devices(exe.device)[0])

    return line


def run_study(
    config,
    out: str | os.PathLike,
    *,
    executor: str | Executor = "local",
    address: str | None = None,
    force: bool = False,
    keep_going: bool = True,
    report: ReportFn | None = None,
    quiet: bool = False,
    console=None,
    device: str | None = None,
    precision: str | None = None,
    gpus_per_job: float | None = None,
) -> RunSummary:
    """Run (or resume) a study's jobs into a run directory, then call ``report`` when they all finished.

    Args:
        config: a YAML path, a validated config model, or a [`LoadedConfig`][headcount.experiments.runner.config.LoadedConfig].
        out: the run directory (created; reused when it holds this config).
        executor: ``"local"``, ``"ray"``, or an [`Executor`][headcount.experiments.runner.execution.Executor] instance.
        address: Ray cluster address (``host:port``, ``ray://host:port``, ``auto``); None starts a
            local Ray instance.
        force: take over a run directory made by another config (see the module docstring:
            nothing is deleted; the old config and report move to ``history/``).
        keep_going: after a job fails, still run the jobs that do not depend on it.
        report: called as ``report(run_dir, loaded=..., store=...)`` when every job has finished
            (e.g. ``headcount.experiments.report.build_report``); its return value (the page's path) is
            the summary's ``report``. None: no report.
        quiet: no progress display.
        console: a rich Console for the progress display (default: stderr).
        device: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``; default: the config's ``device:``
            (see ``headcount.runtime.device``); each job runs with ``HEADCOUNT_DEVICE`` set from it.
        precision: ``auto`` | ``fp32`` | ``bf16``; default: the config's ``precision:`` when it
            sets one (else ``$HEADCOUNT_PRECISION``, else auto); each job runs with
            ``HEADCOUNT_PRECISION`` set to it.
        gpus_per_job: the ray executor's ``RayExecutor(gpus_per_job=...)``: GPUs a job that runs a
            model asks for (0.5: two such jobs share a GPU); None: its default. Refused with the
            local executor, which runs one job per GPU.

    Returns:
        A [`RunSummary`][headcount.experiments.runner.study.RunSummary].

    Raises:
        HeadcountError: bad config, a run directory of another config (without ``force``), an
            unreachable Ray cluster; [`JobsFailed`][headcount.experiments.runner.study.JobsFailed] when jobs failed (the others are kept).

    >>> run_study("/nonexistent.yaml", "/tmp/never")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: cannot read /nonexistent.yaml: ...
    """
    t0 = time.perf_counter()
    if report and not callable(report):  # report=True of earlier versions: the caller must say how
        raise HeadcountError("run_study(report=...) takes a function such as headcount.experiments.report.build_report "
                             "(headcount.experiments.run_study draws the report itself)")
    loaded = _coerce_config(config)
    exe = make_executor(executor, address, **({} if gpus_per_job is None else {"gpus_per_job": gpus_per_job}))
    if device is None and "device" in getattr(loaded.config, "model_fields_set", ()):
        device = loaded.config.device  # else $HEADCOUNT_DEVICE, else auto
    exe.set_device(device)  # an unavailable device is refused before the run directory is touched
    if precision is None and "precision" in getattr(loaded.config, "model_fields_set", ()):
        precision = loaded.config.precision
    exe.set_precision(precision)
    jobs = loaded.study_type.expand(loaded.config)
    plan = Plan(list(jobs or []))
    for fn in sorted({j.fn for j in plan}):  # fail before touching the run directory
        resolve_function(fn)
    exe.check()

    out = Path(out)
    _check_out_dir(out)
    store = RunStore(out)
    # connect (Ray) and check the jobs against the cluster before touching the run directory (a
    # refused run writes nothing), and only when something is left to run
    left = [j for j in plan if not store.is_done(j.key)]
    exe.console = False if quiet else console  # what it says while it connects and checks (Ray): before any progress
    with exe.session(left) if left else nullcontext(), store:
        manifest_path = out / MANIFEST
        now = utcnow()
        replaced = None  # the manifest of another config that --force moves to history/
        if manifest_path.is_file():
            old = store.manifest  # a corrupt manifest is one error line, not a traceback
            if old.get("config_hash") != loaded.hash:
                if not force:
                    raise HeadcountError(
                        f"{out} holds a run of another config ({old.get('study', '?')}, config hash "
                        f"{old.get('config_hash')}; this one is {loaded.hash}): use another --out, or --force "
                        "to reuse its finished jobs (nothing is deleted)"
                    )
                replaced = old
                manifest = _new_manifest(loaded, now, previous=old.get("config_hash"))
            else:
                manifest = old
        else:
            manifest = _new_manifest(loaded, now)
        store.refuse_users_tmp()  # a user's file in a killed job's folder: refused while nothing is written
        store.begin()  # from here on the run writes: its outputs and session go into the record first
        if replaced is not None:
            _archive(store, replaced)
        manifest.update(last_run=now, headcount_version=headcount_version(), executor=exe.name,
                        versions=versions())
        atomic_write_json(manifest_path, manifest)
        store.sealed(MANIFEST)  # stamped now: a later edit of the user's is theirs
        if not (out / CONFIG).is_file():
            atomic_write_text(out / CONFIG, loaded.text)
            store.sealed(CONFIG)
        cleaned = store.clean_tmp()
        store.write_plan(plan)

        pending = [j for j in plan if not store.is_done(j.key)]
        store.clear_stale(j.key for j in pending)  # a jobs/<key>/ without DONE: headcount's files go, the user's refuse
        summary = RunSummary(out, len(plan), len(plan) - len(pending), cleaned=cleaned)
        timed = [(j.kind, store.load(j.key, j.name).meta.get("seconds", 0.0)) for j in plan
                 if store.is_done(j.key)]  # finished jobs of this run: the estimate of the rest
        with Reporter(len(pending), reused=summary.reused, quiet=quiet, console=console, pending=pending,
                      timed=timed, fresh=_fresh_estimate(exe, pending)) as reporter:
            if cleaned:
                reporter.print(f"[dim]removed {cleaned} unfinished job director{'y' if cleaned == 1 else 'ies'} "
                               "of an interrupted run[/dim]")
            outcome = exe.run(pending, store, reporter, keep_going=keep_going)
        summary.ran, summary.failed, summary.skipped = outcome.ran, outcome.failed, outcome.skipped

        if report and not store.missing():
            summary.report = report(out, loaded=loaded, store=store)
        summary.seconds = round(time.perf_counter() - t0, 1)
    if summary.failed:
        first, why = next(iter(summary.failed.items()))
        more = f" (and {len(summary.failed) - 1} more)" if len(summary.failed) > 1 else ""
        raise JobsFailed(
            f"job {first!r} failed: {why}{more}; {len(summary.ran)} ran, "
            f"{len(summary.skipped)} skipped; tracebacks in {out / 'logs'}; run the same command again to retry"
        )
    return summary
