"""``bench/bench_kv_peers.py`` end to end in ``--quick`` mode on a saved tiny Llama (3 layers, 4 query
heads on 2 KV heads of 8) with the niah test tokenizer: the headcount half (prompts split into
context and question, scores, budgets, measured bytes) and, where ``make kvpress`` built its venv,
the kvpress half on the same token ids; the table's rows, resuming, and bad input in one line.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from niah_helpers import save_niah_checkpoint, write_niah_task

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_kv_peers.py"
KVPRESS = Path(os.environ.get("HEADCOUNT_KVPRESS", Path.home() / ".cache" / "headcount-kvpress")).expanduser()
#: the tiny tokenizer takes 512 positions: prompts of 128 tokens, streaming heads of 4 + 16 slots
TINY = ["--quick", "--length", "128", "--score-length", "96", "--sink", "4", "--window", "16", "--require-full", "0"]


def bench(*args: str, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("kvpeers")
    model = save_niah_checkpoint(root / "llama")
    task = write_niah_task(root / "task", lengths=[60], examples=3)
    return root, model, task


def rows_of(out: Path) -> dict:
    with open(out / "table.csv") as f:
        return {(r["method"], float(r["kept_target"])): r for r in csv.DictReader(f)}


@pytest.fixture(scope="module")
def headcount_only(setup):
    root, model, task = setup
    out = root / "hc"
    done = bench(*TINY, "--model", str(model), "--task", str(task), "--out", str(out),
                 env={"HEADCOUNT_KVPRESS": str(root / "no-kvpress")})
    return out, done


def test_headcount_half_rows_and_measured_bytes(headcount_only):
    out, done = headcount_only
    assert done.returncode == 0, done.stderr
    assert "make kvpress" in done.stderr  # the kvpress half is left out, and says how to get it
    rows = rows_of(out)
    assert set(rows) == {("full", 1.0), ("hc-retrieval", 0.5), ("hc-retrieval", 0.25), ("hc-uniform", 0.5),
                         ("hc-uniform", 0.25)}
    assert all(int(r["n"]) == 3 for r in rows.values())
    assert float(rows[("full", 1.0)]["kept_measured"]) == 1.0
    for kept in (0.5, 0.25):  # the cache's real bytes: below the target, not above (a few question slots)
        for method in ("hc-retrieval", "hc-uniform"):
            measured = float(rows[(method, kept)]["kept_measured"])
            assert 0.1 < measured < kept + 0.02, (method, kept, measured)
    assert float(rows[("hc-retrieval", 0.25)]["kept_measured"]) < float(rows[("hc-retrieval", 0.5)]["kept_measured"])
    prompts = json.loads((out / "prompts.json").read_text())
    assert len(prompts["prompts"]) == 3
    for p in prompts["prompts"]:  # the question is split off the context, and is short
        assert p["context_ids"] and 0 < len(p["question_ids"]) < 20 and p["target_ids"]
    assert (out / "table.md").read_text().startswith("| method |")


def test_rerun_skips_done_results_and_refuses_other_settings(setup, headcount_only):
    root, model, task = setup
    out, _ = headcount_only
    again = bench(*TINY, "--model", str(model), "--task", str(task), "--out", str(out),
                  env={"HEADCOUNT_KVPRESS": str(root / "no-kvpress")})
    assert again.returncode == 0, again.stderr
    assert "headcount side: 0 runs to do" in again.stderr
    other = bench(*TINY, "--prompts", "4", "--model", str(model), "--task", str(task), "--out", str(out))
    assert other.returncode == 2
    assert other.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in other.stderr


def test_bad_method_is_one_error_line(setup, tmp_path):
    _, model, task = setup
    done = bench(*TINY, "--methods", "full,nonesuch", "--model", str(model), "--task", str(task), "--out",
                 str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip().splitlines()[-1]]
    assert "nonesuch" in done.stderr


@pytest.mark.skipif(not (KVPRESS / "bin" / "python").is_file(),
                    reason=f"no kvpress venv in {KVPRESS}: run `make kvpress`")
def test_kvpress_half_on_the_same_ids(setup):
    root, model, task = setup
    out = root / "both"
    methods = "full,hc-retrieval,kvpress-none,kvpress-snapkv,kvpress-duo-attention,kvpress-adakv-snapkv"
    done = bench(*TINY, "--methods", methods, "--model", str(model), "--task", str(task), "--out", str(out),
                 env={"HEADCOUNT_KVPRESS": str(KVPRESS)})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = rows_of(out)
    # kvpress's transformers on the same checkpoint and ids: the full cache's answer loss, to float noise
    assert abs(float(rows[("kvpress-none", 1.0)]["answer_loss"]) - float(rows[("full", 1.0)]["answer_loss"])) < 1e-3
    for kept in (0.5, 0.25):
        snap = float(rows[("kvpress-snapkv", kept)]["kept_measured"])  # really evicted: about 1 - compression_ratio
        assert kept - 0.02 < snap < kept + 0.15, (kept, snap)
        for masking in ("kvpress-duo-attention", "kvpress-adakv-snapkv"):  # masks only: the cache keeps everything
            r = rows[(masking, kept)]
            assert r["masks_only"] == "True" and float(r["kept_measured"]) == 1.0
            assert 0 < float(r["kept_attended"]) < 1
    # DuoAttention streams as many KV heads as headcount's retrieval budget: fewer attended at 0.25
    assert float(rows[("kvpress-duo-attention", 0.25)]["kept_attended"]) < \
        float(rows[("kvpress-duo-attention", 0.5)]["kept_attended"])


def test_a_budget_with_full_prefill_holds_the_same_bytes(setup):
    """``NAME+full-prefill``: the same budget, its streaming heads prefilled with full attention and
    evicted after (as kvpress prefills): the same measured bytes, another run of the prompts."""
    root, model, task = setup
    out = root / "prefill"
    done = bench(*TINY, "--methods", "full,hc-uniform,hc-uniform+full-prefill", "--model", str(model), "--task",
                 str(task), "--out", str(out), env={"HEADCOUNT_KVPRESS": str(root / "no-kvpress")})
    assert done.returncode == 0, done.stderr
    rows = rows_of(out)
    for kept in (0.5, 0.25):
        masked, full = rows[("hc-uniform", kept)], rows[("hc-uniform+full-prefill", kept)]
        assert full["kept_measured"] == masked["kept_measured"] and full["side"] == "headcount"
        assert int(full["n"]) == 3
