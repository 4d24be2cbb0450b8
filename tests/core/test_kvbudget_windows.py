"""KV budgets count each layer's real cache (issue #44.2): a layer whose attention is bounded by a
sliding window keeps ``min(tokens, window - 1)`` tokens in the model's own cache, not every token.

- the windows come from one helper (``headcount.kv.budget.model_windows``, which asks the
  adapter): Mistral with a window (every layer), Gemma2/3 (local and global layers), Qwen2 with
  its windowed top layers, and none for Llama;
- ``KVBudget.full_bytes`` equals the bytes of transformers' own ``DynamicCache`` after every
  length, below, at and beyond the window (tiny random models);
- at Gemma 3's layout (18 layers, 5 local : 1 global, a 512 window) the model's cache at 2,000
  tokens is 0.379 of layers x KV heads x tokens; a budget is a share of that real cache (a
  "memory 0.5" budget came out 1.28x the unpatched cache before), only the global layers' KV
  heads stream, as many as a brute-force count allows, and a target below what the local layers
  keep by themselves is refused;
- windowed models run under a budget (Mistral, Gemma 3, Qwen2 with windowed top layers): the local
  layers keep the model's own window, the global layers the budget's choice; the model's own logits,
  greedy tokens and cache bytes at the full budget, the loop reference with streaming global heads;
- what cannot be budgeted is refused in one line: a streaming head in a windowed layer, a model
  whose every layer is windowed, soft-capped attention (Gemma 2) at the first forward, a budget
  made for other windows.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from conftest import tiny_config, tiny_model
from transformers import DynamicCache

from headcount.core.gates import layout
from headcount.kv.budget import KVBudget, model_windows
from headcount.kv.cache import ATTENTION, apply_kv_budget
from headcount.kv.memory import KVBudgetSettings, n_full_allowed
from headcount.kv.policies.random import random_budget
from headcount.kv.policies.scores import budget_from_scores
from headcount.kv.policies.uniform import uniform_budget
from headcount.runtime.errors import HeadcountError

#: tiny configs with windows (conftest's rows, and Qwen2 with its top layers windowed), and without
WINDOWED = {"mistral": {}, "gemma2": {}, "gemma3": {},
            "qwen2": dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)}
WINDOWS = {"mistral": (4, 4, 4), "gemma2": (4, None, 4), "gemma3": (4, None, 4), "qwen2": (None, 4, 4),
           "llama": (None, None, None)}


def shape(model) -> tuple[int, int, int, int]:
    g = layout(model)
    return g.n_layers, g.n_heads, g.n_kv_heads, g.head_dim


def dynamic_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)


@pytest.mark.parametrize("arch", sorted(WINDOWS))
def test_the_windows_are_what_the_models_own_cache_keeps(arch):
    overrides = WINDOWED.get(arch, {})
    assert model_windows(tiny_config(arch, **overrides)) == WINDOWS[arch]
    kwargs = {"attn_implementation": "eager"} if arch == "gemma2" else {}
    model = tiny_model(arch, head="lm", **kwargs, **overrides)
    full = KVBudget.full_cache(*shape(model), model_window=model_windows(model.config))
    ids = torch.randint(5, 99, (2, 9), generator=torch.Generator().manual_seed(0))
    for steps in ((2,), (3,), (4,), (5,), (9,), (2, 1, 1, 1, 4)):  # below, at and beyond the window; in steps
        cache = DynamicCache(config=model.config)
        seen = 0
        with torch.no_grad():
            for step in steps:
                model(input_ids=ids[:, seen:seen + step], cache=cache, use_cache=True)
                seen += step
                assert dynamic_bytes(cache) == full.full_bytes(seen, batch=2) == full.kv_bytes(seen, batch=2), \
                    (steps, seen)
    if arch != "llama":  # layers x KV heads x tokens overstates a windowed model's cache
        plain = KVBudget.full_cache(*shape(model))
        assert full.full_bytes(9) < plain.full_bytes(9)


# --- Gemma 3's layout, the issue's numbers ----------------------------------------------------------
def gemma3_layout(memory: float = 0.8) -> tuple[tuple[int | None, ...], KVBudgetSettings]:
    """18 layers, 5 local (a 512 window) : 1 global, 4 query heads on 1 KV head of 256, at 2,000 tokens."""
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)]
    config = transformers.Gemma3TextConfig(num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                                           head_dim=256, hidden_size=64, intermediate_size=8, vocab_size=10,
                                           sliding_window=512, layer_types=types)
    return model_windows(config), KVBudgetSettings(memory=memory, context=2000, sink=64, window=256)


def test_gemma3s_cache_is_counted_and_a_budget_is_a_share_of_it():
    windows, s = gemma3_layout()
    assert windows.count(None) == 3 and set(windows) == {None, 512}
    full = KVBudget.full_cache(18, 4, 1, 256, model_window=windows)
    naive = 2 * 256 * 4 * 18 * 1 * 2000  # layers x KV heads x tokens
    own = 3 * 2000 + 15 * 511  # slots: 3 global layers keep every token, 15 local ones 511
    assert full.full_bytes(2000) == 2 * 256 * 4 * own and 0.379 <= full.full_bytes(2000) / naive < 0.380
    scores = [[float(i)] for i in range(18)]  # the last layers score highest
    budget = budget_from_scores(scores, 4, 256, s, model_window=windows)
    assert budget.kv_bytes(2000) <= s.memory * full.full_bytes(2000)
    assert budget.meta["bytes"]["full_cache"] == full.full_bytes(2000) and budget.meta["bytes"]["ratio"] <= s.memory
    for layer, w in enumerate(windows):  # a local layer keeps the model's own window: never streamed
        if w is not None:
            assert budget.full[layer] == [True] and budget.slots(2000)[layer] == [511]
    # brute force: k of the 3 global KV heads full, the rest 64 + 256 tokens; the 15 local ones 511
    k = max(k for k in range(4) if k * 2000 + (3 - k) * 320 + 15 * 511 <= s.memory * own)
    assert k == 1 and n_full_allowed(18, 4, 1, 256, s, model_window=windows) == k
    streamed = [layer for layer in range(18) if not budget.full[layer][0]]
    assert streamed == [5, 11] and budget.full[17] == [True]  # the best-scored global layer keeps its cache


def test_a_target_below_what_the_local_layers_keep_is_refused():
    """At 2,000 tokens Gemma 3's local layers alone are 0.56 of its own cache: "memory 0.5" cannot
    be met by budgeting its global layers (the budget of the issue streamed local layers too)."""
    windows, s = gemma3_layout(memory=0.5)
    for make in (lambda: n_full_allowed(18, 4, 1, 256, s, model_window=windows),
                 lambda: uniform_budget(18, 4, 1, 256, s, model_window=windows),
                 lambda: random_budget(18, 4, 1, 256, s, 0, model_window=windows)):
        with pytest.raises(HeadcountError, match="windowed layers") as e:
            make()
        assert "\n" not in str(e.value)


def test_the_baselines_budget_only_the_layers_that_cache_every_token():
    windows, s = gemma3_layout()
    full = KVBudget.full_cache(18, 4, 1, 256, model_window=windows).full_bytes(2000)
    uni = uniform_budget(18, 4, 1, 256, s, model_window=windows)
    assert all(uni.full[layer] == [w is not None] for layer, w in enumerate(windows))
    assert uni.kv_bytes(2000) <= s.memory * full
    w = uni.window[5][0]
    wider = KVBudget([[None] if x else [64] for x in windows], [[None] if x else [w + 1] for x in windows], 4, 256,
                     model_window=windows)
    assert wider.kv_bytes(2000) > s.memory * full  # the widest window that fits
    for seed in range(4):
        rnd = random_budget(18, 4, 1, 256, s, seed, model_window=windows)
        assert all(rnd.full[layer] == [True] for layer, x in enumerate(windows) if x is not None)
        assert rnd.n_full == 15 + n_full_allowed(18, 4, 1, 256, s, model_window=windows)
        assert rnd.kv_bytes(2000) <= s.memory * full


def test_what_cannot_be_budgeted_is_refused_in_one_line():
    s = KVBudgetSettings(memory=0.5, context=64, sink=2, window=8)
    every = (4, 4, 4)  # Mistral with a window: every layer's cache is bounded already
    for make in (lambda: n_full_allowed(3, 4, 2, 8, s, model_window=every),
                 lambda: uniform_budget(3, 4, 2, 8, s, model_window=every),
                 lambda: random_budget(3, 4, 2, 8, s, 0, model_window=every),
                 lambda: budget_from_scores([[0.0, 1.0]] * 3, 4, 8, s, model_window=every)):
        with pytest.raises(HeadcountError, match="sliding window") as e:
            make()
        assert "\n" not in str(e.value)
    with pytest.raises(HeadcountError, match=r"\[0\]\[1\].*window of 4"):
        KVBudget([[None, 2], [2, 2], [None, None]], [[None, 8], [8, 8], [None, None]], 4, 8, model_window=(4, None, 4))
    for bad in ((4, None), (0, None, None), (-1, None, None), (2.5, None, None), ("4", None, None), 4):
        with pytest.raises(HeadcountError, match="model_window"):
            KVBudget.full_cache(3, 4, 2, 8, model_window=bad)


def test_a_windowed_budget_is_written_and_read_back(tmp_path):
    b = KVBudget([[None, None], [2, None], [None, None]], [[None, None], [8, None], [None, None]], 4, 8,
                 model_window=(4, None, 4))
    doc = b.to_dict()
    assert doc["model_window"] == [4, None, 4]
    assert KVBudget.load(b.save(tmp_path / "budget.json")) == b
    old = {k: v for k, v in doc.items() if k != "model_window"}  # a file written before the field
    assert KVBudget.from_dict(old).model_window == (None, None, None)
    for bad in ([4, None], [4, None, -2], "4"):
        (tmp_path / "bad.json").write_text(json.dumps({**doc, "model_window": bad}))
        with pytest.raises(HeadcountError, match="model_window"):
            KVBudget.load(tmp_path / "bad.json")


#: windowed rows whose attention the budget attention runs (Gemma 2 soft-caps its logits: refused)
RUNS = sorted(set(WINDOWED) - {"gemma2"})


def _budgets(model):
    """The full cache, and the global layers' KV heads half streaming (sink 1 + window 2), both with
    the model's own windows."""
    n_layers, n_heads, n_kv, head_dim = shape(model)
    windows = model_windows(model.config)
    rows = [[(None, None)] * n_kv if w is not None else [(1, 2)] + [(None, None)] * (n_kv - 1) for w in windows]
    half = KVBudget([[s for s, _ in r] for r in rows], [[w for _, w in r] for r in rows], n_heads, head_dim,
                    model_window=windows)
    return KVBudget.full_cache(n_layers, n_heads, n_kv, head_dim, model_window=windows), half


@pytest.mark.parametrize("arch", RUNS)
def test_a_windowed_model_runs_under_a_budget(arch):
    """The local layers keep the model's own window (sink 0, the last W - 1 tokens), the global
    layers what the budget says: at the full budget the model's own logits and greedy tokens, with
    streaming global heads the loop reference (the model's windows in its local layers), prefilled at
    once, token by token or in chunks; the cache holds the bytes the budget predicts, and at the full
    budget the bytes of transformers' own cache."""
    from test_kvcache import LENGTH, NEW, budgeted, ids_and_mask, real, with_reference

    model = tiny_model(arch, head="lm", attn_implementation="sdpa", **WINDOWED[arch])
    full, half = _budgets(model)
    assert any(w is not None for w in full.model_window) and LENGTH > max(w for w in full.model_window if w)
    for left_pad in (0, 3):
        ids, mask = ids_and_mask(model, left_pad=left_pad)
        with torch.no_grad():
            own = model(input_ids=ids, attention_mask=mask).logits
            own_tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
            dyn = DynamicCache(config=model.config)
            model(input_ids=ids, attention_mask=mask, past_key_values=dyn, use_cache=True)
        want = with_reference(model, half, input_ids=ids, attention_mask=mask)
        # the streaming heads bite where a layer caches every token (Mistral: every layer is windowed)
        assert bool((real(want, mask) - real(own, mask)).abs().max() > 0.01) is (None in full.model_window)
        assert (real(with_reference(model, full, input_ids=ids, attention_mask=mask), mask)
                - real(own, mask)).abs().max() <= 1e-5  # the reference is the model's own attention at the full budget
        for steps in (None, 1, 5):
            got, cache = budgeted(model, full, ids, mask, steps)
            assert (real(got, mask) - real(own, mask)).abs().max() <= 1e-5, (left_pad, steps)
            assert cache.nbytes() == full.kv_bytes(LENGTH, batch=2) == full.full_bytes(LENGTH, batch=2)
            got, cache = budgeted(model, half, ids, mask, steps)
            assert (real(got, mask) - real(want, mask)).abs().max() <= 1e-5, (left_pad, steps)
            assert cache.nbytes() == half.kv_bytes(LENGTH, batch=2) <= full.kv_bytes(LENGTH, batch=2)
        held = sum(t.numel() * t.element_size() for layer in dyn.layers for t in (layer.keys, layer.values))
        assert held == full.full_bytes(LENGTH, batch=2)
        with torch.no_grad(), apply_kv_budget(model, full) as cache:
            tokens = model.generate(input_ids=ids, attention_mask=mask, cache=cache, max_new_tokens=NEW,
                                    do_sample=False)
        assert torch.equal(tokens, own_tokens)


def test_soft_capped_attention_is_refused_at_the_first_forward():
    model = tiny_model("gemma2", head="lm", attn_implementation="eager")
    full, _ = _budgets(model)
    with pytest.raises(HeadcountError, match="softcap") as e, torch.no_grad(), apply_kv_budget(model, full) as cache:
        model(input_ids=torch.tensor([[5, 6, 7]]), cache=cache, use_cache=True)
    assert "\n" not in str(e.value)


def test_a_budget_for_other_windows_does_not_fit():
    model = tiny_model("llama", head="lm")
    other = KVBudget.full_cache(*shape(model), model_window=(4, None, 4))
    with pytest.raises(HeadcountError, match="model_window"):
        apply_kv_budget(model, other)
