"""Tiny GGUF files written with the gguf package (``GGUFWriter``): a decoder of the Llama layout
(the one transformers' GGUF reader knows best) with a 64-token byte-pair tokenizer, 75 KB, read by
transformers in about a second. The layout can be declared one way and the tensors written
another (``block_count`` 100,000 over tensors for 2 layers), which is what the layout checks see.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ARCH = "llama"  # the architecture the file declares (general.architecture)


def write_gguf(path: Path, *, block_count: int = 2, layers: int | None = None, heads: int = 4, kv_heads: int = 2,
               hidden: int = 32, ffn: int = 40, vocab: int = 64, seed: int = 0, embedding_length: int | None = None
               ) -> Path:
    """A GGUF file at ``path`` declaring ``block_count`` layers of ``heads`` query heads on
    ``kv_heads`` key/value heads, holding tensors for ``layers`` of them (default: all), float32."""
    import gguf

    layers = block_count if layers is None else layers
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_block_count(block_count)
    w.add_context_length(64)
    w.add_embedding_length(hidden if embedding_length is None else embedding_length)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(97 + i % 26) * (1 + i // 26) for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges(["a a"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    rng = np.random.default_rng(seed)

    def t(*shape):  # numpy shape [rows, columns]: GGUF stores it innermost first
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)

    head_dim = hidden // heads
    w.add_tensor("token_embd.weight", t(vocab, hidden))
    for i in range(layers):
        for name, shape in (("attn_norm", (hidden,)), ("ffn_norm", (hidden,)), ("attn_q", (heads * head_dim, hidden)),
                            ("attn_k", (kv_heads * head_dim, hidden)), ("attn_v", (kv_heads * head_dim, hidden)),
                            ("attn_output", (hidden, heads * head_dim)), ("ffn_gate", (ffn, hidden)),
                            ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn))):
            w.add_tensor(f"blk.{i}.{name}.weight", t(*shape))
    w.add_tensor("output_norm.weight", t(hidden))
    w.add_tensor("output.weight", t(vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
