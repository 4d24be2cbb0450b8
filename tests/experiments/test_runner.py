"""The study framework: job keys, the resumable store, executors (local, Ray), the report, the CLI."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import toy_study  # noqa: F401  (registers the toy study type)
from cli_helpers import sigkill_when

from headcount.experiments import run_study
from headcount.experiments.runner import Job, JobsFailed, Plan, RunStore, parse_study_config
from headcount.experiments.runner.store import DONE
from headcount.runtime.errors import HeadcountError

TESTS = Path(__file__).resolve().parents[1]  # tests/: toy_study.py and the helpers
REPO = TESTS.parent

CONFIG = """\
study: toy_study:toy
name: toy study  # distinctive-comment-xyzzy
values: [1, 2, 3]
steps: 4
factor: 2.0
"""


def write_config(tmp_path: Path, text: str = CONFIG, name: str = "toy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def tree(run: Path, with_meta: bool = False) -> dict[str, bytes]:
    """Every file under RUN/jobs (what must be identical across executors and interruptions)."""
    out = {}
    for p in sorted((run / "jobs").rglob("*")):
        if p.is_file() and (with_meta or p.name != "meta.json"):
            out[p.relative_to(run).as_posix()] = p.read_bytes()
    return out


def counts(count_dir: Path) -> dict[str, int]:
    return {p.stem: len(p.read_text().splitlines()) for p in count_dir.glob("*.count")}


def keys_of(text: str) -> dict[str, str]:
    loaded = parse_study_config(text)
    return Plan(loaded.study_type.expand(loaded.config)).names


@pytest.fixture
def count_dir(tmp_path, monkeypatch):
    d = tmp_path / "counts"
    d.mkdir()
    monkeypatch.setenv("TOY_COUNT_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    """One uninterrupted local run of CONFIG, shared by the comparisons below."""
    tmp = tmp_path_factory.mktemp("reference")
    summary = run_study(write_config(tmp), tmp / "run", quiet=True)
    assert summary.ran and summary.report is not None
    return tmp / "run"


# --- keys ------------------------------------------------------------------------------------
def test_keys_change_exactly_downstream_of_a_change():
    a = Job("a", "toy", "toy_study:make", {"x": 1})
    b = Job("b", "toy", "toy_study:make", {"x": 2})
    c = Job("c", "toy", "toy_study:make", {"y": 0}, deps=[a, b])
    a2 = Job("a", "toy", "toy_study:make", {"x": 9})
    c2 = Job("c", "toy", "toy_study:make", {"y": 0}, deps=[a2, b])
    assert a2.key != a.key and c2.key != c.key and b.key == Job("b", "toy", "toy_study:make", {"x": 2}).key
    # key ignores dict order and the job name, and includes the input names
    assert Job("z", "toy", "toy_study:make", {"b": 1, "a": 2}).key == Job("q", "toy", "toy_study:make", {"a": 2, "b": 1}).key
    assert Job("c", "toy", "toy_study:make", {"y": 0}, deps={"other": a}).key != Job("c", "toy", "toy_study:make", {"y": 0}, deps={"a": a}).key


def test_study_settings_change_only_the_jobs_that_read_them():
    base = keys_of(CONFIG)
    factor = keys_of(CONFIG.replace("factor: 2.0", "factor: 3.0"))
    assert {n for n in base if base[n] != factor[n]} == {"combine", "square"}
    steps = keys_of(CONFIG.replace("steps: 4", "steps: 5"))
    assert all(base[n] != steps[n] for n in base)  # every make reads steps; the rest is downstream
    more = keys_of(CONFIG.replace("[1, 2, 3]", "[1, 2, 3, 4]"))
    assert all(more[f"make-{v}"] == base[f"make-{v}"] for v in (1, 2, 3)) and more["combine"] != base["combine"]
    assert keys_of("# reformatted\n" + CONFIG.replace("[1, 2, 3]", "\n  - 1\n  - 2\n  - 3")) == base


def test_version_is_part_of_every_key(monkeypatch):
    import headcount.experiments.runner.jobs as jobs

    before = Job("a", "toy", "toy_study:make", {"x": 1}).key
    monkeypatch.setattr(jobs, "headcount_version", lambda: "99.0")
    assert Job("a", "toy", "toy_study:make", {"x": 1}).key != before


def test_jobs_are_validated_and_immutable():
    with pytest.raises(HeadcountError, match="JSON"):
        Job("a", "toy", "toy_study:make", {"x": {1, 2}})
    with pytest.raises(HeadcountError, match="module:function"):
        Job("a", "toy", "toy_study.make", {})
    job = Job("a", "toy", "toy_study:make", {"x": [1]})
    job.params["x"].append(2)  # a copy
    assert job.params == {"x": [1]}
    with pytest.raises(AttributeError):
        job.name = "b"
    with pytest.raises(HeadcountError, match="unique"):
        Plan([Job("a", "toy", "toy_study:make", {"x": 1}), Job("a", "toy", "toy_study:make", {"x": 2})])


# --- local runs, resume, re-runs -------------------------------------------------------------
def test_local_run_results_and_no_rerun(tmp_path, count_dir):
    cfg = write_config(tmp_path)
    run = tmp_path / "run"
    first = run_study(cfg, run, quiet=True)
    assert sorted(first.ran) == ["combine", "make-1", "make-2", "make-3", "square"] and first.reused == 0
    store = RunStore(run)
    totals = sum(store.result(f"make-{v}")["total"] for v in (1, 2, 3))
    assert store.result("combine")["value"] == 2.0 * totals
    assert store.result("square")["value"] == (2.0 * totals) ** 2
    assert (store.result("make-2").dir / DONE).is_file()
    assert store.result("make-2").path("numbers.txt").read_text().count("\n") == 4

    second = run_study(cfg, run, quiet=True)  # the same command again: nothing to do
    assert second.ran == [] and second.reused == 5
    assert counts(count_dir) == {"make-1": 1, "make-2": 1, "make-3": 1, "combine": 1, "square": 1}


def test_other_config_is_refused_and_force_reruns_only_what_changed(tmp_path, count_dir, capsys):
    from headcount.cli.app import main

    run = tmp_path / "run"
    run_study(write_config(tmp_path), run, quiet=True)
    before = tree(run, with_meta=True)
    yaml_before = (run / "study.yaml").read_text()
    other = write_config(tmp_path, CONFIG.replace("factor: 2.0", "factor: 3.0"), "other.yaml")

    with pytest.raises(SystemExit) as e:
        main(["study", str(other), "--out", str(run), "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "another config" in err[0] and "--force" in err[0]
    assert tree(run, with_meta=True) == before and (run / "study.yaml").read_text() == yaml_before

    summary = run_study(other, run, force=True, quiet=True)
    assert sorted(summary.ran) == ["combine", "square"] and summary.reused == 3
    assert counts(count_dir)["make-1"] == 1 and counts(count_dir)["combine"] == 2
    # nothing deleted: the old results are still there, the old config moved to history/
    assert all(before[p] == (run / p).read_bytes() for p in before)
    (hist,) = (run / "history").iterdir()
    assert (hist / "study.yaml").read_text() == yaml_before and (hist / "report.html").is_file()
    assert "factor: 3.0" in (run / "study.yaml").read_text()


def test_failed_job_keeps_the_rest_and_the_same_command_retries(tmp_path, count_dir, monkeypatch):
    cfg = write_config(tmp_path)
    run = tmp_path / "run"
    monkeypatch.setenv("TOY_FAIL", "make-2")
    with pytest.raises(JobsFailed, match="make-2"):
        run_study(cfg, run, quiet=True)
    store = RunStore(run)
    assert store.has("make-1") and store.has("make-3") and not store.has("combine")
    key = store.plan["jobs"][[e["name"] for e in store.plan["jobs"]].index("make-2")]["key"]
    assert "toy failure" in (run / "logs" / f"{key}.error.txt").read_text()
    assert not (run / "report.html").exists()

    monkeypatch.delenv("TOY_FAIL")
    summary = run_study(cfg, run, quiet=True)
    assert sorted(summary.ran) == ["combine", "make-2", "square"]
    assert counts(count_dir) == {"make-1": 1, "make-2": 2, "make-3": 1, "combine": 1, "square": 1}
    assert not (run / "logs" / f"{key}.error.txt").exists()


def test_run_dir_guards(tmp_path):
    cfg = write_config(tmp_path)
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(HeadcountError, match="headcount has no record of it"):
        run_study(cfg, stranger, quiet=True)
    assert [p.name for p in stranger.iterdir()] == ["notes.txt"]

    run = tmp_path / "run"
    holder = RunStore(run)
    holder.lock()  # another process running the same directory
    try:
        with pytest.raises(HeadcountError, match="in use"):
            run_study(cfg, run, quiet=True)
    finally:
        holder.unlock()


@pytest.mark.slow
def test_sigkill_mid_job_resumes_to_identical_results(tmp_path, reference_run, count_dir):
    cfg = write_config(tmp_path)
    run = tmp_path / "run"
    signals = tmp_path / "signals"
    signals.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
               TOY_SLEEP="0.4", TOY_SIGNAL_DIR=str(signals))
    cmd = [sys.executable, "-m", "headcount", "study", str(cfg), "--out", str(run)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # make-1 is done, make-2 is writing
    sigkill_when(proc, signals / "make-2.midway", within=600, what="the study never reached make-2")
    assert proc.returncode == -signal.SIGKILL
    leftovers = [p.name for p in (run / "jobs").iterdir() if p.name.startswith(".headcount-tmp.")]
    assert len(leftovers) == 1  # the half-written make-2
    assert RunStore(run).has("make-1") and not RunStore(run).has("make-2")

    env.pop("TOY_SLEEP")
    done = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "report:" in done.stdout
    assert tree(run) == tree(reference_run)  # same keys, same bytes, nothing half-written
    assert not [p for p in (run / "jobs").iterdir() if p.name.startswith(".")]
    assert counts(count_dir) == {"make-1": 1, "make-2": 2, "make-3": 1, "combine": 1, "square": 1}
    for p in (run / "jobs").rglob("*.json"):
        json.loads(p.read_text())


# --- Ray ----------------------------------------------------------------------------------------
def terminal():
    import io

    from rich.console import Console

    buf = io.StringIO()
    return buf, Console(file=buf, force_terminal=True, color_system=None, width=120)


def test_progress_shows_jobs_with_eta_and_steps_inside_jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_SLEEP", "0.05")
    buf, console = terminal()
    run_study(write_config(tmp_path), tmp_path / "run", console=console)
    text = buf.getvalue()
    assert "jobs" in text and "eta" in text and "5/5" in text
    assert "make-2: drawing" in text  # the job's own steps
    assert "done  make-3" in text


@pytest.mark.slow
def test_ray_executor_gives_the_same_results_as_local(tmp_path, reference_run, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("TOY_SLEEP", "0.3")  # long enough for step updates to reach the driver
    run = tmp_path / "run"
    buf, console = terminal()
    summary = run_study(write_config(tmp_path), run, executor="ray", console=console)
    assert len(summary.ran) == 5 and summary.report is not None
    assert tree(run) == tree(reference_run)
    metas = [json.loads(p.read_text()) for p in (run / "jobs").glob("*/meta.json")]
    assert {m["executor"] for m in metas} == {"ray"}
    assert ": drawing" in buf.getvalue()  # steps reported inside Ray tasks reach the display


def test_unreachable_ray_address_is_one_line_exit_2(tmp_path, capsys):
    from headcount.cli.app import main

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["study", str(write_config(tmp_path)), "--out", str(run), "--executor", "ray",
              "--address", "127.0.0.1:1", "--quiet"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot reach the Ray cluster at 127.0.0.1:1")
    assert not run.exists()


# --- report ---------------------------------------------------------------------------------------
def test_report_has_every_figure_table_and_the_context(reference_run):
    html = (reference_run / "report.html").read_text()
    images = html.split('src="data:image/png;base64,')[1:]
    assert len(images) == 2  # totals (a Figure) and combined (a PNG file a job wrote)
    for img in images:
        assert base64.b64decode(img.split('"', 1)[0]).startswith(b"\x89PNG")
    for anchor in ("figure-totals", "figure-combined", "table-totals", "table-steps", "table-jobs"):
        assert f'id="{anchor}"' in html
    assert "distinctive-comment-xyzzy" in html  # the config as given
    for software in ("python", "torch", "transformers", "headcount"):
        assert f"<td>{software}</td>" in html
    assert "square = " in html

    store = RunStore(reference_run)
    totals = pd.read_csv(reference_run / "results" / "totals.csv")
    assert list(totals["job"]) == ["make-1", "make-2", "make-3"]
    assert list(totals["total"]) == [store.result(f"make-{v}")["total"] for v in (1, 2, 3)]
    steps = pd.read_csv(reference_run / "results" / "steps.csv")
    assert len(steps) == 12 and list(steps.columns) == ["job", "step", "number"]
    jobs = pd.read_csv(reference_run / "results" / "jobs.csv")
    assert len(jobs) == 5 and (jobs["status"] == "done").all() and (jobs["seconds"] >= 0).all()
    assert {p.name for p in (reference_run / "figures").iterdir()} == {"totals.png", "combined.png"}


def test_report_command_redraws_from_saved_results(reference_run, tmp_path, capsys):
    import shutil

    from headcount.cli.app import main

    run = tmp_path / "copy"
    shutil.copytree(reference_run, run)
    (run / "report.html").unlink()
    shutil.rmtree(run / "results")
    assert main(["report", str(run)]) == 0
    assert "report:" in capsys.readouterr().out
    assert (run / "report.html").read_text().count("data:image/png;base64,") == 2
    assert (run / "results" / "totals.csv").read_bytes() == (reference_run / "results" / "totals.csv").read_bytes()

    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_report_command_waits_for_no_one_and_races_no_study(reference_run, tmp_path, capsys):
    """`headcount report` takes RUN/.lock: while a study holds it (another process), the report is
    refused with one error line and the run's files stay as they were; afterwards it redraws."""
    import shutil
    import subprocess
    import sys
    import textwrap

    from headcount.cli.app import main

    run = tmp_path / "copy"
    shutil.copytree(reference_run, run)
    before = (run / "report.html").read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from headcount.experiments.runner.store import RunStore
        with RunStore({str(run)!r}):
            print("locked", flush=True)
            sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(SystemExit) as e:
            main(["report", str(run)])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "in use" in err and err.count("\n") == 1
        assert (run / "report.html").read_bytes() == before
    finally:
        holder.communicate("\n", timeout=60)
    assert main(["report", str(run)]) == 0


def test_report_refuses_an_unfinished_run(tmp_path, monkeypatch):
    from headcount.experiments.report import build_report

    monkeypatch.setenv("TOY_FAIL", "square")
    run = tmp_path / "run"
    with pytest.raises(JobsFailed):
        run_study(write_config(tmp_path), run, quiet=True)
    with pytest.raises(HeadcountError, match="1 of 5 jobs have not finished"):
        build_report(run)


# --- registry, docs -------------------------------------------------------------------------------
def test_registry_refuses_a_conflicting_registration():
    from headcount.experiments.runner import get_study_type, register_study

    toy = get_study_type("toy")
    assert register_study("toy", toy_study.ToyConfig, toy_study.expand).report is toy.report  # re-import: fine
    with pytest.raises(HeadcountError, match="already registered"):
        register_study("toy", toy_study.ToyConfig, lambda c: [])
    assert get_study_type("toy_study:toy") is get_study_type("toy")


def test_study_types_come_from_entry_points_built_in_and_plugin(tmp_path, monkeypatch):
    """Built-in types are entry points of headcount itself; a plugin's entry point (a module that
    registers its type) is found the same way; a broken one is one error line."""
    from importlib.metadata import EntryPoint

    from headcount.experiments.runner import get_study_type, registry, study_types

    assert {"transfer", "lottery", "demo"} <= set(study_types())  # headcount's own entry points
    assert get_study_type("lottery").name == "lottery"
    (tmp_path / "plugin_study.py").write_text(
        "from headcount.experiments.runner import StudyConfig, register_study\n"
        "class Cfg(StudyConfig):\n    n: int = 1\n"
        "register_study('plugin-x', Cfg, lambda c: [])\n")
    (tmp_path / "broken_study.py").write_text("raise RuntimeError('half-installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # the plugin's registration is undone
    found = {**registry._entry_points(),
             "plugin-x": EntryPoint("plugin-x", "plugin_study", registry.ENTRY_POINT_GROUP),
             "broken": EntryPoint("broken", "broken_study", registry.ENTRY_POINT_GROUP)}
    monkeypatch.setattr(registry, "_entry_points", lambda: found)
    assert "plugin-x" in study_types() and "plugin-x" not in registry._REGISTRY
    assert get_study_type("plugin-x").config_model.__name__ == "Cfg"
    assert parse_study_config("study: plugin-x\nn: 3\n").config.n == 3
    with pytest.raises(HeadcountError, match="study type 'broken' failed to load.*half-installed"):
        get_study_type("broken")


