"""Generic code never names an architecture: only src/headcount/core/arch/ may (docs/design.md).

What counts as *naming* is what makes code architecture-specific: an identifier (variable,
attribute, function, class, argument, imported module) or a string literal used as a key,
type name or attribute path (``"albert"``, ``"encoder.albert_layer_groups"``,
``"BertModel"``). Prose is exempt: comments, docstrings and string literals with whitespace
(help texts, error messages) may say "ALBERT" or "BERT-family" to explain things.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "headcount"
ARCH_DIR = SRC / "core" / "arch"


def registered_names() -> set[str]:
    """The words that name an architecture, from the adapter registry: every registered
    ``model_type`` and every name in an adapter's ``family``, split at non-letters, digits dropped
    (``xlm-roberta`` -> xlm, roberta; ``DeBERTa-v2/v3`` -> deberta)."""
    from headcount.core.arch import adapters, supported_model_types

    words = list(supported_model_types()) + [name for a in adapters() for name in a.family]
    return {w for text in words for w in re.split(r"[^a-z]+", text.lower()) if len(w) >= 3} - SUFFIXES


#: words inside model types that name no architecture (``gemma3_text``: Gemma 3's text-only model)
SUFFIXES = {"text"}


NAMES = registered_names()

_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9]*")  # words, split at "_", "-", ".", ...
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")  # BertAdapter -> Bert, Adapter


def arch_names(text: str) -> set[str]:
    """Architecture names that occur as a whole word or identifier part in ``text``.

    ``BertModel``, ``deberta_v2``, ``xlm-roberta``, ``RoBERTa`` count; ``headcount``,
    ``bertology``, ``albertina`` do not.
    """
    found = set()
    for token in _TOKEN.findall(text):
        parts = {token.lower()} | {p.lower() for p in _CAMEL.findall(token)}
        found |= parts & NAMES
    return found


def _prose(node: ast.AST, docstrings: set[int]) -> bool:
    return id(node) in docstrings or any(c.isspace() for c in node.value)


def code_names(source: str) -> list[tuple[int, str, set[str]]]:
    """``(line, text, names)`` for every identifier or non-prose string that names an architecture."""
    tree = ast.parse(source)
    docstrings = {  # string expression statements: docstrings and string "comments"
        id(n.value) for n in ast.walk(tree)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
    }
    hits = []
    for node in ast.walk(tree):
        texts: list[str] = []
        if isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            texts = [node.name]
        elif isinstance(node, ast.arg):
            texts = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            texts = [node.arg]
        elif isinstance(node, ast.alias):
            texts = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            texts = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and not _prose(node, docstrings):
            texts = [node.value]
        for text in texts:
            if found := arch_names(text):
                hits.append((getattr(node, "lineno", 0), text, found))
    return sorted(hits, key=lambda h: h[0])


def generic_files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if ARCH_DIR not in p.parents)


def test_the_names_come_from_the_registry():
    assert {"bert", "roberta", "albert", "distilbert", "electra", "deberta", "xlm", "modernbert"} <= NAMES
    assert {"llama", "mistral", "qwen", "gemma", "gpt", "neox", "phi", "starcoder", "cohere"} <= NAMES
    assert not {"v2", "v3", "headcount", "model", "text"} & NAMES


def test_the_matcher():
    assert arch_names("class BertAdapter: ...") == {"bert"}
    assert arch_names("enc.albert_layer_groups") == {"albert"}
    assert arch_names('model_type == "xlm-roberta"') == {"xlm", "roberta"}
    assert arch_names("RoBERTa and DeBERTa-v2, DistilBertModel") == {"roberta", "deberta", "bert"}
    assert arch_names("DistilBERT") == {"distilbert", "bert"}
    assert arch_names("ELECTRA") == {"electra"}
    assert arch_names('model_type == "modernbert"; ModernBertAdapter') == {"modernbert", "bert"}
    assert arch_names("import headcount; bertology; albertina; robertson; HeadcountError") == set()


def test_code_names_sees_code_and_skips_prose():
    source = '''
"""Module docstring about ALBERT."""
from .arch.bert import BertAdapter   # a comment about RoBERTa
import transformers as albert_lib

def f(model, deberta_scale=1):
    """BERT-family docstring."""
    if model.config.model_type == "electra":
        return model.encoder.albert_layer_groups
    x = getattr(model, "distilbert")
    raise ValueError("ALBERT models need more")
'''
    found = {text for _, text, _ in code_names(source)}
    assert found == {"arch.bert", "BertAdapter", "albert_lib", "deberta_scale", "electra", "albert_layer_groups",
                     "distilbert"}


def test_there_is_generic_code_to_check():
    names = {p.name for p in generic_files()}
    assert {"gates.py", "surgery.py", "masks.py", "models.py", "app.py", "attention.py"} <= names


@pytest.mark.parametrize("path", generic_files(), ids=lambda p: str(p.relative_to(SRC)))
def test_generic_code_names_no_architecture(path):
    hits = code_names(path.read_text(encoding="utf-8"))
    bad = [f"{path.relative_to(SRC)}:{line}: {text!r} names {sorted(found)}" for line, text, found in hits]
    assert not bad, "architecture names outside src/headcount/core/arch/:\n" + "\n".join(bad)
