"""`headcount kv-eval` end to end on a saved tiny Llama (3 layers, 4 query heads on 2 KV heads of 8)
and a tiny generated niah task: one row per method (the budget, the full cache, the uniform window
and random full KV heads), each one's measured bytes as its budget predicts, the baselines at the
budget's memory, the paired tests' p-values, progress on stderr only, the output headcount's, and
bad input in one ``error:`` line with exit 2.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import assert_one_error_line, run_cli
from niah_helpers import save_niah_checkpoint, write_niah_task

from headcount.analysis.kv_methods import COLUMNS, wilson_interval
from headcount.kv.budget import KVBudget
from headcount.runtime.record import Record

LAYERS, KV, DIM = 3, 2, 8
CONTEXT, SINK, WINDOW = 72, 4, 8
SLOT = 2 * DIM * 4  # bytes of one cached token of one KV head (keys and values, float32)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("kveval")
    model = save_niah_checkpoint(root / "llama")
    task = write_niah_task(root / "task", lengths=[60], examples=3)
    return root, model, task


@pytest.fixture(scope="module")
def evaluated(setup, tmp_path_factory):
    import contextlib
    import io

    from headcount.cli.app import main  # capsys is function-scoped: this module-scoped run captures by hand

    root, model, task = setup
    budget_dir = root / "budget"
    assert main(["kv-budget", "--model", str(model), "--random", "3", "--memory", "0.5", "--context", str(CONTEXT),
                 "--sink", str(SINK), "--window", str(WINDOW), "--out", str(budget_dir)]) in (0, None)
    out, stdout, stderr = root / "eval", io.StringIO(), io.StringIO()
    # progress lines from the first moment (a tiny model's steps end within the quiet time)
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), pytest.MonkeyPatch.context() as mp:
        mp.setattr("headcount.runtime.progress.QUIET_S", 0.0)
        try:
            code = main(["kv-eval", "--model", str(model), "--budget", str(budget_dir / "budget.json"), "--task",
                         str(task), "--context", str(CONTEXT), "--lm-texts", "2", "--max-new-tokens", "4",
                         "--out", str(out)])
        except SystemExit as e:
            code = e.code
    return KVBudget.load(budget_dir / "budget.json"), out, code or 0, stdout.getvalue(), stderr.getvalue()


def test_one_row_per_method_each_measured_as_its_budget_predicts(evaluated):
    budget, out, code, stdout, err = evaluated
    assert code == 0, err
    rows = pd.read_csv(out / "kv-eval.csv").set_index("method")
    assert list(rows.columns) == list(COLUMNS[1:])
    assert list(rows.index) == ["budget", "full", "uniform", "random"]
    assert (rows["kv_bytes"] == rows["kv_bytes_predicted"]).all()
    assert rows.loc["budget", "kv_bytes"] == budget.kv_bytes(CONTEXT)
    assert rows.loc["full", "kv_bytes"] == LAYERS * KV * CONTEXT * SLOT == rows.loc["full", "full_cache_bytes"]
    assert rows.loc["full", "kv_bytes"] > rows.loc["budget", "kv_bytes"]
    # random: as many full KV heads, the same sink and window: the same bytes; uniform: the widest
    # window within them, less than one token per KV head below
    assert rows.loc["random", "kv_bytes"] == rows.loc["budget", "kv_bytes"]
    assert rows.loc["random", "n_full"] == budget.n_full > 0 and rows.loc["uniform", "n_full"] == 0
    gap = rows.loc["budget", "kv_bytes"] - rows.loc["uniform", "kv_bytes"]
    assert 0 <= gap < LAYERS * KV * SLOT
    # the full cache ends a generation holding every token; a streaming one at most sink + window each
    assert rows.loc["full", "kv_bytes_end"] > rows.loc["uniform", "kv_bytes_end"]
    assert rows.loc["uniform", "kv_bytes_end"] <= rows.loc["uniform", "kv_bytes"]


def test_the_intervals_and_the_paired_tests(evaluated):
    _, out, code, _, err = evaluated
    assert code == 0, err
    rows = pd.read_csv(out / "kv-eval.csv").set_index("method")
    assert (rows["n_needles"] == 3).all() and (rows["n_lm_texts"] == 2).all()
    for name, r in rows.iterrows():
        low, high = wilson_interval(round(r["needle_accuracy"] * 3), 3)
        assert (r["needle_low"], r["needle_high"]) == pytest.approx((low, high))
        assert r["needle_low"] <= r["needle_accuracy"] <= r["needle_high"]
        assert math.isfinite(r["lm_loss"]) and math.isfinite(r["prefill_s"]) and math.isfinite(r["decode_s_per_token"])
        for p in ("p_vs_full", "p_vs_uniform"):
            if (name, p) in {("full", "p_vs_full"), ("uniform", "p_vs_uniform")}:
                assert math.isnan(r[p])
            else:
                assert 0 <= r[p] <= 1
    assert rows.loc["full", "kv_ratio"] == 1.0


def test_the_table_on_stdout_progress_on_stderr_and_the_output_headcounts(evaluated):
    _, out, code, stdout, err = evaluated
    assert code == 0, err
    assert "kv-eval:" in err and "elapsed" in err
    assert "kv-eval:" not in stdout and "ETA" not in stdout
    assert stdout.splitlines()[0].startswith("method") and "p vs full" in stdout
    assert [line.split()[0] for line in stdout.splitlines()[1:5]] == ["budget", "full", "uniform", "random"]
    assert (out / "kv-eval.png").read_bytes()[:4] == b"\x89PNG"
    assert {"kv-eval.csv", "kv-eval.png"} <= set(Record.read(out).files)


def _bad_budget(tmp_path: Path) -> Path:
    return KVBudget.full_cache(LAYERS + 1, 4, KV, DIM).save(tmp_path / "budget.json")


@pytest.mark.parametrize("case", ["layout", "missing", "context", "task", "prefill"])
def test_bad_input_is_one_error_line(capsys, setup, tmp_path, case):
    _, model, task = setup
    good = KVBudget.full_cache(LAYERS, 4, KV, DIM).save(tmp_path / "good.json")
    args = {"layout": ["--budget", _bad_budget(tmp_path)], "missing": ["--budget", tmp_path / "nope.json"],
            "context": ["--budget", good, "--context", 600], "task": ["--budget", good, "--task", "offline/movies"],
            "prefill": ["--budget", good, "--prefill", "lazy"]}
    code, stdout, err = run_cli(capsys, "kv-eval", "--model", model, "--task", task, *args[case],
                                "--out", tmp_path / "o")
    assert_one_error_line(code, err)
    assert not (tmp_path / "o").exists()


def test_full_prefill_keeps_the_budgets_bytes_and_is_recorded(setup, evaluated, capsys, tmp_path):
    """``--prefill full``: the same methods, each holding the bytes its budget predicts (the rule changes
    how a prompt's streaming heads attend, not what the cache keeps); the output's identity names it."""
    budget, masked_out, _, _, _ = evaluated
    root, model, task = setup
    code, stdout, err = run_cli(capsys, "kv-eval", "--model", model, "--budget", root / "budget" / "budget.json",
                                "--task", task, "--context", CONTEXT, "--lm-texts", "2", "--max-new-tokens", "4",
                                "--prefill", "full", "--out", tmp_path / "full")
    assert code == 0, err
    full, masked = pd.read_csv(tmp_path / "full" / "kv-eval.csv"), pd.read_csv(masked_out / "kv-eval.csv")
    assert list(full["method"]) == list(masked["method"])
    assert list(full["kv_bytes"]) == list(masked["kv_bytes"])
    assert Record.read(tmp_path / "full").identity != Record.read(masked_out).identity


def test_a_generated_tasks_prompts_fill_the_budgets_context(setup, evaluated, capsys, tmp_path):
    """Without --context the budget's context sets a generated task's prompt length (context -
    max-new-tokens), as with --context: prompts of the task's own 30 tokens would leave the uniform
    window nothing to evict. Seen in the full cache's bytes when its generation ended."""
    from niah_helpers import write_niah_task

    root, model, _ = setup
    short = write_niah_task(tmp_path / "short", lengths=[30], examples=3)
    code, stdout, err = run_cli(capsys, "kv-eval", "--model", model, "--budget", root / "budget" / "budget.json",
                                "--task", short, "--lm-texts", "1", "--max-new-tokens", "4", "--no-random",
                                "--out", tmp_path / "o")
    assert code == 0, err
    full = pd.read_csv(tmp_path / "o" / "kv-eval.csv").set_index("method").loc["full"]
    tokens = full["kv_bytes_end"] / (SLOT * KV * LAYERS)
    assert 40 < tokens <= CONTEXT, tokens
