"""Who switched a model to the KV-budget attention, and what it ran before.

One budget at a time: the switch is the model's (its configs' attention implementation), the
cache that made it owns it (a weak reference) and records what every config ran before, so that
``restore()`` puts each back; a second apply while that cache lives unrestored is refused, and a
cache gone without restoring (garbage-collected) hands its record to the next apply.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from headcount.runtime.errors import HeadcountError

#: the name of the attention function (and of its mask function) in transformers' interfaces
ATTENTION = "headcount_kv_budget"


@dataclass
class _Switch:
    """A model switched to the budget attention: what each of its configs ran before (``(config,
    _attn_implementation_internal)``) and the cache that owns the switch (a weak reference)."""

    before: list[tuple[object, object]]
    owner: weakref.ref


#: model -> its switch (weak keys: a model that is gone takes its record with it)
_SWITCHED: "weakref.WeakKeyDictionary[torch.nn.Module, _Switch]" = weakref.WeakKeyDictionary()


def _attention_state(model) -> list[tuple[object, object]]:
    """``(config, its _attn_implementation_internal)`` of every config ``set_attn_implementation``
    may change: the model's, its sub-models', and their sub-configs at any depth."""
    todo = [model.config] + [getattr(m, "config", None) for m in model.modules() if m is not model]
    configs: list = []
    while todo:
        config = todo.pop()
        if not isinstance(config, PretrainedConfig) or any(config is c for c in configs):
            continue
        configs.append(config)
        todo += [getattr(config, key, None) for key in (getattr(config, "sub_configs", None) or {})]
    return [(c, getattr(c, "_attn_implementation_internal", None)) for c in configs]


def take_switch(model) -> list[tuple[object, object]]:
    """What the model ran before its switch: recorded now, or handed over by a cache that is gone
    without restoring. Refuses a model a live cache holds, or one switched by other means."""
    switch = _SWITCHED.get(model)
    owner = switch.owner() if switch is not None else None
    if owner is not None:
        raise HeadcountError("a KV budget is already applied to this model (an apply_kv_budget whose cache was not "
                             "restored): call restore() on that cache, or leave its with block, first; one budget at "
                             "a time")
    if switch is not None and model.config._attn_implementation == ATTENTION:
        return switch.before
    if model.config._attn_implementation == ATTENTION:
        raise HeadcountError(f"the model already runs {ATTENTION!r} attention, and no KV-budget cache switched it (a "
                             "copy of a switched model?): model.set_attn_implementation('sdpa') (or its own) first")
    return _attention_state(model)


def record_switch(model, before: list[tuple[object, object]], cache) -> None:
    """``cache`` owns the switch of ``model`` from now on; ``before``: what its configs ran."""
    _SWITCHED[model] = _Switch(before, weakref.ref(cache))


def release(model, cache) -> None:
    """Switch ``model`` back to what it ran before, when ``cache`` still owns the switch (else nothing)."""
    switch = _SWITCHED.get(model)
    if switch is not None and switch.owner() is cache:
        for config, implementation in switch.before:
            config._attn_implementation_internal = implementation
        del _SWITCHED[model]


__all__ = ["ATTENTION", "record_switch", "release", "take_switch"]
