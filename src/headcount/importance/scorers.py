"""The scorer registry: every importance method is declared once, as a [`Scorer`][headcount.importance.scorers.Scorer].

A scorer is a function ``fn(model, batches, ctx) -> Scores`` plus what it needs and supports. The
command line's choices, the settings' validation, the study configs, the pipeline and the report
ask this registry; nothing else compares method names. The built-in methods are declared at the
end of [`headcount.importance.scoring`][headcount.importance.scoring] (import it, or ``headcount.importance.scoring.get_scorer``, to have them);
a plugin package declares its own under the entry-point group ``headcount.scorers`` (a module
that calls [`register_scorer`][headcount.importance.scorers.register_scorer] when imported), or calls [`register_scorer`][headcount.importance.scorers.register_scorer] itself:

>>> from headcount.importance.scorers import Scorer, register_scorer
>>> def weight_count(model, batches, ctx):   # doctest: +SKIP
...     ...
>>> register_scorer(Scorer("weight-count", weight_count, needs_data=False))   # doctest: +SKIP

Then ``headcount score --method weight-count``, ``headcount prune --method weight-count`` and a
study's ``method: weight-count`` use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

from headcount.importance.scorer_options import ScorerOptions, flag
from headcount.runtime.errors import HeadcountError

#: the entry-point group of plugin scorers (each entry: a module that registers its scorers)
ENTRY_POINTS = "headcount.scorers"


@dataclass(frozen=True)
class ScoreContext:
    """What [`headcount.importance.scoring.score`][headcount.importance.scoring.score] passes to a scorer besides the model and batches.

    Attributes:
        rt: the ``Runtime`` (device, precision, token budget).
        keep_per_example: keep per-example contributions (scorers with ``per_example``).
        progress: called with the amount of work done (or None): examples, or what the scorer's
            ``progress_unit`` counts (``ablation``: heads ablated).
        accumulate: the accumulation (scorers with ``accumulations``).
        at: the mask whose gate values the gradient is taken at (scorers with ``gate_gradient``), or None.
        options: the scorer's own options: an instance of its ``Scorer.options`` class
            (``headcount.importance.scorer_options``; ``retrieval``:
            ``RetrievalOptions``, ``long-range``: ``LongRangeOptions``), checked when it was built.
    """

    rt: object
    keep_per_example: bool = False
    progress: Callable | None = None
    accumulate: str = "per-batch"
    at: object = None
    options: ScorerOptions = field(default_factory=ScorerOptions)


@dataclass(frozen=True)
class Scorer:
    """One importance method.

    Attributes:
        name: what ``--method`` and configs call it.
        fn: ``fn(model, batches, ctx: ScoreContext) -> Scores`` (``heads [L, H]``, ``mlps [L]``).
        needs_data: False: batches are ignored (no data is loaded for it; e.g. ``magnitude``).
        needs_loss: False: it reads attention only, never the loss (labels are dropped; a model
            without a trained head is fine; e.g. ``entropy``).
        gate_gradient: it differentiates the gates: a mask can be held at its gate values
            (``at_mask``), and the embedding objectives' contrastive loss applies.
        accumulations: the ``accumulate`` modes it defines (empty: none; the default mode of
            ``headcount.importance.scores.ACCUMULATE`` is then accepted and ignored).
        can_prune: it can drive ``headcount prune`` (a score that is not an importance cannot).
        per_example: it can return per-example contributions (``Scores.per_example``), which
            the transfer study's paired bootstrap needs.
        description: one line for ``--help`` and the docs.
        scores_mlps: False: its MLP scores are NaN by design (``entropy`` describes attention only).
        progress_unit: what its ``ctx.progress(done)`` counts: ``examples`` ([`count_examples`][headcount.importance.scorers.count_examples]
            is the total), or ``heads`` (one per head of the model: ``ablation``).
        options: its options class, a frozen dataclass subclassing
            ``headcount.importance.scorer_options.ScorerOptions`` (each field's default, range or
            choices and help declared with ``option``; the default: no options). ``headcount score``
            gets a flag per field, ``ScoreSettings.options`` holds one, and the scorer is handed it
            as ``ctx.options``.
    """

    name: str
    fn: Callable
    needs_data: bool = True
    needs_loss: bool = True
    gate_gradient: bool = False
    accumulations: tuple[str, ...] = ()
    can_prune: bool = True
    per_example: bool = False
    description: str = ""
    meta: dict = field(default_factory=dict)
    scores_mlps: bool = True
    progress_unit: str = "examples"
    options: type[ScorerOptions] = ScorerOptions

    def options_of(self, given: ScorerOptions | Mapping | None = None) -> ScorerOptions:
        """Its options: ``given`` as they are (an instance of its class), or built from a mapping of
        field -> value (None, empty: the defaults). A name its class does not declare is refused
        in one line naming the method that takes it.

        >>> from headcount.importance.scoring import get_scorer  # the built-in scorers registered
        >>> get_scorer("long-range").options_of({"sink": 2}).sink
        2
        >>> get_scorer("gradient").options_of({"sink": 2})
        Traceback (most recent call last):
        ...
        headcount.runtime.errors.HeadcountError: --sink is an option of --method long-range, not gradient
        """
        if isinstance(given, self.options):
            return given
        if isinstance(given, ScorerOptions):
            raise HeadcountError(f"{type(given).__name__} are not the options of --method {self.name} "
                                 f"({self.options.__name__})")
        given = dict(given or {})
        own = {f.name for f in fields(self.options)}
        for name in given:
            if name not in own:
                takers = [n for n in scorer_names() if name in {f.name for f in fields(_REGISTRY[n].options)}]
                where = f"an option of --method {' / '.join(takers)}" if takers else "no scorer's option"
                raise HeadcountError(f"{flag(name)} is {where}, not {self.name}")
        return self.options(**given)


def count_examples(batches) -> int:
    """The examples in ``batches`` (a list): the rows of each dict batch's ``input_ids`` [b, s], or a
    batch's ``examples`` (needle-in-a-haystack batches): the total of a scorer's ``examples`` progress."""
    n = 0
    for b in batches:
        n += len(b.examples) if hasattr(b, "examples") else int(b["input_ids"].shape[0])
    return n


_REGISTRY: dict[str, Scorer] = {}
_PLUGINS_LOADED = False


def register_scorer(scorer: Scorer, replace: bool = False) -> Scorer:
    """Add ``scorer`` to the registry (a second scorer of the same name is refused unless ``replace``)."""
    if not isinstance(scorer, Scorer):
        raise HeadcountError(f"register_scorer takes a Scorer, not {type(scorer).__name__}")
    if not scorer.name or scorer.name != scorer.name.strip():
        raise HeadcountError(f"a scorer needs a name without surrounding spaces (got {scorer.name!r})")
    if scorer.name in _REGISTRY and not replace and _REGISTRY[scorer.name] is not scorer:
        raise HeadcountError(f"a scorer named {scorer.name!r} is already registered")
    _REGISTRY[scorer.name] = scorer
    return scorer


def unregister_scorer(name: str) -> None:
    """Remove a scorer (tests, plugins replacing one)."""
    _REGISTRY.pop(name, None)


def _load_plugins() -> None:
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINTS):
        try:
            ep.load()
        except Exception as e:  # a broken plugin is one line, not a traceback of every command
            raise HeadcountError(f"the scorer plugin {ep.name!r} ({ep.value}) failed to load: {e}") from None


def scorer_names(**wanted) -> tuple[str, ...]:
    """Names of the registered scorers, optionally those whose attributes equal ``wanted``
    (``scorer_names(can_prune=True)``)."""
    _load_plugins()
    return tuple(n for n, s in _REGISTRY.items() if all(getattr(s, k) == v for k, v in wanted.items()))


def get_scorer(name: str) -> Scorer:
    """The scorer called ``name``; one line naming the choices for an unknown one."""
    _load_plugins()
    if name not in _REGISTRY:
        raise HeadcountError(f"unknown method {name!r}; choose one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


__all__ = ["Scorer", "ScoreContext", "count_examples", "register_scorer", "unregister_scorer", "get_scorer", "scorer_names",
           "ENTRY_POINTS"]
