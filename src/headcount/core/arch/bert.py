"""BERT and the models that share its module layout (RoBERTa, XLM-RoBERTa, ELECTRA, CamemBERT)."""

from __future__ import annotations

from headcount.core.arch.base import Adapter, Block
from headcount.core.arch.registry import register_adapter


class BertAdapter(Adapter):
    model_types = ("bert", "roberta", "xlm-roberta", "electra", "camembert")
    family = ("BERT", "RoBERTa", "XLM-RoBERTa", "ELECTRA", "CamemBERT")

    def encoder(self, model):
        return self.base(model).encoder

    def blocks(self, model):
        return [
            Block(
                layer=layer,
                attention=layer.attention.self,
                head_projections=(layer.attention.self.query, layer.attention.self.key, layer.attention.self.value),
                out_projection=layer.attention.output.dense,
                ffn_in=layer.intermediate.dense,
                ffn_out=layer.output.dense,
            )
            for layer in self.encoder(model).layer
        ]


register_adapter(BertAdapter())
