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
