"""``headcount report RUN_DIR``: redraw a run's report from its saved results."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from headcount.experiments.report.content import ReportContent, ReportTable, Section
from headcount.experiments.report.html import figure_png, render_html, tidy
from headcount.experiments.report.terminal import SUMMARY_FILE, summary_record
from headcount.runtime.atomic import atomic_write_bytes
from headcount.runtime.errors import HeadcountError


def _scalars(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, (int, float, str, bool)) or v is None:
            out[name] = v
        elif isinstance(v, dict) and not prefix:
            out.update(_scalars(v, prefix=f"{name}."))
    return out


def default_report(store, config) -> ReportContent:
    """The report of a study type without ``report_fn``: one table of scalar results per job kind.

    >>> default_report.__name__
    'default_report'
    """
    # lazy: pandas costs ~0.2 s to import, and headcount --help loads this module
    import pandas as pd

    by_kind: dict[str, list[dict]] = {}
    for r in store.results():
        by_kind.setdefault(r.kind, []).append({"job": r.name, **_scalars(r.result)})
    sections = [
        Section(kind, tables={f"results_{kind}": pd.DataFrame(rows)}, main=False)  # raw: not for the terminal
        for kind, rows in by_kind.items()
    ]
    return ReportContent(sections=sections)


def _versions_table(manifest: dict) -> ReportTable:
    # lazy: pandas and ..runner.study (which imports pandas) cost ~0.2-0.5 s; headcount --help loads this module
    import pandas as pd

    from headcount.experiments.runner.study import versions

    now = versions()
    then = manifest.get("versions", {})
    rows = [{"software": k, "results computed with": then.get(k, ""), "report drawn with": v} for k, v in now.items()]
    return ReportTable("versions", pd.DataFrame(rows), csv=False)


def build_report(run_dir: str | os.PathLike, *, loaded=None, store=None) -> Path:
    """Draw ``RUN/report.html``, ``RUN/results/*.csv`` and ``RUN/figures/*.png`` from saved results.

    The study type's ``report_fn(store, config)`` supplies the sections; the page adds the
    config, the jobs with their timings (also ``results/jobs.csv``) and the software versions.
    ``RUN/results/summary.json`` keeps the summary and the main tables as shown (cells as text),
    for the terminal ([`print_summary`][headcount.experiments.report.terminal.print_summary]).
    Each output is replaced atomically, and only when the run directory's record lists it as
    headcount's (a file the user added under ``results/`` stays); nothing under ``jobs/`` is touched.

    Args:
        run_dir: a run directory made by ``headcount study``.
        loaded: the validated config (read from ``RUN/study.yaml`` when omitted).
        store: the run's [`RunStore`][headcount.experiments.runner.store.RunStore] (opened when omitted).

    Returns:
        The path of ``report.html``.

    Raises:
        HeadcountError: not a run directory, or jobs of the plan have not finished.

    >>> build_report("/nonexistent")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: /nonexistent is not a headcount run directory...
    """
    # lazy: ..runner imports pandas and rich (~0.5 s), and headcount --help loads this module
    from headcount.experiments.runner.config import parse_study_config
    from headcount.experiments.runner.store import CONFIG, RunStore
    from headcount.runtime.lock import lock_holder

    run_dir = Path(run_dir)
    if not (run_dir / "manifest.json").is_file():
        holder = lock_holder(run_dir)  # a study that has just begun there has not written it yet
        if holder is not None:
            raise HeadcountError(f"{run_dir} is in use by another headcount process ({holder})")
        raise HeadcountError(f"{run_dir} is not a headcount run directory (no manifest.json)")
    store = store or RunStore(run_dir)
    manifest = store.manifest
    if loaded is None:
        base = Path(manifest["config_file"]).parent if manifest.get("config_file") else run_dir
        loaded = parse_study_config(store.config_text, where=str(run_dir / CONFIG), base_dir=base)
    missing = store.missing()
    if missing:
        raise HeadcountError(
            f"{len(missing)} of {len(store.plan['jobs'])} jobs have not finished (first: {missing[0]!r}); "
            f"finish the run with `headcount study {manifest.get('config_file') or CONFIG} --out {run_dir}`"
        )
    if "matplotlib.pyplot" not in sys.modules:
        import matplotlib  # lazy: ~0.2 s, and only a report draws; headcount --help loads this module

        matplotlib.use("Agg")
    st = loaded.study_type
    content = st.report(store, loaded.config) if st.report is not None else None
    if content is None:
        content = default_report(store, loaded.config)
    if not isinstance(content, ReportContent):
        raise HeadcountError(f"the report function of study type {st.name!r} must return a ReportContent "
                             f"(got {type(content).__name__})")
    if not content.title:
        content.title = loaded.config.name or f"{st.name} study"
    if not content.summary and loaded.config.description:
        content.summary = loaded.config.description

    pngs = {f.name: figure_png(f.source) for f in content.figures()}
    timings, per_node = _with_nodes(store, store.timings())
    jobs_table = ReportTable("jobs", timings, caption=f"{len(timings)} jobs, "
                             f"{timings['seconds'].fillna(0).sum():.1f} s of compute in total{per_node}")
    versions_table = _versions_table(manifest)
    drawn = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    subtitle = (f"study type {st.name} · config hash {manifest.get('config_hash')} · "
                f"run directory {run_dir.resolve()} · drawn {drawn}")
    page = render_html(content, pngs, subtitle=subtitle, config_text=store.config_text,
                       jobs_table=jobs_table, versions_table=versions_table)

    files: dict[str, bytes] = {}  # relative path -> content: what this report writes
    for t in [*content.tables(), jobs_table]:
        if t.csv:
            files[f"results/{t.name}.csv"] = tidy(t.data).to_csv(index=False).encode("utf-8")
    files[f"results/{SUMMARY_FILE}"] = json.dumps(summary_record(content), indent=1, ensure_ascii=False).encode("utf-8")
    for name, png in pngs.items():
        files[f"figures/{name}.png"] = png
    explorer = _explorer_page(run_dir)
    if explorer is not None:  # linked from the top of the report
        files["explore.html"] = explorer.encode("utf-8")
        page = page.replace("</h1>", '</h1>\n<p class="explore-link"><a href="explore.html">Explore the heads</a>: '
                            "every score grid, survival across seeds and pattern class on one page "
                            "(<code>headcount explore RUN</code> adds attention examples)</p>", 1)
    files["report.html"] = page.encode("utf-8")
    publish(run_dir, files, store.record)
    return run_dir / "report.html"


def _with_nodes(store, timings):
    """The jobs table with the Ray node (id, address) that ran each job, when the run used Ray,
    and the caption's ``; jobs per node: 10.0.0.1 (3f2a9c1e) 12, ...``."""
    import json

    ids, addresses = [], []
    for key in timings["key"]:
        meta_path = store.job_dir(key) / "meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8")) if store.is_done(key) else {}
        except (OSError, ValueError):
            meta = {}
        ids.append(meta.get("node_id"))
        addresses.append(meta.get("node_address"))
    if not any(ids):
        return timings, ""
    timings = timings.assign(node_address=addresses, node_id=ids)
    counts = timings.dropna(subset=["node_id"]).groupby(["node_address", "node_id"]).size()
    return timings, "; jobs per node: " + ", ".join(f"{a} ({i[:8]}) {n}" for (a, i), n in counts.items())


def _explorer_page(run_dir: Path) -> str | None:
    """The explorer page of a run from its saved results only (no model, no attention), or None
    when the run has no score, mask or pattern results (a study type without them)."""
    from headcount.experiments.explorer import explore

    try:
        return explore(run_dir, attention=False).html()
    except HeadcountError:
        return None


def publish(run_dir: Path, files: dict[str, bytes], record) -> None:
    """Write a report's files, replacing only what the run directory's record lists as headcount's.

    A file the user put under ``results/`` or ``figures/`` stays where it is; one with the name of a
    new output is refused before anything is written. Listed files the new report does not write
    (a figure of an earlier config) are removed. Each file is replaced atomically.

    Raises:
        HeadcountError: a name the report writes is not headcount's (never replaced).
    """
    from headcount.runtime.record import Record, refuse_foreign

    rec = record if record is not None else Record.read(run_dir)
    if rec is None:  # run directories always have one (RunStore.lock); a bare folder: record what we write
        rec = Record(run_dir, "study")
    refuse_foreign(run_dir, rec.in_the_way(sorted(files)), what="the run directory")
    from headcount.experiments.runner.store import REPORT_DIRS, REPORT_PAGES, is_report_file

    for d in REPORT_DIRS:
        if (run_dir / d).is_symlink() or (run_dir / d).exists() and not (run_dir / d).is_dir():
            raise HeadcountError(f"{run_dir / d} is not a directory; move it away")
    rec.join_session()  # before this process makes temporary files here
    rec.claim(files, rewrite=True)  # checked above: listed ones are headcount's, and claims again while rewritten
    rec.write()  # claimed before written: a kill leaves them listed, and the next report replaces them
    for rel, data in files.items():
        atomic_write_bytes(run_dir / rel, data)
    stale = [k for k in rec.files if is_report_file(k) and k not in REPORT_PAGES and k not in files]
    for rel in stale:
        if rec.owns(rel):
            (run_dir / rel).unlink(missing_ok=True)
        rec.forget(rel)
    rec.seal(list(files))
    rec.write()
