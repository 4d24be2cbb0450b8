"""What decoder adapters share (no adapter registers here): causal language models whose
attention has query heads and, under grouped-query attention (GQA), fewer key/value heads.

transformers 5 attention modules infer their head counts from the projections' sizes
(``view(..., -1, head_dim)``) and map query head i to key/value head
``i // self.num_key_value_groups`` (``repeat_kv`` in eager, ``enable_gqa`` in sdpa, both reading
the *module* attribute), so surgery needs the weights sliced and that attribute (and the few
others a family's forward reads) set per layer. transformers' own attention interface and cache
classes run the pruned model: the caches size each layer from the K/V they are given.
"""

from __future__ import annotations

from headcount.core.arch.base import Adapter, Block


class DecoderAdapter(Adapter):
    """Llama's module layout (``model.layers[i].self_attn.{q,k,v,o}_proj``, a gated MLP
    ``mlp.{gate,up,down}_proj``); families with other names override ``blocks``."""

    #: the attribute of the attention module that holds the output projection
    out_name = "o_proj"
    is_decoder = True
    #: attributes of the layer that normalise the attention / MLP block's *output* before the
    #: residual add ("sandwich" norms), or None: the gates that scale a whole block go after them
    #: (``Block.attention_output`` / ``mlp_output``). Declared, never guessed from a name: Llama's
    #: ``post_attention_layernorm`` is the MLP's *input* norm, Gemma 2's the attention's output norm.
    attention_post_norm: str | None = None
    mlp_post_norm: str | None = None

    def num_kv_heads(self, config) -> int:
        return int(getattr(config, "num_key_value_heads", None) or self.num_heads(config))

    def head_dim(self, config) -> int:
        # an explicit head size where the config has one (Gemma: 256 with hidden 2048 / 8 heads)
        return int(getattr(config, "head_dim", None) or config.hidden_size // self.num_heads(config))

    def cache_windows(self, config) -> tuple[int | None, ...]:
        """Per layer, the sliding window of the model's own attention (tokens a query sees, itself
        included; transformers' cache keeps one fewer), or None where the layer attends to, and
        caches, every token. Read as transformers' own ``DynamicCache(config=...)`` reads it
        (``layer_types`` with ``sliding_window`` / ``attention_chunk_size``): a family whose
        windows live elsewhere overrides this."""
        from transformers.cache_utils import get_layer_types_and_kwargs

        _, per_layer = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        return tuple(kwargs.get("sliding_window") for kwargs in per_layer)

    def encoder(self, model):
        return self.base(model)

    def layers(self, model):
        return self.base(model).layers

    def blocks(self, model):
        out = []
        for layer in self.layers(model):
            att, mlp = layer.self_attn, layer.mlp
            out.append(Block(layer=layer, attention=att, head_projections=(att.q_proj, att.k_proj, att.v_proj),
                             out_projection=att.o_proj, ffn_in=mlp.up_proj, ffn_out=mlp.down_proj,
                             head_units=(("q",), ("kv",), ("kv",)), ffn_in_extra=(mlp.gate_proj,),
                             per_head=self.per_head(att), attention_output=self._post_norm(layer, self.attention_post_norm),
                             mlp_output=self._post_norm(layer, self.mlp_post_norm)))
        return out

    @staticmethod
    def _post_norm(layer, name: str | None):
        return None if name is None else getattr(layer, name)

    def per_head(self, attention) -> tuple:
        """``(module, parameter, unit)`` of per-head tensors to slice (none by default: q/k
        norms over ``head_dim`` share one weight across heads)."""
        return ()

    def task_head_reads_all_positions(self, model):
        # a decoder's sequence classifier reads each row's last real token: a position per row
        return True

    def set_heads(self, attention, n_heads, n_kv, head_dim):
        # the one map transformers reads: query head i -> KV slot i // num_key_value_groups
        attention.num_key_value_groups = n_heads // n_kv if n_kv else 1
        for name, value in (("num_key_value_heads", n_kv), ("num_heads", n_heads), ("num_attention_heads", n_heads)):
            if isinstance(getattr(attention, name, None), int):
                setattr(attention, name, value)

    def attention_without_heads(self, attention, hidden_states, *args, **kwargs):
        # The output projection lives inside the module: with no head it yields its bias (gate
        # semantics). The cache still gets this layer's positions: one zero K/V value per token
        # ([batch, 1, seq, 1]), as caches read the sequence length off a layer's tensors.
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:
            b, s = hidden_states.shape[:2]
            zeros = hidden_states.new_zeros(b, 1, s, 1)
            cache.update(zeros, zeros.clone(), attention.layer_idx)
        # o_proj of no input: its bias. Called, not computed here, so that its gate hook still runs
        # (gate gradients stay defined when every head is gone; a Conv1D with no input left has a
        # forward that returns its bias, see headcount.core.surgery)
        empty = hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
        return getattr(attention, self.out_name)(empty), None
