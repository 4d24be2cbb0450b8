"""mkdocs_hooks.py: bare ``>>>`` docstring lines become code blocks (flags dropped), and 404.html's
root-absolute links become relative (the built site opened from disk)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bare_doctest_lines_become_a_code_block_without_flags():
    text = "Load a model.\n\n>>> m = load_model('x')   # doctest: +SKIP\n>>> m.eval()\n\nMore text."
    out = _hooks().doctest_blocks(text)
    assert out == "Load a model.\n\n```pycon\n>>> m = load_model('x')\n>>> m.eval()\n```\n\nMore text."
    fenced = "```python\n>>> x = 1\n```"
    assert _hooks().doctest_blocks(fenced) == fenced
    examples = "Text.\n\nExamples:\n    >>> x = 1\n"
    assert _hooks().doctest_blocks(examples) == examples


def test_404_links_are_made_relative(tmp_path):
    (tmp_path / "404.html").write_text('<link href="/assets/a.css"><a href="//cdn.x/y"></a><img src="/img.png">')
    _hooks().on_post_build({"site_dir": str(tmp_path), "site_url": None})
    assert (tmp_path / "404.html").read_text() == '<link href="./assets/a.css"><a href="//cdn.x/y"></a><img src="./img.png">'
