"""Architecture adapters and their registry (the only package that names architectures).

Every module of this package other than ``base``, ``registry``, ``decoder`` (what decoder
adapters share) and ``gguf_layouts`` (the GGUF export's names of each family, imported by
``headcount.core.export_gguf`` when it writes) is an adapter that registers itself on import; importing the package imports them all (in name order), so adding an
architecture is one file here and its row in the tests' architecture table.
"""

from __future__ import annotations

import importlib
import pkgutil

from headcount.core.arch.base import Adapter, Block, Layout, grouped_rows
from headcount.core.arch.registry import (
    adapters,
    get_adapter,
    is_decoder,
    refuse_model_type,
    register_adapter,
    require_decoder,
    require_kv_groups,
    supported_model_types,
)

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in ("base", "registry", "decoder", "gguf_layouts"):
        importlib.import_module(f"{__name__}.{_module}")

__all__ = ["Adapter", "Block", "Layout", "adapters", "get_adapter", "grouped_rows", "is_decoder", "refuse_model_type",
           "register_adapter", "require_decoder", "require_kv_groups", "supported_model_types"]
