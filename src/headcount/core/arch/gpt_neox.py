"""GPT-NeoX (Pythia): multi-head attention (one KV head per query head) with a fused
``query_key_value`` whose rows are interleaved per head, ``[n_heads, 3, head_dim]`` (the forward
views its output as ``[..., -1, 3 * head_dim]`` and chunks the last axis): one head projection
whose heads each hold 3 parts inside. Output ``dense``; MLP ``dense_h_to_4h`` / ``dense_4h_to_h``.
"""

from __future__ import annotations

from headcount.core.arch.base import Block
from headcount.core.arch.decoder import DecoderAdapter
from headcount.core.arch.registry import register_adapter

QKV_PER_HEAD = 3


class GptNeoxAdapter(DecoderAdapter):
    model_types = ("gpt_neox",)
    family = ("GPT-NeoX", "Pythia")
    out_name = "dense"

    def head_dim(self, config):
        return int(config.hidden_size) // int(config.num_attention_heads)

    def blocks(self, model):
        return [
            Block(layer=layer, attention=layer.attention, head_projections=(layer.attention.query_key_value,),
                  out_projection=layer.attention.dense, ffn_in=layer.mlp.dense_h_to_4h,
                  ffn_out=layer.mlp.dense_4h_to_h, head_units=(("q",),), head_interleave=(QKV_PER_HEAD,))
            for layer in self.layers(model)
        ]


register_adapter(GptNeoxAdapter())
