"""DeBERTa-v2/v3: disentangled attention with optional separate relative-position projections."""

from __future__ import annotations

from headcount.core.arch.base import Adapter, Block
from headcount.core.arch.registry import register_adapter


class DebertaV2Adapter(Adapter):
    model_types = ("deberta-v2",)
    family = ("DeBERTa-v2/v3",)

    def encoder(self, model):
        return self.base(model).encoder

    def max_tokens(self, config):
        # relative positions only (DeBERTa-v3): no absolute position table to run past
        return super().max_tokens(config) if getattr(config, "position_biased_input", True) else None

    def blocks(self, model):
        blocks = []
        for layer in self.encoder(model).layer:
            att = layer.attention.self
            projections = [att.query_proj, att.key_proj, att.value_proj]
            # Relative-position projections are per head too when keys are not shared.
            projections += [getattr(att, n) for n in ("pos_key_proj", "pos_query_proj") if hasattr(att, n)]
            blocks.append(
                Block(
                    layer=layer,
                    attention=att,
                    head_projections=tuple(projections),
                    out_projection=layer.attention.output.dense,
                    ffn_in=layer.intermediate.dense,
                    ffn_out=layer.output.dense,
                )
            )
        return blocks


register_adapter(DebertaV2Adapter())
