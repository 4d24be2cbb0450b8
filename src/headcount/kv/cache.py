"""A KV budget applied to a decoder with real memory savings: a transformers cache that stores,
per layer, every token only for the full KV heads and only the sink + recent window for the
streaming ones, and the attention function that reads it.

How it plugs into transformers 5 without touching modelling code: a decoder's attention module
calls ``cache.update(k, v, layer_idx)`` and hands what it returns to the function registered
under ``config._attn_implementation`` in ``AttentionInterface``. [`KVBudgetCache`][headcount.kv.cache.KVBudgetCache]'s
update returns a [`BudgetedKV`][headcount.kv.cache.BudgetedKV] (the layer's parts: full heads with every token,
streaming heads with their kept tokens and those tokens' positions) instead of two tensors, and
[`kv_budget_attention`][headcount.kv.cache.kv_budget_attention], registered as ``"headcount_kv_budget"`` (with sdpa's
mask function in ``AttentionMaskInterface``), runs each part (torch's
``scaled_dot_product_attention`` for several query tokens, two matmuls for one):

- a full KV head's query heads attend causally to every token (the model's own attention);
- a streaming KV head's query heads attend to key position ``k`` from query position ``p`` when
  ``k <= p`` and (``k < sink`` or ``k >= p - window``): the sinks, the ``window`` tokens before
  ``p`` and ``p`` itself. The same Lambda-shaped mask in prefill (DuoAttention's streaming mask,
  arXiv 2410.10819) as in decoding, where the cache holds exactly the sinks and the last
  ``window`` tokens, so that a prompt prefilled at once, in chunks, or token by token gives
  the same result.

The prefill rule is a named option (``apply_kv_budget(..., prefill=)``, ``PREFILL_RULES``):
``masked`` (the default: the Lambda mask in every call, DuoAttention's training mask, independent of
how the prompt is chunked) or ``full`` (DuoAttention's inference path and kvpress: every query of a
call attends causally to every key the call is given, the cache keeps the sinks and the window
after it; one call's prefill is then the model's own attention, and decoding, one token a call, is
the same as ``masked``). The memory held after each call is the same under both.

Grouped-query attention is respected: the budget is per KV head and a query head follows its KV
head (``h // group``); the cache stores each KV head once and decoding packs a group's query heads
onto their KV head (no K/V repeated). Keys keep the rotary rotation of their original position
(as DuoAttention: no re-rotation after eviction). Positions are cache slots: with left padding a
short row's first slots (its sinks) are padding, which the padding mask hides.

    cache = hc.apply_kv_budget(model, hc.KVBudget.load("budget.json"))
    out = model.generate(**inputs, cache=cache, max_new_tokens=32, do_sample=False)
    cache.nbytes()          # bytes the K/V tensors hold now

Outside a budget cache (no cache, a ``DynamicCache``) the switched model runs transformers' sdpa
attention; ``with hc.apply_kv_budget(...) as cache:`` switches it back on exit.

**One budget at a time** ([`headcount.kv.switch`][headcount.kv.switch]): a second
``apply_kv_budget`` while the cache that switched the model lives unrestored is refused in one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from headcount.kv.budget import PREFILL_RULES, KVBudget, check_prefill
from headcount.kv.switch import ATTENTION, record_switch, release, take_switch
from headcount.runtime.errors import HeadcountError

#: keyword arguments of a model's attention call that change the attention itself: refused,
#: rather than silently ignored (logit soft-capping, learned sinks); ``sliding_window`` is run
#: where the budget states the layer's window (``model_window``)
_UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias")


# --- what the cache hands the attention function ---------------------------------------------
@dataclass
class PartKV:
    """The K/V of one layer's KV heads that share a budget, for one attention call.

    Attributes:
        kv_heads: the KV heads of the part (the layer's indices).
        q_index: ``[n_part * group]`` long: their query heads, in the order of ``kv_heads``.
        keys: ``[batch, n_part, seq_k, head_dim]``.
        values: ``[batch, n_part, seq_k, head_dim]``.
        positions: ``[seq_k]`` long: the cache slot of each key (None for a full part: slots
            ``0..seq_k-1``).
        sink: a streaming part's sink (None: full).
        window: a streaming part's recent window (None: full).
        every_head: the part is the whole layer, in order (no gather or scatter of query heads).
        causal: a streaming part read with the plain causal mask in this call (``prefill="full"``).
    """

    kv_heads: tuple[int, ...]
    q_index: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor | None
    sink: int | None
    window: int | None
    every_head: bool
    causal: bool = False


@dataclass
class BudgetedKV:
    """What [`KVBudgetCache`][headcount.kv.cache.KVBudgetCache] returns to a layer's attention, in place of its
    key and value tensors: the layer's parts, the slot of the first query (``start``) and the
    number of slots after this step (``length``)."""

    parts: list[PartKV]
    start: int
    length: int
    layer: int
    group: int
    model_window: int | None = None


# --- the cache ---------------------------------------------------------------------------------
class _Part:
    """One layer's KV heads that share a budget, and what the cache keeps of them."""

    def __init__(self, kv_heads: list[int], group: int, n_kv: int, sink: int | None, window: int | None):
        self.kv_heads = tuple(kv_heads)
        self.kv_index = torch.tensor(kv_heads, dtype=torch.long)
        self.q_index = torch.tensor([h * group + j for h in kv_heads for j in range(group)], dtype=torch.long)
        self.sink, self.window = sink, window
        self.every_head = list(kv_heads) == list(range(n_kv))
        self.keys: torch.Tensor | None = None  # [batch, n_part, slots, head_dim]
        self.values: torch.Tensor | None = None

    @property
    def full(self) -> bool:
        return self.window is None

    def kept_positions(self, seen: int, device) -> torch.Tensor:
        """``[slots]``: the slots a streaming part holds after ``seen`` tokens (sinks, then the
        last ``window``)."""
        sink, window = self.sink or 0, self.window or 0
        if seen <= sink + window:
            return torch.arange(seen, device=device)
        return torch.cat([torch.arange(sink, device=device), torch.arange(seen - window, seen, device=device)])

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.keys, self.values) if t is not None]


class KVBudgetLayer(CacheLayerMixin):
    """One layer of a [`KVBudgetCache`][headcount.kv.cache.KVBudgetCache]: a part for the full KV heads and one per
    distinct ``(sink, window)`` of the streaming ones."""

    is_compileable = False
    is_croppable = False
    is_sliding = False  # masks are sized over every slot, as for a full layer

    def __init__(self, budget: KVBudget, layer: int, prefill: str = PREFILL_RULES[0]):
        super().__init__()
        self.layer, self.n_kv, self.group = layer, budget.n_kv_heads, budget.group_size
        self.causal = prefill == "full"  # streaming parts see every key of a call (then evict)
        self.model_window = budget.model_window[layer]
        shared: dict[tuple, list[int]] = {}
        if self.model_window is not None:
            # a layer the model itself bounds by a sliding window of W tokens (query p reads keys
            # k > p - W): one part, every KV head, no sink and a window of W - 1 (the W - 1 tokens
            # transformers' own sliding cache keeps); its mask is the model's in every call
            self.causal = False
            shared[(0, self.model_window - 1)] = list(range(self.n_kv))
        else:
            for head, (s, w) in enumerate(zip(budget.sink[layer], budget.window[layer])):
                shared.setdefault((s, w), []).append(head)
        # the full heads first, then the streaming groups by (sink, window)
        order = sorted(shared, key=lambda sw: (sw[1] is not None, sw[0] or 0, sw[1] or 0))
        self.parts = [_Part(shared[sw], self.group, self.n_kv, *sw) for sw in order]
        self.seen = 0  # tokens (slots) this layer has been given

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        for part in self.parts:
            part.kv_index, part.q_index = part.kv_index.to(self.device), part.q_index.to(self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple:
        """Add ``key_states`` / ``value_states`` (``[batch, n_kv, seq, head_dim]``), evict what a
        streaming part no longer needs, and return the layer's [`BudgetedKV`][headcount.kv.cache.BudgetedKV] twice (as
        keys and as values: the attention function reads it once)."""
        if key_states.shape[1] != self.n_kv:
            raise HeadcountError(f"the budget gives layer {self.layer} {self.n_kv} KV heads, the model's layer has "
                                 f"{key_states.shape[1]} (a pruned model? make the budget for the model as it is)")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, new = self.seen, key_states.shape[-2]
        self.seen += new
        views = []
        for part in self.parts:
            k = key_states if part.every_head else key_states.index_select(1, part.kv_index)
            v = value_states if part.every_head else value_states.index_select(1, part.kv_index)
            if part.keys is not None and part.values is not None:
                k, v = torch.cat([part.keys, k], dim=-2), torch.cat([part.values, v], dim=-2)
            if part.full:
                part.keys, part.values = k, v
                views.append(PartKV(part.kv_heads, part.q_index, k, v, None, None, None, part.every_head))
                continue
            # the keys this step sees: what was kept after `start` tokens, then the new ones
            positions = torch.cat([part.kept_positions(start, k.device),
                                   torch.arange(start, self.seen, device=k.device)])
            views.append(PartKV(part.kv_heads, part.q_index, k, v, positions, part.sink, part.window, part.every_head,
                                self.causal))
            n, sink, window = k.shape[-2], part.sink or 0, part.window or 0
            if n > sink + window:  # keep the sinks and the last `window` tokens
                part.keys = torch.cat([k[:, :, :sink], k[:, :, n - window:]], dim=-2)
                part.values = torch.cat([v[:, :, :sink], v[:, :, n - window:]], dim=-2)
            else:
                part.keys, part.values = k, v
        kv = BudgetedKV(views, start, self.seen, self.layer, self.group, self.model_window)
        return kv, kv

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0  # the mask covers every slot; streaming parts index it

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for part in self.parts for t in part.tensors())

    def _apply(self, fn) -> None:
        for part in self.parts:
            if part.keys is not None:
                part.keys, part.values = fn(part.keys), fn(part.values)

    def offload(self):
        self._apply(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self):
        if self.is_initialized:
            self._apply(lambda t: t.to(self.device, non_blocking=True))

    def reset(self) -> None:
        for part in self.parts:
            part.keys = part.values = None
        self.seen = 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._apply(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._apply(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._apply(lambda t: t[indices, ...])

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise HeadcountError("a KV-budget cache cannot be cropped: its streaming heads no longer hold the "
                                 "tokens before their window")


class KVBudgetCache(Cache):
    """A transformers cache that stores, per layer, every token for the budget's full KV heads and
    the sink + recent window for its streaming ones ([`KVBudget`][headcount.kv.budget.KVBudget]).

    Made by [`apply_kv_budget`][headcount.kv.cache.apply_kv_budget], which also switches the model to the attention
    that reads it. Pass it as ``cache=`` (the older name ``past_key_values=`` still works, deprecated) to the model's forward or to
    ``generate``; one cache serves one sequence of calls (``reset()`` empties it). Used as a
    context manager it switches the model back to its previous attention on exit.

    Attributes:
        budget: the [`KVBudget`][headcount.kv.budget.KVBudget] it applies.
        prefill: how streaming heads attend inside one call (``PREFILL_RULES``).
    """

    def __init__(self, budget: KVBudget, config=None, prefill: str = PREFILL_RULES[0]):
        check_prefill(prefill)
        super().__init__(layers=[KVBudgetLayer(budget, layer, prefill) for layer in range(budget.n_layers)])
        self.budget, self.prefill = budget, prefill
        self._config = config
        self._model_ref = None  # the model apply_kv_budget switched (its record: _SWITCHED)

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        if self._config is not None and self._config._attn_implementation != ATTENTION:
            raise HeadcountError(f"the model runs {self._config._attn_implementation!r} attention, which cannot read a "
                                 "KV-budget cache: make the cache with headcount.apply_kv_budget(model, budget)")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def nbytes(self) -> int:
        """Bytes of every K/V tensor the cache holds now (what [`KVBudget.kv_bytes`][headcount.kv.budget.KVBudget.kv_bytes] predicts)."""
        return sum(layer.nbytes() for layer in self.layers if isinstance(layer, KVBudgetLayer))

    def __enter__(self) -> "KVBudgetCache":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        """Switch the model back to the attention it ran before [`apply_kv_budget`][headcount.kv.cache.apply_kv_budget]
        (every config as it was). Once: a second call, or a call after a later apply took the
        model over, does nothing."""
        if self._model_ref is not None:
            release(self._model_ref, self)
        self._model_ref = None


# --- the attention function --------------------------------------------------------------------
def _streaming_mask(part: PartKV, start: int, q_len: int, mask: torch.Tensor | None) -> torch.Tensor:
    """``[1 or batch, 1, q_len, seq_k]`` bool: the Lambda mask of a streaming part (sinks, the
    ``window`` slots before each query and the query itself; with ``part.causal`` every slot up to
    the query), and the model's mask (padding) at the part's key slots."""
    positions = part.positions if part.positions is not None else torch.arange(part.keys.shape[-2])
    k = positions[None, :]  # [1, seq_k]
    p = torch.arange(start, start + q_len, device=k.device)[:, None]  # [q_len, 1]
    keep = k <= p  # [q_len, seq_k]
    if not part.causal:
        keep = keep & ((k < (part.sink or 0)) | (k >= p - (part.window or 0)))
    keep = keep[None, None]
    if mask is None:
        return keep
    cols = mask.index_select(-1, positions)  # [batch, 1, q_len, seq_k]
    if cols.dtype == torch.bool:
        return cols & keep
    return cols.masked_fill(~keep, torch.finfo(cols.dtype).min)  # an additive float mask


def _attend(query, keys, values, mask, causal: bool, group: int, dropout: float, scaling) -> torch.Tensor:
    """Attention of ``query [b, n*group, q, d]`` on ``keys``/``values [b, n, k, d]``, K/V never
    repeated. One query token (decoding): the group's query heads are packed onto their KV head
    (``[b, n, group, d]``, as transformers' ``pack_gqa``) and attend by two matmuls and a float32
    softmax: torch's CPU sdpa kernel pays milliseconds of threading overhead on the short key
    ranges of streaming heads (measured: 24 us to 80 ms per call under load, the matmuls 50 us).
    Longer queries: sdpa with ``enable_gqa``. Returns ``[b, n*group, q, d_v]``."""
    b, n_q, q_len, d = query.shape
    if q_len == 1:
        packed = query.reshape(b, n_q // group, group, d)  # [b, n, group, d]
        scores = torch.matmul(packed, keys.transpose(-1, -2)) * (d ** -0.5 if scaling is None else scaling)
        if mask is not None:  # [b or 1, 1, 1, k]
            scores = (scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool
                      else scores + mask)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        weights = F.dropout(weights, p=dropout, training=dropout > 0)
        return torch.matmul(weights, values).reshape(b, n_q, 1, values.shape[-1])  # [b, n, group, d_v] -> heads
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                          is_causal=causal, enable_gqa=group > 1)


def kv_budget_attention(module, query: torch.Tensor, key, value, attention_mask: torch.Tensor | None,
                        dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """The attention function registered as ``"headcount_kv_budget"`` in transformers'
    ``AttentionInterface`` (same signature as the built-in ones).

    With a [`BudgetedKV`][headcount.kv.cache.BudgetedKV] (from a [`KVBudgetCache`][headcount.kv.cache.KVBudgetCache]) each part of the layer
    attends as its budget says; with plain tensors (no cache, another cache) it is transformers'
    sdpa attention.

    Args:
        module: the attention module (``num_key_value_groups``, ``training``).
        query: ``[batch, n_heads, q_len, head_dim]``, rotary applied.
        key: a [`BudgetedKV`][headcount.kv.cache.BudgetedKV], or ``[batch, n_kv, seq_k, head_dim]``.
        value: the same object as ``key``, or ``[batch, n_kv, seq_k, head_dim]``.
        attention_mask: ``[batch, 1, q_len, seq_k]`` bool (or additive float), or None (plain causal).
        dropout: attention dropout probability (training only).
        scaling: the softmax scale (None: ``head_dim ** -0.5``).

    Returns:
        ``(output [batch, q_len, n_heads, head_dim], None)``.
    """
    if not isinstance(key, BudgetedKV):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    used = [name for name in _UNSUPPORTED if kwargs.get(name) is not None]
    if used:
        raise HeadcountError(f"the KV-budget attention does not support {', '.join(used)} (this model's attention "
                             "uses it); run the model without a budget")
    window = kwargs.get("sliding_window")
    if window != key.model_window:  # the budget's model_window was checked against the model at apply
        raise HeadcountError(f"layer {key.layer} attends within a sliding window of {window} tokens, the budget says "
                             f"{key.model_window} (null: every token): make the budget for the model as it is")
    b, n_q, q_len, _ = query.shape
    group = key.group
    if n_q != group * sum(len(part.kv_heads) for part in key.parts):
        raise HeadcountError(f"layer {key.layer} has {n_q} query heads, the budget {group} per KV head "
                             "(a pruned model? make the budget for the model as it is)")
    if attention_mask is not None and attention_mask.shape[-1] != key.length:
        raise HeadcountError(f"the attention mask covers {attention_mask.shape[-1]} positions, the KV-budget cache "
                             f"{key.length}: pass the 2-D attention mask of every token so far")
    p = dropout if module.training else 0.0
    out = query.new_empty(0)  # the whole output when one part covers the layer, else filled part by part
    for part in key.parts:
        q = query if part.every_head else query.index_select(1, part.q_index)
        if part.positions is None:  # full heads: the model's own mask; None = plain causal (or one query)
            o = _attend(q, part.keys, part.values, attention_mask, attention_mask is None and q_len > 1, group, p,
                        scaling)
        else:  # one query without padding sees every slot a streaming part kept: no mask to build
            mask = None if q_len == 1 and attention_mask is None else _streaming_mask(part, key.start, q_len,
                                                                                     attention_mask)
            o = _attend(q, part.keys, part.values, mask, False, group, p, scaling)
        if part.every_head:
            out = o
        else:
            if out.numel() == 0:
                out = query.new_empty(b, n_q, q_len, part.values.shape[-1])
            out.index_copy_(1, part.q_index, o)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, kv_budget_attention)
# sdpa's mask (bool, None when plain causal): the full parts use it as it is, the streaming
# parts read it at their key slots
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


# --- the user's entry point --------------------------------------------------------------------
def apply_kv_budget(model, budget: KVBudget | str | os.PathLike, prefill: str = PREFILL_RULES[0]) -> KVBudgetCache:
    """Switch ``model`` to the KV-budget attention and return an empty cache for ``budget``.

    Args:
        model: a decoder (causal LM) whose layers' K/V heads the budget describes; its attention
            modules must take their attention function from transformers' interface (every
            transformers 5 decoder headcount has an adapter for does).
        budget: a [`KVBudget`][headcount.kv.budget.KVBudget] or the path of a ``budget.json``.
        prefill: ``masked`` (streaming heads read the Lambda mask in every call: the prompt's
            result does not depend on how it is chunked) or ``full`` (inside one call they attend
            to every key of it, as DuoAttention's inference and kvpress prefill; the cache keeps
            their sinks and window after the call). The bytes held after each call are the same.

    Returns:
        A [`KVBudgetCache`][headcount.kv.cache.KVBudgetCache] to pass as ``cache=`` (one per generated
        sequence: call again, or ``cache.reset()``). The model stays switched (outside such a
        cache it runs transformers' sdpa attention) until ``cache.restore()`` or the end of a
        ``with`` block.

    Raises:
        HeadcountError: the budget does not fit the model (layers, query or KV heads, head size,
            the layers' own sliding windows),
            a budget is already applied to it (restore that cache first: one at a time), an
            argument is not a model or a budget, or the file is missing or malformed.

    >>> with hc.apply_kv_budget(model, "budget.json") as cache:          # doctest: +SKIP
    ...     out = model.generate(**inputs, cache=cache, max_new_tokens=32, do_sample=False)
    """
    if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
        raise HeadcountError(f"apply_kv_budget's 'model' must be a transformers decoder (a torch module with a "
                             f".config), got {type(model).__name__}")
    if not isinstance(budget, (KVBudget, str, os.PathLike)):
        raise HeadcountError(f"apply_kv_budget's 'budget' must be a KVBudget or the path of a budget.json, got "
                             f"{type(budget).__name__}" + (" (KVBudget.from_dict reads one)" if isinstance(budget, dict)
                                                           else ""))
    check_prefill(prefill)
    if not isinstance(budget, KVBudget):
        budget = KVBudget.load(budget)
    budget.check_model(model)
    before = take_switch(model)
    if model.config._attn_implementation != ATTENTION:
        model.set_attn_implementation(ATTENTION)
        if model.config._attn_implementation != ATTENTION:
            raise HeadcountError(f"{type(model).__name__} cannot switch its attention implementation (its attention "
                                 "does not use transformers' AttentionInterface): no KV budget for it")
    cache = KVBudgetCache(budget, model.config, prefill)
    cache._model_ref = model
    record_switch(model, before, cache)
    return cache


__all__ = ["ATTENTION", "BudgetedKV", "KVBudgetCache", "KVBudgetLayer", "PartKV", "apply_kv_budget",
           "kv_budget_attention"]
