"""A pruned (or unpruned) decoder as one GGUF file that llama.cpp runs.

Written with the ``gguf`` package (``GGUFWriter``) in the layout llama.cpp's own converter
(``convert_hf_to_gguf.py``) writes, for the families of
``headcount.core.arch.gguf_layouts`` (Llama). What llama.cpp's loader accepts was read from its
source (the vendored copy in the llama-cpp-python sdist, ``src/llama-model.cpp`` and
``src/models/{llama,deci}.cpp``):

- ``{arch}.attention.head_count``, ``.head_count_kv`` and ``{arch}.feed_forward_length`` are read
  as one number or as one per layer (``get_key_or_arr``). The ``llama`` graph uses layer 0's
  counts for every layer, so a cut that keeps the same query heads, KV heads and MLP width in
  every layer is written as ``llama`` (scalars); any other cut as ``deci`` (DeciLM /
  Nemotron-NAS: Llama layers whose graph reads ``n_head(il)``, ``n_head_kv(il)``, ``n_ff(il)``).
- ``deci``: a layer with ``n_head == 0`` is attention-free (its residual passes unchanged: what
  a layer whose heads are all removed computes) and holds no attention tensor, its norm included.
  ``n_ff == 0`` skips the layer's *whole* update (``continue`` before ``inpL = cur``), which would
  drop that layer's attention output too, so a removed MLP is written as width 1 with zero
  gate, up and down rows (output exactly 0). The head size is read only when layer 0 has
  heads (``n_embd_head_k`` comes from ``n_head(0)``), so a layer 0 without heads is written
  with one head whose q, k, v and output rows are zero (output exactly 0; it costs one KV head
  of cache).
- q and k rows are permuted per head into llama.cpp's rope layout (pairs of consecutive values;
  transformers rotates the two halves), as the converter does; transformers' GGUF reader undoes it.
- Tokenizer: copied key for key from the GGUF file the model was read from (what llama.cpp read
  before), else built from the transformers tokenizer as the converter's ``_set_vocab_gpt2``
  does: byte-level BPE only, with a pre-tokenizer llama.cpp knows by name
  (``headcount.core.arch.gguf_layouts.PRE_TOKENIZERS``).

Refused, one line each: an encoder, a family without a layout, biases, an activation other than
SiLU, rope scaling other than none or linear, gates left by ``shrink``, another tokenizer kind.

The written file is checked before it replaces anything ([`check_gguf_file`][headcount.core.export_gguf.check_gguf_file]):
read back with ``gguf.GGUFReader``, dequantised, un-permuted into a copy of the model, and its
logits compared with PyTorch's on random inputs (the copy against the model with its weights
rounded to the written type; the difference the type itself makes is reported beside).
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from headcount.runtime.errors import HeadcountError

#: ``--gguf-type``: what 2-D weights are stored as (norms are always f32, as the converter
#: writes them). ``q8_0``: llama.cpp's 8-bit blocks of 32, quantised by the gguf package's port
#: of llama.cpp's reference quantiser (what ``convert_hf_to_gguf.py --outtype q8_0`` writes);
#: a tensor whose rows are not a multiple of 32 is stored as f16 (the converter's fallback)
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")
#: the GGUF metadata key that marks a file headcount wrote (a JSON string: command, identity, seal)
GGUF_MARKER = "headcount.export"


@dataclass(frozen=True)
class GgufSettings:
    """How ``headcount export --format gguf`` writes (the command's defaults are read from here)."""

    type: str = "f32"


@dataclass(frozen=True)
class GgufPlan:
    """What the file holds per layer (lists of ``n_layers``)."""

    arch: str
    n_head: list[int]
    n_head_kv: list[int]
    n_ff: list[int]
    head_dim: int
    #: layers whose removed MLP is written as width 1 with zero rows (``n_ff == 0`` would skip the layer)
    placeholder_mlps: list[int]
    #: layers written with one zero head (layer 0 without heads: the head size is read from it)
    placeholder_heads: list[int]
    tied: bool


def _require_gguf():
    try:  # lazy: an optional dependency (the offline extra)
        import gguf
    except ImportError:
        raise HeadcountError("--format gguf needs the gguf package: pip install gguf") from None
    return gguf


def _check_type(gguf_type: str) -> str:
    if gguf_type not in GGUF_TYPES:
        raise HeadcountError(f"unknown --gguf-type {gguf_type!r}; choose one of {', '.join(GGUF_TYPES)}")
    return gguf_type


def _family(model: nn.Module):
    from headcount.core.arch import get_adapter
    from headcount.core.arch.gguf_layouts import GGUF_LAYOUTS, gguf_layout

    adapter = get_adapter(model)
    if not getattr(adapter, "is_decoder", False):
        raise HeadcountError(f"--format gguf writes decoders (llama.cpp runs causal LMs); "
                             f"{type(model).__name__} is an encoder: export it as ONNX")
    layout = gguf_layout(model.config.model_type)
    if layout is None:
        raise HeadcountError(f"--format gguf knows the GGUF layout of model types {', '.join(sorted(GGUF_LAYOUTS))} "
                             f"only, not {model.config.model_type!r}: export it as ONNX")
    if model.get_output_embeddings() is None:
        raise HeadcountError(f"--format gguf writes a causal LM with its output head; {type(model).__name__} has none")
    return adapter, layout


def gguf_plan(model: nn.Module) -> GgufPlan:
    """The per-layer counts the GGUF file of ``model`` states, or one error line saying what
    llama.cpp cannot express."""
    from headcount.core.gates import kept_heads, kept_kv_heads, layout
    from headcount.core.surgery import kept_neurons, pruning_record

    adapter, fam = _family(model)
    config = model.config
    record = pruning_record(model) or {}
    if record.get("gates"):
        raise HeadcountError("--format gguf: gates stay on shared layers (masked at some depths only); "
                             "a GGUF file has no gates")
    act = getattr(config, "hidden_act", None)
    if act != "silu":
        raise HeadcountError(f"--format gguf: llama.cpp's graph for this family uses SiLU; the model's activation is {act!r}")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") not in ("default", "linear"):
        raise HeadcountError(f"--format gguf writes default or linear rope scaling only, not {rope.get('rope_type')!r}")
    grid = layout(model)
    size = adapter.intermediate_size(config)
    n_head, n_kv, n_ff, mlps = [], [], [], []
    for i, block in enumerate(adapter.blocks(model)):
        projections = [*block.head_projections, block.out_projection, block.ffn_in, *block.ffn_in_extra, block.ffn_out]
        if any(getattr(p, "bias", None) is not None for p in projections):
            raise HeadcountError(f"--format gguf writes bias-free projections only; layer {i} has biases")
        heads = len(kept_heads(block.out_projection, grid.n_heads))
        n_head.append(heads)
        n_kv.append(len(kept_kv_heads(block.out_projection, grid.n_kv_heads)) if heads else 0)
        width = len(kept_neurons(block.ffn_in, size))
        if width == 0:
            mlps.append(i)
        n_ff.append(width)
    uniform = len(set(zip(n_head, n_kv, n_ff))) == 1 and n_head[0] > 0 and n_ff[0] > 0
    placeholder_heads = []
    if not uniform:
        n_ff = [w or 1 for w in n_ff]  # see the module docstring: deci skips a layer of n_ff 0 whole
        if n_head[0] == 0:
            n_head[0], n_kv[0] = 1, 1
            placeholder_heads = [0]
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return GgufPlan(arch=fam.arch if uniform else fam.per_layer_arch, n_head=n_head, n_head_kv=n_kv, n_ff=n_ff,
                    head_dim=adapter.head_dim(config), placeholder_mlps=mlps if not uniform else [],
                    placeholder_heads=placeholder_heads, tied=tied)


# -- tensors ----------------------------------------------------------------------------------
def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' q/k rows ``[n_head * d, in]`` (rotary halves) -> llama.cpp's (rotary pairs):
    ``convert_hf_to_gguf.py``'s ``LlamaModel.permute``."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of [`permute`][headcount.core.export_gguf.permute] (transformers' GGUF reader does the same)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def gguf_tensors(model: nn.Module, plan: GgufPlan) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 array in numpy order (``[out, in]`` for a projection: GGUF
    states it innermost first), exactly the tensors llama.cpp's loader creates for ``plan``."""
    adapter, fam = _family(model)
    d, hidden = plan.head_dim, model.config.hidden_size
    out = {"token_embd.weight": _np(model.get_input_embeddings().weight)}
    layers = adapter.layers(model)
    for i, block in enumerate(adapter.blocks(model)):
        layer, pre = layers[i], f"blk.{i}."
        if plan.n_head[i]:
            q, k, v = (_np(p.weight) for p in block.head_projections)
            o = _np(block.out_projection.weight)
            if i in plan.placeholder_heads:  # one head of zeros: its output is exactly 0
                q, k, v, o = (np.zeros((d, hidden), np.float32),) * 3 + (np.zeros((hidden, d), np.float32),)
            if fam.permute_qk:
                q, k = permute(q, plan.n_head[i]), permute(k, plan.n_head_kv[i])
            out[pre + "attn_norm.weight"] = _np(getattr(layer, fam.attn_norm).weight)
            out.update({pre + "attn_q.weight": q, pre + "attn_k.weight": k, pre + "attn_v.weight": v,
                        pre + "attn_output.weight": o})
        out[pre + "ffn_norm.weight"] = _np(getattr(layer, fam.ffn_norm).weight)
        if i in plan.placeholder_mlps:  # width 1, all zeros: output exactly 0 (n_ff 0 would skip the layer)
            gate, up, down = np.zeros((1, hidden), np.float32), np.zeros((1, hidden), np.float32), np.zeros((hidden, 1), np.float32)
        else:
            gate, up, down = _np(block.ffn_in_extra[0].weight), _np(block.ffn_in.weight), _np(block.ffn_out.weight)
        out.update({pre + "ffn_gate.weight": gate, pre + "ffn_up.weight": up, pre + "ffn_down.weight": down})
    out["output_norm.weight"] = _np(model.get_submodule(fam.final_norm).weight)
    if not plan.tied:
        out["output.weight"] = _np(model.get_output_embeddings().weight)
    return out


def _stored(gguf, name: str, data: np.ndarray, gguf_type: str):
    """``(array to write, its GGML type)``: norms f32; 2-D weights in ``gguf_type``."""
    Q = gguf.GGMLQuantizationType
    if data.ndim == 1 or gguf_type == "f32":
        return data.astype(np.float32), Q.F32
    if gguf_type == "f16":
        return data.astype(np.float16), Q.F16
    qtype = Q.BF16 if gguf_type == "bf16" else Q.Q8_0
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except gguf.QuantError:  # rows not a multiple of the block size (32): the converter's fallback
        return data.astype(np.float16), Q.F16


def rounded(gguf, data: np.ndarray, gguf_type: str) -> np.ndarray:
    """``data`` as the file holds it, back in float32 (what the type's rounding leaves)."""
    stored, qtype = _stored(gguf, "", data, gguf_type)
    return gguf.quants.dequantize(stored, qtype).reshape(data.shape).astype(np.float32)


# -- tokenizer ---------------------------------------------------------------------------------
def _pre_name(tokenizer) -> str:
    from headcount.core.arch.gguf_layouts import PRE_TOKENIZERS

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if model.get("type") != "BPE" or not any(p.get("type") == "ByteLevel" for p in parts):
        raise HeadcountError("--format gguf writes byte-level BPE tokenizers (llama.cpp's gpt2 kind) only; this "
                             f"model's is {model.get('type')!r} with pre-tokenizer {pre.get('type')!r}")
    if any(p.get("type") == "ByteLevel" and p.get("add_prefix_space") for p in parts):
        raise HeadcountError("--format gguf: the tokenizer adds a prefix space, which llama.cpp's BPE tokenizer does not")
    key = tuple((p.get("type"), p.get("use_regex", p.get("individual_digits"))) for p in parts)
    name = PRE_TOKENIZERS.get(key)
    if name is None:
        raise HeadcountError(f"--format gguf: llama.cpp has no pre-tokenizer name headcount knows for {key} "
                             f"(known: {', '.join(PRE_TOKENIZERS.values())})")
    return name


def _write_hf_tokenizer(gguf, writer, tokenizer, vocab_size: int) -> None:
    """As ``convert_hf_to_gguf.py``'s ``_set_vocab_gpt2``: tokens by id (``[PADi]`` where the
    vocabulary has none), their types, the pre-tokenizer's name, merges and special ids."""
    from headcount.core.surgery import save_tokenizer

    if not getattr(tokenizer, "is_fast", False):
        raise HeadcountError("--format gguf needs a fast (tokenizers) tokenizer to write into the file")
    pre = _pre_name(tokenizer)
    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise HeadcountError(f"--format gguf: the tokenizer has ids up to {max(vocab.values())}, "
                             f"the model {vocab_size} embeddings")
    reverse = {i: t for t, i in vocab.items()}
    added = tokenizer.added_tokens_decoder
    T = gguf.TokenType
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(T.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(T.CONTROL if added[i].special else T.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(T.NORMAL)
    from headcount.core.arch.gguf_layouts import BPE_TOKENIZER_MODEL

    writer.add_tokenizer_model(BPE_TOKENIZER_MODEL)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    with tempfile.TemporaryDirectory() as tmp:  # SpecialVocab reads merges and special ids from files
        save_tokenizer(tokenizer, tmp)
        special = gguf.SpecialVocab(tmp, load_merges=True, n_vocab=vocab_size)
    # whether a BOS / EOS is added as the tokenizer itself does it (llama.cpp's defaults per
    # pre-tokenizer differ): llama-simple then gets the same ids as ``tokenizer(prompt)``
    ids = tokenizer("a")["input_ids"]
    special.add_special_token["bos"] = tokenizer.bos_token_id is not None and ids[:1] == [tokenizer.bos_token_id]
    special.add_special_token["eos"] = tokenizer.eos_token_id is not None and ids[-1:] == [tokenizer.eos_token_id]
    special.add_to_gguf(writer, quiet=True)


def _copy_tokenizer(gguf, writer, source: Path) -> None:
    """Every ``tokenizer.*`` key of the GGUF file the model was read from, as it is there."""
    reader = gguf.GGUFReader(str(source))
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)


# -- writing ----------------------------------------------------------------------------------
def write_gguf(model: nn.Module, path: Path, gguf_type: str = GgufSettings.type, tokenizer=None,
               source: Path | None = None, marker: str | None = None) -> GgufPlan:
    """Write ``model`` as a GGUF file at ``path`` (the caller makes it atomic).

    ``source``: the GGUF file the model was read from (its tokenizer is copied), else
    ``tokenizer`` (a transformers tokenizer) is written; neither: no tokenizer (llama.cpp then
    refuses the file). ``marker``: the string of the [`GGUF_MARKER`][headcount.core.export_gguf.GGUF_MARKER] key."""
    gguf = _require_gguf()
    _check_type(gguf_type)
    plan = gguf_plan(model)
    tensors = gguf_tensors(model, plan)
    config = model.config
    rope = dict(getattr(config, "rope_parameters", None) or {})
    w = gguf.GGUFWriter(str(path), plan.arch)
    if marker is not None:
        w.add_string(GGUF_MARKER, marker)  # first: its seal placeholder sits near the file's start
    w.add_name(str(getattr(config, "_name_or_path", "") or type(model).__name__))
    from headcount.core.arch.gguf_layouts import file_type

    w.add_file_type(file_type(gguf, gguf_type))
    w.add_block_count(len(plan.n_head))
    w.add_context_length(int(config.max_position_embeddings))
    w.add_embedding_length(int(config.hidden_size))
    uniform = plan.arch != _family(model)[1].per_layer_arch
    w.add_feed_forward_length(plan.n_ff[0] if uniform else plan.n_ff)
    w.add_head_count(plan.n_head[0] if uniform else plan.n_head)
    w.add_head_count_kv(plan.n_head_kv[0] if uniform else plan.n_head_kv)
    # explicit head size: llama.cpp derives hidden / heads otherwise (wrong once heads are removed)
    w.add_key_length(plan.head_dim)
    w.add_value_length(plan.head_dim)
    w.add_rope_dimension_count(plan.head_dim)
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rope["factor"]))
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    w.add_vocab_size(int(config.vocab_size))
    if source is not None:
        _copy_tokenizer(gguf, w, Path(source))
    elif tokenizer is not None:
        _write_hf_tokenizer(gguf, w, tokenizer, int(config.vocab_size))
    for name, data in tensors.items():
        stored, qtype = _stored(gguf, name, data, gguf_type)
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(name, stored)  # shape and type read off the array
        else:  # bytes of blocks: the writer derives the shape from the type
            w.add_tensor(name, stored, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return plan


# -- reading back -----------------------------------------------------------------------------
def read_plan(path: Path) -> dict:
    """The architecture and per-layer counts a GGUF file states: ``{"arch", "n_head",
    "n_head_kv", "n_ff"}`` (lists of ``block_count``; a scalar is repeated)."""
    gguf = _require_gguf()
    fields = gguf.GGUFReader(str(path)).fields
    arch = fields["general.architecture"].contents()
    n = int(fields[f"{arch}.block_count"].contents())

    def per_layer(key):
        v = fields[f"{arch}.{key}"].contents()
        return [int(x) for x in v] if isinstance(v, list) else [int(v)] * n

    return {"arch": arch, "n_head": per_layer("attention.head_count"), "n_head_kv": per_layer("attention.head_count_kv"),
            "n_ff": per_layer("feed_forward_length")}


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file, dequantised to float32, in numpy order (``[out, in]``)."""
    gguf = _require_gguf()
    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    return out


def _load_into(model: nn.Module, tensors: dict[str, np.ndarray], plan: GgufPlan) -> nn.Module:
    """A copy of ``model`` with the file's weights in place of its own (q/k un-permuted;
    placeholder heads and MLPs, which the model lacks, dropped)."""
    adapter, fam = _family(model)
    copy_ = copy.deepcopy(model)
    layers = adapter.layers(copy_)

    def put(param: nn.Parameter, data: np.ndarray):
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.ascontiguousarray(data)).to(param.dtype))

    put(copy_.get_input_embeddings().weight, tensors["token_embd.weight"])
    for i, block in enumerate(adapter.blocks(copy_)):
        pre = f"blk.{i}."
        if plan.n_head[i] and i not in plan.placeholder_heads:
            q, k = tensors[pre + "attn_q.weight"], tensors[pre + "attn_k.weight"]
            if fam.permute_qk:
                q, k = unpermute(q, plan.n_head[i]), unpermute(k, plan.n_head_kv[i])
            for p, data in zip(block.head_projections, (q, k, tensors[pre + "attn_v.weight"])):
                put(p.weight, data)
            put(block.out_projection.weight, tensors[pre + "attn_output.weight"])
            put(getattr(layers[i], fam.attn_norm).weight, tensors[pre + "attn_norm.weight"])
        put(getattr(layers[i], fam.ffn_norm).weight, tensors[pre + "ffn_norm.weight"])
        if i not in plan.placeholder_mlps:
            put(block.ffn_in_extra[0].weight, tensors[pre + "ffn_gate.weight"])
            put(block.ffn_in.weight, tensors[pre + "ffn_up.weight"])
            put(block.ffn_out.weight, tensors[pre + "ffn_down.weight"])
    put(copy_.get_submodule(fam.final_norm).weight, tensors["output_norm.weight"])
    if not plan.tied:
        put(copy_.get_output_embeddings().weight, tensors["output.weight"])
    return copy_.eval()


def check_gguf_file(path: Path, model: nn.Module, gguf_type: str, plan: GgufPlan) -> dict:
    """Read ``path`` back into a copy of ``model`` and compare logits on random inputs of
    export's check shapes: ``{"max_abs_diff"}`` (the file against the model with its weights
    rounded to ``gguf_type``: 0 up to float error when the layout is right) and
    ``{"type_diff"}`` (the file against the model itself: what the type's rounding costs; equal
    to the first for f32), and ``"scale"`` (the largest |logit|)."""
    from headcount.core.export import CHECK_SHAPES, random_inputs, torch_output

    gguf = _require_gguf()
    stated = read_plan(path)
    want = {"arch": plan.arch, "n_head": plan.n_head, "n_head_kv": plan.n_head_kv, "n_ff": plan.n_ff}
    if stated != want:
        raise HeadcountError(f"the written GGUF file states {stated}, the model needs {want}")
    tensors = read_tensors(path)
    expected = gguf_tensors(model, plan)
    if set(tensors) != set(expected) or any(tensors[k].shape != expected[k].shape for k in expected):
        raise HeadcountError("the written GGUF file's tensors differ in names or shapes from the model's")
    from_file = _load_into(model, tensors, plan)
    reference = model if gguf_type == "f32" else _load_into(
        model, {k: rounded(gguf, v, gguf_type) for k, v in expected.items()}, plan)
    worst = type_diff = scale = 0.0
    for k, shape in enumerate(CHECK_SHAPES):
        inputs = random_inputs(model, *shape, seed=k + 1)
        got, ref = torch_output(from_file, inputs), torch_output(reference, inputs)
        mine = ref if reference is model else torch_output(model, inputs)
        worst = max(worst, float(np.abs(got - ref).max()))
        type_diff = max(type_diff, float(np.abs(got - mine).max()))
        scale = max(scale, float(np.abs(mine).max()))
    return {"max_abs_diff": worst, "type_diff": type_diff, "scale": scale}


def export_gguf(model: nn.Module, path: Path, gguf_type: str = GgufSettings.type, tolerance: float = 1e-4,
                tokenizer=None, source: Path | None = None, marker: str | None = None) -> tuple[GgufPlan, dict]:
    """Write and check: ``(plan, check)``; a read-back difference above ``tolerance`` raises
    (the caller has written to a temporary path: nothing replaces ``--out`` then).

    >>> plan, check = export_gguf(load_for_export("pruned/"), Path("m.gguf"))     # doctest: +SKIP
    """
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance > 0):
        raise HeadcountError(f"--tolerance must be a positive number (got {tolerance})")
    model = model.float().cpu().eval()
    plan = write_gguf(model, path, gguf_type, tokenizer=tokenizer, source=source, marker=marker)
    check = check_gguf_file(path, model, gguf_type, plan)
    if not check["max_abs_diff"] <= tolerance:
        raise HeadcountError(f"the GGUF file read back differs from PyTorch by {check['max_abs_diff']:.3g} > "
                             f"tolerance {tolerance:g}; nothing written")
    return plan, check


def gguf_marker(path: Path) -> dict | None:
    """The headcount marker of a GGUF file (None: not GGUF, or not written by headcount)."""
    try:
        gguf = _require_gguf()
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                return None
        field = gguf.GGUFReader(str(path)).fields.get(GGUF_MARKER)
        data = json.loads(field.contents()) if field is not None else None
    except Exception:
        return None
    return data if isinstance(data, dict) and data.get("command") == "export" else None


__all__ = ["GGUF_TYPES", "GgufSettings", "GgufPlan", "gguf_plan", "gguf_tensors", "write_gguf", "read_plan",
           "read_tensors", "check_gguf_file", "export_gguf", "gguf_marker", "permute", "unpermute"]
