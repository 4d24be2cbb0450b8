"""ModernBERT: fused query/key/value projection, gated (GLU) feed-forward block, pre-LayerNorm,
rotary positions, global attention every n-th layer and sliding-window attention in between.

- ``attn.Wqkv`` ``[3 * n_heads * head_dim, hidden]``: rows are query, key, value parts, each
  ``[n_heads, head_dim]`` (the forward views them as ``[3, -1, head_dim]``, so it runs with
  any number of heads left): one head projection of 3 parts.
- ``attn.Wo`` ``[hidden, n_heads * head_dim]``: the per-head context vectors enter here.
- ``mlp.Wi`` ``[2 * intermediate, hidden]``: input and gate halves (``chunk(2)``): 2 parts;
  ``mlp.Wo`` ``[hidden, intermediate]``.

Local and global layers differ only in their attention mask, which the adapter never touches.
Attention probabilities come from the eager implementation (``attn`` returns them).
"""

from __future__ import annotations

from headcount.core.arch.base import Adapter, Block
from headcount.core.arch.registry import register_adapter

QKV_PARTS = 3  # query, key, value
GLU_PARTS = 2  # input, gate


class ModernBertAdapter(Adapter):
    model_types = ("modernbert",)
    family = ("ModernBERT",)

    def encoder(self, model):
        # ModernBertModel runs the layers itself (no separate encoder module).
        return self.base(model)

    def blocks(self, model):
        return [
            Block(
                layer=layer,
                attention=layer.attn,
                head_projections=(layer.attn.Wqkv,),
                out_projection=layer.attn.Wo,
                ffn_in=layer.mlp.Wi,
                ffn_out=layer.mlp.Wo,
                head_chunks=(QKV_PARTS,),
                ffn_in_chunks=GLU_PARTS,
            )
            for layer in self.encoder(model).layers
        ]

    def task_head_reads_all_positions(self, model):
        # ModernBertForSequenceClassification pools every position when classifier_pooling == "mean".
        return getattr(model.config, "classifier_pooling", "cls") == "mean"

    def attention_without_heads(self, attention, hidden_states, *args, **kwargs):
        # Wo and its dropout live inside this module: with no head the output is Wo's bias
        # (zeros when the model has none), as gating every head gives.
        empty = hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        return attention.out_drop(attention.Wo(empty)), None


register_adapter(ModernBertAdapter())
