"""`headcount kv-budget` end to end on a saved tiny Llama (3 layers, 4 query heads on 2 KV heads
of 8): the full KV heads are the best-scored ones, as many as the memory target allows (checked
against a brute-force count written here), pooled by max over a group's query heads unless the
scores give ``kv_groups``; the random and uniform baselines at the same memory; the output is
headcount's (its record), and bad input gives one ``error:`` line and exit 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_error_line, run_cli
from conftest import save_tiny, tiny_model

from headcount.kv.budget import KVBudget
from headcount.kv.cache import apply_kv_budget
from headcount.runtime.record import Record

LAYERS, HEADS, KV, DIM = 3, 4, 2, 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny(tiny_model("llama", head="lm"), tmp_path_factory.mktemp("m") / "llama")


def write_scores(path: Path, heads, model_dir=None, kv_groups=None) -> Path:
    d = {"heads": heads, "method": "test", "objective": "lm"}
    if model_dir is not None:
        d["model"] = str(model_dir)
    if kv_groups is not None:
        d["kv_groups"] = kv_groups
    path.write_text(json.dumps(d))
    return path


def n_full_brute_force(memory: float, context: int, sink: int, window: int, n: int = LAYERS * KV) -> int:
    """The most full KV heads whose cache (the rest keeping min(context, sink + window) tokens)
    stays within ``memory`` of the full cache."""
    for k in range(n, -1, -1):
        if k * context + (n - k) * min(context, sink + window) <= memory * n * context + 1e-9:
            return k
    return -1


def budget_of(out: Path) -> tuple[KVBudget, dict]:
    doc = json.loads((out / "budget.json").read_text())
    return KVBudget.from_dict(doc), doc


HEAD_SCORES = [[0.1, 0.8, 0.3, 0.2], [0.5, 0.0, 0.9, 0.05], [0.6, 0.65, 0.7, 0.1]]
#: max over each group's 2 query heads, ranked: (1, 1) 0.9, (0, 0) 0.8, (2, 1) 0.7, (2, 0) 0.65, (1, 0) 0.5, (0, 1) 0.3
RANKED = [(1, 1), (0, 0), (2, 1), (2, 0), (1, 0), (0, 1)]


@pytest.mark.parametrize("memory, context, sink, window", [(0.5, 64, 4, 8), (0.3, 64, 2, 10), (0.9, 100, 4, 16),
                                                           (0.2, 64, 4, 8), (1.0, 32, 0, 4)])
def test_the_best_scored_kv_heads_keep_the_full_cache_within_the_target(capsys, model_dir, tmp_path, memory,
                                                                          context, sink, window):
    scores = write_scores(tmp_path / "scores.json", HEAD_SCORES, model_dir)
    out = tmp_path / "b"
    code, stdout, err = run_cli(capsys, "kv-budget", "--scores", scores, "--memory", memory, "--context", context,
                                "--sink", sink, "--window", window, "--out", out)
    assert code == 0, err
    budget, doc = budget_of(out)
    k = n_full_brute_force(memory, context, sink, window)
    assert budget.n_full == k and doc["n_full"] == k
    assert {(layer, h) for layer in range(LAYERS) for h in range(KV) if budget.full[layer][h]} == set(RANKED[:k])
    for layer in range(LAYERS):
        for h in range(KV):
            assert (budget.sink[layer][h], budget.window[layer][h]) == ((None, None) if budget.full[layer][h]
                                                                        else (sink, window))
    used = 2 * DIM * 4 * (k * context + (LAYERS * KV - k) * min(context, sink + window))
    full = 2 * DIM * 4 * LAYERS * KV * context
    assert doc["bytes"] == {"context": context, "batch": 1, "dtype": "float32", "full_cache": full, "budget": used,
                            "ratio": used / full}
    assert used <= memory * full
    assert doc["made_from"]["pooling"] == "max" and doc["made_from"]["model"] == str(model_dir)
    assert doc["made_from"]["scores"] == str(scores) and doc["made_from"]["method"] == "test"
    assert f"{k} of 6 KV heads keep the full cache" in stdout
    assert "budget.json" in Record.read(out).files


def test_kv_groups_are_used_when_the_scores_give_them(capsys, model_dir, tmp_path):
    # the per-query-head maximum would choose (1, 1) and (0, 0); the KV-head scores say (2, 0) and (0, 1)
    kv = [[0.0, 0.6], [0.1, 0.2], [0.9, 0.3]]
    scores = write_scores(tmp_path / "scores.json", HEAD_SCORES, model_dir, kv_groups=kv)
    code, _, err = run_cli(capsys, "kv-budget", "--scores", scores, "--memory", 0.5, "--context", 64, "--sink", 4,
                           "--window", 8, "--out", tmp_path / "b")
    assert code == 0, err
    budget, doc = budget_of(tmp_path / "b")
    assert budget.full == [[False, True], [False, False], [True, False]]
    assert doc["made_from"]["pooling"] == "kv_groups" and doc["made_from"]["kv_scores"] == kv


def test_non_finite_scores_rank_last(capsys, model_dir, tmp_path):
    heads = [[float("nan")] * 4, [0.5, 0.0, 0.9, 0.05], [0.6, 0.65, 0.7, 0.1]]
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps({"heads": heads, "model": str(model_dir)}).replace("NaN", "null"))
    code, out, err = run_cli(capsys, "kv-budget", "--scores", scores, "--memory", 0.8, "--context", 64, "--sink", 4,
                             "--window", 8, "--out", tmp_path / "b")
    assert code == 0, err
    budget, _ = budget_of(tmp_path / "b")
    assert budget.n_full == 4 and budget.full[0] == [False, False]
    assert "2 KV-head scores are not finite" in out


def test_the_random_baseline_keeps_as_many_full_heads_seeded(capsys, model_dir, tmp_path):
    args = ["--model", model_dir, "--memory", 0.5, "--context", 64, "--sink", 4, "--window", 8]
    chosen = {}
    for seed in range(6):
        code, _, err = run_cli(capsys, "kv-budget", *args, "--random", seed, "--out", tmp_path / f"r{seed}")
        assert code == 0, err
        budget, doc = budget_of(tmp_path / f"r{seed}")
        assert budget.n_full == n_full_brute_force(0.5, 64, 4, 8) and doc["made_from"]["seed"] == seed
        chosen[seed] = budget.full
    code, _, _ = run_cli(capsys, "kv-budget", *args, "--random", 0, "--out", tmp_path / "again")
    assert budget_of(tmp_path / "again")[0].full == chosen[0]  # the same seed, the same heads
    assert len({json.dumps(c) for c in chosen.values()}) > 1  # other seeds, other heads


@pytest.mark.parametrize("memory, context, sink", [(0.5, 64, 4), (0.25, 100, 0), (0.13, 64, 8)])
def test_the_uniform_baseline_streams_every_head_as_wide_as_the_target_allows(capsys, model_dir, tmp_path, memory,
                                                                              context, sink):
    code, _, err = run_cli(capsys, "kv-budget", "--model", model_dir, "--uniform", "--memory", memory, "--context",
                           context, "--sink", sink, "--out", tmp_path / "u")
    assert code == 0, err
    budget, doc = budget_of(tmp_path / "u")
    window = math.floor(memory * context) - sink
    assert budget.n_full == 0 and set(sum(budget.window, ())) == {window} and set(sum(budget.sink, ())) == {sink}
    assert doc["bytes"]["budget"] <= memory * doc["bytes"]["full_cache"]
    wider = KVBudget.uniform(LAYERS, HEADS, KV, DIM, sink=sink, window=window + 1)
    assert wider.kv_bytes(context) > memory * wider.full_bytes(context)  # the widest that fits


def test_a_written_budget_applies_to_the_model(capsys, model_dir, tmp_path):
    from headcount.core.models import load_model

    scores = write_scores(tmp_path / "scores.json", HEAD_SCORES, model_dir)
    code, _, err = run_cli(capsys, "kv-budget", "--scores", scores, "--context", 64, "--sink", 2, "--window", 6,
                           "--out", tmp_path / "b")
    assert code == 0, err
    model = load_model(str(model_dir), head="lm")
    budget, doc = budget_of(tmp_path / "b")
    ids = torch.randint(5, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), apply_kv_budget(model, tmp_path / "b" / "budget.json") as cache:
        model(input_ids=ids, cache=cache, use_cache=True)
        assert cache.nbytes() == doc["bytes"]["budget"] == budget.kv_bytes(64)


def test_a_second_run_with_other_settings_needs_force(capsys, model_dir, tmp_path):
    args = ["kv-budget", "--model", model_dir, "--uniform", "--context", 64, "--sink", 4, "--out", tmp_path / "b"]
    assert run_cli(capsys, *args)[0] == 0
    assert run_cli(capsys, *args)[0] == 0  # the same run again
    code, _, err = run_cli(capsys, *args, "--memory", 0.25)
    assert_one_error_line(code, err)
    code, _, err = run_cli(capsys, *args, "--memory", 0.25, "--force")
    assert code == 0, err
    assert budget_of(tmp_path / "b")[1]["made_from"]["memory"] == 0.25


def test_a_file_headcount_does_not_own_is_not_replaced(capsys, model_dir, tmp_path):
    out = tmp_path / "b"
    out.mkdir()
    (out / "budget.json").write_text("mine")
    code, _, err = run_cli(capsys, "kv-budget", "--model", model_dir, "--uniform", "--out", out, "--force")
    assert_one_error_line(code, err)
    assert (out / "budget.json").read_text() == "mine"


# --- bad input: one line, exit 2, nothing written -------------------------------------------------------
def _bad(capsys, tmp_path, *argv) -> str:
    code, _, err = run_cli(capsys, "kv-budget", *argv, "--out", tmp_path / "o")
    assert_one_error_line(code, err)
    assert not (tmp_path / "o").exists()
    return err


def test_a_target_below_the_sinks_is_refused(capsys, model_dir, tmp_path):
    scores = write_scores(tmp_path / "s.json", HEAD_SCORES, model_dir)
    err = _bad(capsys, tmp_path, "--scores", scores, "--memory", 0.1, "--context", 64, "--sink", 4, "--window", 8)
    assert "below the smallest cache" in err and "0.1875" in err  # 12 of 64 tokens per head
    err = _bad(capsys, tmp_path, "--model", model_dir, "--random", 1, "--memory", 0.1, "--context", 64, "--sink", 8)
    assert "below the smallest cache" in err
    err = _bad(capsys, tmp_path, "--model", model_dir, "--uniform", "--memory", 0.05, "--context", 64, "--sink", 4)
    assert "fewer than its --sink 4" in err
    err = _bad(capsys, tmp_path, "--model", model_dir, "--uniform", "--memory", 0.1, "--context", 64, "--sink", 4,
               "--window", 8)
    assert "exceed --memory" in err


@pytest.mark.parametrize("content, why", [
    ("{not json", "corrupt (JSONDecodeError)"), ("\x00\xff", "corrupt (UnicodeDecodeError)"), ("[1, 2]", "not a scores file"),
    ('{"heads": [[1, 2, 3, 4]]}', "3 rows"), ('{"heads": [[1, 2], [1, 2], [1, 2]]}', "must list 4 heads"),
    ('{"heads": [[1, 2, 3, "x"], [1, 2, 3, 4], [1, 2, 3, 4]]}', "must be a number"),
    ('{"heads": [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]], "kv_groups": [[1, 2, 3]]}', "kv_groups"),
])
def test_malformed_scores_are_refused(capsys, model_dir, tmp_path, content, why):
    scores = tmp_path / "s.json"
    scores.write_text(content, encoding="latin-1")
    err = _bad(capsys, tmp_path, "--scores", scores, "--model", model_dir)
    assert why in err


def test_options_that_do_not_go_together_are_refused(capsys, model_dir, tmp_path):
    scores = write_scores(tmp_path / "s.json", HEAD_SCORES)  # names no model
    assert "give --model" in _bad(capsys, tmp_path, "--scores", scores)
    assert "--scores" in _bad(capsys, tmp_path, "--model", model_dir)
    assert "give one" in _bad(capsys, tmp_path, "--model", model_dir, "--uniform", "--random", 1)
    assert "leave --scores out" in _bad(capsys, tmp_path, "--scores", scores, "--model", model_dir, "--uniform")
    assert "is missing" in _bad(capsys, tmp_path, "--scores", tmp_path / "none.json", "--model", model_dir)
    assert "dtype" in _bad(capsys, tmp_path, "--model", model_dir, "--uniform", "--dtype", "int8")
    assert "encoder" in _bad(capsys, tmp_path, "--model", save_tiny(tiny_model("bert"), tmp_path / "bert"), "--uniform")
    assert "checkpoint directory not found" in _bad(capsys, tmp_path, "--model", tmp_path / "nothing", "--uniform")


@pytest.mark.parametrize("arch, overrides", [("gemma3", {}),
                                             ("qwen2", dict(use_sliding_window=True, sliding_window=4,
                                                            max_window_layers=1))])
def test_a_model_with_sliding_window_layers_gets_a_budget_of_its_global_layers(capsys, tmp_path, arch, overrides):
    """The windowed layers keep the model's own window (a fixed cost, said in a second line with the
    bytes the budget could choose among); only the layers that cache every token stream; the budget
    runs on the model (tests/core/test_kvbudget_windows.py checks what it computes)."""
    from headcount.kv.budget import KVBudget, model_windows
    from headcount.kv.cache import apply_kv_budget

    model = tiny_model(arch, head="lm", attn_implementation="eager", **overrides)
    saved = save_tiny(model, tmp_path / arch)
    windows = model_windows(model.config)
    for i, mode in enumerate((["--uniform"], ["--random", 1])):
        out = tmp_path / f"b{i}"
        code, stdout, err = run_cli(capsys, "kv-budget", "--model", saved, *mode, "--memory", 0.8, "--context", 64,
                                    "--sink", 1, "--window", 2, "--out", out)
        assert code == 0, err
        budget = KVBudget.load(out / "budget.json")
        assert budget.model_window == windows
        for layer, w in enumerate(windows):
            if w is not None:  # the model's own window: never streamed
                assert all(s is None for s in budget.sink[layer])
        n = sum(w is not None for w in windows)
        fixed = budget.cached(64)
        per = budget.full_bytes(64) // sum(fixed)
        own = per * sum(c for c, w in zip(fixed, windows) if w is not None)
        assert (f"{n} of {len(windows)} layers attend within their own sliding window (4 tokens): they keep it "
                f"({own:,} bytes at 64 tokens, fixed)") in stdout
        with torch.no_grad(), apply_kv_budget(model, budget) as cache:
            model(input_ids=torch.tensor([[5, 6, 7, 8, 9, 10]]), cache=cache, use_cache=True)
        assert cache.nbytes() == budget.kv_bytes(6)


def test_a_model_whose_every_layer_is_windowed_has_nothing_to_budget(capsys, tmp_path):
    saved = save_tiny(tiny_model("mistral", head="lm", attn_implementation="eager"), tmp_path / "mistral")
    err = _bad(capsys, tmp_path, "--model", saved, "--uniform", "--context", 64)
    assert "every layer of the model attends within a sliding window" in err
