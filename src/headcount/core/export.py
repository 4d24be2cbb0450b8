"""Pruned (and unpruned) models that run without headcount: ONNX files and plain transformers checkpoints.

A pruned checkpoint ([`headcount.core.surgery.save_pruned`][headcount.core.surgery.save_pruned]) loads only through
[`headcount.core.surgery.load_pruned`][headcount.core.surgery.load_pruned]: its layers have fewer heads and neurons than its config
says, so a plain ``from_pretrained`` refuses it (size mismatch). Two ways out:

- [`export_onnx`][headcount.core.export.export_onnx]: the model, task head included, traced to ONNX (the legacy TorchScript
  exporter, eager attention), with dynamic batch and sequence axes, then run by onnxruntime on
  random inputs of two shapes and compared with PyTorch; a difference above the tolerance is an
  error and nothing is written.
- [`export_hf`][headcount.core.export.export_hf]: a plain transformers checkpoint, *when a plain config can describe the pruned
  model*. What can: the same number of feed-forward neurons kept in every layer (the config's
  intermediate size), and the same number of heads kept in every layer only where the
  architecture's config takes the head size explicitly (``attention_head_size``); a config that
  derives the head size as hidden / heads (BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA) cannot
  describe "6 heads of 64 with hidden 768". A whole MLP removed (its output bias is gone),
  heads removed unevenly, a layer with no head left, or gates left on shared layers cannot be
  described either. Whether a config can is decided by building the plain model from it and
  comparing every tensor's name and shape with the pruned model's; [`native_config`][headcount.core.export.native_config] says
  why not.
"""

from __future__ import annotations

import copy
import inspect
import io
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from headcount.core.arch import get_adapter
from headcount.core.gates import layout
from headcount.runtime.bounds import Bound
from headcount.runtime.errors import HeadcountError

# transformers, .models and .surgery (which load transformers, 1.2 s) are imported where used:
# the command line reads ExportSettings to declare its options and starts without them.

#: export formats: ``onnx`` (one file), ``hf`` (a plain transformers checkpoint directory) and
#: ``gguf`` (one file for llama.cpp: ``headcount.core.export_gguf``)
FORMATS = ("onnx", "hf", "gguf")
#: the opsets the legacy exporter writes that headcount accepts (>= 17: LayerNorm is one op)
OPSET_RANGE = (17, 20)


@dataclass(frozen=True)
class ExportSettings:
    """How ``headcount export`` writes and checks (the command's defaults are read from here)."""

    format: str = "onnx"
    opset: int = 17
    tolerance: float = 1e-4  # max |onnxruntime - PyTorch| accepted on fp32 outputs


DEFAULT_OPSET = ExportSettings.opset
DEFAULT_TOLERANCE = ExportSettings.tolerance
#: max |onnxruntime - PyTorch| an export accepts
TOLERANCE = Bound(0, 1, low_open=True)
#: the two input shapes (batch, sequence) of the check: different, so that fixed axes would fail
CHECK_SHAPES = ((2, 16), (3, 9))
#: the key of the ONNX metadata entry that marks a file headcount wrote (command, identity)
ONNX_MARKER = "headcount"

INSTALL_HINT = "headcount export needs onnx and onnxruntime: pip install 'headcount[export]'"


def require_onnx():
    """``(onnx, onnxruntime)``, or the one-line error naming the extra that installs them."""
    try:  # lazy: optional dependencies (the export extra)
        import onnx
        import onnxruntime
    except ImportError:
        raise HeadcountError(INSTALL_HINT) from None
    return onnx, onnxruntime


# -- loading ----------------------------------------------------------------------------------
def load_for_export(spec: str) -> nn.Module:
    """The model of ``spec`` with the head it was saved with (the class ``config.json`` names; a
    GGUF file's is a causal LM), eager attention (exportable by every architecture), eval mode.
    Pruned checkpoints are replayed; a GGUF file loads from its conversion
    ([`gguf_source`][headcount.core.gguf.gguf_source], as every loader does)."""
    # lazy: transformers, .model_spec and .surgery (which import it) cost ~0.7 s; headcount --help loads this module
    import transformers

    from headcount.core.gguf import dequantised, gguf_source, is_gguf
    from headcount.core.model_spec import resolve
    from headcount.core.surgery import is_pruned_checkpoint, load_pruned

    path = resolve(spec)
    try:
        if is_pruned_checkpoint(path):
            model = load_pruned(path)
        else:
            source, gguf = gguf_source(path)
            config = transformers.AutoConfig.from_pretrained(source, **gguf)
            names = getattr(config, "architectures", None) or []
            cls = getattr(transformers, names[0], None) if names else None
            if cls is None:  # (a GGUF file read itself names no class: it holds a causal LM)
                auto = transformers.AutoModelForCausalLM if is_gguf(path) else transformers.AutoModel
                cls = auto._model_mapping[type(config)]
            model = cls.from_pretrained(source, config=config, **gguf)
            if gguf:
                dequantised(model)
        get_adapter(model)
    except HeadcountError:
        raise
    except Exception as e:  # a config or weights the loader cannot read: the input, not a bug
        raise HeadcountError(f"cannot load model {spec!r}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    model.set_attn_implementation("eager")
    return model.eval()


# -- inputs and outputs -----------------------------------------------------------------------
def input_names(model: nn.Module) -> list[str]:
    """``input_ids``, ``attention_mask``, and ``token_type_ids`` when the model takes them and
    has more than one token type (a single type is always 0: no input needed)."""
    names = ["input_ids", "attention_mask"]
    params = inspect.signature(model.forward).parameters
    if "token_type_ids" in params and int(getattr(model.config, "type_vocab_size", 0) or 0) > 1:
        names.append("token_type_ids")
    return names


def output_name(model: nn.Module) -> str:
    """``logits`` for a model with a task head, else ``last_hidden_state``."""
    base = getattr(model, "base_model", model)
    return "last_hidden_state" if base is model else "logits"


class _Traced(nn.Module):
    """Positional inputs in [`input_names`][headcount.core.export.input_names] order -> the one output tensor."""

    def __init__(self, model: nn.Module, names: list[str]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *tensors):
        out = self.model(**dict(zip(self.names, tensors)))
        return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def random_inputs(model: nn.Module, batch: int, seq: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids ``[batch, seq]`` (int64); the last row ends in ``seq // 4`` padding positions."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1 and seq > 3:
        mask[-1, seq - seq // 4:] = 0
    out = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in input_names(model):
        out["token_type_ids"] = torch.randint(0, int(cfg.type_vocab_size), (batch, seq), generator=g)
    return out


@torch.no_grad()
def torch_output(model: nn.Module, inputs: dict) -> np.ndarray:
    return _Traced(model, list(inputs))(*inputs.values()).float().numpy()


# -- ONNX -------------------------------------------------------------------------------------
def check_opset(opset: int) -> int:
    lo, hi = OPSET_RANGE
    if not isinstance(opset, int) or not lo <= opset <= hi:
        raise HeadcountError(f"--opset must be an integer in {lo}..{hi} (got {opset})")
    return opset


def to_onnx(model: nn.Module, opset: int = DEFAULT_OPSET, metadata: dict | None = None) -> bytes:
    """The serialized ONNX model of ``model`` (CPU, fp32), batch and sequence axes dynamic.

    Inputs: [`input_names`][headcount.core.export.input_names] (int64 ``[batch, sequence]``); an input the graph does not use
    (``attention_mask`` once every head is removed) is dropped by the exporter. Output:
    [`output_name`][headcount.core.export.output_name], ``[batch, labels]``, ``[batch, sequence, vocab]`` or ``[batch, sequence, hidden]``.
    ``metadata``: string entries for the file's ``metadata_props``.
    """
    onnx, _ = require_onnx()
    check_opset(opset)
    model = model.float().cpu().eval()
    names = input_names(model)
    example = random_inputs(model, *CHECK_SHAPES[0])
    out_name = output_name(model)
    out_rank = torch_output(model, example).ndim
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[out_name] = {0: "batch", 1: "sequence"} if out_rank == 3 else {0: "batch"}
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings about python bools in the HF code: shapes are checked below
        # the wrapper in eval mode: the exporter restores the wrapper's mode afterwards, and a new
        # module is in training mode, which would switch the model's dropout on for good
        torch.onnx.export(_Traced(model, names).eval(), tuple(example[n] for n in names), buf, dynamo=False,
                          opset_version=opset, input_names=names, output_names=[out_name], dynamic_axes=axes,
                          do_constant_folding=True)
    proto = onnx.load_from_string(buf.getvalue())
    for key, value in (metadata or {}).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    return proto.SerializeToString()


def check_onnx(data: bytes, model: nn.Module, shapes=CHECK_SHAPES) -> list[dict]:
    """Run ``data`` with onnxruntime (CPU) on random inputs of each ``(batch, seq)`` shape and
    compare with PyTorch; returns ``[{"batch", "sequence", "max_abs_diff"}]``."""
    _, ort = require_onnx()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    rows = []
    for k, (batch, seq) in enumerate(shapes):
        inputs = random_inputs(model, batch, seq, seed=k + 1)
        ref = torch_output(model, inputs)
        got = session.run(None, {n: t.numpy() for n, t in inputs.items() if n in wanted})[0]
        if got.shape != ref.shape:
            raise HeadcountError(f"ONNX output has shape {list(got.shape)}, PyTorch {list(ref.shape)} "
                                 f"(batch {batch}, sequence {seq})")
        rows.append({"batch": batch, "sequence": seq, "max_abs_diff": float(np.abs(got - ref).max())})
    return rows


def export_onnx(model: nn.Module, opset: int = DEFAULT_OPSET, tolerance: float = DEFAULT_TOLERANCE,
                metadata: dict | None = None) -> tuple[bytes, list[dict]]:
    """Export and check: ``(onnx bytes, check rows)``; a difference above ``tolerance`` raises.

    >>> data, rows = export_onnx(load_for_export("pruned/"))     # doctest: +SKIP
    """
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance > 0):
        raise HeadcountError(f"--tolerance must be a positive number (got {tolerance})")
    try:
        data = to_onnx(model, opset, metadata)
    except HeadcountError:
        raise
    except Exception as e:  # protobuf's 2 GB limit, an op the exporter lacks
        raise HeadcountError(f"ONNX export failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    rows = check_onnx(data, model)
    worst = max(r["max_abs_diff"] for r in rows)
    if not worst <= tolerance:
        raise HeadcountError(f"onnxruntime and PyTorch outputs differ by {worst:.3g} > tolerance {tolerance:g}; "
                             "nothing written")
    return data, rows


def onnx_marker(path: Path) -> dict | None:
    """The headcount metadata entry of an ONNX file (None: not ONNX, or not written by headcount)."""
    onnx, _ = require_onnx()
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:
        return None
    for entry in proto.metadata_props:
        if entry.key == ONNX_MARKER:
            try:
                data = json.loads(entry.value)
            except ValueError:
                return None
            return data if isinstance(data, dict) and data.get("command") == "export" else None
    return None


# -- plain transformers checkpoints -----------------------------------------------------------
def _shapes(model: nn.Module) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _size_keys(config, value: int, reader) -> list[str]:
    """Config fields that hold ``value`` and that ``reader(config)`` reads (the adapter knows
    which field is the intermediate size; this finds its name without naming an architecture)."""
    keys = []
    for key, v in config.to_dict().items():
        if v == value and isinstance(v, int) and not isinstance(v, bool):
            probe = copy.deepcopy(config)
            setattr(probe, key, value + 1)
            try:
                if reader(probe) == value + 1:
                    keys.append(key)
            except Exception:
                pass
    return keys


def native_config(model: nn.Module):
    """A plain config that describes the pruned ``model`` exactly, or HeadcountError saying why not.

    Decided by building the plain model (on the meta device: no memory) and comparing every
    tensor name and shape with ``model``'s.
    """
    from headcount.core.surgery import (  # lazy: .surgery imports transformers (~0.7 s)
        RECORD,
        pruning_record,
    )

    record = pruning_record(model)
    config = copy.deepcopy(model.config)
    if hasattr(config, RECORD):
        delattr(config, RECORD)
    if not record:
        return config
    why = "a plain transformers config cannot describe it: "
    if record.get("gates"):
        raise HeadcountError(why + "gates stay on shared layers (masked at some depths only)")
    if record.get("removed_mlps"):
        raise HeadcountError(why + f"whole MLPs are removed (layers {record['removed_mlps']}): "
                                   "a plain layer always has its feed-forward block")
    adapter = get_adapter(model)
    n_layers, n_heads = layout(model)
    kept_heads = {n_heads - len(r) for r in record["removed_heads"]}
    if len(kept_heads) > 1:
        raise HeadcountError(why + f"layers keep different numbers of heads ({sorted(kept_heads)})")
    size = adapter.intermediate_size(config)
    kept_neurons = {size - len(r) for r in record["removed_neurons"]}
    if len(kept_neurons) > 1:
        raise HeadcountError(why + f"layers keep different numbers of feed-forward neurons ({sorted(kept_neurons)})")
    heads, neurons = kept_heads.pop(), kept_neurons.pop()
    if heads == 0:
        raise HeadcountError(why + "no layer has a head left")
    if neurons != size:
        keys = _size_keys(config, size, adapter.intermediate_size)
        if not keys:
            raise HeadcountError(why + "its config has no intermediate-size field headcount can find")
        setattr(config, keys[0], neurons)
    grid = layout(model)
    if grid.n_kv_heads is not None:
        # decoders: every layer must keep as many key/value slots (repeated K/V heads count: their
        # copies are real weights); the plain config then states both counts and the head size
        kv = {len(slots) for slots in record.get("kv_heads") or [range(grid.n_kv_heads)] * n_layers}
        if len(kv) > 1:
            raise HeadcountError(why + f"layers keep different numbers of key/value heads ({sorted(kv)})")
        n_kv = kv.pop()
        if n_kv != grid.n_kv_heads and hasattr(config, "num_key_value_heads"):
            config.num_key_value_heads = n_kv
    if heads != n_heads:
        head_dim = adapter.head_dim(model.config)
        setattr(config, "num_attention_heads", heads)
        config.attention_head_size = head_dim  # read by configs that take the head size explicitly
        if grid.n_kv_heads is not None:
            config.head_dim = head_dim  # decoders read an explicit head size where their config has one
    try:
        with torch.device("meta"):
            plain = type(model)(config)
        if callable(getattr(config, "validate", None)):
            config.validate()  # the checks save_pretrained runs (LlamaConfig: hidden % heads == 0)
    except Exception as e:
        cause = getattr(e, "__cause__", None) or e  # a strict-dataclass validator wraps the reason
        raise HeadcountError(why + f"{type(config).__name__} refuses {heads} heads "
                                   f"({str(cause).splitlines()[0] if str(cause) else type(cause).__name__})") from None
    want, got = _shapes(model), _shapes(plain)
    wrong = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    if wrong:
        k = wrong[0]
        detail = f"{k}: pruned {list(want[k]) if k in want else 'absent'}, plain {list(got[k]) if k in got else 'absent'}"
        hint = (f"{type(config).__name__} derives the head size from hidden size / heads, so it cannot describe "
                f"{heads} heads of {adapter.head_dim(model.config)}") if heads != n_heads else "shapes differ"
        raise HeadcountError(why + f"{hint} ({detail})")
    return config


def export_hf(model: nn.Module, out_dir: Path, tokenizer=None) -> tuple[nn.Module, float]:
    """Save ``model`` as a plain transformers checkpoint in ``out_dir`` (which must not exist yet:
    the caller stages it) and check that ``from_pretrained`` of its class loads it with the same
    outputs. ``config.json`` and ``tokenizer_config.json`` also carry the keys transformers 4.x
    reads (``headcount.core.export_compat``), which 5.x reads past. Returns
    ``(reloaded model, max abs difference)``."""
    config = native_config(model)
    plain = type(model)(config).eval()
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.save_pretrained(out_dir, safe_serialization=True)
    if tokenizer is not None:
        # lazy: .surgery imports transformers (~0.7 s)
        from headcount.core.surgery import save_tokenizer

        save_tokenizer(tokenizer, out_dir)  # without the padding/truncation of its last call
    # transformers 4.x reads neither 5.x's rope_parameters nor its tokenizer class name: it would
    # load the checkpoint with its default rope theta and answer wrong, without an error
    from headcount.core.export_compat import add_legacy_keys, drop_legacy_keys

    legacy = add_legacy_keys(out_dir, plain.config)
    reloaded = type(model).from_pretrained(out_dir).eval()
    rope = getattr(plain.config, "rope_parameters", None)
    if legacy and getattr(reloaded.config, "rope_parameters", None) != rope:
        # (not seen: 5.x reads rope_parameters first) the file must say what this model does
        drop_legacy_keys(out_dir, legacy)
        warnings.warn("the exported config.json has no transformers 4.x rope keys: "
                      "this transformers read them back differently", stacklevel=2)
        reloaded = type(model).from_pretrained(out_dir).eval()
    worst = 0.0
    for k, shape in enumerate(CHECK_SHAPES):
        inputs = random_inputs(model, *shape, seed=k + 1)
        worst = max(worst, float(np.abs(torch_output(reloaded, inputs) - torch_output(model, inputs)).max()))
    return reloaded, worst


__all__ = ["FORMATS", "ExportSettings", "DEFAULT_OPSET", "DEFAULT_TOLERANCE", "load_for_export", "export_onnx", "to_onnx", "check_onnx",
           "native_config", "export_hf", "onnx_marker", "input_names", "output_name", "random_inputs"]
