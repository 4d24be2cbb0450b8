"""What headcount promises about your files: kills, Ctrl-C, locks, --out guards,
outputs that appear together, content fingerprints, modes and resumed metrics.

Kills are real: a child process runs the CLI with one library function wrapped so that it
SIGKILLs itself at a chosen point (inside a Trainer checkpoint, in the middle of the final model
save, after shrink staged its checkpoint); the rerun is compared with an uninterrupted run.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli
from training_helpers import make_checkpoint, make_task, one_thread

from headcount.runtime.errors import HeadcountError
from headcount.runtime.io import LOCK_NAME, lock_file, unlock_file
from headcount.runtime.record import RECORD

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

#: 64 training examples, batch 16, 2 epochs: 8 steps, a checkpoint every 2
FT = ["--epochs", "2", "--batch-size", "16", "--lr", "1e-2", "--max-length", "32", "--max-train-examples", "64",
      "--max-eval-examples", "32", "--save-steps", "2", "--seed", "1"]

#: the child: wrap one function so that the process SIGKILLs itself at KILL_POINT, then run the CLI
CHILD = r"""
import os, signal, sys
# Ctrl-C raises KeyboardInterrupt, as in a terminal, even when the test runs in a background job
# (a non-interactive shell starts those with SIGINT ignored, and Python keeps an inherited SIG_IGN)
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
import torch
torch.set_num_threads(1)
import transformers
point, step = os.environ.get("KILL_POINT", ""), int(os.environ.get("KILL_STEP", "0"))
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
if point == "checkpoint":  # weights, optimizer and RNG of checkpoint-STEP written, trainer_state.json not yet
    orig = transformers.Trainer._save_rng_state
    def save_rng(self, output_dir):
        orig(self, output_dir)
        if self.state.global_step == step:
            die()
    transformers.Trainer._save_rng_state = save_rng
elif point == "final":  # the final model's weights half written
    orig_save = transformers.PreTrainedModel.save_pretrained
    def save(self, path, *a, **k):
        out = orig_save(self, path, *a, **k)
        if "checkpoint-" not in str(path):
            f = next(Path(path).glob("*.safetensors"))
            data = f.read_bytes()
            f.write_bytes(data[: len(data) // 2])
            die()
        return out
    transformers.PreTrainedModel.save_pretrained = save
elif point == "shrink":  # the pruned checkpoint staged, not yet renamed into --out
    import headcount.core.surgery as S
    orig_pruned = S.save_pruned
    def save_pruned(*a, **k):
        orig_pruned(*a, **k)
        die()
    S.save_pruned = save_pruned
from headcount.cli.app import main
main(sys.argv[1:])
"""


def child(args, env=None, **kw) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.run([sys.executable, "-c", CHILD, *args], env=full_env, capture_output=True, text=True,
                          timeout=300, **kw)


def one_error(code, err, status=2) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == status, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden ones too, the lock aside) -> sha256: to compare 'byte-identical'."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file() and not p.is_symlink() and p.name != LOCK_NAME}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("safety")
    pre = make_checkpoint(root / "pre")
    clf = make_checkpoint(root / "clf", head="classification")
    task = make_task(root / "task", n_train=64, n_dev=32)
    mask = root / "mask.json"
    mask.write_text(json.dumps({"heads": [[1, 0, 1, 1], [1, 1, 1, 0]], "mlps": [1, 1]}))
    return {"pre": str(pre), "clf": str(clf), "task": str(task), "mask": mask, "root": root}


@pytest.fixture(scope="module")
def uninterrupted(world, tmp_path_factory):
    """One finetune run without interruption (what every killed-and-resumed run must equal)."""
    out = tmp_path_factory.mktemp("ft") / "out"
    r = child(["finetune", "--model", world["pre"], "--task", world["task"], *FT, "--out", str(out)])
    assert r.returncode == 0, r.stderr
    return json.loads((out / "metrics.json").read_text())


def _same_run(m, base):
    assert m["final"] == base["final"] and m["epochs"] == base["epochs"] and m["steps"] == base["steps"]
    # the whole run's tokens, not only the resumed part, and a rate that is not 0
    assert m["train_tokens"] == base["train_tokens"] > 0 and m["tokens_per_s"] > 0


# -- 1. --out never deletes or hides what headcount did not write ---------------------------------------
def test_shrink_refuses_a_directory_it_did_not_write(capsys, world, tmp_path, monkeypatch):
    v = tmp_path / "v"
    (v / "sub").mkdir(parents=True)
    (v / "notes.txt").write_text("precious\n")
    before = snapshot(v)
    code, _, err = run_cli(capsys, "shrink", "--model", world["clf"], "--mask", world["mask"], "--out", v)
    assert "not empty and headcount has no record of it (it holds notes.txt)" in one_error(code, err)
    assert snapshot(v) == before and (v / "sub").is_dir()
    # an existing file is refused, not turned into a directory or hidden
    f = tmp_path / "afile.txt"
    f.write_text("mine\n")
    code, _, err = run_cli(capsys, "shrink", "--model", world["clf"], "--mask", world["mask"], "--out", f)
    assert "existing file" in one_error(code, err)
    assert f.read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["afile.txt", "v"]
    # the working directory is never taken over
    monkeypatch.chdir(v)
    code, _, err = run_cli(capsys, "shrink", "--model", world["clf"], "--mask", world["mask"], "--out", ".")
    one_error(code, err)
    assert snapshot(v) == before


def test_shrink_output_is_recognised_and_force_says_what_it_replaces(capsys, world, tmp_path):
    out = tmp_path / "small"
    code, _, err = run_cli(capsys, "shrink", "--model", world["clf"], "--mask", world["mask"], "--out", out)
    assert code == 0, err
    assert (out / "config.json").is_file() and json.loads((out / RECORD).read_text())["command"] == "shrink"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]  # nothing written beside --out
    first = snapshot(out)
    # the same inputs again: allowed (rewrites its own files)
    code, _, err = run_cli(capsys, "shrink", "--model", world["clf"], "--mask", world["mask"], "--out", out)
    assert code == 0, err
    # another mask into the same --out: refused without --force, earlier output untouched
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"heads": [[1, 1, 1, 1], [0, 1, 1, 1]], "mlps": [1, 0]}))
    code, _, err = run_cli(capsys, "shrink", "--model", world["clf"], "--mask", other, "--out", out)
    assert "different `headcount shrink` run" in one_error(code, err)
    assert snapshot(out) == first
    code, stdout, err = run_cli(capsys, "shrink", "--model", world["clf"], "--mask", other, "--out", out, "--force")
    assert code == 0, err
    assert "--force: replacing" in stdout and "model.safetensors" in stdout
    assert json.loads((out / "headcount.json").read_text())["mask"] == str(other)
    # another command's output is refused as --out
    code, _, err = run_cli(capsys, "score", "--model", world["clf"], "--task", world["task"], "--method", "magnitude",
                           "--out", out)
    assert "holds the output of `headcount shrink`" in one_error(code, err)
    # outputs get the usual file modes (safetensors writes 0600 by itself)
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


# -- 2/8. kills during checkpoint and model writes; temp files cleaned on the next run ------------------------
@pytest.mark.slow
@pytest.mark.parametrize("point,step", [("checkpoint", 6), ("final", 0)])
def test_finetune_killed_while_writing_resumes_and_matches(capsys, world, uninterrupted, tmp_path, point, step):
    out = tmp_path / "ft"
    args = ["finetune", "--model", world["pre"], "--task", world["task"], *FT, "--out", str(out)]
    r = child(args, env={"KILL_POINT": point, "KILL_STEP": str(step)})
    assert r.returncode == -signal.SIGKILL, r.stderr
    if point == "checkpoint":  # the partial checkpoint is in its temporary folder, without its trainer_state.json
        partial, = (out / "checkpoints").glob(f".headcount-tmp.*.checkpoint-{step}.save/checkpoint-{step}")
        assert partial.is_dir() and not (partial / "trainer_state.json").exists()
        assert not (out / "checkpoints" / f"checkpoint-{step}").exists()  # never in place until complete
    else:  # the half-written final model sits in a temp directory inside --out
        assert [p.name for p in out.iterdir() if p.name.startswith(".headcount-tmp.") and ".model." in p.name], \
            list(out.iterdir())
    code, _, err = run_cli(capsys, *args)
    assert code == 0, err
    m = json.loads((out / "metrics.json").read_text())
    _same_run(m, uninterrupted)
    left = [p.name for p in out.iterdir() if p.name.startswith(".headcount-tmp.")]
    assert left == [] and not (out / "checkpoints").exists()
    if point == "checkpoint" and step == 6:
        assert m["resumed_from"] == "checkpoint-4"  # the newest complete one, the partial one discarded
    if point == "final":  # resumed after the last step: 0 steps trained here, the whole run reported
        assert m["resumed_from"] == "checkpoint-8"


@pytest.mark.slow
def test_shrink_killed_before_its_output_is_complete(capsys, world, tmp_path):
    out = tmp_path / "small"
    r = child(["shrink", "--model", world["clf"], "--mask", str(world["mask"]), "--out", str(out)],
              env={"KILL_POINT": "shrink"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not (out / "config.json").exists()  # nothing half-published; only a staging dir inside --out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]
    code, _, err = run_cli(capsys, "shrink", "--model", world["clf"], "--mask", world["mask"], "--out", out)
    assert code == 0, err
    assert (out / "model.safetensors").is_file() and not [p for p in out.iterdir() if "staging" in p.name]


# -- 3. Ctrl-C ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_exits_130_with_one_line_and_keeps_the_checkpoints(capsys, world, tmp_path):
    out = tmp_path / "ft"
    slow = [a if a != "2" or i != 1 else "40" for i, a in enumerate(FT)]  # 40 epochs: time to press Ctrl-C
    args = ["finetune", "--model", world["pre"], "--task", world["task"], *slow, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", CHILD, *args], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not list((out / "checkpoints").glob("checkpoint-*/trainer_state.json")) and time.time() < deadline:
            if p.poll() is not None:
                break
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    lines = [x for x in err.splitlines() if x.strip()]
    line = lines[-1]  # after the progress lines, one error line
    assert [x for x in lines if x.startswith("error:")] == [line] and "Traceback" not in err
    assert "interrupted" in line and str(out) in line and "same command" in line
    assert list((out / "checkpoints").glob("checkpoint-*/trainer_state.json"))


def test_ctrl_c_in_process_keeps_earlier_results(capsys, world, tmp_path, monkeypatch):
    out = tmp_path / "s"
    assert run_cli(capsys, "score", "--model", world["clf"], "--task", world["task"], "--method", "magnitude",
                   "--out", out)[0] == 0
    before = snapshot(out)
    import headcount.cli.api

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(headcount.cli.api, "score_command", interrupted)
    code, _, err = run_cli(capsys, "score", "--model", world["clf"], "--task", world["task"], "--method", "magnitude",
                           "--out", out)
    assert "interrupted" in one_error(code, err, status=130)
    assert snapshot(out) == before


# -- 4. content fingerprints -----------------------------------------------------------------------------------
def test_edited_data_or_rewritten_checkpoint_is_another_run(capsys, world, tmp_path):
    from headcount.experiments.runner.jobs import Job

    root = tmp_path / "w"
    task = make_task(root / "task", n_train=64, n_dev=32)
    pre = make_checkpoint(root / "pre")
    key = Job("ft", "finetune", "headcount.experiments.studies.jobs:finetune_job", {"model": str(pre), "task": str(task)}).key
    out = tmp_path / "ft"
    assert run_cli(capsys, "finetune", "--model", pre, "--task", task, *FT, "--out", out)[0] == 0
    # flip the validation labels under the same file name
    dev = task.parent / "dev.csv"
    rows = dev.read_text().splitlines()
    dev.write_text("\n".join([rows[0]] + [r.replace("positive", "X").replace("negative", "positive").replace("X", "negative")
                                          for r in rows[1:]]) + "\n")
    code, _, err = run_cli(capsys, "finetune", "--model", pre, "--task", task, *FT, "--out", out)
    assert "different run" in one_error(code, err) and "task_fingerprint" in err
    key2 = Job("ft", "finetune", "headcount.experiments.studies.jobs:finetune_job", {"model": str(pre), "task": str(task)}).key
    assert key2 != key
    # a checkpoint rewritten at the same path
    make_checkpoint(pre, seed=5)
    key3 = Job("ft", "finetune", "headcount.experiments.studies.jobs:finetune_job", {"model": str(pre), "task": str(task)}).key
    assert key3 not in (key, key2)
    # score: the same settings on changed data are a different run too
    s = tmp_path / "s"
    assert run_cli(capsys, "score", "--model", pre, "--task", task, "--method", "magnitude", "--out", s)[0] == 0
    make_checkpoint(pre, seed=6)
    code, _, err = run_cli(capsys, "score", "--model", pre, "--task", task, "--method", "magnitude", "--out", s)
    assert "different `headcount score` run (different model)" in one_error(code, err)


def test_fingerprints_are_cached_by_size_and_mtime(tmp_path, monkeypatch):
    import headcount.data.fingerprint as F

    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 1000)
    first = F.file_digest(f)
    calls = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: calls.append(a[0]) or real_open(*a, **k))
    assert F.file_digest(f) == first and calls == []  # not read again
    monkeypatch.undo()
    f.write_bytes(b"b" * 1000)
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert F.file_digest(f) != first


# -- 5/7. locks -------------------------------------------------------------------------------------------------
def test_every_command_locks_its_out(capsys, world, tmp_path):
    out = tmp_path / "ft"
    out.mkdir()
    fd = lock_file(out)
    try:
        for argv in (["finetune", "--model", world["pre"], "--task", world["task"], *FT],
                     ["score", "--model", world["clf"], "--task", world["task"], "--method", "magnitude"],
                     ["shrink", "--model", world["clf"], "--mask", world["mask"]]):
            code, _, err = run_cli(capsys, *argv, "--out", out)
            assert "in use by another headcount process" in one_error(code, err)
    finally:
        unlock_file(fd)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]


def test_lock_is_never_followed_through_a_link(capsys, world, tmp_path):
    from headcount.experiments.runner.store import RunStore

    victim = tmp_path / "victim.txt"
    victim.write_text("do not touch\n")
    for d in (tmp_path / "run", tmp_path / "s"):
        d.mkdir()
        (d / LOCK_NAME).symlink_to(victim)
    with pytest.raises(HeadcountError, match="symbolic link"):
        RunStore(tmp_path / "run").lock()
    code, _, err = run_cli(capsys, "score", "--model", world["clf"], "--task", world["task"], "--method", "magnitude",
                           "--out", tmp_path / "s")
    assert "symbolic link" in one_error(code, err)
    hard = tmp_path / "h"
    hard.mkdir()
    os.link(victim, hard / LOCK_NAME)
    with pytest.raises(HeadcountError, match="other links"):
        RunStore(hard).lock()
    assert victim.read_text() == "do not touch\n"


# -- 6. outputs appear together or not at all ---------------------------------------------------------------------
def test_a_failed_write_leaves_the_earlier_set_intact(capsys, world, tmp_path, monkeypatch):
    out = tmp_path / "s"
    assert run_cli(capsys, "score", "--model", world["clf"], "--task", world["task"], "--method", "magnitude",
                   "--out", out)[0] == 0
    before = snapshot(out)
    import headcount.analysis.plots

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "heads.png"))

    monkeypatch.setattr(headcount.analysis.plots, "head_heatmap", full_disk)
    code, _, err = run_cli(capsys, "score", "--model", world["clf"], "--task", world["task"], "--method", "entropy",
                           "--max-examples", "8", "--out", out, "--force")
    assert "no space left" in one_error(code, err)
    assert snapshot(out) == before  # scores.json was not replaced without heads.png


# -- 10. inputs that were accepted and should not be ---------------------------------------------------------------
def test_empty_strings_and_out_of_range_values_are_refused(capsys, world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv, needle in ((["info", "--model", ""], "--model must not be empty"),
                         (["score", "--out", "", "--method", "magnitude"], "--out must not be empty"),
                         (["score", "--out=", "--method", "magnitude"], "--out must not be empty"),
                         (["magnitude", "--threshold", "2", "--out", "m"], "--threshold must be in [0, 1]")):
        code, _, err = run_cli(capsys, *argv)
        assert needle in one_error(code, err)
    assert list(tmp_path.iterdir()) == []


def test_a_finished_magnitude_run_is_not_replaced_by_a_bad_threshold(capsys, world, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "weight_mask.safetensors").write_bytes(b"earlier")
    before = snapshot(out)
    code, _, err = run_cli(capsys, "magnitude", "--model", world["pre"], "--task", world["task"], "--threshold", "2",
                           "--out", out)
    one_error(code, err)
    assert snapshot(out) == before


def test_study_seed_below_zero_is_refused(tmp_path):
    from headcount.experiments import CONFIGS
    from headcount.experiments.runner.config import load_study_config

    text = (CONFIGS / "demo.yaml").read_text()
    assert "seeds: [1]" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("seeds: [1]", "seeds: [-1]"))
    with pytest.raises(HeadcountError, match="seed must be >= 0"):
        load_study_config(bad)


def test_index_weight_map_outside_the_checkpoint_is_refused(capsys, world, tmp_path):
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(world["clf"], ck)
    (ck / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"bert.pooler.dense.weight": "../../other/model.safetensors"}}))
    code, _, err = run_cli(capsys, "info", "--model", ck)
    assert "not a file inside" in one_error(code, err)


# -- 9. corrupt run-directory files under `report` and `study` ------------------------------------------------
TOY = "study: toy_study:toy\nvalues: [1, 2]\nsteps: 2\nfactor: 2.0\n"


@pytest.mark.parametrize("victim", ["manifest.json", "plan.json", "result.json", "meta.json"])
def test_corrupt_run_files_are_one_error_line(capsys, tmp_path, victim):
    import toy_study  # noqa: F401  (registers the toy study type)

    config = tmp_path / "toy.yaml"
    config.write_text(TOY)
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "study", config, "--out", run, "--quiet")
    assert code == 0, err
    targets = {"manifest.json": [run / "manifest.json"], "plan.json": [run / "plan.json"],
               "result.json": sorted(run.glob("jobs/*/result.json")), "meta.json": sorted(run.glob("jobs/*/meta.json"))}
    target = targets[victim][0]
    target.write_bytes(b"\xff{not json")
    before = {k: v for k, v in snapshot(run).items() if k.startswith("jobs/")}
    codes = {}
    for argv in (["report", run], ["study", config, "--out", run, "--quiet"]):
        code, _, err = run_cli(capsys, *argv)
        codes[argv[0]] = code
        assert "internal error" not in err and "Traceback" not in err, err
        if code != 0:  # a file the command needs: one line naming it; else it was not needed or rebuilt
            assert "corrupt" in one_error(code, err) and target.name in err
    if victim != "plan.json":  # plan.json is rebuilt from the config; the others are needed by the report
        assert codes["report"] == 2
    assert {k: v for k, v in snapshot(run).items() if k.startswith("jobs/")} == before  # results untouched


def test_hub_retry_warnings_are_silenced(capsys):
    import logging

    from huggingface_hub.utils import logging as hub_logging

    hub_logging.set_verbosity_warning()
    run_cli(capsys, "info", "--model", "")
    assert hub_logging.get_verbosity() == logging.ERROR


@pytest.mark.slow
def test_magnitude_killed_in_a_checkpoint_resumes_and_matches(capsys, world, tmp_path):
    args = ["magnitude", "--model", world["pre"], "--task", world["task"], *FT, "--epochs", "1", "--sparsity", "0.5"]
    r = child([*args, "--out", str(tmp_path / "a")])
    assert r.returncode == 0, r.stderr
    out = tmp_path / "b"
    r = child([*args, "--out", str(out)], env={"KILL_POINT": "checkpoint", "KILL_STEP": "4"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert list((out / "full" / "checkpoints").glob(".headcount-tmp.*.checkpoint-4.save/checkpoint-4"))  # partial
    code, _, err = run_cli(capsys, *args, "--out", out)
    assert code == 0, err
    a, b = (json.loads((d / "magnitude.json").read_text()) for d in (tmp_path / "a", out))
    for k in ("full_metric", "metric", "sparsity", "pruned", "total", "round"):
        assert a[k] == b[k], k
    from headcount.importance.magnitude import load_weight_mask

    ma, mb = load_weight_mask(tmp_path / "a"), load_weight_mask(out)
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


def test_api_save_never_deletes_a_folder_it_did_not_write(tmp_path):
    from headcount.core.masks import Mask
    from headcount.core.models import load_model
    from headcount.core.surgery import save_pruned, shrink

    v = tmp_path / "v"
    v.mkdir()
    (v / "notes.txt").write_text("precious\n")
    model = load_model(str(make_checkpoint(tmp_path / "pre")), head="base")
    shrink(model, Mask.full(2, 4).without_heads([(0, 1)]))
    with pytest.raises(HeadcountError, match="notes.txt"):
        save_pruned(model, v)
    assert (v / "notes.txt").read_text() == "precious\n" and sorted(p.name for p in tmp_path.iterdir()) == ["pre", "v"]
    save_pruned(model, tmp_path / "w")
    save_pruned(model, tmp_path / "w")  # an earlier version of the same output is replaced


def test_ctrl_c_in_a_study_exits_130_and_the_same_command_resumes(capsys, tmp_path, monkeypatch):
    import toy_study

    config = tmp_path / "toy.yaml"
    config.write_text(TOY)
    run = tmp_path / "run"
    real = toy_study._side_effects

    def press_ctrl_c(label):
        if label == "make-2":
            raise KeyboardInterrupt
        real(label)

    monkeypatch.setattr(toy_study, "_side_effects", press_ctrl_c)
    code, _, err = run_cli(capsys, "study", config, "--out", run, "--quiet")
    line = one_error(code, err, status=130)
    assert "interrupted" in line and str(run) in line
    kept = {p.name for p in (run / "jobs").iterdir() if not p.name.startswith(".")}
    assert kept  # make-1 finished and is kept
    monkeypatch.setattr(toy_study, "_side_effects", real)
    code, out, err = run_cli(capsys, "study", config, "--out", run, "--quiet")
    assert code == 0, err
    assert f"{len(kept)} reused" in out


def test_a_file_rewritten_in_place_with_its_mtime_restored_is_hashed_again(tmp_path, monkeypatch):
    import headcount.data.fingerprint as F
    import headcount.runtime.digests as D

    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(D, "_MEMORY", {})
    monkeypatch.setattr(D, "_DISK", None)
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"a" * (2 << 20))  # > 1 MiB: remembered on disk too
    st = os.stat(f)
    first = F.file_digest(f)
    assert (tmp_path / "cache" / "digests.json").is_file()
    # the same size, inode and mtime, other content: only the inode change time tells
    with open(f, "r+b") as fh:
        fh.write(b"b" * 10)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    while os.stat(f).st_ctime_ns == st.st_ctime_ns:  # a coarse clock (older kernels): wait for the next tick
        time.sleep(0.01)
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(f)
    assert (now.st_size, now.st_ino, now.st_mtime_ns) == (st.st_size, st.st_ino, st.st_mtime_ns)
    expected = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
    assert first != expected and F.file_digest(f) == expected  # this process's cache
    monkeypatch.setattr(D, "_MEMORY", {})
    monkeypatch.setattr(D, "_DISK", None)
    assert F.file_digest(f) == expected  # a later process, through digests.json
