"""ALBERT: one shared layer (per group) applied at every depth.

Blocks repeat the shared modules, one block per application: gates are per application
(depth), surgery on a shared module removes a head from every depth at once.
"""

from __future__ import annotations

from headcount.core.arch.base import Adapter, Block
from headcount.core.arch.registry import register_adapter


class AlbertAdapter(Adapter):
    model_types = ("albert",)
    family = ("ALBERT",)

    def encoder(self, model):
        return self.base(model).encoder

    def blocks(self, model):
        enc = self.encoder(model)
        cfg = enc.config
        blocks = []
        for depth in range(cfg.num_hidden_layers):
            group = enc.albert_layer_groups[int(depth / (cfg.num_hidden_layers / cfg.num_hidden_groups))]
            for layer in group.albert_layers:
                att = layer.attention
                blocks.append(
                    Block(
                        layer=layer,
                        attention=att,
                        head_projections=(att.query, att.key, att.value),
                        out_projection=att.dense,
                        ffn_in=layer.ffn,
                        ffn_out=layer.ffn_output,
                    )
                )
        return blocks

    def attention_without_heads(self, attention, hidden_states, *args, **kwargs):
        # dense, dropout, residual and LayerNorm live inside ALBERT's attention module.
        empty = hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        out = attention.output_dropout(attention.dense(empty))
        return attention.LayerNorm(hidden_states + out), None


register_adapter(AlbertAdapter())
