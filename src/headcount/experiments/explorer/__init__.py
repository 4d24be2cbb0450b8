"""The head explorer: one self-contained HTML page that joins, per attention head, its importance
under each objective, whether each seed's mask kept it, when pruning removed it, its attention
pattern class, and what it attends to on a few examples.

The package holds [`data`][headcount.experiments.explorer.data] (the page model: quantities as [layers, heads] grids, per-head
details, attention quantised to bytes), [`sources`][headcount.experiments.explorer.sources] (reading a study's run directory, or a
model and a task with score and mask files), [`page`][headcount.experiments.explorer.page] (the HTML; its script ``explorer.js``
and style ``explorer.css`` are package files inlined at write time) and [`output`][headcount.experiments.explorer.output] (writing
the one file safely). The command line is
``headcount explore``; in a notebook::

    import headcount as hc
    ex = hc.explore("runs/lottery")                     # a run directory
    ex = hc.explore(model="runs/ft/model", task="glue/sst2", scores=["scores.json"])
    ex                                                   # shows the page (an iframe)
    ex.save("explore.html")
"""

from __future__ import annotations

import html
from pathlib import Path

from headcount.experiments.explorer.data import DEFAULT_EXAMPLES, MAX_EXAMPLES, MAX_TOKENS
from headcount.runtime.errors import HeadcountError


class Explorer:
    """An explorer page: ``page`` (the JSON-able model), ``html``, ``save``; shown inline
    by Jupyter (``_repr_html_``: the page in an ``<iframe srcdoc>``)."""

    def __init__(self, page: dict, settings: dict | None = None):
        self.page = page
        self.settings = settings or {}
        self._html: str | None = None

    @property
    def identity(self) -> str:
        from headcount.experiments.explorer.output import identity_of

        return identity_of(self.settings)

    def html(self) -> str:
        """The whole page (one self-contained HTML document)."""
        if self._html is None:
            from headcount.experiments.explorer.page import render

            self._html = render(self.page, self.identity)
        return self._html

    def save(self, path, force: bool = True) -> Path:
        """Write the page to ``path``; a file there is replaced only if it is an explorer page
        (``force=False``: only one of the same settings)."""
        from headcount.experiments.explorer.output import write_page

        return write_page(path, self.html(), self.identity, force=force)

    def _repr_html_(self) -> str:
        return (f'<iframe srcdoc="{html.escape(self.html(), quote=True)}" style="width:100%;height:900px;'
                f'border:1px solid #cbd2db" sandbox="allow-scripts" title="headcount explorer"></iframe>')

    def __repr__(self) -> str:
        p = self.page
        return (f"Explorer({p['title']!r}: {p['layers']} x {p['heads']} heads, {len(p['quantities'])} quantities, "
                f"{len(p['attention']['examples']) if p.get('attention') else 0} examples)")


def explore(run=None, *, model: str | None = None, task: str | None = None, scores=(), masks=(), texts=None,
            examples: int = DEFAULT_EXAMPLES, job: str | None = None, device=None, attention: bool = True) -> Explorer:
    """The explorer of a run directory (``run``) or of a ``model`` on a ``task``.

    Args:
        run: a study's run directory (transfer, lottery, or any whose jobs write ``scores.json``,
            ``mask.json`` or ``patterns.json``).
        model: instead of ``run``: a checkpoint (or hub id, ``offline``), with ``task`` or ``texts``.
        task: with ``model``: the task whose dev examples the page shows; None with ``texts``: the
            attention on them alone (the model with the head it was saved with, no task).
        scores: with ``model``: paths of ``scores.json`` files to show.
        masks: with ``model``: paths of ``mask.json`` files to show.
        texts: with ``model``: your own texts (strings or pairs) instead of the task's dev examples.
        examples: dev examples whose attention the page holds (1 to 16, each cut to 128 tokens).
        job: with ``run``: the finetune job whose model gives the attention (default: the first
            finished one that kept its model).
        device: where the model runs (``auto``, ``cpu``, ``cuda:N``; default ``$HEADCOUNT_DEVICE``).
        attention: with ``run``: False leaves the attention examples out (no model is loaded).

    Returns:
        An ``Explorer`` (``.save(path)``; a notebook shows it).

    Raises:
        HeadcountError: both or neither of ``run`` and ``model``; a model with neither a task nor
            texts; bad files.
    """
    from headcount.experiments.explorer.sources import from_model, from_run

    if (run is None) == (model is None):
        raise HeadcountError("give a run directory, or --model with --task or --text (not both)")
    if run is not None:
        if scores or masks or texts is not None:
            raise HeadcountError("--scores, --mask and --text go with --model; a run directory has its own results")
        page = from_run(run, examples=examples, job=job, device=device, attention=attention)
        settings = {"run": str(Path(run).expanduser().resolve()), "examples": examples, "job": job}
    else:
        assert model is not None
        if task is None and texts is None:
            raise HeadcountError("--model needs --task (the attention on its dev examples) or --text (on your own "
                                 "texts, repeatable)")
        if job is not None:
            raise HeadcountError("--job goes with a run directory")
        page = from_model(model, task, scores=scores, masks=masks, texts=texts, examples=examples, device=device)
        local = Path(str(model)).expanduser()
        settings = {"model": str(local.resolve()) if local.exists() else str(model),
                    "task": None if task is None else str(task),
                    "scores": [str(Path(p).resolve()) for p in scores], "masks": [str(Path(p).resolve()) for p in masks],
                    "texts": texts, "examples": examples}
    return Explorer(page, settings)


__all__ = ["DEFAULT_EXAMPLES", "MAX_EXAMPLES", "MAX_TOKENS", "Explorer", "explore"]
