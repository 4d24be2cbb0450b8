"""Defaults a newcomer relies on (issue 34, items 5, 6 and 7), on tiny checkpoints:

- ``load_model(dir)`` loads the head the checkpoint was saved with (a fine-tuned classifier keeps
  its trained classifier), ``head=`` still chooses another;
- a task head the checkpoint lacks is drawn from ``seed``: the same seed, the same head (and the
  global random state untouched), so two identical ``prune`` runs give identical numbers, and the
  seed is recorded;
- ``info`` and ``shrink`` say what their parameter counts count.
"""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
import transformers
from cli_helpers import run_cli, write_mask
from conftest import save_tiny, tiny_model
from training_helpers import make_checkpoint, make_task, one_thread

import headcount as hc
from headcount.core.models import checkpoint_head, load_model, new_weights
from headcount.core.surgery import count_parameters

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

PRUNE = ["--max-examples", "16", "--max-eval-examples", "16", "--batch-size", "8", "--max-length", "32",
         "--step", "0.25"]


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    root = tmp_path_factory.mktemp("defaults")
    reg = tiny_model("bert", head="classification", num_labels=1, problem_type="regression")
    return {"root": root, "clf": make_checkpoint(root / "clf", head="classification", initializer_range=0.3),
            "pre": make_checkpoint(root / "pre", initializer_range=0.3),
            "mlm": save_tiny(tiny_model("bert", head="mlm"), root / "mlm"),
            "reg": save_tiny(reg, root / "reg"),
            "task": make_task(root / "task", n_train=32, n_dev=16)}


def _classifier(model) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if k.startswith("classifier.")}


# -- item 5: the checkpoint's own head ------------------------------------------------------------
def test_load_model_keeps_the_fine_tuned_classifier(w):
    model = hc.load_model(str(w["clf"]))
    assert type(model) is transformers.BertForSequenceClassification and not new_weights(model)
    saved = safetensors.torch.load_file(str(w["clf"] / "model.safetensors"))
    head = _classifier(model)
    assert set(head) == {"classifier.weight", "classifier.bias"}
    for k, v in head.items():
        assert torch.equal(v, saved[k])


@pytest.mark.parametrize("name, head, cls", [
    ("pre", "base", transformers.BertModel),
    ("mlm", "mlm", transformers.BertForMaskedLM),
    ("reg", "regression", transformers.BertForSequenceClassification),
])
def test_every_saved_head_is_the_default(w, name, head, cls):
    assert checkpoint_head(str(w[name])) == head
    model = load_model(str(w[name]))
    assert type(model) is cls and not new_weights(model)
    if head == "regression":
        assert model.config.num_labels == 1 and model.config.problem_type == "regression"


def test_another_head_when_told(w):
    assert type(load_model(str(w["clf"]), head="base")) is transformers.BertModel
    model = load_model(str(w["pre"]), head="classification", num_labels=3)
    assert model.config.num_labels == 3 and set(new_weights(model)) == {"classifier.weight", "classifier.bias"}


def test_a_shrunk_classifier_loads_with_its_head(w, tmp_path, capsys):
    mask = write_mask(tmp_path / "mask.json", [[1, 0, 1, 1], [1, 1, 1, 0]], [1, 1])
    assert run_cli(capsys, "shrink", "--model", w["clf"], "--mask", mask, "--out", tmp_path / "small")[0] == 0
    model = load_model(str(tmp_path / "small"))
    assert type(model) is transformers.BertForSequenceClassification
    for k, v in _classifier(model).items():
        assert torch.equal(v, _classifier(load_model(str(w["clf"])))[k])


# -- item 6: a new head drawn from the seed -------------------------------------------------------
def test_the_same_seed_gives_the_same_new_head(w):
    state = torch.get_rng_state()
    a, b, c = (_classifier(load_model(str(w["pre"]), head="classification", num_labels=2, seed=s)) for s in (3, 3, 4))
    assert torch.equal(torch.get_rng_state(), state)  # drawn in a forked random state
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["classifier.weight"], c["classifier.weight"])
    # as if torch's global generator had been seeded with it (what finetune's set_seed does before loading)
    torch.manual_seed(3)
    unseeded = _classifier(load_model(str(w["pre"]), head="classification", num_labels=2))
    assert all(torch.equal(a[k], unseeded[k]) for k in a)


def _numbers(trace) -> list[dict]:
    """A trace's rows without their wall time."""
    import csv

    with open(trace, newline="") as f:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]


def test_two_identical_prune_runs_give_identical_numbers(w, tmp_path, capsys):
    outs = []
    for run, noise in enumerate((1, 2)):
        torch.manual_seed(noise)  # whatever the global random state, the new head is the same
        torch.randn(noise * 7)
        code, out, err = run_cli(capsys, "prune", "--model", w["pre"], "--task", w["task"], "--out", tmp_path / f"p{run}",
                                 *PRUNE)
        assert code == 0, err
        assert "untrained head, drawn with --seed 0" in out
        outs.append(tmp_path / f"p{run}")
    first, second = (_numbers(o / "trace.csv") for o in outs)
    assert first == second and len(first) >= 2 and first[0]["metric"] != ""
    masks = [json.loads((o / "mask.json").read_text()) for o in outs]
    assert masks[0]["heads"] == masks[1]["heads"] and masks[0]["metric"] == masks[1]["metric"]
    assert masks[0]["head"] == "new" and masks[0]["head_seed"] == 0
    # another seed draws another head (and records it)
    code, _, err = run_cli(capsys, "prune", "--model", w["pre"], "--task", w["task"], "--out", tmp_path / "p9",
                           *PRUNE, "--seed", "9")
    assert code == 0, err
    assert json.loads((tmp_path / "p9" / "mask.json").read_text())["head_seed"] == 9


def test_score_records_the_seed_of_a_new_head_and_none_for_a_trained_one(w, tmp_path, capsys):
    for model, out in ((w["pre"], "s-new"), (w["clf"], "s-trained")):
        code, _, err = run_cli(capsys, "score", "--model", model, "--task", w["task"], "--max-examples", "8",
                               "--out", tmp_path / out)
        assert code == 0, err
    new, trained = (json.loads((tmp_path / o / "scores.json").read_text()) for o in ("s-new", "s-trained"))
    assert (new["head"], new["head_seed"]) == ("new", 0)
    assert trained["head"] == "checkpoint" and "head_seed" not in trained


# -- item 7: what a parameter count counts --------------------------------------------------------
def _info(capsys, model) -> dict:
    code, stdout, err = run_cli(capsys, "info", "--model", model)
    assert code == 0, err
    return dict(line.strip().split(": ", 1) for line in stdout.splitlines() if ": " in line)


def test_info_and_shrink_name_what_they_count(w, tmp_path, capsys):
    clf = load_model(str(w["clf"]))
    total, body = count_parameters(clf), count_parameters(clf.base_model)
    assert total - body == 32 * 2 + 2  # the classifier: hidden x labels + labels
    assert _info(capsys, w["clf"])["parameters"] == f"{total:,} with the task head (encoder alone: {body:,})"
    pre = count_parameters(load_model(str(w["pre"])))
    assert _info(capsys, w["pre"])["parameters"] == f"{pre:,} (the encoder alone, no output head)"
    full = write_mask(tmp_path / "full.json", [[1] * 4] * 2, [1, 1])
    code, stdout, err = run_cli(capsys, "shrink", "--model", w["clf"], "--mask", full, "--out", tmp_path / "same")
    assert code == 0, err
    assert (f"{total:,} parameters with the task head (was {total:,}); encoder alone {body:,} (was {body:,})"
            in stdout)
    code, stdout, err = run_cli(capsys, "shrink", "--model", w["pre"], "--mask", full, "--out", tmp_path / "enc")
    assert code == 0, err
    assert f"{pre:,} parameters, the encoder alone (no output head) (was {pre:,})" in stdout
