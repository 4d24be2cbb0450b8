"""Loading models and tokenizers from a model spec (hub id, local checkpoint, pruned checkpoint,
GGUF file, ``offline``, ``offline-decoder``): the spec is resolved and its files checked by
[`model_spec`][headcount.core.model_spec]; what the loaded weights miss is checked here
([`check_loading`][headcount.core.models.check_loading]).
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from headcount.core.arch import get_adapter, is_decoder
from headcount.core.checkpoint_check import check_finite_config
from headcount.core.gguf import dequantised, gguf_source, is_gguf
from headcount.core.layout_check import check_config_layout
from headcount.core.model_spec import model_source, resolve
from headcount.core.offline_models import OFFLINE
from headcount.core.surgery import is_pruned_checkpoint, load_pruned
from headcount.runtime.errors import HeadcountError

#: what a model is loaded for -> the transformers auto class
HEADS = {
    "classification": "AutoModelForSequenceClassification",
    "regression": "AutoModelForSequenceClassification",
    "mlm": "AutoModelForMaskedLM",
    "base": "AutoModel",
    "lm": "AutoModelForCausalLM",
}


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
        return _load_pruned_checkpoint(spec, path, auto, config_kwargs)
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


def _load_pruned_checkpoint(spec, path: str, auto, config_kwargs: dict):
    """A pruned checkpoint (its surgery replayed) as the auto class ``auto`` (the head asked for);
    ``config_kwargs`` (``num_labels``, ``problem_type``) size a task head the checkpoint lacks."""
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
    classifier = type(model).__name__.endswith("ForSequenceClassification")
    if classifier and getattr(model.config, "pad_token_id", 0) is None and is_decoder(model):
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
