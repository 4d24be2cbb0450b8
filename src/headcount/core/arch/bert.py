"""BERT and the models that share its module layout (RoBERTa, XLM-RoBERTa, ELECTRA, CamemBERT)."""

from __future__ import annotations

from headcount.core.arch.base import Adapter, Block
from headcount.core.arch.registry import register_adapter


class BertAdapter(Adapter):
    model_types = ("bert", "roberta", "xlm-roberta", "electra", "camembert")
    family = ("BERT", "RoBERTa", "XLM-RoBERTa", "ELECTRA", "CamemBERT")

    #: model types whose position ids start after the padding index (RoBERTa's embeddings)
    offset_positions = ("roberta", "xlm-roberta", "camembert")

    def encoder(self, model):
        return self.base(model).encoder

    def max_tokens(self, config):
        n = super().max_tokens(config)
        if n is not None and config.model_type in self.offset_positions:
            n -= int(getattr(config, "pad_token_id", 0) or 0) + 1
        return n

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
