"""`headcount score` and `headcount prune` end to end on a tiny classifier and a local task."""

from __future__ import annotations

import csv
import json

import pytest
from cli_helpers import run_cli
from training_helpers import make_checkpoint, make_task, one_thread


@pytest.fixture(scope="module", autouse=True)
def _one_thread(tmp_path_factory):
    yield from one_thread(tmp_path_factory)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyse")
    ckpt = make_checkpoint(root / "clf", head="classification")
    task = make_task(root / "task")
    return ckpt, task


def run(args, capsys):
    return run_cli(capsys, *args)


def test_score_writes_contract_files(setup, tmp_path, capsys):
    ckpt, task = setup
    code, out, err = run(["score", "--model", str(ckpt), "--task", str(task), "--max-examples", "64",
                          "--batch-size", "16", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    s = json.loads((tmp_path / "scores.json").read_text())
    assert len(s["heads"]) == 2 and len(s["heads"][0]) == 4 and len(s["mlps"]) == 2
    assert s["method"] == "gradient" and s["normalize"] == "none" and s["objective"] == "task"
    assert s["n_examples"] == 64 and s["n_tokens"] > 64
    assert s["model"] == str(ckpt) and s["task"] == "has-good" and s["head"] == "checkpoint"
    assert any(v > 0 for row in s["heads"] for v in row)
    assert (tmp_path / "heads.png").stat().st_size > 1000


def test_score_prints_progress_lines_to_a_non_terminal_stderr(setup, tmp_path, capsys, monkeypatch):
    """Scoring's progress (examples done / total) goes to stderr as plain lines (capsys: not a
    terminal), the first and the final one; stdout holds none of it (before: no progress at all).
    The quiet time is 0 here: a tiny model's scoring ends within it (and then prints nothing)."""
    monkeypatch.setattr("headcount.runtime.progress.QUIET_S", 0.0)
    ckpt, task = setup
    code, out, err = run(["score", "--model", str(ckpt), "--task", str(task), "--max-examples", "32",
                          "--batch-size", "8", "--method", "ablation", "--out", str(tmp_path / "a")], capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("scoring (ablation): ")]
    assert lines[0] == "scoring (ablation): 0/8 heads" and lines[-1].startswith("scoring (ablation): 8/8 heads (100%)")
    assert "\r" not in err and "scoring (" not in out
    code, out, err = run(["score", "--model", str(ckpt), "--task", str(task), "--max-examples", "32",
                          "--batch-size", "8", "--out", str(tmp_path / "g")], capsys)
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("scoring (gradient): ")]
    assert lines[0] == "scoring (gradient): 0/32 examples", err
    assert lines[-1].startswith("scoring (gradient): 32/32 examples (100%), ") and "examples/s" in lines[-1]
    assert "scoring (" not in out


def test_score_timing_line_only_when_asked(setup, tmp_path, capsys, monkeypatch):
    """``HEADCOUNT_TIMING=1``: one ``timing:`` line of the phases (the bench reads it); else none,
    and the same files either way."""
    ckpt, task = setup
    args = ["score", "--model", str(ckpt), "--task", str(task), "--max-examples", "16", "--batch-size", "8"]
    code, out, err = run([*args, "--out", str(tmp_path / "plain")], capsys)
    assert code == 0, err
    assert "timing:" not in out + err
    monkeypatch.setenv("HEADCOUNT_TIMING", "1")
    code, out, err = run([*args, "--out", str(tmp_path / "timed")], capsys)
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("timing:")]
    assert len(lines) == 1, out
    for phase in ("imports", "load", "data", "score", "write", "total"):
        assert f" {phase} " in lines[0], lines[0]
    plain, timed = (json.loads((tmp_path / d / "scores.json").read_text()) for d in ("plain", "timed"))
    assert plain["heads"] == timed["heads"] and plain["mlps"] == timed["mlps"]


def test_score_mlm_objective_fits_a_head(setup, tmp_path, capsys, monkeypatch):
    ckpt, task = setup
    code, out, err = run(["score", "--model", str(ckpt), "--task", str(task), "--objective", "mlm",
                          "--max-examples", "32", "--normalize", "layer+global", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert "fitted" in out
    s = json.loads((tmp_path / "scores.json").read_text())
    assert s["objective"] == "mlm" and s["head"] == "fitted"
    assert max(max(r) for r in s["heads"]) == pytest.approx(1.0)
    assert min(min(r) for r in s["heads"]) == pytest.approx(0.0)


def test_prune_stops_at_threshold(setup, tmp_path, capsys):
    ckpt, task = setup
    code, out, err = run(["prune", "--model", str(ckpt), "--task", str(task), "--threshold", "0.95",
                          "--step", "0.25", "--step-of", "total", "--mlps", "--max-examples", "64",
                          "--max-eval-examples", "64", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    mask = json.loads((tmp_path / "mask.json").read_text())
    rows = list(csv.DictReader((tmp_path / "trace.csv").open()))
    assert rows[0]["phase"] == "full"
    full = float(rows[0]["metric"])
    accepted = [r for r in rows if r["accepted"] == "True"]
    assert all(float(r["metric"]) >= 0.95 * full - 1e-9 for r in accepted)
    assert int(accepted[-1]["heads_kept"]) == mask["n_heads_kept"] == sum(map(sum, mask["heads"]))
    assert mask["threshold"] == 0.95 and mask["full_metric"] == pytest.approx(full)
    assert (tmp_path / "curve.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--threshold", "0"], "threshold"),
    (["--threshold", "1.5"], "threshold"),
    (["--max-examples", "0"], "max-examples"),
    (["--objective", "nope"], "objective"),
    (["--method", "entropy"], "cannot drive pruning"),
])
def test_prune_bad_input(setup, tmp_path, capsys, args, message):
    ckpt, task = setup
    code, out, err = run(["prune", "--model", str(ckpt), "--task", str(task), *args, "--out", str(tmp_path)], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "mask.json").exists()


def test_score_bad_input(setup, tmp_path, capsys):
    ckpt, task = setup
    for args, message in ((["--max-examples", "0"], "max-examples"), (["--method", "nope"], "method"),
                          (["--normalize", "x"], "normalisation"), (["--split", "nope"], "split"),
                          (["--task", "offline/moveis"], "offline/movies")):
        code, out, err = run(["score", "--model", str(ckpt), "--task", str(task), *args, "--out", str(tmp_path)],
                             capsys)
        assert code == 2, (args, err)
        assert err.strip().startswith("error:") and message in err and len(err.strip().splitlines()) == 1
