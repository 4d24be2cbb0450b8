"""Cohere (Command-R): Llama's modules, attention and MLP in parallel from one LayerNorm, and
with ``use_qk_norm`` per-head LayerNorms whose weights are ``[n_heads, head_dim]`` (q_norm) and
``[n_kv, head_dim]`` (k_norm): surgery slices them with the heads they belong to.
"""

from __future__ import annotations

from headcount.core.arch.decoder import DecoderAdapter
from headcount.core.arch.registry import register_adapter


class CohereAdapter(DecoderAdapter):
    model_types = ("cohere",)
    family = ("Cohere",)

    def per_head(self, attention):
        if not getattr(attention, "use_qk_norm", False):
            return ()
        return ((attention.q_norm, "weight", "q"), (attention.k_norm, "weight", "kv"))


register_adapter(CohereAdapter())
