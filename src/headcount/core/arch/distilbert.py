"""DistilBERT: q_lin/k_lin/v_lin/out_lin inside one attention module; FFN lin1/lin2."""

from __future__ import annotations

from headcount.core.arch.base import Adapter, Block
from headcount.core.arch.registry import register_adapter


class DistilBertAdapter(Adapter):
    model_types = ("distilbert",)
    family = ("DistilBERT",)

    def num_heads(self, config):
        return int(config.n_heads)

    def head_dim(self, config):
        return int(config.dim) // int(config.n_heads)

    def intermediate_size(self, config):
        return int(config.hidden_dim)

    def encoder(self, model):
        return self.base(model).transformer

    def blocks(self, model):
        return [
            Block(
                layer=layer,
                attention=layer.attention,
                head_projections=(layer.attention.q_lin, layer.attention.k_lin, layer.attention.v_lin),
                out_projection=layer.attention.out_lin,
                ffn_in=layer.ffn.lin1,
                ffn_out=layer.ffn.lin2,
            )
            for layer in self.encoder(model).layer
        ]

    def attention_without_heads(self, attention, hidden_states, *args, **kwargs):
        # out_lin lives inside this module: with no head its output is its bias.
        empty = hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        return attention.out_lin(empty), None


register_adapter(DistilBertAdapter())
