"""mkdocs hooks (``hooks:`` in mkdocs.yml): text the site derives from the code, so the docs cannot
drift from it.

``<!-- architectures -->`` in a page becomes the supported architectures' names, and
``<!-- architecture-table -->`` a table of every adapter with the ``config.model_type`` values
it serves, both read from the adapter registry (``headcount.core.arch``).
"""

from __future__ import annotations


def architectures() -> str:
    """The names of every supported architecture, as papers write them: ``BERT, RoBERTa, ...``."""
    from headcount.core.arch import adapters

    return ", ".join(name for adapter in adapters() for name in adapter.family)


def architecture_table() -> str:
    from headcount.core.arch import adapters

    rows = ["| architectures | `model_type` | adapter |", "|---|---|---|"]
    for adapter in adapters():
        cls = type(adapter)
        types = ", ".join(f"`{t}`" for t in adapter.model_types)
        rows.append(f"| {', '.join(adapter.family)} | {types} | `{cls.__module__}.{cls.__name__}` |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_) -> str:
    if "<!-- architectures -->" in markdown:
        markdown = markdown.replace("<!-- architectures -->", architectures())
    if "<!-- architecture-table -->" in markdown:
        markdown = markdown.replace("<!-- architecture-table -->", architecture_table())
    return markdown


try:  # the API reference's docstrings (mkdocstrings reads them with griffe)
    from griffe import Extension as _GriffeExtension
except ImportError:  # pragma: no cover - griffe comes with mkdocstrings
    _GriffeExtension = object


class DoctestBlocks(_GriffeExtension):
    """A griffe extension (``extensions:`` of mkdocstrings' python handler in mkdocs.yml): a run of
    ``>>>`` lines outside an ``Examples:`` section becomes a ``pycon`` code block, its doctest flags
    (``# doctest: +SKIP``) dropped; markdown would render it as a quoted paragraph."""

    def on_instance(self, *, obj, **_) -> None:
        if obj.docstring is not None:
            obj.docstring.value = doctest_blocks(obj.docstring.value)


def doctest_blocks(text: str) -> str:
    """``>>>`` runs of ``text`` (and their output lines) fenced as ``pycon``; text already in a fence
    or an ``Examples:`` section is left as it is (``"Load it.\\n\\n>>> m = load()  # doctest: +SKIP"``
    becomes the text, then a fence holding ``>>> m = load()``).
    """
    import re

    out, block, fenced, section = [], None, False, False
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        if not fenced and block is None and re.match(r"^(Examples?|Example):\s*$", stripped):
            section = True
        elif section and line and not line[0].isspace() and not stripped.startswith(">>>"):
            section = False
        if block is not None:
            if stripped:  # a prompt or its output
                block.append(re.sub(r"\s*#\s*doctest:.+$", "", line))
                continue
            out.extend(["```pycon", *block, "```"])
            block = None
        if not fenced and not section and stripped.startswith(">>>") and not line[0].isspace():
            block = [re.sub(r"\s*#\s*doctest:.+$", "", line)]
            continue
        out.append(line)
    if block is not None:
        out.extend(["```pycon", *block, "```"])
    return "\n".join(out)


def on_post_build(config, **_) -> None:
    """``404.html`` links root-absolute (``href="/assets/..."``: mkdocs renders the error page for a
    web server's root, without ``site_url``), which break when the built site is opened from disk;
    the page lies at the site's root, so ``./`` reaches the same files."""
    import re
    from pathlib import Path

    page = Path(config["site_dir"]) / "404.html"
    if page.is_file() and not config.get("site_url"):
        text = page.read_text(encoding="utf-8")
        page.write_text(re.sub(r'((?:href|src)=")/(?!/)', r"\1./", text), encoding="utf-8")
