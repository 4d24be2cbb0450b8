"""A study's run directory at the edges of docs/promises.md: two studies on one ``--out`` at once,
the study's own files (``manifest.json``, ``study.yaml``) edited by the user against ``headcount
report`` and a resumed ``headcount study``, and a user's files in a lottery job's ``checkpoints/``.

Each case checks the promise, not the way it is kept: one ``error:`` line and exit 2 for what is
refused, a byte-identical disk around it, and the same results as a run alone for what goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import toy_study  # noqa: F401  (registers the toy study type)

from cli_helpers import sigkill_when

from headcount.cli.app import main
from headcount.experiments import run_study
from headcount.experiments.runner import RunStore
from headcount.runtime.record import LOCK_NAME, Record

TESTS = Path(__file__).resolve().parents[1]  # tests/: toy_study.py and the helpers

CONFIG = """\
study: toy_study:toy
name: toy study
values: [1, 2, 3]
steps: 4
factor: 2.0
"""
OTHER = CONFIG.replace("factor: 2.0", "factor: 3.0")


def write_config(folder: Path, text: str = CONFIG, name: str = "toy.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def results(run: Path) -> dict[str, bytes]:
    """Every file under RUN/jobs but the timings (what a run alone and a raced run must share)."""
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted((run / "jobs").rglob("*"))
            if p.is_file() and p.name != "meta.json"}


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (hidden ones, the record and the lock included): a link's target,
    a file's bytes and inode (a file rewritten or moved into place has another), a folder. The lock
    is there or not (its text names whoever took it last)."""
    out = {}
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = Path(top) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            elif name == LOCK_NAME:
                out[rel] = ("lock", p.stat().st_ino)
            else:
                out[rel] = ("file", p.read_bytes(), p.stat().st_ino)
    return out


def cli(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(code: int, err: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> dict[str, Path]:
    """A run of each config alone (the results a raced run must end with)."""
    tmp = tmp_path_factory.mktemp("alone")
    runs = {}
    for label, text in (("config", CONFIG), ("other", OTHER)):
        run_study(write_config(tmp / label, text), tmp / label / "run", quiet=True)
        runs[label] = tmp / label / "run"
    return runs


# --- a. two studies on one --out at once ---------------------------------------------------------
# Each process imports everything first, says so, and waits for the go (a file): the two then call
# `headcount study` at the same moment, whatever the machine's load did to their start-up.
STARTER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import toy_study  # noqa: F401
    from headcount.cli.app import main
    from headcount.experiments.runner import store  # noqa: F401  (imported before the go)
    Path(sys.argv[1]).touch()
    while not Path(sys.argv[2]).exists():
        time.sleep(0.005)
    main(sys.argv[3:])
""")


def start_together(tmp_path: Path, commands: list[list[str]], env: dict) -> list[subprocess.CompletedProcess]:
    go = tmp_path / "go"
    procs, ready = [], []
    for i, argv in enumerate(commands):
        ready.append(tmp_path / f"ready-{i}")
        procs.append(subprocess.Popen([sys.executable, "-c", STARTER, str(ready[-1]), str(go), *argv], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.time() + 120
        while not all(r.exists() for r in ready):
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.time() < deadline, "the studies never started"
            time.sleep(0.02)
        go.touch()
        done = []
        for p in procs:
            out, err = p.communicate(timeout=180)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        return done
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.slow
@pytest.mark.parametrize("configs", [("config", "config"), ("config", "other"), ("config", "config", "other")])
def test_studies_started_together_on_one_out_run_once_and_the_others_are_refused(tmp_path, alone, configs):
    """Started at the same moment on one new --out (the same config, another one, or three at
    once): exactly one runs, each other one is refused with one error line and exit 2 without
    running a job, and the run that went on ends with the results of a run alone."""
    counts = tmp_path / "counts"
    counts.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
               TOY_SLEEP="0.5", TOY_COUNT_DIR=str(counts))
    files = {label: write_config(tmp_path / label, CONFIG if label == "config" else OTHER)
             for label in set(configs)}
    run = tmp_path / "run"
    done = start_together(tmp_path, [["study", str(files[c]), "--out", str(run), "--no-report"] for c in configs],
                          env)
    ran = [i for i, d in enumerate(done) if d.returncode == 0]
    assert len(ran) == 1, [(d.returncode, d.stderr[-2000:]) for d in done]
    for i, d in enumerate(done):
        if i not in ran:
            one_error_line(d.returncode, d.stderr)
            assert "in use by another headcount process" in d.stderr, d.stderr
    winner = configs[ran[0]]
    assert results(run) == results(alone[winner])
    # every job ran once, by the one run
    assert {p.stem: len(p.read_text().splitlines()) for p in counts.glob("*.count")} == {
        "make-1": 1, "make-2": 1, "make-3": 1, "combine": 1, "square": 1}
    rec = Record.read(run)
    assert len(rec.sessions) == 1
    assert not [p for p in (run / "jobs").iterdir() if p.name.startswith(".")]
    assert json.loads((run / "manifest.json").read_text())["config_hash"] == json.loads(
        (alone[winner] / "manifest.json").read_text())["config_hash"]


# --- b. the study's own files, edited ----------------------------------------------------------
def edit(path: Path, how: str, tmp_path: Path) -> None:
    text = path.read_text()
    if how == "byte":  # one character, still valid JSON / YAML
        i = text.index("toy study") if path.suffix == ".yaml" else text.index('"created"') + 1
        path.write_text(text[:i] + text[i].swapcase() + text[i + 1:])
    elif how == "invalid":
        path.write_text("{ not json: [" if path.suffix == ".json" else "study: [toy\n  : : -\n")
    else:  # a link to a copy of the same bytes, elsewhere
        (tmp_path / "elsewhere").mkdir(exist_ok=True)
        target = tmp_path / "elsewhere" / path.name
        target.write_text(text)
        path.unlink()
        path.symlink_to(target)


@pytest.mark.parametrize("command", ["report", "study"])
@pytest.mark.parametrize("how", ["byte", "invalid", "link"])
@pytest.mark.parametrize("name", ["manifest.json", "study.yaml"])
def test_an_edited_manifest_or_config_is_refused_by_report_and_study(tmp_path, alone, capsys, name, how, command):
    run = tmp_path / "run"
    shutil.copytree(alone["config"], run, symlinks=True)
    cfg = write_config(tmp_path / "cfg")
    edit(run / name, how, tmp_path)
    before = snapshot(tmp_path)
    argv = ["report", run] if command == "report" else ["study", cfg, "--out", run]
    code, _, err = cli(argv, capsys)
    one_error_line(code, err)
    assert snapshot(tmp_path) == before  # never rewritten, never moved to history/, nothing new


@pytest.mark.parametrize("name", ["manifest.json", "study.yaml", "plan.json"])
def test_a_file_of_the_study_edited_while_it_runs_stays_the_users(tmp_path, capsys, monkeypatch, name):
    """The user changes a byte of the run's own file while the study runs: the run that ends
    does not take the edit for its own (its record keeps what headcount wrote), so the next
    `report` and `study` refuse it (one line, exit 2) and the file is never rewritten or moved."""
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "cfg")
    square = toy_study.square

    def square_and_edit(params, inputs, workdir, progress):  # the last job: the user edits meanwhile
        p = run / name
        text = p.read_text()
        p.write_text(text.replace("toy", "Toy", 1) if "toy" in text else text + " ")
        return square(params, inputs, workdir, progress)

    monkeypatch.setattr(toy_study, "square", square_and_edit)
    code, _, err = cli(["study", cfg, "--out", run], capsys)
    assert code == 0, err
    monkeypatch.setattr(toy_study, "square", square)
    before = snapshot(tmp_path)
    for argv in (["report", run], ["study", cfg, "--out", run], ["study", cfg, "--out", run, "--force"]):
        code, _, err = cli(argv, capsys)
        one_error_line(code, err)
        assert snapshot(tmp_path) == before
    assert RunStore(run).is_done(json.loads((run / "plan.json").read_text())["jobs"][0]["key"])


HOLDER = textwrap.dedent("""
    import sys
    from headcount.runtime.io import lock_file
    from headcount.runtime.record import TMP_PREFIX
    from pathlib import Path
    run = Path(sys.argv[1])
    run.mkdir()
    fd = lock_file(run, "headcount study")
    (run / (TMP_PREFIX + "1b5310b8..headcount-out.json.qwcl1kwp.tmp")).write_text("{")  # its record, being written
    print("locked", flush=True)
    sys.stdin.readline()
""")


@pytest.mark.parametrize("command", ["study", "report"])
def test_a_study_that_has_just_begun_is_in_use_not_someone_elses_folder(tmp_path, capsys, command):
    """The moment a study has taken a new --out and is writing its record (the window a second
    `headcount study` or `report` started at the same time meets): the second one is refused as
    in use, not sent to "choose a new or empty directory"; nothing is changed."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        argv = ["report", run] if command == "report" else ["study", write_config(tmp_path / "cfg"), "--out", run]
        before = snapshot(tmp_path)
        code, _, err = cli(argv, capsys)
        one_error_line(code, err)
        assert "in use by another headcount process" in err and f"pid {holder.pid}" in err
        assert snapshot(tmp_path) == before
    finally:
        holder.communicate("\n", timeout=60)


# --- c. a user's files in a lottery job's checkpoints/ --------------------------------------------
NOTE = b"my notes on this checkpoint\n"


@pytest.fixture(scope="module")
def lottery(tmp_path_factory):
    """A lottery study on a tiny model, one task and one seed, whose fine-tuning saves a checkpoint
    every 2 of its 8 steps (each new one replaces the one before)."""
    from training_helpers import make_checkpoint, make_task

    root = tmp_path_factory.mktemp("lottery")
    make_checkpoint(root / "pre")
    make_task(root / "task", n_train=64, n_dev=32)
    (root / "study.yaml").write_text(textwrap.dedent("""
        study: lottery
        model: pre
        tasks: [task/task.yaml]
        seeds: [1]
        train: {lr: 0.01, batch_size: 16, epochs: 2, max_length: 32, save_steps: 2}
    """))
    return root


def first_finetune_only(monkeypatch):
    """Run only the study's first fine-tuning job (the one whose checkpoints the cases touch): the
    rest of the plan stays to run, and the run ends without its report."""
    from headcount.experiments.runner.local import LocalExecutor

    run_here = LocalExecutor._run_here

    def first(self, jobs, *args, **kwargs):
        return run_here(self, [j for j in jobs if j.kind == "finetune"][:1], *args, **kwargs)

    monkeypatch.setattr(LocalExecutor, "_run_here", first)


def test_a_note_saved_into_a_lottery_checkpoint_while_the_job_runs_stays_and_stays_the_users(
        lottery, tmp_path, monkeypatch, capsys):
    """The user saves a note into the job's first checkpoint while it trains: the Trainer replaces
    that checkpoint by newer ones and removes its own files at the end, the job finishes, and
    the note is still there, byte for byte, in the finished job's folder, listed nowhere as
    headcount's (so nothing headcount does later removes it)."""
    import headcount.train.trainer as trainer

    move_listed = trainer.move_listed
    saved = []

    def move_then_note(src, dst, *args, **kwargs):  # the first checkpoint in place: the user saves a note there
        moved = move_listed(src, dst, *args, **kwargs)
        if not saved:
            (Path(dst) / "note.txt").write_bytes(NOTE)
            saved.append(Path(dst).name)
        return moved

    monkeypatch.setattr(trainer, "move_listed", move_then_note)
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    first_finetune_only(monkeypatch)
    run = tmp_path / "run"
    code, _, err = cli(["study", lottery / "study.yaml", "--out", run, "--device", "cpu"], capsys)
    assert code == 0, err
    assert saved == ["checkpoint-2"]  # and checkpoints 4, 6 and 8 followed it
    (job,) = [p for p in (run / "jobs").iterdir() if (p / "DONE").is_file()]
    notes = [p for p in run.rglob("note.txt")]
    assert notes == [job / "checkpoints" / "checkpoint-2" / "note.txt"] and notes[0].read_bytes() == NOTE
    # the Trainer's own files are gone, the note alone keeps its folders
    assert sorted(p.relative_to(job / "checkpoints").as_posix() for p in (job / "checkpoints").rglob("*")) == [
        "checkpoint-2", "checkpoint-2/note.txt"]
    rec = Record.read(run)
    assert not [k for k in rec.files if k.startswith(f"jobs/{job.name}/checkpoints")]
    assert f"jobs/{job.name}/DONE" in rec.files and not list(job.glob(".headcount*"))


KILLED = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import headcount.train.trainer as trainer
    from headcount.cli.app import main
    move_listed = trainer.move_listed

    def move_then_wait(src, dst, *args, **kwargs):  # a checkpoint in place: the test kills the run now
        moved = move_listed(src, dst, *args, **kwargs)
        Path(sys.argv[1]).write_text(str(dst))
        time.sleep(600)
        return moved

    trainer.move_listed = move_then_wait
    main(sys.argv[2:])
""")


@pytest.mark.slow
def test_a_note_saved_into_a_killed_lottery_jobs_checkpoint_refuses_the_resume_naming_it(
        lottery, tmp_path, monkeypatch, capsys):
    """A run killed while a lottery job trains leaves the job's temporary folder with a complete
    checkpoint; the user saves a note into it; the resume refuses with one line naming the note
    before anything is removed, and goes on once the note is moved away."""
    run = tmp_path / "run"
    signal_file = tmp_path / "checkpoint"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
               HEADCOUNT_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(signal_file), "study", str(lottery / "study.yaml"),
                             "--out", str(run), "--device", "cpu"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # the path is written whole before the killed process's sleep begins
    sigkill_when(proc, signal_file, within=300, what="no checkpoint was saved", settle=0.2)
    checkpoint = Path(signal_file.read_text())
    assert checkpoint.is_dir() and checkpoint.parent.name == "checkpoints"
    assert checkpoint.parents[1].name.startswith(".headcount-tmp.")  # the killed job's temporary folder
    (checkpoint / "note.txt").write_bytes(NOTE)
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    first_finetune_only(monkeypatch)
    before = snapshot(tmp_path)
    code, _, err = cli(["study", lottery / "study.yaml", "--out", run, "--device", "cpu"], capsys)
    one_error_line(code, err)
    assert "note.txt" in err
    assert snapshot(tmp_path) == before
    # moved away, the resume removes the killed job's folder and runs the job again
    (checkpoint / "note.txt").rename(tmp_path / "note.txt")
    code, _, err = cli(["study", lottery / "study.yaml", "--out", run, "--device", "cpu"], capsys)
    assert code == 0, err
    assert not checkpoint.parents[1].exists()
    assert [p for p in (run / "jobs").iterdir() if (p / "DONE").is_file()]


def test_a_note_in_the_checkpoints_of_a_lottery_job_that_fails_stays_and_refuses_the_next_run(
        lottery, tmp_path, monkeypatch, capsys):
    """The job fails after the user saved a note into its checkpoint: the failed job's folder goes
    but the note, which stays in place; the next run refuses with one line naming it, and nothing
    changes."""
    import headcount.train.trainer as trainer

    move_listed = trainer.move_listed
    calls = []

    def note_then_fail(src, dst, *args, **kwargs):
        calls.append(dst)
        if len(calls) == 3:
            raise RuntimeError("the disk went away")
        moved = move_listed(src, dst, *args, **kwargs)
        if len(calls) == 2:
            (Path(dst) / "note.txt").write_bytes(NOTE)
        return moved

    monkeypatch.setattr(trainer, "move_listed", note_then_fail)
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    first_finetune_only(monkeypatch)
    run = tmp_path / "run"
    code, _, err = cli(["study", lottery / "study.yaml", "--out", run, "--device", "cpu", "--quiet"], capsys)
    one_error_line(code, err)
    assert "the disk went away" in err
    (note,) = run.rglob("note.txt")
    assert note.read_bytes() == NOTE and note.parent.name == "checkpoint-4"
    # the failed job's files are gone but the note (and what tells it apart)
    tmp = note.parents[2]
    assert tmp.name.startswith(".headcount-tmp.")
    assert sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()) == [
        ".headcount-job.json", "checkpoints/checkpoint-4/note.txt"]
    # the next run (another process: the failed job's folder is of a session that has ended)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    before = snapshot(tmp_path)
    done = subprocess.run([sys.executable, "-m", "headcount", "study", str(lottery / "study.yaml"), "--out", str(run),
                           "--device", "cpu"],
                          env=env, capture_output=True, text=True, timeout=300)
    one_error_line(done.returncode, done.stderr)
    assert "checkpoint-4/note.txt" in done.stderr
    assert snapshot(tmp_path) == before
