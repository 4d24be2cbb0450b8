"""The KV policy registry (``headcount.kv.policies``): one row per built-in policy, each run on a
tiny Llama (3 layers, 4 query heads on 2 KV heads of 8): the budget fits the model, its bytes
the target, and the model runs under it; the registry holds exactly the files of its folder;
the worked example of docs/extending.md (a random-window policy) runs as the page prints it,
through ``make_budget`` and ``headcount kv-budget --policy``; and ``--policy`` / ``--seed`` take
bad input in one line.
"""

from __future__ import annotations

import json
import pkgutil
import re
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_error_line, run_cli
from conftest import save_tiny, tiny_model

import headcount.kv.policies as policies
from headcount.core.gates import layout
from headcount.kv.budget import KVBudget
from headcount.kv.cache import apply_kv_budget
from headcount.kv.memory import KVBudgetSettings, n_full_allowed
from headcount.kv.policies import get_policy, make_budget, policy_names, unregister_policy
from headcount.kv.policy import BudgetRequest
from headcount.runtime.errors import HeadcountError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
SETTINGS = KVBudgetSettings(memory=0.5, context=64, sink=4, window=8)
#: (layer, KV head) scores of the scores policy: (1, 1) and (0, 0) rank first
KV_SCORES = [[0.8, 0.3], [0.5, 0.9], [0.65, 0.7]]

#: one row per built-in policy: its options, and what its budget keeps given (budget, n_full_allowed)
ROWS = {
    "full": ({}, lambda b, k: b.n_full == b.n_layers * b.n_kv_heads and b.meta["bytes"]["ratio"] == 1.0),
    "scores": ({}, lambda b, k: b.n_full == k and [(0, 0), (1, 1)] == [(i, j) for i, r in enumerate(b.full)
                                                                     for j, f in enumerate(r) if f]),
    "uniform": ({"window": None}, lambda b, k: b.n_full == 0 and b.window[0][0] == 64 // 2 - 4),
    "random": ({"seed": 3}, lambda b, k: b.n_full == k and b.meta["made_from"]["seed"] == 3),
}


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", head="lm")


def request_for(model, name: str, options: dict, settings: KVBudgetSettings = SETTINGS) -> BudgetRequest:
    g = layout(model)
    scores = KV_SCORES if get_policy(name).needs_scores else None
    return BudgetRequest(g.n_layers, g.n_heads, g.n_kv_heads, g.head_dim, settings, kv_scores=scores,
                         options=options, meta={"model": "tiny"})


def run_under(model, budget: KVBudget) -> torch.Tensor:
    """The logits of 20 tokens with the budget's cache (a prefill, then one decoding step)."""
    ids = torch.arange(3, 23)[None]
    with apply_kv_budget(model, budget) as cache, torch.no_grad():
        model(input_ids=ids[:, :-1], cache=cache)
        return model(input_ids=ids[:, -1:], cache=cache).logits


def test_the_registry_holds_one_policy_per_file_of_its_folder_and_each_has_a_row():
    files = {m.name for m in pkgutil.iter_modules(policies.__path__)}
    assert {get_policy(f).name for f in files} == set(ROWS) <= set(policy_names())


@pytest.mark.parametrize("name", sorted(ROWS))
def test_each_policy_makes_a_budget_that_fits_the_model_and_the_target(model, name):
    options, keeps = ROWS[name]
    budget = make_budget(name, request_for(model, name, options))
    budget.check_model(model)
    g = layout(model)
    allowed = n_full_allowed(g.n_layers, g.n_heads, g.n_kv_heads, g.head_dim, SETTINGS)
    assert keeps(budget, allowed), budget.full
    made = budget.meta["made_from"]
    assert made["mode"] == name and made["model"] == "tiny" and made["context"] == SETTINGS.context
    ratio = budget.kv_bytes(64) / budget.full_bytes(64)
    assert ratio == budget.meta["bytes"]["ratio"] and (name == "full" or ratio <= SETTINGS.memory)
    assert KVBudget.from_dict(json.loads(json.dumps(budget.to_dict()))) == budget  # budget.json round trip
    assert torch.isfinite(run_under(model, budget)).all()


def test_make_budget_refuses_what_a_policy_does_not_take(model):
    with pytest.raises(HeadcountError, match="give --scores"):
        make_budget("scores", request_for(model, "uniform", {}))
    with pytest.raises(HeadcountError, match="takes no seed"):
        make_budget("uniform", request_for(model, "uniform", {"seed": 1}))
    with pytest.raises(HeadcountError, match="draws its full KV heads with a seed"):
        make_budget("random", request_for(model, "random", {}))
    with pytest.raises(HeadcountError, match="unknown KV policy 'nope'; choose one of full"):
        get_policy("nope")


def docs_policy() -> str:
    """The code block of docs/extending.md's "A new KV policy" section, as the page prints it."""
    page = DOCS.read_text(encoding="utf-8")
    section = page.split("## A new KV policy", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def random_window():
    """The docs' random-window policy, registered for one test (and gone after it)."""
    code = docs_policy()
    exec(compile(code, str(DOCS), "exec"), {"__name__": "docs_random_window"})
    yield get_policy("random-window")
    unregister_policy("random-window")


def test_the_docs_random_window_policy_is_one_file_that_runs(model, random_window, capsys, tmp_path):
    assert random_window.options == ("seed",) and not random_window.needs_scores
    budget = make_budget("random-window", request_for(model, "random-window", {"seed": 1}))
    budget.check_model(model)
    windows = [w for row in budget.window for w in row]
    assert budget.n_full == 0 and all(4 <= w <= 8 for w in windows) and len(set(windows)) > 1
    assert budget.meta["made_from"]["mode"] == "random-window" and budget.meta["bytes"]["ratio"] <= SETTINGS.memory
    again = make_budget("random-window", request_for(model, "random-window", {"seed": 1}))
    assert again.window == budget.window  # seeded: the same windows
    assert torch.isfinite(run_under(model, budget)).all()
    with pytest.raises(HeadcountError, match="exceed --memory"):
        make_budget("random-window", request_for(model, "random-window", {}, KVBudgetSettings(memory=0.05, context=64,
                                                                                              sink=4, window=8)))
    # the command reads the same registry
    model_dir = save_tiny(model, tmp_path / "llama")
    code, out, err = run_cli(capsys, "kv-budget", "--model", model_dir, "--policy", "random-window", "--seed", 1,
                             "--memory", 0.5, "--context", 64, "--sink", 4, "--window", 8, "--out", tmp_path / "b")
    assert code == 0, err
    written = KVBudget.load(tmp_path / "b" / "budget.json")
    assert written == budget and "sink 4 + window" in out


@pytest.mark.parametrize("args, says", [
    (("--policy", "nope"), "unknown KV policy 'nope'"),
    (("--policy", "uniform", "--uniform"), "each name the policy"),
    (("--policy", "uniform", "--seed", 2), "leave --seed out"),
    (("--random", 2, "--seed", 2), "gives the seed already"),
    (("--policy", "random"), "give one (--random SEED)"),
    (("--policy", "full", "--scores", "s.json"), "--policy full chooses without scores"),
])
def test_policy_flags_take_bad_input_in_one_line(model, capsys, tmp_path, args, says):
    model_dir = save_tiny(model, tmp_path / "llama")
    code, _, err = run_cli(capsys, "kv-budget", "--model", model_dir, *args, "--out", tmp_path / "b")
    assert_one_error_line(code, err)
    assert says in err and not (tmp_path / "b").exists()


def test_policy_full_states_the_full_cache(model, capsys, tmp_path):
    model_dir = save_tiny(model, tmp_path / "llama")
    code, out, err = run_cli(capsys, "kv-budget", "--model", model_dir, "--policy", "full", "--context", 64,
                             "--out", tmp_path / "b")
    assert code == 0, err
    budget = KVBudget.load(tmp_path / "b" / "budget.json")
    assert budget.n_full == 6 and budget.meta["bytes"]["ratio"] == 1.0 and "6 of 6 KV heads keep the full cache" in out
