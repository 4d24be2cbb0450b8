"""StarCoder2: Llama's attention (biases optional) and a plain MLP ``c_proj(act(c_fc(x)))``."""

from __future__ import annotations

from headcount.core.arch.base import Block
from headcount.core.arch.decoder import DecoderAdapter
from headcount.core.arch.registry import register_adapter


class Starcoder2Adapter(DecoderAdapter):
    model_types = ("starcoder2",)
    family = ("StarCoder2",)

    def blocks(self, model):
        return [
            Block(layer=layer, attention=layer.self_attn,
                  head_projections=(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                  out_projection=layer.self_attn.o_proj, ffn_in=layer.mlp.c_fc, ffn_out=layer.mlp.c_proj,
                  head_units=(("q",), ("kv",), ("kv",)))
            for layer in self.layers(model)
        ]


register_adapter(Starcoder2Adapter())
