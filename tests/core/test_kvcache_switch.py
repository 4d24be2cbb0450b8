"""A model after a KV budget (issue #43.7): whatever sequence of ``apply_kv_budget``, ``restore``
and exceptions it went through, once its budget is restored the model is the model it was: its
logits (no cache, ``DynamicCache()``, ``DynamicCache(config)``) and greedy ``generate`` equal a
fresh copy's to 0.0, and every config's attention implementation (what
``set_attn_implementation`` swaps: ``_attn_implementation_internal`` of the model's config, its
sub-configs and its sub-models') is the original.

One budget is applied to a model at a time: a second ``apply_kv_budget`` while an earlier cache
still holds the model (not restored, still alive) is refused in one line naming what to do; an
earlier cache that is gone without restoring (garbage-collected) is taken over, with the
original attention it recorded.
"""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import DECODER_IDS, tiny_model
from transformers import DynamicCache

from headcount.core.gates import layout
from headcount.kv.budget import KVBudget
from headcount.kv.cache import ATTENTION, apply_kv_budget
from headcount.runtime.errors import HeadcountError

#: decoders the budget attention runs (the windowed ones are refused at apply: tests/core/test_kvbudget_windows.py)
RUNS = [a for a in DECODER_IDS if a not in ("mistral", "gemma2", "gemma3")]
IDS = torch.randint(5, 99, (2, 10), generator=torch.Generator().manual_seed(3))


def budget(model) -> KVBudget:
    g = layout(model)
    return KVBudget.uniform(g.n_layers, g.n_heads, g.n_kv_heads, g.head_dim, sink=1, window=2).with_full([(0, 0)])


def attention_state(model) -> list:
    """Every config set_attn_implementation may change, and its implementation."""
    configs, todo = [], [model.config] + [m.config for m in model.modules() if hasattr(m, "config")]
    while todo:
        c = todo.pop()
        if any(c is seen for seen in configs):
            continue
        configs.append(c)
        todo += [getattr(c, k) for k in getattr(c, "sub_configs", {}) if getattr(c, k, None) is not None]
    return [getattr(c, "_attn_implementation_internal", None) for c in configs]


def behaviour(model) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(input_ids=IDS).logits,
                model(input_ids=IDS, past_key_values=DynamicCache(), use_cache=True).logits,
                model(input_ids=IDS, cache=DynamicCache(config=model.config), use_cache=True).logits,
                model.generate(input_ids=IDS, attention_mask=torch.ones_like(IDS), max_new_tokens=5, do_sample=False)]


def assert_as_fresh(model, fresh, want):
    assert attention_state(model) == attention_state(fresh)
    assert model.config._attn_implementation == fresh.config._attn_implementation != ATTENTION
    for got, exp in zip(behaviour(model), want):
        assert got.shape == exp.shape and (got.double() - exp.double()).abs().max().item() == 0.0


def run_budget(model, cache, fail: bool = False):
    """A forward through ``cache``; with ``fail`` one that raises inside the model (a token id
    beyond the vocabulary: IndexError in the embedding)."""
    with torch.no_grad():
        return model(input_ids=IDS + (10**6 if fail else 0), cache=cache, use_cache=True).logits


def refused_second(model):
    with pytest.raises(HeadcountError, match="already applied") as e:
        apply_kv_budget(model, budget(model))
    assert "\n" not in str(e.value) and "restore()" in str(e.value)


# --- the sequences --------------------------------------------------------------------------------
def orphan_then_apply_and_restore(model):
    """An exception outside `with` leaves the first cache unrestored: a second apply is refused
    while it lives; restoring it, or dropping it, lets the next apply + restore bring the model back."""
    first = apply_kv_budget(model, budget(model))
    with pytest.raises(IndexError):
        run_budget(model, first, fail=True)
    refused_second(model)
    first.restore()
    second = apply_kv_budget(model, budget(model))
    run_budget(model, second)
    second.restore()
    third = apply_kv_budget(model, budget(model))
    del third  # gone without restoring: the next apply takes over from it
    gc.collect()
    fourth = apply_kv_budget(model, budget(model))
    assert model.config._attn_implementation == ATTENTION
    run_budget(model, fourth)
    fourth.restore()


def nested_applies(model):
    with apply_kv_budget(model, budget(model)) as outer:
        refused_second(model)
        run_budget(model, outer)  # the outer cache still works
        with pytest.raises(HeadcountError, match="already applied"), apply_kv_budget(model, budget(model)):
            pass


def restore_twice(model):
    cache = apply_kv_budget(model, budget(model))
    run_budget(model, cache)
    cache.restore()
    cache.restore()
    later = apply_kv_budget(model, budget(model))
    cache.restore()  # a restored cache's restore does not undo a later apply
    assert model.config._attn_implementation == ATTENTION
    later.restore()
    with pytest.raises(HeadcountError, match="apply_kv_budget"):
        run_budget(model, later)  # a restored cache is refused by the model's own attention


def exception_inside_with(model):
    with pytest.raises(ValueError, match="user code"), apply_kv_budget(model, budget(model)) as cache:
        run_budget(model, cache)
        raise ValueError("user code")
    with pytest.raises(IndexError), apply_kv_budget(model, budget(model)) as cache:
        run_budget(model, cache, fail=True)


def apply_twice_without_restore(model):
    first = apply_kv_budget(model, budget(model))
    refused_second(model)
    refused_second(model)
    first.restore()


def with_then_dynamic_cache(model):
    """The review's case: full attention through a DynamicCache after a `with` block exited."""
    with torch.no_grad(), apply_kv_budget(model, budget(model)) as cache:
        model.generate(input_ids=IDS, attention_mask=torch.ones_like(IDS), cache=cache, max_new_tokens=4,
                       do_sample=False)


SEQUENCES = [orphan_then_apply_and_restore, nested_applies, restore_twice, exception_inside_with,
             apply_twice_without_restore, with_then_dynamic_cache]


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")  # the review's own call
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", RUNS)
def test_after_any_sequence_the_model_is_a_fresh_models_equal(arch, impl):
    fresh = tiny_model(arch, head="lm", attn_implementation=impl)
    want = behaviour(fresh)
    model = tiny_model(arch, head="lm", attn_implementation=impl)
    for sequence in SEQUENCES:
        sequence(model)
        assert_as_fresh(model, fresh, want)
    # all of them again, one after another with no check between
    for sequence in SEQUENCES:
        sequence(model)
    assert_as_fresh(model, fresh, want)


def test_a_model_switched_by_hand_is_refused_not_adopted():
    model = tiny_model("llama", head="lm", attn_implementation="eager")
    model.set_attn_implementation(ATTENTION)  # e.g. a deep copy of a model inside a `with` block
    with pytest.raises(HeadcountError, match="no KV-budget cache") as e:
        apply_kv_budget(model, budget(model))
    assert "\n" not in str(e.value)
