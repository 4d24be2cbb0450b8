"""Llama-style decoders: separate ``q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj`` linears with
grouped-query attention (``[n_q * head_dim]`` query rows, ``[n_kv * head_dim]`` key and value
rows) and a gated MLP (``down(act(gate(x)) * up(x))``).

Mistral, Qwen2 and the Gemma family have the same modules; Qwen3 and Gemma3 add q/k RMSNorms
over ``head_dim`` with one weight shared by every head (nothing to slice: removing a head leaves
the others' norms as they were). Gemma2/3 soft-cap attention logits and alternate sliding-window
and global layers; both act per head or per position, never across heads.
"""

from __future__ import annotations

from headcount.core.arch.decoder import DecoderAdapter
from headcount.core.arch.registry import register_adapter


class LlamaAdapter(DecoderAdapter):
    model_types = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
    family = ("Llama", "Mistral", "Qwen2", "Qwen3", "Gemma", "Gemma2", "Gemma3")


register_adapter(LlamaAdapter())
