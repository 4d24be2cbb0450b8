"""Checkpoints whose weights do not fill the model (issue 29): the checkpoint table.

transformers fills a missing tensor with random weights, drops an unexpected one and hides its
load report behind the verbosity setting; a NaN in ``config.json`` makes every output NaN. Each
row of :data:`BROKEN` breaks a copy of a tiny classifier one way and runs ``headcount score``
on it: one ``error:`` line, exit status 2, nothing written. A new task head on a pre-trained
encoder is expected: exit 0 and one line that says so. The per-architecture tests check the
adapters' split of body and head tensors on every row of the architecture table.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_error_line, run_cli
from conftest import save_tiny, tiny_model
from safetensors.torch import load_file, save_file
from training_helpers import make_checkpoint, make_task, one_thread

from headcount.core.arch import get_adapter
from headcount.core.models import load_model, new_weights
from headcount.runtime.errors import HeadcountError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return {"clf": make_checkpoint(root / "clf", head="classification"), "pre": make_checkpoint(root / "pre"),
            "task": make_task(root / "task", n_train=16, n_dev=8)}


def _copy(world, d: Path, name="ck") -> Path:
    dst = d / name
    shutil.copytree(world["clf"], dst)
    return dst


def _tensors(world, d, edit) -> Path:
    """A copy of the tiny classifier whose weights ``edit(state_dict)`` changed."""
    c = _copy(world, d)
    state = load_file(c / "model.safetensors")
    edit(state)
    save_file(state, c / "model.safetensors", metadata={"format": "pt"})
    return c


def _config(world, d, **changes) -> Path:
    c = _copy(world, d)
    cfg = json.loads((c / "config.json").read_text())
    cfg.update(changes)
    (c / "config.json").write_text(json.dumps(cfg))  # writes NaN / Infinity as Python's json does
    return c


def _drop_layer_1(state):
    for k in [k for k in state if ".layer.1." in k]:
        del state[k]


def _pruned_without_layer_1(world, d) -> Path:
    """A pruned checkpoint (``headcount shrink``) whose layer 1 tensors were deleted, loaded with
    another head than the saved one (the path where a missing module used to be made new)."""
    from headcount.cli.app import main

    mask = d / "mask.json"
    mask.write_text(json.dumps({"heads": [[1, 0, 1, 1], [1, 1, 1, 1]], "mlps": [1, 1]}))
    src = d / "src"
    shutil.copytree(world["pre"], src)
    try:
        main(["shrink", "--model", str(src), "--mask", str(mask), "--out", str(d / "pruned")])
    except SystemExit as e:
        assert not e.code
    state = load_file(d / "pruned" / "model.safetensors")
    _drop_layer_1(state)
    save_file(state, d / "pruned" / "model.safetensors", metadata={"format": "pt"})
    return d / "pruned"


BROKEN = {  # id -> (builder(world, d) -> checkpoint, what the error line must say)
    "missing-body-layer": (lambda w, d: _tensors(w, d, _drop_layer_1),
                           "lacks encoder tensor bert.encoder.layer.1.attention.self.query.weight (and 15 more)"),
    "missing-one-tensor": (lambda w, d: _tensors(w, d, lambda s: s.pop("bert.embeddings.LayerNorm.weight")),
                           "lacks encoder tensor bert.embeddings.LayerNorm.weight; it would run with random weights"),
    "unexpected-body-tensor": (lambda w, d: _tensors(w, d, lambda s: s.update(
        {"bert.encoder.layer.1.extra.weight": torch.zeros(3)})),
        "holds an unexpected encoder tensor bert.encoder.layer.1.extra.weight"),
    "extra-layer": (lambda w, d: _tensors(w, d, lambda s: s.update(
        {k.replace(".layer.1.", ".layer.2."): v.clone() for k, v in list(s.items()) if ".layer.1." in k})),
        "unexpected encoder tensor bert.encoder.layer.2."),
    "wrong-shape": (lambda w, d: _tensors(w, d, lambda s: s.update(
        {"bert.encoder.layer.0.attention.self.query.weight": torch.zeros(32, 16)})),
        "tensor bert.encoder.layer.0.attention.self.query.weight has shape [32, 16] in the checkpoint, "
        "the model its config.json describes needs [32, 32]"),
    "wrong-shape-head": (lambda w, d: _tensors(w, d, lambda s: s.update({"classifier.weight": torch.zeros(2, 16)})),
                         "tensor classifier.weight has shape [2, 16]"),
    "config-nan": (lambda w, d: _config(w, d, layer_norm_eps=float("nan")), "sets layer_norm_eps to nan"),
    "config-infinite": (lambda w, d: _config(w, d, initializer_range=float("inf")), "initializer_range to inf"),
    "config-nested-nan": (lambda w, d: _config(w, d, rope_scaling={"factor": float("nan")}),
                          "rope_scaling.factor to nan"),
    "pruned-missing-body-layer": (_pruned_without_layer_1, "encoder.layer.1."),
}


def _snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.name != ".headcount.lock"}


@pytest.mark.parametrize("case", list(BROKEN), ids=list(BROKEN))
def test_a_broken_checkpoint_is_refused(case, world, tmp_path, capsys):
    build, needle = BROKEN[case]
    ck = build(world, tmp_path)
    before = _snapshot(tmp_path)
    code, out, err = run_cli(capsys, "score", "--model", ck, "--task", world["task"], "--method", "magnitude",
                             "--out", tmp_path / "o")
    assert_one_error_line(code, err)
    assert needle in err, err
    assert "internal error" not in err
    assert _snapshot(tmp_path) == before  # nothing written, --out not created


def test_a_new_classifier_head_is_said_in_one_line(world, tmp_path, capsys):
    code, out, err = run_cli(capsys, "score", "--model", world["pre"], "--task", world["task"], "--method", "magnitude",
                             "--out", tmp_path / "o")
    assert code == 0, err
    said = [line for line in (out + err).splitlines() if "new, untrained task head" in line]
    assert len(said) == 1, out + err
    assert json.loads((tmp_path / "o" / "scores.json").read_text())["head"] == "new"


def test_a_classifier_config_without_its_head_weights_is_a_new_head(world, tmp_path, capsys):
    """config.json names a classifier, its tensors are gone: the head is new and said to be (it was
    reported as the checkpoint's trained head)."""
    ck = _tensors(world, tmp_path, lambda s: [s.pop(k) for k in ("classifier.weight", "classifier.bias")])
    code, out, err = run_cli(capsys, "score", "--model", ck, "--task", world["task"], "--out", tmp_path / "o")
    assert code == 0, err
    assert sum("new, untrained task head" in line for line in out.splitlines()) == 1, out
    assert json.loads((tmp_path / "o" / "scores.json").read_text())["head"] == "new"


def test_non_finite_scores_are_flagged(world, tmp_path, capsys):
    """A NaN weight: exit 0 (the checkpoint loads), one warning line, and scores.json lists them."""
    def poison(s):
        s["bert.encoder.layer.1.attention.self.query.weight"][0, 0] = float("nan")

    ck = _tensors(world, tmp_path, poison)
    code, out, err = run_cli(capsys, "score", "--model", ck, "--task", world["task"], "--method", "magnitude",
                             "--out", tmp_path / "o")
    assert code == 0, err
    warned = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "1 head and 0 MLP scores are not finite" in warned[0], out
    assert json.loads((tmp_path / "o" / "scores.json").read_text())["non_finite_scores"] == {"heads": [[1, 0]], "mlps": []}


def test_finite_scores_of_a_pruned_model_are_not_flagged(world, tmp_path, capsys):
    """Removed heads have no score (NaN by design) and entropy scores no MLPs: no warning."""
    from headcount.cli.app import main

    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"heads": [[1, 0, 1, 1], [1, 1, 1, 0]], "mlps": [1, 0]}))
    try:
        main(["shrink", "--model", str(world["clf"]), "--mask", str(mask), "--out", str(tmp_path / "p")])
    except SystemExit as e:
        assert not e.code
    for method in ("entropy", "magnitude"):
        code, out, err = run_cli(capsys, "score", "--model", tmp_path / "p", "--task", world["task"], "--method", method,
                                 "--out", tmp_path / method)
        assert code == 0, err
        assert "warning" not in out + err
        assert "non_finite_scores" not in json.loads((tmp_path / method / "scores.json").read_text())


# -- the library, on every architecture ------------------------------------------------------------------------
def test_body_and_head_tensors_on_every_architecture(arch, tmp_path):
    """A pre-trained encoder loads as a classifier with only head tensors new; the same checkpoint
    without one of its encoder tensors is refused, and so is one with an extra encoder tensor."""
    path = save_tiny(tiny_model(arch, head="base"), tmp_path / "base")
    model = load_model(str(path), head="classification", num_labels=3)
    adapter = get_adapter(model)
    new = new_weights(model)
    assert new and not [k for k in new if adapter.is_body_tensor(model, k)], new
    assert all(adapter.is_body_tensor(model, k) for k in adapter.base(model).state_dict()
               if not k.startswith(adapter.task_head_parts))
    assert new_weights(load_model(str(path), head="base")) == ()

    state = load_file(path / "model.safetensors")
    victim = next(k for k in state if ".0." in k and k.endswith("weight"))  # a tensor of the first layer
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    save_file({k: v for k, v in state.items() if k != victim}, broken / "model.safetensors", metadata={"format": "pt"})
    for head in ("base", "classification"):
        with pytest.raises(HeadcountError, match="lacks encoder tensor"):
            load_model(str(broken), head=head, num_labels=3)
    save_file({**state, victim.replace(".0.", ".7."): state[victim].clone()}, broken / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(HeadcountError, match="unexpected encoder tensor"):
        load_model(str(broken), head="classification", num_labels=3)


def test_a_classifier_checkpoint_loads_as_base_and_mlm(tmp_path):
    """The saved head of another task is dropped (and a pooler the MLM model lacks), silently."""
    path = save_tiny(tiny_model("bert", head="classification"), tmp_path / "clf")
    assert new_weights(load_model(str(path), head="base")) == ()
    mlm = load_model(str(path), head="mlm")
    assert new_weights(mlm) and all(not get_adapter(mlm).is_body_tensor(mlm, k) for k in new_weights(mlm))


def test_mismatched_sizes_can_still_be_asked_for(tmp_path):
    """``ignore_mismatched_sizes=True`` (a caller's explicit choice): the tensor is new, not an error."""
    path = save_tiny(tiny_model("bert", head="classification"), tmp_path / "clf")
    model = load_model(str(path), head="classification", num_labels=5, ignore_mismatched_sizes=True)
    assert {"classifier.weight", "classifier.bias"} <= set(new_weights(model))
    with pytest.raises(HeadcountError, match="classifier.weight has shape"):
        load_model(str(path), head="classification", num_labels=5)


# -- inputs longer than the model's positions ---------------------------------------------------------------------
def test_the_position_limit_of_every_architecture(arch):
    """``max_tokens`` is the longest input that runs: one more token fails where positions are a
    table (RoBERTa's start after the padding index), and None means no table (DeBERTa-v3 style)."""
    model = tiny_model(arch, head="base")
    n = get_adapter(model).max_tokens(model.config)
    with torch.no_grad():
        model(input_ids=torch.full((1, n or 200), 5))
        if n is not None and arch.split("-")[0] != "modernbert":  # rotary: longer runs, past its context
            with pytest.raises((RuntimeError, IndexError)):
                model(input_ids=torch.full((1, n + 1), 5))


def test_max_length_beyond_the_positions_is_cut_and_said(world, tmp_path, capsys):
    """--max-length 256 on a model with 64 positions: was a tensor-size RuntimeError (internal error)."""
    words = " ".join(["good film"] * 100)
    (tmp_path / "long.csv").write_text("sentence,label\n" + "".join(f"{words},{'negative' if i % 2 else 'positive'}\n"
                                                                      for i in range(4)))
    (tmp_path / "long.yaml").write_text("files: {train: long.csv, validation: long.csv}\ntext: sentence\n"
                                        "labels: [negative, positive]\n")
    for command in ("score", "prune"):
        code, out, err = run_cli(capsys, command, "--model", world["clf"], "--task", tmp_path / "long.yaml",
                                 "--max-length", "256", "--out", tmp_path / command)
        assert code == 0, err
        said = [line for line in out.splitlines() if "--max-length 256 is more than the 64 positions" in line]
        assert len(said) == 1, out
