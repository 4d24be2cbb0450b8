"""Phi-3: one fused ``qkv_proj`` whose rows are ``[q: n_q * head_dim; k: n_kv * head_dim;
v: n_kv * head_dim]`` (three parts of unequal size) and a fused ``gate_up_proj`` (2 parts).

Its forward splits the fused output at ``self.config.num_attention_heads * head_dim`` and
``self.num_key_value_heads * head_dim``: after surgery a layer's split points differ from the
model's config, so the attention module gets its own view of the config ([`HeadsView`][headcount.core.arch.phi3.HeadsView])
that answers ``num_attention_heads`` with the layer's own count and passes everything else
(``_attn_implementation`` included, so switching the implementation still reaches it) to the
model's config.
"""

from __future__ import annotations

from headcount.core.arch.base import Block
from headcount.core.arch.decoder import DecoderAdapter
from headcount.core.arch.registry import register_adapter


class HeadsView:
    """The model's config with one layer's ``num_attention_heads``; every other read goes through."""

    def __init__(self, config, num_attention_heads: int):
        self.__dict__["_config"] = config
        self.__dict__["num_attention_heads"] = num_attention_heads

    def __getattr__(self, name):
        return getattr(self.__dict__["_config"], name)

    def __setattr__(self, name, value):
        setattr(self.__dict__["_config"], name, value)


class Phi3Adapter(DecoderAdapter):
    model_types = ("phi3",)
    family = ("Phi-3",)

    def blocks(self, model):
        return [
            Block(layer=layer, attention=layer.self_attn, head_projections=(layer.self_attn.qkv_proj,),
                  out_projection=layer.self_attn.o_proj, ffn_in=layer.mlp.gate_up_proj, ffn_out=layer.mlp.down_proj,
                  head_units=(("q", "kv", "kv"),), ffn_in_chunks=2)
            for layer in self.layers(model)
        ]

    def set_heads(self, attention, n_heads, n_kv, head_dim):
        super().set_heads(attention, n_heads, n_kv, head_dim)
        config = attention.config.__dict__["_config"] if isinstance(attention.config, HeadsView) else attention.config
        attention.config = HeadsView(config, n_heads)


register_adapter(Phi3Adapter())
