"""A new importance method is one declaration: registered from this test module, it runs through
``headcount score``, ``headcount prune`` and a study config's prune job, with no other file changed;
and the registry, not a list of names, decides what each command accepts."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import run_cli
from training_helpers import make_checkpoint, make_task, one_thread

from headcount.core.gates import layout
from headcount.experiments.runner import parse_study_config
from headcount.importance.scorers import Scorer, get_scorer, register_scorer, scorer_names, unregister_scorer
from headcount.importance.scores import Scores
from headcount.runtime.errors import HeadcountError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)
CALLS = []


def depth_first(model, batches, ctx):
    """A made-up importance: deeper heads matter more, MLPs by depth too (needs no data)."""
    CALLS.append(len(list(batches)))
    n_layers, n_heads = layout(model)
    heads = torch.arange(n_layers * n_heads, dtype=torch.float32).reshape(n_layers, n_heads) + 1
    return Scores(heads=heads, mlps=torch.arange(n_layers, dtype=torch.float32) + 1, method="depth-first",
                  meta=ctx.rt.meta())


@pytest.fixture(scope="module")
def registered():
    register_scorer(Scorer("depth-first", depth_first, needs_data=False, needs_loss=False,
                           description="deeper = more important (a test scorer)"))
    yield
    unregister_scorer("depth-first")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    return {"root": root, "clf": make_checkpoint(root / "clf", head="classification"),
            "task": make_task(root / "task", n_train=16, n_dev=16)}


def test_score_and_prune_take_a_registered_method(registered, world, tmp_path, capsys):
    code, out, err = run_cli(capsys, "score", "--model", world["clf"], "--task", world["task"], "--method", "depth-first",
                             "--out", tmp_path / "s")
    assert code == 0, err
    s = json.loads((tmp_path / "s" / "scores.json").read_text())
    assert s["method"] == "depth-first" and s["heads"][0][0] == 1.0 and s["heads"][-1][-1] == 8.0
    code, out, err = run_cli(capsys, "prune", "--model", world["clf"], "--task", world["task"], "--method", "depth-first",
                             "--threshold", "0.01", "--step", "0.25", "--max-examples", "16", "--max-eval-examples", "16",
                             "--out", tmp_path / "p")
    assert code == 0, err
    mask = json.loads((tmp_path / "p" / "mask.json").read_text())
    assert mask["heads"][0][0] == 0 and mask["method"] == "depth-first"  # the shallowest head goes first
    assert "depth-first" in scorer_names(can_prune=True)


def test_a_study_config_takes_it_and_its_prune_job_runs_it(registered, world, tmp_path):
    from headcount.experiments.studies.jobs import prune_job

    text = (f"study: lottery\nmodel: {world['clf']}\ntasks: [{world['task']}]\nseeds: [1]\n"
            "pruning: {method: depth-first, accumulate: per-batch, threshold: 0.01}\nmagnitude: {enabled: false}\n"
            "patterns: {enabled: false}\nsuper_survivors: {enabled: false}\n")
    loaded = parse_study_config(text)
    prune = next(j for j in loaded.study_type.expand(loaded.config) if j.kind == "prune")
    assert prune.params["method"] == "depth-first"
    before = len(CALLS)
    (tmp_path / "job").mkdir()
    r = prune_job({**prune.params, "model": str(world["clf"])}, {}, tmp_path / "job", lambda *a: None)
    assert len(CALLS) > before and r["trace"]  # the study's job scored with the registered scorer


def test_the_registry_decides_what_is_accepted(registered, capsys, world, tmp_path):
    with pytest.raises(HeadcountError, match="unknown method 'nonesuch'.*depth-first"):
        get_scorer("nonesuch")
    with pytest.raises(HeadcountError, match="already registered"):
        register_scorer(Scorer("depth-first", lambda *a: None))
    code, _, err = run_cli(capsys, "prune", "--model", world["clf"], "--task", world["task"], "--method", "entropy",
                           "--out", tmp_path / "e")
    assert code == 2 and "cannot drive pruning" in err
    code, _, err = run_cli(capsys, "score", "--model", world["clf"], "--task", world["task"], "--method", "depth-first",
                           "--accumulate", "cumulative", "--out", tmp_path / "c")
    assert code == 2 and "accumulate 'cumulative'" in err
    with pytest.raises(Exception, match="per-example"):
        parse_study_config(f"study: transfer\nmodel: {world['clf']}\ntasks: [{world['task']}]\n"
                           "scoring: {method: depth-first}\n")
