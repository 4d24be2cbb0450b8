"""Llama-style decoders: separate ``q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj`` linears with
grouped-query attention (``[n_q * head_dim]`` query rows, ``[n_kv * head_dim]`` key and value
rows) and a gated MLP (``down(act(gate(x)) * up(x))``).

Mistral, Qwen2, Qwen3 and Gemma have the same modules; Qwen3 adds q/k RMSNorms over ``head_dim``
with one weight shared by every head (nothing to slice: removing a head leaves the others' norms
as they were). Gemma 2/3 (the same modules plus norms after each block) are ``gemma2.py``.
"""

from __future__ import annotations

from headcount.core.arch.decoder import DecoderAdapter
from headcount.core.arch.registry import register_adapter


class LlamaAdapter(DecoderAdapter):
    model_types = ("llama", "mistral", "qwen2", "qwen3", "gemma")
    family = ("Llama", "Mistral", "Qwen2", "Qwen3", "Gemma")


register_adapter(LlamaAdapter())
