"""Bad input, command by command: one ``error:`` line, exit status 2, no traceback, and nothing
changed on disk (earlier outputs byte-identical, no --out created).

Each row of :data:`ROWS` builds its inputs in a fresh folder (``make(w, d)``: ``w`` the shared
tiny world, ``d`` the row's folder) and returns the argv; the CLI runs in-process. A row may add
a ``needle`` that the error line must contain.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from training_helpers import make_checkpoint, make_task, one_thread

from headcount.cli.app import main
from headcount.runtime.record import Record

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The shared world: checkpoints, a task, masks and earlier outputs of every command."""
    root = tmp_path_factory.mktemp("world")
    clf = make_checkpoint(root / "clf", head="classification")
    pre = make_checkpoint(root / "pre")
    task = make_task(root / "task", n_train=32, n_dev=16)
    mask = root / "mask.json"
    mask.write_text(json.dumps({"heads": [[1, 0, 1, 1], [1, 1, 1, 0]], "mlps": [1, 1]}))
    world = {"root": root, "clf": str(clf), "pre": str(pre), "task": str(task), "mask": str(mask)}
    # earlier outputs that bad input must leave byte-identical
    for argv in (["score", "--model", world["clf"], "--task", world["task"], "--method", "magnitude",
                  "--out", str(root / "earlier-score")],
                 ["shrink", "--model", world["clf"], "--mask", world["mask"], "--out", str(root / "earlier-shrink")],
                 ["patterns", "synthetic", "--n-per-class", "2", "--size", "8", "--out", str(root / "maps")]):
        try:
            main(argv)
        except SystemExit as e:
            assert not e.code, argv
    return world


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(Path(root).rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.name == ".headcount.lock":
            continue
        out[rel] = "dir" if p.is_dir() else ("link" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest())
    return out


# -- builders ----------------------------------------------------------------------------------------------------
def ckpt(w, d, name="ck") -> Path:
    """A copy of the tiny classifier to break."""
    dst = d / name
    shutil.copytree(w["clf"], dst)
    return dst


def weights(w, d, data: bytes) -> Path:
    c = ckpt(w, d)
    (c / "model.safetensors").write_bytes(data)
    return c


def tensors(w, d, edit) -> Path:
    """A copy of the tiny classifier whose tensors ``edit(state_dict)`` changed (issue 29: a missing
    encoder tensor was random weights, silently)."""
    import torch  # noqa: F401  (the edits build tensors)
    from safetensors.torch import load_file, save_file

    c = ckpt(w, d)
    state = load_file(c / "model.safetensors")
    edit(state)
    save_file(state, c / "model.safetensors", metadata={"format": "pt"})
    return c


def _zeros(*shape):
    import torch

    return torch.zeros(*shape)


def truncated(w, d) -> Path:
    c = ckpt(w, d)
    f = c / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return c


def config_edit(w, d, **changes) -> Path:
    c = ckpt(w, d)
    cfg = json.loads((c / "config.json").read_text())
    cfg.update(changes)
    (c / "config.json").write_text(json.dumps(cfg))
    return c


def config_text(w, d, data: bytes) -> Path:
    c = ckpt(w, d)
    (c / "config.json").write_bytes(data)
    return c


def no_tokenizer(w, d, keep=(), vocab: list[str] | None = None) -> Path:
    """The tiny classifier without its tokenizer files (but those in ``keep``); ``vocab``: a
    ``vocab.txt`` with these tokens instead."""
    c = ckpt(w, d)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if name not in keep and (c / name).exists():
            (c / name).unlink()
    if vocab is not None:
        (c / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return c


def pickle_only(w, d) -> Path:
    c = ckpt(w, d)
    (c / "model.safetensors").unlink()
    (c / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    return c


def index(w, d, doc) -> Path:
    c = ckpt(w, d)
    (c / "model.safetensors.index.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return c


def text_file(d, name, text: str | bytes) -> Path:
    p = d / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def task_with(d, train: str | bytes | None = None, yaml_extra: str = "", yaml_text: str | None = None) -> Path:
    folder = d / "task"
    make_task(folder, n_train=16, n_dev=8)
    if train is not None:
        (folder / "train.csv").write_bytes(train if isinstance(train, bytes) else train.encode())
    if yaml_text is not None:
        (folder / "task.yaml").write_text(yaml_text)
    elif yaml_extra:
        with open(folder / "task.yaml", "a") as f:
            f.write(yaml_extra)
    return folder / "task.yaml"


def a_file(d) -> Path:
    return text_file(d, "afile.txt", "mine\n")


def foreign(d) -> Path:
    v = d / "v"
    (v / "sub").mkdir(parents=True)
    (v / "notes.txt").write_text("precious\n")
    return v


def hidden(d) -> Path:
    """A folder with only hidden files, one named like a temporary file (not headcount's)."""
    v = d / "h"
    v.mkdir()
    (v / ".notes.txt").write_text("precious\n")
    (v / ".draft.tmp").write_text("mine\n")
    return v


def users(d, *names, folder="o") -> Path:
    """A folder holding only the user's files, named like headcount's outputs (or temp files)."""
    v = d / folder
    v.mkdir(exist_ok=True)
    for n in names:
        (v / n).write_text(f"the user's {n}\n")
    return v


def lock_dir(d) -> Path:
    out = d / "o"
    (out / ".headcount.lock").mkdir(parents=True)
    return out


def lock_link(d) -> Path:
    out = d / "o"
    out.mkdir()
    victim = text_file(d, "victim.txt", "do not touch\n")
    (out / ".headcount.lock").symlink_to(victim)
    return out


def run_dir(d, **files) -> Path:
    """A fake study run directory whose files can be corrupted one by one."""
    run = d / "run"
    (run / "jobs" / "toy-0123456789abcdef").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"format": 1, "study": "toy", "config_hash": "x"}))
    (run / "plan.json").write_text(json.dumps({"jobs": [{"key": "toy-0123456789abcdef", "name": "a", "kind": "toy",
                                                           "fn": "m:f", "params": {}, "inputs": {}}]}))
    job = run / "jobs" / "toy-0123456789abcdef"
    (job / "DONE").write_text("toy-0123456789abcdef\n")
    (job / "result.json").write_text("{}")
    (job / "meta.json").write_text("{}")
    rec = Record(run, "study")  # headcount's record: the folder is a run directory
    rec.claim(["jobs", "manifest.json", "plan.json"])
    rec.write()
    for rel, data in files.items():
        target = run / rel.replace("__", "/")
        target.write_bytes(data if isinstance(data, bytes) else data.encode())
    return run


def magnitude_dir(d, summary: str | None) -> Path:
    m = d / "mag"
    m.mkdir()
    if summary is not None:
        (m / "magnitude.json").write_text(summary)
    return m


def study_config(d, text: str) -> Path:
    return text_file(d, "study.yaml", text)


def demo_config(d, old: str, new: str) -> Path:
    from headcount.experiments import CONFIGS

    return study_config(d, (CONFIGS / "demo.yaml").read_text().replace(old, new))


#: "billion laughs": nine anchors of nine aliases each, 9**9 values in a few hundred bytes (top-level keys)
ALIAS_BOMB = "lol0: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &{c} [{', '.join(['*' + p] * 9)}]\n" for i, p, c in zip(range(1, 9), "abcdefgh", "bcdefghi"))


def full_disk(monkeypatch):
    """Every atomic write fails as on a full disk."""
    import headcount.runtime.atomic

    def fail(path, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(headcount.runtime.atomic, "atomic_write_bytes", fail)


#: what safetensors 0.8 raises when the disk fills while it writes the weights (a SafetensorError, not an OSError)
SAFETENSORS_FULL = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'


def weights_full_disk(monkeypatch):
    """Writing model weights fails as safetensors fails on a full disk."""
    import safetensors
    import transformers.modeling_utils

    def fail(*args, **kwargs):
        raise safetensors.SafetensorError(SAFETENSORS_FULL)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", fail)


@dataclass
class Row:
    id: str
    make: Callable  # (w, d) -> argv
    needle: str = ""
    patch: Callable | None = None  # (monkeypatch) -> None


S, T, M = "score", "--task", "--model"
FT = ["--epochs", "1", "--batch-size", "16", "--max-length", "32"]


def _or(value, default):
    return str(default if value is None else value)


def score(w, d, *extra, model=None, task=None, out=None, method="magnitude"):
    return ["score", M, _or(model, w["clf"]), T, _or(task, w["task"]), "--method", method,
            "--out", _or(out, d / "o"), *extra]


def shrink(w, d, mask=None, out=None, model=None):
    return ["shrink", M, _or(model, w["clf"]), "--mask", _or(mask, w["mask"]), "--out", _or(out, d / "o")]


def prune(w, d, *extra, out=None):
    return ["prune", M, w["clf"], T, w["task"], "--out", str(out or d / "o"), *extra]


def finetune(w, d, *extra, out=None, model=None, task=None):
    return ["finetune", M, str(model or w["pre"]), T, str(task or w["task"]), *FT, "--out", str(out or d / "o"), *extra]


def magnitude(w, d, *extra, out=None):
    return ["magnitude", M, w["pre"], T, w["task"], *FT, "--out", str(out or d / "o"), *extra]


def read_only(monkeypatch):
    """As root, permissions do not stop writes: make ``os.access`` say what it says for other users."""
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p).name == "ro" and mode & os.W_OK
                            else real(p, mode, **k))


def crafted_record(d, key: str) -> Path:
    """A run directory whose record lists ``key`` (a path outside it), beside a file of the user's."""
    run_dir(d)
    text_file(d, "victim.txt", "the user's\n")
    data = json.loads((d / "run" / ".headcount-out.json").read_text())
    data["files"][key] = None
    (d / "run" / ".headcount-out.json").write_text(json.dumps(data))
    return d / "run"


def linked_jobs(d) -> Path:
    run_dir(d)
    (d / "run" / "jobs").rename(d / "elsewhere")
    (d / "run" / "jobs").symlink_to(d / "elsewhere")
    return d / "run"


def empty_lock(d) -> Path:
    out = d / "o"
    out.mkdir()
    (out / ".headcount.lock").write_bytes(b"")
    return out


def ro_dir(d) -> Path:
    out = d / "ro"
    out.mkdir()
    out.chmod(0o500)
    return out


ROWS = [
    # -- model files ----------------------------------------------------------------------------------------
    Row("model-empty-safetensors", lambda w, d: ["info", M, str(weights(w, d, b""))], "not a valid safetensors"),
    Row("model-truncated-safetensors", lambda w, d: ["info", M, str(truncated(w, d))], "truncated"),
    Row("model-garbage-safetensors", lambda w, d: ["info", M, str(weights(w, d, b"\x10\x00\x00\x00\x00\x00\x00\x00not json!!"))],
        "bad header"),
    Row("model-huge-header-size", lambda w, d: ["info", M, str(weights(w, d, struct.pack("<Q", 10**9) + b"{}"))],
        "not a valid safetensors"),
    Row("model-header-not-object", lambda w, d: ["info", M, str(weights(w, d, struct.pack("<Q", 2) + b"[]"))],
        "bad header"),
    Row("model-pickle-only", lambda w, d: ["info", M, str(pickle_only(w, d))], "refuses to unpickle"),
    Row("model-pickle-only-score", lambda w, d: score(w, d, model=pickle_only(w, d)), "pickle"),
    Row("model-auto-map-unknown-type", lambda w, d: ["info", M, str(config_edit(
        w, d, model_type="nonesuch", auto_map={"AutoModel": "modeling_x.XModel"}))]),
    Row("model-config-not-json", lambda w, d: ["info", M, str(config_text(w, d, b"{nope"))]),
    Row("model-config-not-utf8", lambda w, d: ["info", M, str(config_text(w, d, b'{"model_type": "\xff"}'))]),
    Row("model-missing-dir", lambda w, d: ["info", M, str(d / "nowhere" / "ck")], "not found"),
    Row("model-no-config", lambda w, d: ["info", M, str((d / "empty").mkdir() or d / "empty")], "no config.json"),
    Row("model-empty-string", lambda w, d: ["info", M, ""], "must not be empty"),
    Row("model-index-outside", lambda w, d: ["info", M, str(index(w, d, {"weight_map": {"a": "../../other/model.safetensors"}}))],
        "not a file inside"),
    Row("model-index-not-json", lambda w, d: ["info", M, str(index(w, d, "{"))], "corrupt"),
    Row("model-index-no-weight-map", lambda w, d: ["info", M, str(index(w, d, {"metadata": {}}))], "weight_map"),
    Row("model-index-missing-shard", lambda w, d: ["info", M, str(index(w, d, {"weight_map": {"a": "model-00002.safetensors"}}))],
        "missing"),
    Row("model-bad-pruning-record", lambda w, d: ["info", M, str(config_edit(w, d, headcount_pruning={"removed_heads": "x"}))]),
    Row("model-pruning-record-wrong-shape", lambda w, d: shrink(w, d, model=config_edit(
        w, d, headcount_pruning={"removed_heads": [[0, 1, 2, 3, 4, 5, 6]], "removed_mlps": []}))),
    Row("model-bloom-unsupported", lambda w, d: ["info", M, str(config_edit(w, d, model_type="bloom", n_embd=16))],
        "'bloom' is not supported"),
    Row("model-missing-encoder-layer", lambda w, d: score(w, d, model=tensors(w, d, lambda s: [
        s.pop(k) for k in list(s) if ".layer.1." in k])), "lacks encoder tensor bert.encoder.layer.1."),
    Row("model-unexpected-encoder-tensor", lambda w, d: ["info", M, str(tensors(w, d, lambda s: s.update(
        {"bert.encoder.layer.0.extra.weight": _zeros(3)})))], "unexpected encoder tensor bert.encoder.layer.0.extra"),
    Row("model-wrong-shape-tensor", lambda w, d: score(w, d, model=tensors(w, d, lambda s: s.update(
        {"bert.encoder.layer.0.attention.self.query.weight": _zeros(32, 16)}))), "has shape [32, 16] in the checkpoint"),
    Row("model-config-nan", lambda w, d: score(w, d, model=config_edit(w, d, layer_norm_eps=float("nan"))),
        "sets layer_norm_eps to nan"),
    Row("model-config-infinite-info", lambda w, d: ["info", M, str(config_edit(w, d, hidden_dropout_prob=float("inf")))],
        "hidden_dropout_prob to inf"),
    # -- masks (shrink) -------------------------------------------------------------------------------------
    Row("mask-missing", lambda w, d: shrink(w, d, mask=d / "none.json"), "not found"),
    Row("mask-not-json", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", "{heads")), "not JSON"),
    Row("mask-not-utf8", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", b"\xff\xfe\x00h")), "not JSON"),
    Row("mask-nan", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", '{"heads": [[NaN, 1, 1, 1], [1, 1, 1, 1]], "mlps": [1, 1]}'))),
    Row("mask-wrong-shape", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", '{"heads": [[1, 1], [1, 1]], "mlps": [1, 1]}'))),
    Row("mask-values-2", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", '{"heads": [[2, 1, 1, 1], [1, 1, 1, 1]], "mlps": [1, 1]}'))),
    Row("mask-empty-object", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", "{}")), "heads"),
    Row("mask-ragged", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", '{"heads": [[1, 1, 1], [1, 1, 1, 1]], "mlps": [1, 1]}'))),
    Row("mask-list-not-object", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", "[1, 2]"))),
    Row("mask-n-layers-infinite", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", '{"shared_heads": [1, 1, 1, 1], '
                                                                         '"n_layers": 1e999}')), "'n_layers' must be"),
    Row("mask-n-layers-out-of-memory", lambda w, d: shrink(w, d, mask=text_file(
        d, "m.json", '{"shared_heads": [1, 1, 1, 1], "n_layers": 1000000000000}')), "in 1..10000, got 1000000000000"),
    Row("mask-boolean-entry", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", '{"heads": [[1, 1, 1, 1], [1, true, 1, 1]], '
                                                                     '"mlps": [1, 1]}')), "'heads[1][1]' must be 0 or 1"),
    Row("mask-mlps-not-a-list", lambda w, d: shrink(w, d, mask=text_file(d, "m.json", '{"heads": [[1, 1, 1, 1], [1, 1, 1, 1]], '
                                                                       '"mlps": "all"}')), "'mlps' must be"),
    # -- --out guards ----------------------------------------------------------------------------------------------
    Row("shrink-out-existing-file", lambda w, d: shrink(w, d, out=a_file(d)), "existing file"),
    Row("shrink-out-foreign-dir", lambda w, d: shrink(w, d, out=foreign(d)), "not empty"),
    Row("shrink-out-hidden-user-files", lambda w, d: shrink(w, d, out=hidden(d)), "not empty"),
    Row("shrink-out-empty-string", lambda w, d: shrink(w, d, out=""), "must not be empty"),
    Row("shrink-out-lock-is-dir", lambda w, d: shrink(w, d, out=lock_dir(d)), "is a directory"),
    Row("shrink-out-lock-symlink", lambda w, d: shrink(w, d, out=lock_link(d)), "symbolic link"),
    Row("shrink-out-read-only", lambda w, d: shrink(w, d, out=ro_dir(d)), "not writable", patch=read_only),
    Row("shrink-out-other-command", lambda w, d: shrink(w, d, out=w["root"] / "earlier-score"), "holds the output"),
    Row("shrink-out-parent-is-file", lambda w, d: shrink(w, d, out=a_file(d) / "sub")),
    Row("shrink-full-disk", lambda w, d: shrink(w, d), "no space left", patch=full_disk),
    Row("score-out-existing-file", lambda w, d: score(w, d, out=a_file(d)), "existing file"),
    Row("score-out-different-run", lambda w, d: score(w, d, "--seed", "3", out=w["root"] / "earlier-score"),
        "different `headcount score` run"),
    Row("score-out-read-only", lambda w, d: score(w, d, out=ro_dir(d)), "not writable", patch=read_only),
    Row("score-full-disk", lambda w, d: score(w, d), "no space left", patch=full_disk),
    Row("prune-out-existing-file", lambda w, d: prune(w, d, out=a_file(d)), "existing file"),
    Row("prune-out-read-only", lambda w, d: prune(w, d, out=ro_dir(d)), "not writable", patch=read_only),
    Row("finetune-out-existing-file", lambda w, d: finetune(w, d, out=a_file(d)), "existing file"),
    Row("finetune-out-foreign-dir", lambda w, d: finetune(w, d, out=foreign(d)), "not empty"),
    Row("finetune-out-read-only", lambda w, d: finetune(w, d, out=ro_dir(d)), "not writable", patch=read_only),
    Row("finetune-full-disk", lambda w, d: finetune(w, d), "no space left", patch=full_disk),
    Row("magnitude-out-existing-file", lambda w, d: magnitude(w, d, out=a_file(d)), "existing file"),
    Row("magnitude-out-read-only", lambda w, d: magnitude(w, d, out=ro_dir(d)), "not writable", patch=read_only),
    Row("patterns-train-out-existing-file", lambda w, d: ["patterns", "train", "--maps", str(w["root"] / "maps" / "maps.safetensors"),
                                                         "--labels", str(w["root"] / "maps" / "labels.csv"), "--epochs", "1",
                                                         "--out", str(a_file(d))], "existing file"),
    Row("patterns-synthetic-full-disk", lambda w, d: ["patterns", "synthetic", "--n-per-class", "2", "--size", "8",
                                                      "--out", str(d / "o")], "no space left", patch=full_disk),
    Row("patterns-synthetic-other-run", lambda w, d: ["patterns", "synthetic", "--n-per-class", "3", "--size", "8",
                                                      "--out", str(w["root"] / "maps")], "different"),
    # -- score / prune settings -------------------------------------------------------------------------------------
    Row("score-unknown-method", lambda w, d: score(w, d, "--method", "vibes"), "unknown method"),
    Row("score-unknown-normalize", lambda w, d: score(w, d, "--normalize", "sometimes"), "normalisation"),
    Row("score-unknown-objective", lambda w, d: score(w, d, "--objective", "fun"), "objective"),
    Row("score-unknown-split", lambda w, d: score(w, d, "--method", "entropy", "--split", "nonesuch"), "no split"),
    Row("score-zero-examples", lambda w, d: score(w, d, "--max-examples", "0"), "max-examples"),
    Row("score-negative-examples", lambda w, d: score(w, d, "--max-examples", "-5"), "max-examples"),
    Row("score-zero-batch", lambda w, d: score(w, d, "--batch-size", "0"), "batch-size"),
    Row("score-tiny-max-length", lambda w, d: score(w, d, "--max-length", "4"), "max-length"),
    Row("score-not-a-number", lambda w, d: score(w, d, "--seed", "one")),
    Row("prune-threshold-zero", lambda w, d: prune(w, d, "--threshold", "0"), "threshold"),
    Row("prune-threshold-above-one", lambda w, d: prune(w, d, "--threshold", "1.5"), "threshold"),
    Row("prune-step-zero", lambda w, d: prune(w, d, "--step", "0")),
    Row("prune-step-of-unknown", lambda w, d: prune(w, d, "--step-of", "bogus")),
    Row("prune-method-entropy", lambda w, d: prune(w, d, "--method", "entropy"), "cannot drive pruning"),
    # -- tasks ---------------------------------------------------------------------------------------------------------
    Row("task-missing-yaml", lambda w, d: score(w, d, task=d / "none.yaml")),
    Row("task-unknown-name", lambda w, d: score(w, d, task="glue/nonesuch")),
    Row("task-yaml-not-utf8", lambda w, d: score(w, d, task=text_file(d, "t.yaml", b"name: \xff\xfe\n"))),
    Row("task-yaml-unknown-key", lambda w, d: score(w, d, task=task_with(d, yaml_extra="colour: blue\n"))),
    Row("task-yaml-not-mapping", lambda w, d: score(w, d, task=text_file(d, "t.yaml", "- a\n- b\n"))),
    Row("task-csv-empty-split", lambda w, d: score(w, d, "--method", "entropy", task=task_with(d, train="sentence,label\n"))),
    Row("task-csv-unknown-label", lambda w, d: score(w, d, "--method", "entropy",
                                                     task=task_with(d, train="sentence,label\nthe film,maybe\n"))),
    Row("task-csv-not-utf8", lambda w, d: score(w, d, "--method", "entropy",
                                                task=task_with(d, train=b"sentence,label\n\xff\xfe film,positive\n"))),
    Row("task-csv-missing-column", lambda w, d: score(w, d, "--method", "entropy",
                                                      task=task_with(d, train="text,label\nthe film,positive\n"))),
    Row("task-empty-string", lambda w, d: score(w, d, task=""), "must not be empty"),
    # -- finetune ------------------------------------------------------------------------------------------------------
    Row("finetune-zero-epochs", lambda w, d: finetune(w, d, "--epochs", "0"), "epochs"),
    Row("finetune-negative-lr", lambda w, d: finetune(w, d, "--lr", "-1"), "learning rate"),
    Row("finetune-nan-lr", lambda w, d: finetune(w, d, "--lr", "nan"), "learning rate"),
    Row("finetune-zero-batch", lambda w, d: finetune(w, d, "--batch-size", "0"), "batch size"),
    Row("finetune-huge-max-length", lambda w, d: finetune(w, d, "--max-length", "100000"), "max length"),
    Row("finetune-zero-save-steps", lambda w, d: finetune(w, d, "--save-steps", "0")),
    Row("finetune-negative-max-train", lambda w, d: finetune(w, d, "--max-train-examples", "-1")),
    Row("finetune-unknown-mask-mode", lambda w, d: finetune(w, d, "--mask-mode", "sometimes"), "mask mode"),
    Row("finetune-mask-wrong-shape", lambda w, d: finetune(w, d, "--mask", str(text_file(
        d, "m.json", '{"heads": [[1, 1, 1, 1]], "mlps": [1]}')))),
    Row("finetune-weight-mask-not-safetensors", lambda w, d: finetune(w, d, "--weight-mask", str(text_file(
        d, "wm.safetensors", "not a weight mask")))),
    Row("finetune-weight-mask-missing", lambda w, d: finetune(w, d, "--weight-mask", str(d / "none.safetensors")), "not found"),
    Row("finetune-regression-head-for-classes", lambda w, d: finetune(w, d, model=config_edit(
        w, d, num_labels=1, problem_type="regression", id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}))),
    Row("finetune-empty-train-split", lambda w, d: finetune(w, d, task=task_with(d, train="sentence,label\n"))),
    Row("finetune-unknown-label", lambda w, d: finetune(w, d, task=task_with(d, train="sentence,label\nthe film,maybe\n"))),
    Row("magnitude-empty-train-split", lambda w, d: ["magnitude", M, w["pre"], T, str(task_with(d, train="sentence,label\n")),
                                                     *FT, "--out", str(d / "o")]),
    # -- magnitude ------------------------------------------------------------------------------------------------------
    Row("magnitude-threshold-2", lambda w, d: magnitude(w, d, "--threshold", "2"), "threshold"),
    Row("magnitude-rate-zero", lambda w, d: magnitude(w, d, "--rate", "0"), "rate"),
    Row("magnitude-sparsity-one", lambda w, d: magnitude(w, d, "--sparsity", "1.0"), "sparsity"),
    Row("magnitude-sparsity-nan", lambda w, d: magnitude(w, d, "--sparsity", "nan"), "sparsity"),
    Row("magnitude-unknown-control", lambda w, d: magnitude(w, d, "--control", "meh"), "control"),
    Row("magnitude-unknown-variant", lambda w, d: magnitude(w, d, "--variant", "meh"), "variant"),
    Row("magnitude-zero-rounds", lambda w, d: magnitude(w, d, "--rounds", "0"), "rounds"),
    Row("magnitude-negative-rewind", lambda w, d: magnitude(w, d, "--rewind-step", "-1"), "rewind"),
    Row("magnitude-match-not-a-run", lambda w, d: magnitude(w, d, "--match", str(magnitude_dir(d, None))), "not a finished"),
    Row("magnitude-match-corrupt", lambda w, d: magnitude(w, d, "--match", str(magnitude_dir(d, "{"))), "corrupt"),
    Row("magnitude-match-bad-sparsity", lambda w, d: magnitude(w, d, "--match", str(magnitude_dir(d, '{"sparsity": 7}')))),
    # -- patterns ------------------------------------------------------------------------------------------------------
    Row("patterns-train-maps-missing", lambda w, d: ["patterns", "train", "--maps", str(d / "none.safetensors"),
                                                    "--labels", str(w["root"] / "maps" / "labels.csv"), "--out", str(d / "o")]),
    Row("patterns-train-zero-epochs", lambda w, d: ["patterns", "train", "--maps", str(w["root"] / "maps" / "maps.safetensors"),
                                                   "--labels", str(w["root"] / "maps" / "labels.csv"), "--epochs", "0",
                                                   "--out", str(d / "o")], "epochs"),
    Row("patterns-train-labels-not-utf8", lambda w, d: ["patterns", "train", "--maps", str(w["root"] / "maps" / "maps.safetensors"),
                                                       "--labels", str(text_file(d, "l.csv", b"label\n\xff\xfe\n")),
                                                       "--out", str(d / "o")]),
    Row("patterns-synthetic-zero-per-class", lambda w, d: ["patterns", "synthetic", "--n-per-class", "0", "--out", str(d / "o")]),
    Row("patterns-synthetic-negative-size", lambda w, d: ["patterns", "synthetic", "--size", "-8", "--out", str(d / "o")]),
    # -- study / report ---------------------------------------------------------------------------------------------------
    Row("report-corrupt-manifest", lambda w, d: ["report", str(run_dir(d, **{"manifest.json": "{"}))], "corrupt"),
    Row("report-manifest-not-object", lambda w, d: ["report", str(run_dir(d, **{"manifest.json": "[1]"}))], "corrupt"),
    Row("report-corrupt-plan", lambda w, d: ["report", str(run_dir(d, **{"plan.json": "{\"jobs\": 3}"}))]),
    Row("report-not-a-run", lambda w, d: ["report", str(foreign(d))], "not a headcount run directory"),
    Row("study-config-missing", lambda w, d: ["study", str(d / "none.yaml"), "--out", str(d / "run")], "cannot read"),
    Row("study-config-not-utf8", lambda w, d: ["study", str(text_file(d, "s.yaml", b"study: \xff\n")), "--out", str(d / "run")]),
    Row("study-config-unknown-key", lambda w, d: ["study", str(demo_config(d, "study: demo", "study: demo\ncolour: blue")),
                                                  "--out", str(d / "run")], "unknown key"),
    Row("study-seed-negative", lambda w, d: ["study", str(demo_config(d, "seeds: [1]", "seeds: [-1]")), "--out",
                                             str(d / "run")], "seed must be >= 0"),
    Row("study-out-existing-file", lambda w, d: ["study", str(demo_config(d, "", "")), "--out", str(a_file(d))]),
    Row("study-out-foreign-dir", lambda w, d: ["study", str(demo_config(d, "", "")), "--out", str(foreign(d))], "not empty"),
    Row("study-corrupt-manifest", lambda w, d: ["study", str(demo_config(d, "", "")), "--out",
                                                str(run_dir(d, **{"manifest.json": b"\xff{"}))], "corrupt"),
    Row("study-gpus-per-job-zero", lambda w, d: ["study", str(demo_config(d, "", "")), "--out", str(d / "run"),
                                                 "--executor", "ray", "--gpus-per-job", "0"], "--gpus-per-job must be in (0, 256], got 0"),
    Row("study-gpus-per-job-infinite", lambda w, d: ["study", str(demo_config(d, "", "")), "--out", str(d / "run"),
                                                     "--executor", "ray", "--gpus-per-job", "inf"], "must be in (0, 256]"),
    Row("study-gpus-per-job-not-a-number", lambda w, d: ["study", str(demo_config(d, "", "")), "--out", str(d / "run"),
                                                         "--executor", "ray", "--gpus-per-job", "half"], "--gpus-per-job"),
    Row("study-gpus-per-job-local-executor", lambda w, d: ["study", str(demo_config(d, "", "")), "--out", str(d / "run"),
                                                           "--gpus-per-job", "0.5"], "is for the ray executor"),
    Row("demo-gpus-per-job-negative", lambda w, d: ["demo", "--out", str(d / "run"), "--executor", "ray",
                                                    "--gpus-per-job", "-0.5"], "must be in (0, 256]"),
    Row("data-show-unknown-task", lambda w, d: ["data", "show", "glue/nonesuch"]),
    Row("unknown-option", lambda w, d: ["score", "--colour", "blue"]),
    # -- data files: rows dropped or glued (quotes in .tsv), malformed rows -----------------------------------
    # each: (the data file, argv naming a task YAML over it)[1]; the YAML reads the file as train and validation
    Row("data-tsv-tab-in-quotes", lambda w, d: (
        text_file(d, "x.tsv", 'sentence\tlabel\nok\tpositive\n"a\ttab"\tnegative\n'),
        ["data", "show", text_file(d, "t.yaml", "files: {train: x.tsv, validation: x.tsv}\ntext: sentence\n"
                                                "labels: [negative, positive]\n")])[1],
        "x.tsv, line 3: 3 fields, the header has 2"),
    Row("data-tsv-wrong-field-count-score", lambda w, d: (
        text_file(d, "x.tsv", 'sentence\tlabel\nthe "film\tpositive\nthe film\tpositive\textra\n'),
        score(w, d, "--method", "entropy", task=text_file(d, "t.yaml", "files: {train: x.tsv, validation: x.tsv}\n"
                                                                       "text: sentence\nlabels: [negative, positive]\n")))[1],
        "x.tsv, line 3: 3 fields, the header has 2"),
    Row("data-tsv-line-break-in-text", lambda w, d: (
        text_file(d, "x.tsv", "sentence\tlabel\r\na line\r\nbreak\tnegative\r\n"),
        ["data", "show", text_file(d, "t.yaml", "files: {train: x.tsv, validation: x.tsv}\ntext: sentence\n"
                                                "labels: [negative, positive]\n")])[1],
        "x.tsv, line 2: 1 fields, the header has 2"),
    Row("data-csv-unclosed-quote", lambda w, d: (
        text_file(d, "x.csv", 'sentence,label\nok,positive\n"never closed,negative\nb,positive\n'),
        ["data", "show", text_file(d, "t.yaml", "files: {train: x.csv, validation: x.csv}\ntext: sentence\n"
                                                "labels: [negative, positive]\n")])[1],
        "x.csv, line 3: a quote opens a field and is never closed"),
    Row("data-csv-stray-quote", lambda w, d: (
        text_file(d, "x.csv", 'sentence,label\n"the" film,positive\n'),
        ["data", "show", text_file(d, "t.yaml", "files: {train: x.csv, validation: x.csv}\ntext: sentence\n"
                                                "labels: [negative, positive]\n")])[1],
        "x.csv, line 2: not valid CSV"),
    Row("data-csv-swallowed-rows", lambda w, d: (
        text_file(d, "x.csv", 'sentence,label\n"oops,negative\nb,positive\nc",negative,x\n'),
        ["data", "show", text_file(d, "t.yaml", "files: {train: x.csv, validation: x.csv}\ntext: sentence\n"
                                                "labels: [negative, positive]\n")])[1],
        "from line 2 to line 4"),
    Row("data-csv-header-names-a-column-twice", lambda w, d: (
        text_file(d, "x.csv", "sentence,sentence,label\na,b,positive\n"),
        ["data", "show", text_file(d, "t.yaml", "files: {train: x.csv, validation: x.csv}\ntext: sentence\n"
                                                "labels: [negative, positive]\n")])[1],
        "names the column 'sentence' twice"),
    Row("data-jsonl-line-not-an-object", lambda w, d: (
        text_file(d, "x.jsonl", '{"sentence": "a", "label": "positive"}\r\n[1, 2]\r\n'),
        ["data", "show", text_file(d, "t.yaml", "files: {train: x.jsonl, validation: x.jsonl}\ntext: sentence\n"
                                                "labels: [negative, positive]\n")])[1],
        "x.jsonl, line 2: each line must be a JSON object"),
    Row("data-jsonl-lone-surrogate", lambda w, d: score(w, d, task=(
        text_file(d, "x.jsonl", '{"sentence": "a", "label": "positive"}\n{"sentence": "b \\ud800 c", "label": "negative"}\n'),
        text_file(d, "t.yaml", "files: {train: x.jsonl, validation: x.jsonl}\ntext: sentence\n"
                               "labels: [negative, positive]\n"))[1], method="entropy"),  # entropy reads the data
        "x.jsonl, line 2: field 'sentence' holds a lone surrogate"),
    Row("data-jsonl-duplicate-key", lambda w, d: (
        text_file(d, "x.jsonl", '{"sentence": "a", "label": "positive", "label": "negative"}\n'),
        ["data", "show", text_file(d, "t.yaml", "files: {train: x.jsonl, validation: x.jsonl}\ntext: sentence\n"
                                                "labels: [negative, positive]\n")])[1],
        "x.jsonl, line 1: the key 'label' appears twice"),
    Row("data-label-superscript-digit", lambda w, d: score(w, d, task=task_with(
        d, train="sentence,label\nthe film,\u00b2\nthe plot,positive\n"), method="entropy"), "label '\u00b2' is not one of"),
    Row("data-show-label-superscript-digit", lambda w, d: ["data", "show", task_with(
        d, train="sentence,label\nthe film,\u00b2\nthe plot,positive\n")], "label '\u00b2' is not one of"),
    Row("data-glue-download-no-header", lambda w, d: (
        text_file(d, "dev.tsv", '1\t100\t200\tthe "film\tthe film\n'),
        ["data", "show", text_file(d, "t.yaml", "glue: mrpc\nfiles: {train: dev.tsv, validation: dev.tsv}\n")])[1],
        "the header line is missing"),
    Row("data-glue-raw-mrpc-files", lambda w, d: (
        text_file((d / "MRPC").mkdir() or d / "MRPC", "msr_paraphrase_train.txt", "Quality\t#1 ID\t#2 ID\t#1 String\n"),
        ["data", "show", "glue/mrpc"])[1],  # HEADCOUNT_GLUE_DIR: the row's folder (the working directory)
        "--path_to_mrpc", patch=lambda mp: mp.setenv("HEADCOUNT_GLUE_DIR", os.getcwd())),
    # -- model files and the process (config.json, tokenizer, full disk, Ctrl-C) -------------------
    Row("model-config-list", lambda w, d: ["info", M, str(config_text(w, d, b"[1, 2]"))], "holds a list, not a JSON object"),
    Row("model-config-number-score", lambda w, d: score(w, d, model=config_text(w, d, b"3")), "holds a number"),
    Row("model-config-string-shrink", lambda w, d: shrink(w, d, model=config_text(w, d, b'"bert"')), "holds a string"),
    Row("model-config-null-finetune", lambda w, d: finetune(w, d, model=config_text(w, d, b"null")), "holds null"),
    Row("model-config-list-export", lambda w, d: ["export", M, str(config_text(w, d, b"[]")), "--out", str(d / "o")],
        "not a JSON object"),
    Row("model-no-tokenizer-score", lambda w, d: score(w, d, model=no_tokenizer(w, d)), "has no tokenizer files"),
    Row("model-no-tokenizer-prune", lambda w, d: ["prune", M, str(no_tokenizer(w, d)), T, w["task"], "--out", str(d / "o")],
        "has no tokenizer files"),
    Row("model-no-tokenizer-finetune", lambda w, d: finetune(w, d, model=no_tokenizer(w, d)), "has no tokenizer files"),
    Row("model-tokenizer-config-only", lambda w, d: score(w, d, model=no_tokenizer(w, d, keep=("tokenizer_config.json",))),
        "has no tokenizer files"),
    Row("model-vocab-only-special", lambda w, d: score(w, d, model=no_tokenizer(
        w, d, keep=("tokenizer_config.json",), vocab=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])), "has no vocabulary"),
    Row("shrink-full-disk-weights", lambda w, d: shrink(w, d), "no space left", patch=weights_full_disk),
    # (finetune on a full disk reports progress first: tests/cli/test_process.py)
    # -- option and config ranges, study validation ------------------------------------------------
    Row("finetune-epochs-infinite", lambda w, d: finetune(w, d, "--epochs", "inf"), "epochs must be in (0, 1000], got inf"),
    Row("finetune-epochs-1e308", lambda w, d: finetune(w, d, "--epochs", "1e308"), "epochs must be in (0, 1000]"),
    Row("finetune-epochs-nan", lambda w, d: finetune(w, d, "--epochs", "nan"), "epochs"),
    Row("finetune-lr-infinite", lambda w, d: finetune(w, d, "--lr", "inf"), "learning rate must be in (0, 1]"),
    Row("finetune-lr-above-one", lambda w, d: finetune(w, d, "--lr", "5"), "learning rate"),
    Row("finetune-huge-batch", lambda w, d: finetune(w, d, "--batch-size", "100000"), "batch size"),
    Row("finetune-huge-max-train", lambda w, d: finetune(w, d, "--max-train-examples", str(10**12)), "max train examples"),
    Row("finetune-seed-negative", lambda w, d: finetune(w, d, "--seed", "-1"), "--seed must be at least 0"),
    Row("finetune-seed-above-32-bits", lambda w, d: finetune(w, d, "--seed", str(2**32)),
        "--seed must be an integer in 0..4294967295"),
    Row("finetune-huge-save-steps", lambda w, d: finetune(w, d, "--save-steps", str(10**12)), "save steps"),
    Row("magnitude-rate-above-one", lambda w, d: magnitude(w, d, "--rate", "1.5"), "rate must be in (0, 1), got 1.5"),
    Row("magnitude-rate-nan", lambda w, d: magnitude(w, d, "--rate", "nan"), "rate"),
    Row("magnitude-threshold-nan", lambda w, d: magnitude(w, d, "--threshold", "nan"), "threshold"),
    Row("magnitude-huge-rounds", lambda w, d: magnitude(w, d, "--rounds", "100000"), "rounds"),
    Row("magnitude-epochs-infinite", lambda w, d: magnitude(w, d, "--epochs", "inf"), "epochs"),
    Row("magnitude-seed-negative", lambda w, d: magnitude(w, d, "--seed", "-3"), "--seed"),
    Row("score-seed-negative", lambda w, d: score(w, d, "--seed", "-1"), "--seed"),
    Row("score-huge-batch", lambda w, d: score(w, d, "--batch-size", str(10**7)), "--batch-size"),
    Row("score-negative-tokens-per-batch", lambda w, d: score(w, d, "--tokens-per-batch", "-5"), "--tokens-per-batch"),
    Row("prune-negative-max-eval-examples", lambda w, d: prune(w, d, "--max-eval-examples", "-1"), "--max-eval-examples"),
    Row("prune-step-nan", lambda w, d: prune(w, d, "--step", "nan"), "step"),
    Row("prune-threshold-infinite", lambda w, d: prune(w, d, "--threshold", "inf"), "threshold"),
    Row("export-tolerance-infinite", lambda w, d: ["export", M, w["clf"], "--out", str(d / "m.onnx"), "--tolerance", "inf"],
        "--tolerance"),
    Row("patterns-train-lr-infinite", lambda w, d: ["patterns", "train", "--maps", str(w["root"] / "maps" / "maps.safetensors"),
                                                   "--labels", str(w["root"] / "maps" / "labels.csv"), "--lr", "inf",
                                                   "--out", str(d / "o")], "--lr"),
    Row("patterns-train-labels-glued-rows", lambda w, d: ["patterns", "train", "--maps", str(w["root"] / "maps" / "maps.safetensors"),
                                                         "--labels", str(text_file(d, "l.csv", 'index,label\n"0,vertical\n1",block\n'
                                                                                   '2,diagonal')),
                                                         "--epochs", "1", "--out", str(d / "o")], "l.csv, line 2: not valid CSV"),
    Row("patterns-synthetic-huge-size", lambda w, d: ["patterns", "synthetic", "--size", "100000", "--out", str(d / "o")],
        "--size"),
    Row("data-show-zero-examples", lambda w, d: ["data", "show", w["task"], "--n", "0"], "--n"),
    Row("study-gpus-per-job-huge", lambda w, d: ["study", str(demo_config(d, "", "")), "--out", str(d / "run"),
                                                 "--executor", "ray", "--gpus-per-job", "1e308"], "--gpus-per-job"),
    Row("study-model-missing", lambda w, d: ["study", str(demo_config(d, "model: offline", "model: /nonexistent")),
                                             "--out", str(d / "run")], "checkpoint directory not found: /nonexistent"),
    Row("study-model-relative-missing", lambda w, d: ["study", str(demo_config(d, "model: offline", "model: ./nowhere")),
                                                      "--out", str(d / "run")], "not found"),
    Row("study-n-boot-1e26", lambda w, d: ["study", str(demo_config(d, "n_boot: 200", "n_boot: 1.0e+26")),
                                           "--out", str(d / "run")], "n_boot"),
    Row("study-n-boot-huge-integer", lambda w, d: ["study", str(demo_config(d, "n_boot: 200", f"n_boot: {10**26}")),
                                                   "--out", str(d / "run")], "n_boot"),
    Row("study-seeds-boolean", lambda w, d: ["study", str(demo_config(d, "seeds: [1]", "seeds: [true]")),
                                             "--out", str(d / "run")], "'transfer.seeds[0]' must be a number, not true"),
    Row("study-seed-above-32-bits", lambda w, d: ["study", str(demo_config(d, "seeds: [1]", f"seeds: [{2**32}]")),
                                                  "--out", str(d / "run")], "seeds[0]"),
    Row("study-epochs-infinite", lambda w, d: ["study", str(demo_config(d, "epochs: 1,", "epochs: .inf,")),
                                               "--out", str(d / "run")], "must be a finite number"),
    Row("study-lr-huge", lambda w, d: ["study", str(demo_config(d, "lr: 2.0e-4", "lr: 2.0e+4")),
                                       "--out", str(d / "run")], "learning rate"),
    Row("study-boolean-batch-size", lambda w, d: ["study", str(demo_config(d, "eval_batch_size: 80", "eval_batch_size: true")),
                                                  "--out", str(d / "run")], "must be a number, not true"),
    Row("study-huge-random-draws", lambda w, d: ["study", str(demo_config(d, "random_draws: 1", "random_draws: 1000000")),
                                                 "--out", str(d / "run")], "random_draws"),
    Row("study-huge-magnitude-rounds", lambda w, d: ["study", str(demo_config(d, "rounds: 1,", "rounds: 5000,")),
                                                     "--out", str(d / "run")], "rounds"),
    Row("study-head-corpus-missing", lambda w, d: ["study", str(demo_config(d, "head_corpus: offline/corpus",
                                                                           "head_corpus: ./none.txt")),
                                                   "--out", str(d / "run")], "file not found"),
    Row("study-alias-bomb", lambda w, d: ["study", str(demo_config(d, "study: demo", "study: demo\n" + ALIAS_BOMB)),
                                          "--out", str(d / "run")], "expands to more than"),
    Row("study-alias-inside-itself", lambda w, d: ["study", str(demo_config(d, "study: demo", "study: demo\nloop: &x [*x]")),
                                                   "--out", str(d / "run")], "refers to the value it is in"),
    Row("study-duplicate-key", lambda w, d: ["study", str(demo_config(d, "study: demo", "study: demo\nname: twice")),
                                             "--out", str(d / "run")], "key 'name' appears twice"),
    Row("study-duplicate-nested-key", lambda w, d: ["study", str(demo_config(d, "  model: offline", "  model: offline\n  model: offline")),
                                                    "--out", str(d / "run")], "key 'transfer.model' appears twice"),
    Row("task-yaml-duplicate-key", lambda w, d: score(w, d, task=task_with(d, yaml_extra="name: again\n")),
        "key 'name' appears twice"),
    Row("task-yaml-alias-bomb", lambda w, d: score(w, d, task=task_with(d, yaml_extra=ALIAS_BOMB)), "expands to more than"),
    # -- ownership of --out -------------------------------------------------------------------------
    Row("own-score-users-outputs-force", lambda w, d: score(w, d, "--force", out=users(d, "scores.json", "heads.png")),
        "no record"),
    Row("own-shrink-users-checkpoint-force", lambda w, d: shrink(w, d, out=users(d, "config.json", "model.safetensors"))
        + ["--force"], "no record"),
    Row("own-export-hf-users-checkpoint-force", lambda w, d: ["export", "--format", "hf", M, w["clf"], "--out",
                                                             users(d, "config.json", "model.safetensors"), "--force"],
        "no record"),
    Row("own-finetune-users-metrics", lambda w, d: ["finetune", M, w["pre"], T, w["task"], "--out",
                                                   users(d, "metrics.json")], "no record"),
    Row("own-magnitude-users-trace", lambda w, d: ["magnitude", M, w["pre"], T, w["task"], "--out",
                                                  users(d, "trace.csv")], "no record"),
    Row("own-score-temp-like-names", lambda w, d: score(w, d, out=users(d, ".draft.20261201.tmp")), "no record"),
    Row("own-prune-temp-like-in-cwd", lambda w, d: ["prune", M, w["clf"], T, w["task"], "--out", "."]
        if users(d, ".thesis.12345.tmp", folder=".") else [], "no record"),
    Row("own-lock-file-of-the-user", lambda w, d: score(w, d, out=users(d, ".headcount.lock")), "not headcount's lock"),
    Row("own-record-of-another-command", lambda w, d: score(w, d, out=w["root"] / "earlier-shrink"),
        "holds the output of `headcount shrink`"),
    Row("own-study-users-files", lambda w, d: ["study", str(demo_config(d, "", "")), "--out",
                                              users(d, "manifest.json", "report.html")], "no record"),
    Row("own-report-of-a-folder-without-record", lambda w, d: ["report", users(d, "manifest.json")], "no record"),
    Row("own-record-points-outside", lambda w, d: ["report", crafted_record(d, "results/../../victim.txt")],
        "refuses a record"),
    Row("own-record-lists-parent", lambda w, d: ["report", crafted_record(d, "..")], "refuses a record"),
    Row("own-record-absolute-path", lambda w, d: ["report", crafted_record(d, str(d / "victim.txt"))], "refuses a record"),
    Row("own-run-jobs-is-a-link", lambda w, d: ["report", linked_jobs(d)], "does not list as its own"),
    Row("own-empty-lock-of-the-user", lambda w, d: score(w, d, out=empty_lock(d)), "empty file that headcount did not create"),
    Row("own-data-fetch-users-manifest", lambda w, d: ["data", "fetch", "--dir", users(d, "MANIFEST.json"), "--force"],
        "does not list as its own"),
]


def test_the_table_is_large_enough():
    assert len(ROWS) >= 60 and len({r.id for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input(row, w, tmp_path, capsys, monkeypatch):
    d = tmp_path / "case"
    d.mkdir()
    argv = [str(a) for a in row.make(w, d)]
    monkeypatch.chdir(d)
    world_before, case_before = snapshot(w["root"]), snapshot(d)
    if row.patch is not None:
        row.patch(monkeypatch)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    _, err = capsys.readouterr()
    monkeypatch.undo()
    for p in d.rglob("*"):  # let pytest clean up read-only folders
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    if row.needle:
        assert row.needle in lines[0], lines[0]
    assert snapshot(w["root"]) == world_before  # earlier outputs byte-identical
    assert snapshot(d) == case_before  # nothing created, changed or hidden
