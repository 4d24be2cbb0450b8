"""KV budgets applied (``headcount.kv.cache``): the KV-budget cache and attention.

- at the full budget the patched attention equals the model's own (eager and sdpa): logits,
  padded batches, greedy tokens;
- streaming heads equal a reference written here (a loop over batch rows, query heads and query
  positions that attends to the sinks, the window and the query itself) in prefill, chunked
  prefill, token-by-token decoding and ``generate``, on a tiny Llama with grouped-query attention
  (4 query heads on 2 KV heads) and on GPT-2 (no GQA);
- the cache holds exactly the bytes the budget predicts, K/V stored once per KV head;
- every head streaming with sink + window >= the length is the full model;
- what it cannot do is refused in one line (a budget that does not fit, sliding-window layers
  at apply, soft-capped attention at the first forward, cropping, a model that was not switched).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import DECODER_IDS, tiny_model
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import headcount as hc
from headcount.core.gates import layout
from headcount.kv.budget import KVBudget
from headcount.kv.cache import ATTENTION, KVBudgetCache, apply_kv_budget
from headcount.runtime.errors import HeadcountError

ATOL = 1e-5
LENGTH = 12
NEW = 8


def shape(model) -> tuple[int, int, int, int]:
    g = layout(model)
    return g.n_layers, g.n_heads, g.n_kv_heads, g.head_dim


def mixed(model) -> KVBudget:
    """Full, and streaming KV heads of two sizes (one a window of 0), in every layer of the tiny models."""
    n_layers, n_heads, n_kv, head_dim = shape(model)
    sink = [[2, None], [1, 3], [None, 0]][:n_layers]
    window = [[3, None], [4, 2], [None, 0]][:n_layers]
    if n_kv != 2:  # GPT-2: 4 KV heads (= query heads)
        sink = [[2, None, 0, 1], [1, 3, None, 2], [None, 0, 4, 1]][:n_layers]
        window = [[3, None, 5, 2], [4, 2, None, 1], [None, 0, 1, 6]][:n_layers]
    return KVBudget(sink, window, n_heads, head_dim)


def ids_and_mask(model, batch: int = 2, length: int = LENGTH, left_pad: int = 0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, model.config.vocab_size, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    if left_pad:
        ids[1, :left_pad], mask[1, :left_pad] = 0, 0
    return ids, mask


# --- the reference ------------------------------------------------------------------------------
def reference_attention(budget: KVBudget, prompt: int = 0):
    """An attention function (no cache: the whole sequence at once) that computes every head by
    an explicit loop: query head h of KV head g = h // group at position p attends to the key
    positions k <= p not padded and, for a streaming g, with k < sink or k >= p - window; a query
    of the first ``prompt`` positions (a prefill with ``prefill="full"``) to every k <= p; in a layer
    with a sliding window W of the model's own (``budget.model_window``), only to k > p - W."""

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        layer, (batch, n_q, length, _) = module.layer_idx, query.shape
        group = n_q // key.shape[1]
        # [batch, seq]: the keys some query sees (a padded key is seen by none; under a sliding window
        # the last row alone no longer sees every key)
        pad = None if attention_mask is None else attention_mask[:, 0].any(dim=-2)
        out = torch.zeros_like(query)
        for b in range(batch):
            for h in range(n_q):
                g = h // group
                sink, window = budget.sink[layer][g], budget.window[layer][g]
                own = budget.model_window[layer]  # the model's own sliding window W: keys k > p - W
                for p in range(length):
                    keys = [k for k in range(p + 1) if (pad is None or bool(pad[b, k]) or k == p)
                            and (window is None or p < prompt or k < sink or k >= p - window)
                            and (own is None or k > p - own)]
                    logits = torch.stack([query[b, h, p] @ key[b, g, k] for k in keys]) * scaling
                    weights = torch.softmax(logits, dim=0)
                    out[b, h, p] = sum(w * value[b, g, k] for w, k in zip(weights, keys))
        return out.transpose(1, 2), None

    return attend


def with_reference(model, budget: KVBudget, prompt: int = 0, **inputs) -> torch.Tensor:
    """Logits of ``model`` (no cache) with the reference attention for ``budget``."""
    AttentionInterface.register("kv_reference", reference_attention(budget, prompt))
    AttentionMaskInterface.register("kv_reference", sdpa_mask)
    before = model.config._attn_implementation
    model.set_attn_implementation("kv_reference")
    try:
        with torch.no_grad():
            return model(**inputs).logits
    finally:
        model.set_attn_implementation(before)


def reference_greedy(model, budget: KVBudget, ids, mask, n: int) -> torch.Tensor:
    for _ in range(n):
        nxt = with_reference(model, budget, input_ids=ids, attention_mask=mask)[:, -1].argmax(-1, keepdim=True)
        ids, mask = torch.cat([ids, nxt], 1), torch.cat([mask, torch.ones_like(nxt)], 1)
    return ids


def budgeted(model, budget, ids, mask, steps=None, prefill="masked", first=None) -> tuple[torch.Tensor, KVBudgetCache]:
    """Logits of the whole sequence through a fresh budget cache, fed in pieces of ``steps``
    tokens (None: at once), the first piece ``first`` tokens long when given."""
    with torch.no_grad(), apply_kv_budget(model, budget, prefill=prefill) as cache:
        step = steps or ids.shape[1]
        starts = [0, *range(first, ids.shape[1], step)] if first else list(range(0, ids.shape[1], step))
        ends = [*starts[1:], ids.shape[1]]
        logits = [model(input_ids=ids[:, i:j], attention_mask=mask[:, :j], cache=cache, use_cache=True).logits
                  for i, j in zip(starts, ends)]
    return torch.cat(logits, 1), cache


def real(logits, mask):
    return logits[mask.bool()]


# --- at the full budget: the model's own attention ------------------------------------------------
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_the_full_budget_is_the_models_own_attention(impl):
    model = tiny_model("llama", head="lm", attn_implementation=impl)
    full = KVBudget.full_cache(*shape(model))
    for left_pad in (0, 3):
        ids, mask = ids_and_mask(model, left_pad=left_pad)
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask).logits
            want_tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
        for steps in (None, 1, 5):
            got, _ = budgeted(model, full, ids, mask, steps)
            assert (real(got, mask) - real(want, mask)).abs().max() <= ATOL, (left_pad, steps)
        with torch.no_grad(), apply_kv_budget(model, full) as cache:
            tokens = model.generate(input_ids=ids, attention_mask=mask, cache=cache, max_new_tokens=NEW,
                                    do_sample=False)
        assert torch.equal(tokens, want_tokens)
        assert model.config._attn_implementation == impl  # switched back


# --- streaming heads: the reference ---------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_streaming_heads_equal_the_reference_in_prefill_and_decoding(arch):
    model = tiny_model(arch, head="lm", attn_implementation="sdpa")
    budget = mixed(model)
    ids, mask = ids_and_mask(model)
    want = with_reference(model, budget, input_ids=ids, attention_mask=mask)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    assert (want - plain).abs().max() > 0.01  # the windows bite: the reference is not the full model
    for steps in (None, 1, 5):  # prefill at once, token by token, chunks
        got, _ = budgeted(model, budget, ids, mask, steps)
        assert (got - want).abs().max() <= ATOL, steps


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_full_prefill_is_the_models_attention_then_decoding_streams(arch):
    """``prefill="full"``: a prompt prefilled in one call gets the model's own logits; the tokens
    decoded after it read the sinks and windows only (the reference with the prompt unmasked), and
    the cache holds the same bytes as under ``masked`` after every call."""
    model = tiny_model(arch, head="lm", attn_implementation="sdpa")
    budget = mixed(model)
    prompt = 8
    for left_pad in (0, 2):
        ids, mask = ids_and_mask(model, left_pad=left_pad)
        with torch.no_grad():
            plain = model(input_ids=ids[:, :prompt], attention_mask=mask[:, :prompt]).logits
        want = with_reference(model, budget, prompt, input_ids=ids, attention_mask=mask)
        masked = with_reference(model, budget, input_ids=ids, attention_mask=mask)
        got, cache = budgeted(model, budget, ids, mask, steps=1, prefill="full", first=prompt)
        assert (real(got[:, :prompt], mask[:, :prompt]) - real(plain, mask[:, :prompt])).abs().max() <= ATOL
        assert (real(got, mask) - real(want, mask)).abs().max() <= ATOL, left_pad
        assert (real(want, mask) - real(masked, mask)).abs().max() > 0.01  # the rule changes the result here
        _, kept = budgeted(model, budget, ids, mask, steps=1, prefill="masked", first=prompt)
        assert cache.nbytes() == kept.nbytes() == budget.kv_bytes(LENGTH, batch=2)


def test_an_unknown_prefill_rule_is_one_error_line():
    model = tiny_model("llama", head="lm")
    with pytest.raises(HeadcountError, match="prefill must be one of masked, full, not 'lazy'"):
        apply_kv_budget(model, mixed(model), prefill="lazy")
    assert model.config._attn_implementation != ATTENTION  # nothing switched


def test_streaming_heads_follow_padding_as_the_reference_does():
    model = tiny_model("llama", head="lm")
    budget = mixed(model)
    ids, mask = ids_and_mask(model, left_pad=3)
    want = with_reference(model, budget, input_ids=ids, attention_mask=mask)
    for steps in (None, 1):
        got, _ = budgeted(model, budget, ids, mask, steps)
        assert (real(got, mask) - real(want, mask)).abs().max() <= ATOL, steps


def test_generate_with_a_budget_gives_the_references_greedy_tokens():
    model = tiny_model("llama", head="lm")
    budget = mixed(model)
    ids, mask = ids_and_mask(model, left_pad=2)
    with torch.no_grad():
        with apply_kv_budget(model, budget) as cache:
            got = model.generate(input_ids=ids, attention_mask=mask, cache=cache, max_new_tokens=NEW, do_sample=False)
        plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    want = reference_greedy(model, budget, ids, mask, NEW)
    assert torch.equal(got, want)
    assert not torch.equal(got, plain)  # the budget changes what is generated here


# --- memory ---------------------------------------------------------------------------------------
def test_the_cache_holds_the_predicted_bytes_once_per_kv_head():
    model = tiny_model("llama", head="lm")
    budget = mixed(model)
    ids, mask = ids_and_mask(model, batch=3)
    with torch.no_grad(), apply_kv_budget(model, budget) as cache:
        seen = 0
        for step in (LENGTH, 1, 1, 4):  # a prefill, then tokens and a chunk
            model(input_ids=ids[:, :step], cache=cache, use_cache=True)
            seen += step
            assert cache.get_seq_length() == seen
            assert cache.nbytes() == budget.kv_bytes(seen, batch=3)
            for layer, held in zip(cache.layers, budget.slots(seen)):
                for part in layer.parts:
                    # [batch, the part's KV heads, slots, head_dim]: K/V never repeated per query head
                    assert tuple(part.keys.shape) == (3, len(part.kv_heads), held[part.kv_heads[0]], budget.head_dim)
                    assert all(held[h] == held[part.kv_heads[0]] for h in part.kv_heads)
    total = budget.kv_bytes(seen, batch=3)
    assert total < budget.full_bytes(seen, batch=3)
    # the model's own cache holds the full bytes
    dyn = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :seen // 2], cache=dyn, use_cache=True)
    assert sum(t.numel() * t.element_size() for layer in dyn.layers for t in (layer.keys, layer.values)) == \
        budget.full_bytes(seen // 2, batch=3)


def test_every_head_streaming_with_a_window_as_long_as_the_text_is_the_full_model():
    model = tiny_model("llama", head="lm")
    n_layers, n_heads, n_kv, head_dim = shape(model)
    ids, mask = ids_and_mask(model, left_pad=2)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        want_tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    for sink, window in ((4, LENGTH + NEW), (0, LENGTH + NEW - 1)):  # sink + window >= every position before
        budget = KVBudget.uniform(n_layers, n_heads, n_kv, head_dim, sink=sink, window=window)
        got, _ = budgeted(model, budget, ids, mask, None)
        assert (real(got, mask) - real(want, mask)).abs().max() <= ATOL
        with torch.no_grad(), apply_kv_budget(model, budget) as cache:
            tokens = model.generate(input_ids=ids, attention_mask=mask, cache=cache, max_new_tokens=NEW,
                                    do_sample=False)
        assert torch.equal(tokens, want_tokens)
    short = KVBudget.uniform(n_layers, n_heads, n_kv, head_dim, sink=1, window=2)
    got, _ = budgeted(model, short, ids, mask, None)
    assert (real(got, mask) - real(want, mask)).abs().max() > 0.01  # a short window does change it


# --- the switch -----------------------------------------------------------------------------------
def test_the_model_is_switched_and_switched_back():
    model = tiny_model("llama", head="lm", attn_implementation="eager")
    ids, _ = ids_and_mask(model)
    with torch.no_grad():
        want = model(input_ids=ids).logits
    cache = hc.apply_kv_budget(model, mixed(model))
    assert model.config._attn_implementation == ATTENTION and isinstance(cache, hc.KVBudgetCache)
    with torch.no_grad():  # without a budget cache: transformers' sdpa attention
        assert (model(input_ids=ids).logits - want).abs().max() <= ATOL
    cache.restore()
    assert model.config._attn_implementation == "eager"
    # a budget cache on a model that was not switched: one line, not a crash inside transformers
    stray = KVBudgetCache(mixed(model), model.config)
    with pytest.raises(HeadcountError, match="apply_kv_budget"), torch.no_grad():
        model(input_ids=ids, cache=stray, use_cache=True)


def test_a_budget_file_applies_and_what_does_not_fit_is_refused(tmp_path):
    model = tiny_model("llama", head="lm")
    budget = mixed(model)
    path = budget.save(tmp_path / "budget.json")
    assert KVBudget.load(path) == budget
    with apply_kv_budget(model, str(path)) as cache:
        assert cache.budget == budget
    n_layers, n_heads, n_kv, head_dim = shape(model)
    for other in (KVBudget.full_cache(n_layers + 1, n_heads, n_kv, head_dim),
                  KVBudget.full_cache(n_layers, n_heads, n_kv * 2, head_dim),
                  KVBudget.full_cache(n_layers, n_heads, n_kv, head_dim * 2)):
        with pytest.raises(HeadcountError, match="the budget is for") as e:
            apply_kv_budget(model, other)
        assert "\n" not in str(e.value)  # the command line's one `error:` line
    encoder = tiny_model("bert")
    with pytest.raises(HeadcountError, match="encoder"):
        apply_kv_budget(encoder, budget)
    doc = json.loads(path.read_text())
    for bad, why in (({**doc, "full": doc["full"][:1]}, "list of"), ({**doc, "format": "mask"}, "format"),
                     ({**doc, "sink": [[None, None]] * n_layers}, "full 1|whole number"),
                     ({**doc, "n_heads": 3}, "multiple")):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(HeadcountError, match=why) as e:
            apply_kv_budget(model, tmp_path / "bad.json")
        assert str(e.value).startswith(str(tmp_path / "bad.json")) and "\n" not in str(e.value)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(HeadcountError, match=r"corrupt \(JSONDecodeError\)"):
        apply_kv_budget(model, tmp_path / "bad.json")


#: decoders whose layers the model itself bounds by a sliding window: refused at apply_kv_budget
#: (tests/core/test_kvbudget_windows.py); Gemma2 soft-caps its attention logits too
REFUSED = {"mistral": "sliding window", "gemma2": "sliding window", "gemma3": "sliding window"}
#: Gemma2 with every layer global: what is left to refuse is its soft-capping, at the first forward
SOFTCAP = dict(layer_types=["full_attention"] * 3)


@pytest.mark.parametrize("arch", [a for a in DECODER_IDS if a not in REFUSED])
def test_every_other_decoder_runs_a_budget(arch):
    """The full budget is the model's own attention; a window as long as the text too."""
    model = tiny_model(arch, head="lm", attn_implementation="eager")
    n_layers, n_heads, n_kv, head_dim = shape(model)
    ids, mask = ids_and_mask(model, length=9)
    with torch.no_grad():
        want = model(input_ids=ids).logits
    for budget in (KVBudget.full_cache(n_layers, n_heads, n_kv, head_dim),
                   KVBudget.uniform(n_layers, n_heads, n_kv, head_dim, sink=2, window=8)):
        got, cache = budgeted(model, budget, ids, mask, 4)
        assert (got - want).abs().max() <= ATOL and cache.nbytes() == budget.kv_bytes(9, batch=2)


@pytest.mark.parametrize("arch, what", sorted(REFUSED.items()))
def test_attention_the_budget_cannot_express_is_refused(arch, what):
    model = tiny_model(arch, head="lm", attn_implementation="eager")
    with pytest.raises(HeadcountError, match=what):  # up front, not at the first forward
        apply_kv_budget(model, KVBudget.full_cache(*shape(model)))
    assert model.config._attn_implementation == "eager"
    model = tiny_model("gemma2", head="lm", attn_implementation="eager", **SOFTCAP)
    ids, _ = ids_and_mask(model)
    with apply_kv_budget(model, KVBudget.full_cache(*shape(model))) as cache, torch.no_grad():
        with pytest.raises(HeadcountError, match="softcap"):
            model(input_ids=ids, cache=cache, use_cache=True)


def test_a_budget_cache_is_not_cropped_but_reset():
    model = tiny_model("llama", head="lm")
    ids, _ = ids_and_mask(model)
    with torch.no_grad(), apply_kv_budget(model, mixed(model)) as cache:
        first = model(input_ids=ids, cache=cache, use_cache=True).logits
        with pytest.raises(HeadcountError, match="cropped"):
            cache.crop(-1)
        cache.reset()
        assert cache.get_seq_length() == 0 and cache.nbytes() == 0
        assert torch.equal(model(input_ids=ids, cache=cache, use_cache=True).logits, first)
