"""The KV-budget API checks what it is given (issue #43.6): a bad value is one ``HeadcountError``
line that names the field, where it is given (``KVBudget.__post_init__``, its constructors and
``apply_kv_budget``'s entry), never a TypeError there or a failure later inside torch.
"""

from __future__ import annotations

import pytest
from conftest import tiny_model

from headcount.kv.budget import KVBudget
from headcount.kv.cache import apply_kv_budget
from headcount.runtime.errors import HeadcountError

SHAPE = dict(n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8)


def refused(match: str, make) -> HeadcountError:
    with pytest.raises(HeadcountError, match=match) as e:
        make()
    assert "\n" not in str(e.value)  # the command line's one `error:` line
    return e.value


@pytest.mark.parametrize("field, value", [
    ("sink", -3), ("window", -2), ("sink", 1.5), ("window", True), ("sink", "4"), ("window", float("inf")),
    ("sink", 2**41), ("window", [3]),
])
def test_a_bad_sink_or_window_is_refused_naming_it(field, value):
    kwargs = {"sink": 4, "window": 8, field: value}
    err = refused(rf"'{field}", lambda: KVBudget.uniform(**SHAPE, **kwargs))
    assert "[0][0]" in str(err)  # where in the grid


@pytest.mark.parametrize("field, value", [
    ("n_layers", 0), ("n_layers", -1), ("n_kv_heads", 0), ("n_heads", 0), ("n_heads", 3), ("head_dim", 0),
    ("head_dim", -8), ("n_heads", True), ("head_dim", 2.5), ("n_layers", "2"), ("n_kv_heads", None),
])
def test_a_bad_shape_is_refused_naming_it(field, value):
    shape = {**SHAPE, field: value}
    refused(rf"'{field}'", lambda: KVBudget.uniform(**shape, sink=4, window=8))
    refused(rf"'{field}'", lambda: KVBudget.full_cache(**shape))


def test_bad_grids_and_fields_given_directly_are_refused_naming_them():
    ok = [[1, 2], [3, 4]]
    refused(r"'sink'", lambda: KVBudget(5, ok, 4, 8))
    refused(r"'window'", lambda: KVBudget(ok, None, 4, 8))
    refused(r"'sink\[1\]'", lambda: KVBudget([[1, 2], 3], ok, 4, 8))
    refused(r"'sink\[1\]\[0\]'", lambda: KVBudget([[1, 2], [-1, 2]], ok, 4, 8))
    refused(r"'window\[0\]\[1\]'", lambda: KVBudget(ok, [[1, None], [3, 4]], 4, 8))  # null against a number
    refused(r"'n_heads'", lambda: KVBudget(ok, ok, "4", 8))
    refused(r"'head_dim'", lambda: KVBudget(ok, ok, 4, None))
    refused(r"'meta'", lambda: KVBudget(ok, ok, 4, 8, meta="made by hand"))
    assert KVBudget(ok, ok, 4, 8, meta=None).meta == {}
    assert KVBudget(ok, ok, 4, 8.0).head_dim == 8 and isinstance(KVBudget(ok, ok, 4, 8.0).head_dim, int)


def test_with_full_and_the_arithmetic_check_their_arguments():
    b = KVBudget.uniform(**SHAPE, sink=4, window=8)
    for heads in ([(2, 0)], [(0, 2)], [(-1, 0)], [(0, -1)], [(0,)], ["a"], 5):
        refused(r"with_full", lambda heads=heads: b.with_full(heads))
    assert b.with_full([(1, 1)]).full == [[False, False], [False, True]]
    for call, field in ((lambda: b.kv_bytes(-1), "tokens"), (lambda: b.full_bytes(2.5), "tokens"),
                        (lambda: b.slots(None), "tokens"), (lambda: b.kv_bytes(10, batch=0), "batch"),
                        (lambda: b.full_bytes(10, element_size=0), "element_size")):
        refused(rf"'{field}'", call)


def test_apply_kv_budget_checks_its_arguments_at_the_entry():
    model = tiny_model("llama", head="lm")
    budget = KVBudget.full_cache(3, 4, 2, 8)
    for bad in (budget.to_dict(), 3, None, [budget]):
        err = refused(r"'budget'", lambda bad=bad: apply_kv_budget(model, bad))
        assert type(bad).__name__ in str(err)
    assert "from_dict" in str(refused(r"'budget'", lambda: apply_kv_budget(model, budget.to_dict())))
    for bad in (None, "llama", budget):
        refused(r"'model'", lambda bad=bad: apply_kv_budget(bad, budget))
    assert model.config._attn_implementation != "headcount_kv_budget"  # nothing was switched
