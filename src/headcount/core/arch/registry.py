"""The adapter registry: ``config.model_type`` -> the [`Adapter`][headcount.core.arch.base.Adapter]
that serves it.

An adapter module registers itself when it is imported (``register_adapter(MyAdapter())`` at
its end); ``headcount.core.arch`` imports every module of its package, so a new adapter is
one new file (plus its row in the tests' architecture table).
"""

from __future__ import annotations

from headcount.core.arch.base import Adapter, Layout
from headcount.runtime.errors import HeadcountError

_REGISTRY: dict[str, Adapter] = {}
#: model types headcount knows and refuses, with the reason (gating and surgery would disagree)
_REFUSED: dict[str, str] = {}


def register_adapter(adapter: Adapter) -> Adapter:
    """Register ``adapter`` for every ``config.model_type`` it lists (later wins).

    >>> from headcount.core.arch.bert import BertAdapter
    >>> class MyAdapter(BertAdapter): model_types = ("my-bert",)
    >>> _ = register_adapter(MyAdapter())
    >>> _ = _REGISTRY.pop("my-bert")
    """
    for model_type in adapter.model_types:
        _REGISTRY[model_type] = adapter
    return adapter


def refuse_model_type(model_types: tuple[str, ...], reason: str) -> None:
    """Name model types whose heads cannot be removed exactly; [`get_adapter`][headcount.core.arch.registry.get_adapter] refuses them
    with ``reason`` instead of the generic "not supported" line.

    >>> refuse_model_type(("my-olmo",), "its q/k norm runs over all heads together")
    >>> _ = _REFUSED.pop("my-olmo")
    """
    for model_type in model_types:
        _REFUSED[model_type] = reason


def supported_model_types() -> list[str]:
    """Every registered ``config.model_type``, sorted."""
    return sorted(_REGISTRY)


def adapters() -> list[Adapter]:
    """The registered adapters, each once, in registration order."""
    seen: dict[int, Adapter] = {}
    for adapter in _REGISTRY.values():
        seen.setdefault(id(adapter), adapter)
    return list(seen.values())


def get_adapter(model_or_config) -> Adapter:
    """The adapter for a model (or config), picked by ``config.model_type``.

    Raises:
        HeadcountError: for a model type no adapter serves.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type in _REFUSED and model_type not in _REGISTRY:
        raise HeadcountError(f"model type {model_type!r} is not supported: {_REFUSED[model_type]}")
    if model_type not in _REGISTRY:
        raise HeadcountError(
            f"model type {model_type!r} is not supported; supported types: {', '.join(supported_model_types())}"
        )
    return _REGISTRY[model_type]


def is_decoder(model_or_config) -> bool:
    """Whether the model's adapter declares it a decoder (``Adapter.is_decoder``)."""
    return get_adapter(model_or_config).is_decoder


def require_decoder(model, what: str, name: str | None = None) -> Layout:
    """The model's [`Layout`][headcount.core.arch.base.Layout]; one error line unless it is a decoder.

    ``what`` names what needs it (``"--objective lm"``, ``"a KV budget"``), ``name`` the model
    as the user gave it (default: "this model").

    Raises:
        HeadcountError: ``"<what> needs a decoder (a causal language model with a key/value cache);
            <name> is an encoder"``.
    """
    adapter = get_adapter(model)
    if not adapter.is_decoder:
        raise HeadcountError(f"{what} needs a decoder (a causal language model with a key/value cache); "
                             f"{name or 'this model'} is an encoder")
    return adapter.layout(model)


def require_kv_groups(model, what: str = "--unit kv-groups") -> Layout:
    """The layout of a decoder with grouped-query attention (fewer key/value heads than query
    heads, so a KV group is more than one head); one error line otherwise, pointing to ``--unit heads``."""
    adapter = get_adapter(model)
    grid = adapter.layout(model) if adapter.is_decoder else None
    if grid is None or grid.n_kv_heads == grid.n_heads:
        why = "is an encoder" if grid is None else "has no grouped-query attention (a KV group is one head)"
        raise HeadcountError(f"{what} needs a decoder with grouped-query attention; this model {why}: "
                             "use --unit heads")
    return grid
