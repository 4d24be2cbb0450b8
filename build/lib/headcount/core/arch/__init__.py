"""Architecture adapters and their registry (the only package that names architectures)."""

from __future__ import annotations

from headcount.core.arch.albert import AlbertAdapter
from headcount.core.arch.base import Adapter, Block, Layout, grouped_rows
from headcount.core.arch.bert import BertAdapter
from headcount.core.arch.deberta_v2 import DebertaV2Adapter
from headcount.core.arch.distilbert import DistilBertAdapter
from headcount.core.arch.modernbert import ModernBertAdapter
from headcount.runtime.errors import HeadcountError

_REGISTRY: dict[str, Adapter] = {}


def register_adapter(adapter: Adapter) -> Adapter:
    """Register ``adapter`` for every ``config.model_type`` it lists (later wins).

    >>> class MyAdapter(BertAdapter): model_types = ("my-bert",)
    >>> _ = register_adapter(MyAdapter())
    """
    for model_type in adapter.model_types:
        _REGISTRY[model_type] = adapter
    return adapter


for _adapter in (BertAdapter(), AlbertAdapter(), DistilBertAdapter(), DebertaV2Adapter(), ModernBertAdapter()):
    register_adapter(_adapter)


def supported_model_types() -> list[str]:
    return sorted(_REGISTRY)


def get_adapter(model_or_config) -> Adapter:
    """The adapter for a model (or config), picked by ``config.model_type``.

    Raises:
        HeadcountError: for a model type no adapter serves.
    """
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type not in _REGISTRY:
        raise HeadcountError(
            f"model type {model_type!r} is not supported; supported types: {', '.join(supported_model_types())}"
        )
    return _REGISTRY[model_type]


__all__ = ["Adapter", "Block", "Layout", "get_adapter", "grouped_rows", "register_adapter", "supported_model_types"]
