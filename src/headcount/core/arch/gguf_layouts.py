"""Where llama.cpp's GGUF files keep a decoder family's tensors: the declarations
``headcount.core.export_gguf`` writes by (no adapter registers here).

One entry per transformers ``model_type`` whose llama.cpp graph was read and checked (the
vendored llama.cpp of the llama-cpp-python sdist, ``src/models/*.cpp``): the GGUF architecture
of a uniform cut, the one of a cut whose counts differ per layer, the module paths of the
embeddings and norms the adapter's blocks do not hold, and whether q/k rows are permuted into
llama.cpp's rope layout (``convert_hf_to_gguf.py``: ``LlamaModel.permute``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufLayout:
    """How one family is written as GGUF.

    Attributes:
        arch: ``general.architecture`` of a cut that keeps the same counts in every layer (its
            graph reads one head count and one MLP width for all layers).
        per_layer_arch: the architecture whose graph reads per-layer head, KV-head and MLP
            counts (``n_head(il)``, ``n_head_kv(il)``, ``n_ff(il)``), a layer without heads included.
        embed / final_norm: attribute paths from the model (``get_submodule``).
        attn_norm / ffn_norm: attribute names of a layer's input norms of attention / MLP.
        permute_qk: llama.cpp's rope pairs consecutive values of a head (transformers' the two
            halves): q and k rows are reordered per head.
    """

    arch: str
    per_layer_arch: str
    embed: str
    final_norm: str
    attn_norm: str
    ffn_norm: str
    permute_qk: bool = True


#: by transformers ``model_type``. Llama's per-layer form is llama.cpp's ``deci`` (DeciLM /
#: Nemotron-NAS: Llama layers with per-layer counts, attention-free layers where n_head is 0)
GGUF_LAYOUTS: dict[str, GgufLayout] = {
    "llama": GgufLayout(arch="llama", per_layer_arch="deci", embed="model.embed_tokens", final_norm="model.norm",
                        attn_norm="input_layernorm", ffn_norm="post_attention_layernorm"),
}


def gguf_layout(model_type: str) -> GgufLayout | None:
    return GGUF_LAYOUTS.get(model_type)


#: ``tokenizer.ggml.model`` of a byte-level BPE tokenizer (llama.cpp's name for GPT-2's kind)
BPE_TOKENIZER_MODEL = "gpt2"
#: the pre-tokenizers of a transformers byte-level BPE tokenizer that llama.cpp names
#: (``tokenizer.ggml.pre``; ``src/llama-vocab.cpp``): the structure of ``pre_tokenizer`` as
#: ``((type, use_regex or individual_digits), ...)`` -> name. ``gpt-2``: GPT-2's regex alone;
#: ``smollm``: digits split one by one, then GPT-2's regex
PRE_TOKENIZERS = {
    (("ByteLevel", True),): "gpt-2",
    (("Digits", True), ("ByteLevel", True)): "smollm",
}


def file_type(gguf, gguf_type: str) -> int:
    """``general.file_type`` of a file whose 2-D weights are ``gguf_type`` (the gguf package's enum)."""
    names = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}
    return int(getattr(gguf.LlamaFileType, names[gguf_type]))
