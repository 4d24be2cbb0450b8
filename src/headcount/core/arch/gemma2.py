"""Gemma 2 / Gemma 3 (text): Llama's modules with "sandwich" norms. Each block's output is
RMS-normalised before the residual add, ``x + post_attention_layernorm(attn(input_layernorm(x)))``
and ``x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))``.

An RMSNorm is scale-invariant, so a gate on ``down_proj``'s output would change nothing at any
value but 0: its gradient is ~0 whatever the MLP does (a real Gemma 3: 1.1e-6 for an MLP whose
removal raises the loss by 1.17). The whole-block gates therefore go after these norms
(``Block.mlp_output`` / ``attention_output``); an RMSNorm of zeros is zeros, so gate 0 still equals
the pruned block. Head gates stay at ``o_proj``'s input: removing a head is zeroing its context
there, and only the sum over a layer's heads is scale-invariant (their gradients sum to ~0 per
layer; each one measures how the head's share turns the normalised output).

Gemma 3 adds q/k RMSNorms over ``head_dim`` with one weight shared by every head (nothing to
slice), Gemma 2 soft-caps attention logits, and both alternate sliding-window and global layers:
these act per head or per position, never across heads.
"""

from __future__ import annotations

from headcount.core.arch.decoder import DecoderAdapter
from headcount.core.arch.registry import register_adapter


class Gemma2Adapter(DecoderAdapter):  # Llama's module layout (DecoderAdapter's)
    model_types = ("gemma2", "gemma3_text")
    family = ("Gemma2", "Gemma3")
    attention_post_norm = "post_attention_layernorm"
    mlp_post_norm = "post_feedforward_layernorm"


register_adapter(Gemma2Adapter())
