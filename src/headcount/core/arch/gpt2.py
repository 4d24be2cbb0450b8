"""GPT-2: multi-head attention whose projections are transformers ``Conv1D`` modules (weight
``[in, out]``: output units are weight *columns*). ``attn.c_attn`` fuses ``[q; k; v]`` (3 parts of
``[n_heads * head_dim]`` outputs); the forward splits it at ``self.split_size``, which surgery
sets per layer. Output ``attn.c_proj``; MLP ``mlp.c_fc`` / ``mlp.c_proj`` (Conv1D too).
"""

from __future__ import annotations

from headcount.core.arch.base import Block
from headcount.core.arch.decoder import DecoderAdapter
from headcount.core.arch.registry import register_adapter


class Gpt2Adapter(DecoderAdapter):
    model_types = ("gpt2",)
    family = ("GPT-2",)
    out_name = "c_proj"

    def head_dim(self, config):
        return int(config.hidden_size) // int(config.num_attention_heads)

    def intermediate_size(self, config):
        return int(config.n_inner or 4 * config.hidden_size)

    def layers(self, model):
        return self.base(model).h

    def blocks(self, model):
        return [
            Block(layer=layer, attention=layer.attn, head_projections=(layer.attn.c_attn,),
                  out_projection=layer.attn.c_proj, ffn_in=layer.mlp.c_fc, ffn_out=layer.mlp.c_proj,
                  head_units=(("q", "kv", "kv"),))
            for layer in self.layers(model)
        ]

    def set_heads(self, attention, n_heads, n_kv, head_dim):
        super().set_heads(attention, n_heads, n_kv, head_dim)
        attention.split_size = n_heads * head_dim  # c_attn's output splits into q, k, v here

    def attention_without_heads(self, attention, hidden_states, *args, **kwargs):
        out, _ = super().attention_without_heads(attention, hidden_states, *args, **kwargs)
        return attention.resid_dropout(out), None


register_adapter(Gpt2Adapter())
