"""The decoder question is asked once: each adapter declares ``is_decoder``, and every command that
needs a decoder asks ``require_decoder`` (one error line), never the layout by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import ARCH_TABLE, tiny_model

from headcount.core.arch import get_adapter, is_decoder, require_decoder, require_kv_groups
from headcount.runtime.errors import HeadcountError

SRC = Path(__file__).resolve().parents[2] / "src" / "headcount"


@pytest.mark.parametrize("arch", ARCH_TABLE, ids=[a.id for a in ARCH_TABLE])
def test_every_adapter_declares_what_the_table_says(arch):
    model = tiny_model(arch.id, head="lm" if arch.decoder else "base")
    adapter = get_adapter(model)
    assert is_decoder(model) is arch.decoder is adapter.is_decoder
    # the flag and the layout agree: only decoders have a key/value level
    assert (adapter.layout(model).n_kv_heads is not None) is arch.decoder
    if arch.decoder:
        assert require_decoder(model, "x").n_kv_heads == (arch.kv_heads or adapter.layout(model).n_heads)
    else:
        with pytest.raises(HeadcountError) as err:
            require_decoder(model, "--objective lm", "my-bert")
        assert str(err.value) == ("--objective lm needs a decoder (a causal language model with a key/value "
                                  "cache); my-bert is an encoder")


@pytest.mark.parametrize("arch", [a for a in ARCH_TABLE if a.decoder], ids=lambda a: a.id)
def test_kv_groups_need_grouped_query_attention(arch):
    model = tiny_model(arch.id, head="lm")
    grid = get_adapter(model).layout(model)
    if grid.n_kv_heads < grid.n_heads:
        assert require_kv_groups(model) == grid
    else:
        with pytest.raises(HeadcountError, match="has no grouped-query attention .*use --unit heads"):
            require_kv_groups(model)


def _strings(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def test_no_hand_written_decoder_refusal_outside_the_registry():
    """"needs a decoder" refusals come from core/arch/registry.py only (a mask checked against a
    layout may still say what the layout lacks)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "registry.py" and path.parent.name == "arch":
            continue
        for text in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            if "needs a decoder" in text or "need a decoder" in text:
                found.append(f"{path.relative_to(SRC)}: {text[:70]!r}")
    assert not found, found
