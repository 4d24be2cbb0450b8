"""Every command that takes ``--model`` takes a GGUF file, the same way (``headcount.core.gguf.gguf_source``),
and the GGUF conversion cache serves any GGUF file a command loads.

One tiny random Llama-layout GGUF decoder (``tests/gguf_files.py``: 2 layers, 4 query heads on 2
KV heads, 64 tokens, 75 KB) and one tiny task, shared by the module; each command runs in-process
and its output is checked, not only its exit status. Then the cache: the first load converts
(one ``note:`` line with the size and the folder), a second load reads the conversion (transformers'
GGUF parser is made to fail), ``HEADCOUNT_GGUF_CACHE=off`` reads the file and writes nothing,
and a cache that cannot be written is one note, not an error.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import transformers
from cli_helpers import assert_one_error_line, run_cli, write_mask
from gguf_files import write_gguf
from training_helpers import make_task

from headcount.core import gguf
from headcount.core.models import load_model, load_tokenizer
from headcount.runtime.paths import GGUF_CACHE_ENV


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The GGUF file, a task, a mask, and the weights transformers reads from the file itself;
    ``$HEADCOUNT_CACHE`` a fresh folder (the first command converts the file into it), one thread."""
    root = tmp_path_factory.mktemp("gguf-every-command")
    path = write_gguf(root / "tiny.gguf")
    want = transformers.AutoModelForCausalLM.from_pretrained(root, gguf_file=path.name).state_dict()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADCOUNT_CACHE", str(root / "cache"))
        mp.delenv(GGUF_CACHE_ENV, raising=False)
        yield {"root": root, "gguf": path, "want": want, "task": make_task(root / "task", n_train=16, n_dev=16),
               "mask": write_mask(root / "mask.json", [[1, 0, 1, 1], [1, 1, 0, 0]], [1, 1])}
    torch.set_num_threads(threads)


def no_gguf_parsing(monkeypatch):
    """transformers' GGUF reader fails the test when anything calls it (a load from the conversion does not)."""
    import transformers.modeling_gguf_pytorch_utils as reader

    def refuse(*a, **kw):
        raise AssertionError("the GGUF file was parsed again")

    monkeypatch.setattr(reader, "load_gguf_checkpoint", refuse)


def size_notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note: converting ")]


def test_the_first_command_converts_with_one_note_and_the_rest_reuse_it(world, capsys, monkeypatch):
    """``info`` is the first load: it converts (one note: size from the header, the folder); then
    every other command runs with transformers' GGUF parser failing if called."""
    folder = gguf.converted_dir(world["gguf"])
    assert not folder.exists()
    code, out, err = run_cli(capsys, "info", "--model", world["gguf"])
    assert code == 0, err
    assert "layers: 2" in out and "4 per layer" in out and "2 per layer (2 query heads each)" in out
    (note,) = size_notes(err)
    params = sum(t.numel() for t in world["want"].values())
    assert f"({params:,} parameters x 4 bytes" in note and str(folder) in note and GGUF_CACHE_ENV in note
    assert gguf.find_converted(world["gguf"]) == folder
    weights = (folder / "model.safetensors").stat().st_size
    assert 4 * params <= weights < 4 * params + 4096  # the estimate is what the weights take (+ a header)
    no_gguf_parsing(monkeypatch)
    code, out, err = run_cli(capsys, "info", "--model", world["gguf"])
    assert code == 0 and "layers: 2" in out and not size_notes(err), err
    model = load_model(str(world["gguf"]), head="lm")
    got = model.state_dict()
    assert set(got) == set(world["want"]) and all(torch.equal(got[k], world["want"][k]) for k in got)
    assert load_tokenizer(str(world["gguf"]))("ab ca")["input_ids"]


@pytest.fixture
def converted(world, monkeypatch):
    """The module's file already converted; transformers' GGUF parser fails if called."""
    gguf.convert_gguf(world["gguf"])
    no_gguf_parsing(monkeypatch)
    return world


def test_export_onnx_and_hf(converted, tmp_path, capsys):
    """Both formats: the ONNX file is checked against PyTorch by export itself; the plain checkpoint
    reloads with the GGUF file's weights and the same logits."""
    code, out, err = run_cli(capsys, "export", "--model", converted["gguf"], "--out", tmp_path / "m.onnx")
    assert code == 0, err
    assert (tmp_path / "m.onnx").stat().st_size > 10_000 and "-> logits" in out and "max abs diff" in out
    code, out, err = run_cli(capsys, "export", "--model", converted["gguf"], "--format", "hf", "--out", tmp_path / "hf")
    assert code == 0, err
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ours = load_model(str(converted["gguf"]), head="lm")
    ids = torch.tensor([[0, 5, 9, 33, 2, 63]])
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, ours(input_ids=ids).logits, rtol=0, atol=1e-5)
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in converted["want"].items())


def test_shrink(converted, tmp_path, capsys):
    code, out, err = run_cli(capsys, "shrink", "--model", converted["gguf"], "--mask", converted["mask"],
                             "--out", tmp_path / "small")
    assert code == 0, err
    assert "5/8 heads" in out
    code, out, err = run_cli(capsys, "info", "--model", tmp_path / "small")
    assert code == 0 and "heads kept: 5/8" in out, err


def test_score_and_prune(converted, tmp_path, capsys):
    code, _, err = run_cli(capsys, "score", "--model", converted["gguf"], "--task", converted["task"],
                           "--max-examples", 8, "--out", tmp_path / "s")
    assert code == 0, err
    heads = np.asarray(json.loads((tmp_path / "s" / "scores.json").read_text())["heads"], dtype=float)
    assert heads.shape == (2, 4) and np.isfinite(heads).all()
    code, _, err = run_cli(capsys, "prune", "--model", converted["gguf"], "--task", converted["task"],
                           "--max-examples", 8, "--max-eval-examples", 8, "--out", tmp_path / "p")
    assert code == 0, err
    mask = json.loads((tmp_path / "p" / "mask.json").read_text())
    assert np.asarray(mask["heads"]).shape == (2, 4)


def test_finetune_and_magnitude(converted, tmp_path, capsys):
    """Trainable: a model read from GGUF is not flagged as quantised (transformers' Trainer refuses those)."""
    code, _, err = run_cli(capsys, "finetune", "--model", converted["gguf"], "--task", converted["task"],
                           "--epochs", 1, "--max-train-examples", 16, "--max-eval-examples", 8, "--out", tmp_path / "ft")
    assert code == 0, err
    assert 0 <= json.loads((tmp_path / "ft" / "metrics.json").read_text())["final"]["score"] <= 1
    assert json.loads((tmp_path / "ft" / "model" / "config.json").read_text())["architectures"] == [
        "LlamaForSequenceClassification"]
    code, _, err = run_cli(capsys, "magnitude", "--model", converted["gguf"], "--task", converted["task"],
                           "--epochs", 1, "--max-train-examples", 16, "--max-eval-examples", 8, "--out", tmp_path / "m")
    assert code == 0, err
    assert (tmp_path / "m" / "weight_mask.safetensors").is_file() and (tmp_path / "m" / "trace.csv").is_file()


def test_explore_and_kv_budget(converted, tmp_path, capsys):
    code, out, err = run_cli(capsys, "explore", "--model", converted["gguf"], "--task", converted["task"],
                             "--out", tmp_path / "e.html")
    assert code == 0, err
    assert "2 layers x 4 heads" in out and (tmp_path / "e.html").stat().st_size > 1000
    code, _, err = run_cli(capsys, "kv-budget", "--model", converted["gguf"], "--uniform", "--memory", 0.5,
                           "--context", 64, "--sink", 4, "--out", tmp_path / "b")
    assert code == 0, err
    assert (tmp_path / "b" / "budget.json").is_file()


# -- the cache's switch and its fallback ------------------------------------------------------------
def test_off_reads_the_file_and_writes_nothing(world, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEADCOUNT_CACHE", str(cache))
    monkeypatch.setenv(GGUF_CACHE_ENV, "off")
    parsed = []
    import transformers.modeling_gguf_pytorch_utils as reader

    original = reader.load_gguf_checkpoint
    monkeypatch.setattr(reader, "load_gguf_checkpoint", lambda *a, **kw: parsed.append(1) or original(*a, **kw))
    code, out, err = run_cli(capsys, "info", "--model", world["gguf"])
    assert code == 0 and "layers: 2" in out, err
    assert parsed and not size_notes(err)
    assert not (cache / "gguf").exists()
    assert gguf.gguf_source(str(world["gguf"])) == (str(world["gguf"].parent), {"gguf_file": "tiny.gguf"})
    model = load_model(str(world["gguf"]), head="lm")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in world["want"].items())
    # read from the file itself it is still trainable: not flagged as quantised (Trainer refuses those)
    classifier = load_model(str(world["gguf"]), head="classification", num_labels=2)
    assert not classifier.is_quantized
    from transformers.trainer_utils import validate_quantization_for_training

    validate_quantization_for_training(classifier)
    # export of the file read itself (its config names no class): the causal LM, as from the conversion
    code, out, err = run_cli(capsys, "export", "--model", world["gguf"], "--format", "hf", "--out", tmp_path / "hf")
    assert code == 0 and "LlamaForCausalLM" in out, err
    # `headcount data fetch` does not convert the offline decoder either
    from headcount.core import offline_models

    monkeypatch.setattr(offline_models, "offline_decoder_file", lambda: world["gguf"])
    assert f"not converted ({GGUF_CACHE_ENV}=off)" in offline_models.offline_decoder_status(convert=True)
    assert not (cache / "gguf").exists()
    monkeypatch.setenv(GGUF_CACHE_ENV, "of")
    assert_one_error_line(*run_cli(capsys, "info", "--model", world["gguf"])[::2])


def test_a_cache_that_cannot_be_written_is_one_note_not_an_error(world, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("HEADCOUNT_CACHE", str(blocker))
    code, out, err = run_cli(capsys, "info", "--model", world["gguf"])
    assert code == 0 and "layers: 2" in out, err
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "cannot write the GGUF conversion" in notes[0] and "tiny.gguf itself" in notes[0], err
    assert blocker.read_text().startswith("a file")
    code, out, err = run_cli(capsys, "info", "--model", world["gguf"])  # the same process: not said again
    assert code == 0 and not [line for line in err.splitlines() if line.startswith("note: ")], err
    assert os.path.isfile(blocker)
