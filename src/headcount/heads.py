"""Output heads fitted on a frozen encoder: a task head, a masked-LM head, and the MLM model built on them.

Both fits run the frozen encoder once, keep what the head reads, and replay it to the head:

- :func:`fit_task_head`: a classifier's head (the parameters outside ``model.base_model``; a
  pooler inside the encoder stays frozen) on the encoder's output at the first position and its
  pooled output, for a number of epochs (AdamW, batches in a seeded order, dropout on in the head).
- :func:`fit_mlm_head`: for a checkpoint without masked-LM weights (the offline default is a
  sentence encoder). The decoder is tied to the input embeddings when the checkpoint's config
  ties them (``tie_word_embeddings``, the usual case) or when it stores no decoder of its own;
  a checkpoint's own untied decoder is kept (and, fitted, trained as part of the head). Only the
  head's own parameters (transform, layer norm, output bias) are trained, on the encoder's hidden states at
  masked positions. Fitting starts from square head linears = identity and the output bias = log
  unigram frequency of the targets (``loss_before`` is that start), then runs AdamW for a few
  hundred steps over batches of masked positions. The fitted parameters are cached on disk
  (``$HEADCOUNT_CACHE/mlm-heads``).

Replaying: :func:`replaying_encoder` puts a stand-in module in the encoder's place for the
duration of the fit (the model's own forward, head and loss run unchanged on the given encoder
output); no module's ``forward`` is reassigned, and every parameter gets its own
``requires_grad`` back afterwards.

:func:`mlm_model` builds the masked-LM model of a checkpoint (its own head or a fitted one,
optionally over a fine-tuned encoder), :func:`evaluate_mlm` its loss and accuracy.
"""

from __future__ import annotations

import hashlib
import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling

from .arch import get_adapter
from .atomic import atomic_path, atomic_write_json
from .device import place, resolve_device
from .errors import HeadcountError
from .evaluation import MLM_METRIC, evaluate_batches
from .models import load_model, load_tokenizer, resolve
from .tasks.base import subset_indices
from .tasks.batching import tokenizer_fingerprint
from .tasks.mlm import IGNORE, MASK_PROBABILITY, mlm_batches, mlm_texts
from .tasks.paths import cache_root, sha256_text

__all__ = ["MLM_HEAD_MAX_TEXTS", "MLM_HEAD_STEPS", "evaluate_mlm", "fit_mlm_head", "fit_task_head",
           "has_mlm_head", "mlm_model", "replaying_encoder"]

#: defaults of :func:`fit_mlm_head`, declared once: :func:`mlm_model`, ``load_for`` (``headcount
#: score/prune --objective mlm``) and the transfer study's ``mlm.head_steps`` / ``head_max_texts``
#: read them from here
MLM_HEAD_STEPS = 300
MLM_HEAD_MAX_TEXTS = 2000


# =============================================================================================
# replaying cached encoder outputs to a head
# =============================================================================================
class _Replay(nn.Module):
    """Stands in for a model's encoder: ``forward`` returns :attr:`output` (set by the caller).

    Other attributes are read from the real encoder (some heads read e.g. its embeddings), which
    is not registered as a submodule: its parameters stay out of the model while it stands aside.
    """

    def __init__(self, encoder: nn.Module):
        super().__init__()
        object.__setattr__(self, "_encoder", encoder)
        self.output = None

    def forward(self, *args, **kwargs):
        if self.output is None:
            raise HeadcountError("no encoder output to replay")
        return self.output

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            encoder = self.__dict__.get("_encoder")
            if encoder is None:
                raise
            return getattr(encoder, name)


@contextmanager
def replaying_encoder(model: nn.Module):
    """Inside the block, the model's encoder is a stand-in that returns ``stand_in.output``.

    The encoder module (``model.base_model``) is put back afterwards, unchanged: only the
    attribute of ``model`` that holds it is swapped (``model.base_model_prefix``).

    >>> with replaying_encoder(model) as stand_in:          # doctest: +SKIP
    ...     stand_in.output = BaseModelOutput(last_hidden_state=hidden)   # [batch, seq, hidden]
    ...     loss = model(input_ids=ids, labels=labels).loss
    """
    prefix = getattr(model, "base_model_prefix", "")
    encoder = getattr(model, prefix, None) if prefix else None
    if not isinstance(encoder, nn.Module) or encoder is model:
        raise HeadcountError("the model has no encoder below its head (no base_model_prefix module)")
    stand_in = _Replay(encoder)
    setattr(model, prefix, stand_in)
    try:
        yield stand_in
    finally:
        setattr(model, prefix, encoder)


@contextmanager
def _trainable(model: nn.Module, params):
    """Only ``params`` require gradients inside the block; every parameter's own flag after it."""
    own = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in own:
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        yield
    finally:
        for p, flag in own:
            p.requires_grad_(flag)


# =============================================================================================
# a task head on a frozen encoder
# =============================================================================================
def fit_task_head(model, batches, *, lr: float, epochs: float, weight_decay: float, seed: int = 0,
                  progress=None, device=None) -> dict:
    """Train only a classifier's task head (the parameters outside ``model.base_model``) on a frozen encoder.

    The encoder runs once over ``batches`` (no gradient); its outputs at the first position
    and its pooled output, all a sequence-classification head reads, are kept and replayed to the
    head for every epoch (AdamW, batches in a seeded random order, dropout on in the head).

    Args:
        model: a sequence-classification model (its encoder is left unchanged).
        batches: task batches with ``labels`` (``headcount.tasks.make_batches``).
        lr / epochs / weight_decay: AdamW settings; a fractional epoch count runs that share of
            the last epoch's batches.
        seed: order of the batches.
        progress: called with one line per epoch.
        device: where to train (:func:`headcount.device.place`: the model is moved there; None:
            ``$HEADCOUNT_DEVICE`` when set, else where the model is).

    Returns:
        ``{"steps", "train_loss", "trainable_params"}``; the model is left in eval mode with
        each parameter's ``requires_grad`` as it was.

    >>> fit_task_head(model, batches, lr=1e-3, epochs=10, weight_decay=0.0)["steps"]      # doctest: +SKIP
    250
    """
    base = model.base_model
    device = place(model, device)  # the encoder pass and the head's training both run there
    in_base = {id(p) for p in base.parameters()}
    head = [p for p in model.parameters() if id(p) not in in_base]
    if not head:
        raise HeadcountError("the model has no task head outside its encoder")
    # BERT-style heads read the first position and the pooled output only: cache [batch, 1, hidden];
    # a head that pools every position (the adapter says) needs [batch, seq, hidden] and the mask.
    all_positions = get_adapter(model).task_head_reads_all_positions(model)
    cached = []
    model.eval()
    with torch.no_grad():
        for b in batches:
            inputs = {k: v.to(device) for k, v in b.items() if k != "labels"}
            out = base(**inputs)
            seq = out[0] if all_positions else out[0][:, :1]
            pooled = getattr(out, "pooler_output", None)  # [batch, hidden] or None
            replay = {"input_ids": inputs["input_ids"] if all_positions else inputs["input_ids"][:, :1]}
            if all_positions and "attention_mask" in inputs:
                replay["attention_mask"] = inputs["attention_mask"]
            cached.append((seq.detach().clone(), None if pooled is None else pooled.detach().clone(),
                           b["labels"].to(device), replay))
    rng = np.random.default_rng(seed)
    n_steps = int(math.ceil(epochs * len(cached)))
    losses, step = [], 0
    try:
        with _trainable(model, head):
            opt = torch.optim.AdamW(head, lr=lr, weight_decay=weight_decay)
            model.train()
            with replaying_encoder(model) as stand_in:
                while step < n_steps:
                    for i in rng.permutation(len(cached)):
                        if step >= n_steps:
                            break
                        seq, pooled, labels, replay = cached[i]
                        stand_in.output = BaseModelOutputWithPooling(last_hidden_state=seq, pooler_output=pooled)
                        loss = model(**replay, labels=labels).loss
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        opt.step()
                        losses.append(float(loss.detach()))
                        step += 1
                    if progress:
                        progress(f"epoch {step / len(cached):.1f}: loss {np.mean(losses[-len(cached):]):.4f}")
    finally:
        model.eval()
    return {"steps": step, "train_loss": float(np.mean(losses[-len(cached):])) if losses else float("nan"),
            "trainable_params": int(sum(p.numel() for p in head))}


# =============================================================================================
# a masked-LM head on a frozen encoder
# =============================================================================================
def _head_parameters(model) -> dict:
    """The masked-LM head's own parameters: outside the base model, not tied to it."""
    prefix = model.base_model_prefix + "."
    base_ptrs = {p.data_ptr() for p in model.base_model.parameters()}
    return {n: p for n, p in model.named_parameters()
            if not n.startswith(prefix) and p.data_ptr() not in base_ptrs}


def _checkpoint_keys(path: str) -> list[str] | None:
    """Tensor names stored in a checkpoint folder (``None`` when they cannot be listed)."""
    d = Path(path)
    if not d.is_dir():
        return None
    keys: list[str] = []
    index = d / "model.safetensors.index.json"
    if index.is_file():
        return list(json.loads(index.read_text()).get("weight_map", {}))
    files = sorted(d.glob("*.safetensors"))
    if files:
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                keys.extend(st.keys())
        return keys
    if (d / "pytorch_model.bin").is_file():
        return list(torch.load(d / "pytorch_model.bin", map_location="meta", weights_only=True, mmap=True))
    return None


def has_mlm_head(model_spec: str, model) -> bool:
    """Whether the checkpoint stores masked-LM head weights (else they were newly created)."""
    keys = _checkpoint_keys(resolve(model_spec))
    if keys is None:  # a hub id not cached locally: trust the config's architectures
        return any("MaskedLM" in a or "ForPreTraining" in a for a in (model.config.architectures or []))
    tops = {n.split(".")[0] for n in _head_parameters(model)}
    return any(k.split(".")[0] in tops for k in keys)


def keeps_own_decoder(model_spec: str, model) -> bool:
    """Whether the masked-LM decoder of ``model`` stays untied from the input embeddings: the
    checkpoint's config unties them (``tie_word_embeddings: false``) and the checkpoint stores
    decoder weights (else the loaded decoder is a random matrix, and tying it is the usual head).
    A hub id not cached locally cannot be listed: its config decides."""
    if getattr(model.config, "tie_word_embeddings", True):
        return False
    out = model.get_output_embeddings()
    if out is None:
        return False
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is out.weight]
    keys = _checkpoint_keys(resolve(model_spec))
    if keys is None:
        return True
    return any(k == n or k.endswith("." + n) for k in keys for n in names)


def _model_fingerprint(model_spec: str) -> str:
    path = resolve(model_spec)
    d = Path(path)
    h = hashlib.sha256(str(d.resolve() if d.is_dir() else path).encode())
    if d.is_dir():
        for f in sorted(d.iterdir()):
            if f.suffix in (".safetensors", ".bin", ".json") and f.is_file():
                st = f.stat()
                h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _features(model, batches, device) -> tuple:
    """Hidden states at masked positions ``[n_masked, hidden]`` and their targets ``[n_masked]``."""
    feats, targets = [], []
    model.eval()
    with torch.no_grad():
        for b in batches:
            inputs = {k: v.to(device) for k, v in b.items() if k != "labels"}
            h = model.base_model(**inputs)[0]                       # [batch, seq, hidden]
            where = b["labels"].to(device) != IGNORE
            feats.append(h[where].float().cpu())
            targets.append(b["labels"][b["labels"] != IGNORE])
    return torch.cat(feats), torch.cat(targets)


def _init_head(model, head: dict, targets) -> None:
    """Start where fitting is short: square linears of the head = identity (the hidden state
    passes unchanged), the output bias = log unigram frequency of the training targets."""
    vocab = model.get_input_embeddings().weight.shape[0]
    params = {id(p) for p in head.values()}
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and id(module.weight) in params and \
                    module.weight.shape[0] == module.weight.shape[1]:
                module.weight.copy_(torch.eye(module.weight.shape[0]))
                if module.bias is not None and id(module.bias) in params:
                    module.bias.zero_()
        counts = torch.bincount(targets, minlength=vocab).double() + 0.5
        prior = (counts / counts.sum()).log().float()
        for p in head.values():
            if p.ndim == 1 and p.shape[0] == vocab:
                p.copy_(prior.to(p.device))


def _evaluate(model, stand_in, feats, targets, device, chunk: int = 1024) -> tuple[float, float]:
    """Held-out loss and accuracy of the head on masked-position features (packed as one sequence)."""
    total, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(targets), chunk):
            h, y = feats[i:i + chunk].to(device), targets[i:i + chunk].to(device)
            stand_in.output = BaseModelOutput(last_hidden_state=h[None])  # [1, n, hidden]
            out = model(input_ids=y[None], labels=y[None])
            total += float(out.loss) * len(y)
            correct += int((out.logits[0].argmax(-1) == y).sum())
            n += len(y)
    return total / n, correct / n


def fit_mlm_head(model_spec: str, texts: Sequence[str], *, steps: int = MLM_HEAD_STEPS, lr: float = 3e-3,
                 head_batch_size: int = 128, batch_size: int = 32, max_length: int = 128,
                 max_texts: int = MLM_HEAD_MAX_TEXTS, eval_fraction: float = 0.1, seed: int = 0,
                 probability: float = MASK_PROBABILITY, force: bool = False, cache_dir=None, device=None,
                 tokenizer=None):
    """A masked-LM model for ``model_spec``; fits its head first when the checkpoint has none.

    Args:
        model_spec: hub id, checkpoint folder, or ``offline``.
        texts: corpus (e.g. :func:`headcount.tasks.mlm_texts`); at most ``max_texts`` are used
            (seeded subset), ``eval_fraction`` of them held out for the reported loss and accuracy.
        steps / lr / head_batch_size: AdamW steps over batches of masked positions.
        batch_size / max_length / probability / seed: as :func:`headcount.tasks.mlm_batches`.
        force: fit even when the checkpoint has a head, and ignore the cache.
        cache_dir: where fitted heads are kept (default ``$HEADCOUNT_CACHE/mlm-heads``).
        device: torch device for fitting (default: cuda when available).
        tokenizer: a tokenizer (default: the checkpoint's).

    Returns:
        ``(model, report)``: the masked-LM model in eval mode, on the CPU; the report has
        ``fitted`` (True when the head was fitted, now or from the cache), ``cached``,
        ``loss`` and ``accuracy`` (held-out masked tokens), ``loss_before`` /
        ``accuracy_before`` (the new head before fitting), and ``message`` (one line to show).

    >>> model, report = fit_mlm_head("offline", mlm_texts("offline/corpus"))   # doctest: +SKIP
    >>> report["fitted"], report["loss"] < report["loss_before"]               # doctest: +SKIP
    (True, True)
    """
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if len(texts) < 2:
        raise HeadcountError("fitting a masked-LM head needs at least two texts")
    idx = subset_indices(len(texts), max_texts, seed)
    texts = texts if idx is None else [texts[i] for i in idx]
    perm = np.random.default_rng(seed).permutation(len(texts))
    n_eval = min(max(1, int(round(eval_fraction * len(texts)))), len(texts) - 1)
    eval_texts = [texts[i] for i in sorted(perm[:n_eval])]
    train_texts = [texts[i] for i in sorted(perm[n_eval:])]

    model = load_model(model_spec, head="mlm")
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_spec)
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out_emb is None or in_emb is None:
        raise HeadcountError(f"model {model_spec!r} has no masked-LM decoder to tie to its input embeddings")
    own_decoder = keeps_own_decoder(model_spec, model)
    if not own_decoder and out_emb.weight is not in_emb.weight:
        out_emb.weight = in_emb.weight  # the decoder is the input embedding matrix
    fitted = force or not has_mlm_head(model_spec, model)
    device = resolve_device(device)  # the device rule: argument, $HEADCOUNT_DEVICE, else auto
    settings = {"steps": steps, "lr": lr, "head_batch_size": head_batch_size, "batch_size": batch_size,
                "max_length": max_length, "max_texts": max_texts, "eval_fraction": eval_fraction,
                "seed": seed, "probability": probability}
    head = _head_parameters(model)
    key = hashlib.sha256(json.dumps([_model_fingerprint(model_spec), tokenizer_fingerprint(tokenizer),
                                     sha256_text(*texts), settings, sorted(head)], sort_keys=True).encode()).hexdigest()[:32]
    folder = (Path(cache_dir) if cache_dir else cache_root() / "mlm-heads") / key
    if fitted and not force and (folder / "head.safetensors").is_file() and (folder / "report.json").is_file():
        state = load_file(str(folder / "head.safetensors"))
        with torch.no_grad():
            for n, p in head.items():
                p.copy_(state[n])
        report = json.loads((folder / "report.json").read_text())
        report["cached"] = True
        return model.eval(), report

    eval_batches = mlm_batches(eval_texts, tokenizer, max_length=max_length, batch_size=batch_size,
                               seed=seed + 1, probability=probability)
    model.to(device)
    report = {"model": model_spec, "fitted": fitted, "cached": False, "n_texts_eval": len(eval_texts),
              "decoder": "checkpoint" if own_decoder else "tied"}
    with _trainable(model, list(head.values()) if fitted else []):
        ev_x, ev_y = _features(model, eval_batches, device)
        if fitted:  # the frozen encoder runs once; the head trains on its outputs
            tr_x, tr_y = _features(model, mlm_batches(train_texts, tokenizer, max_length=max_length,
                                                      batch_size=batch_size, seed=seed,
                                                      probability=probability), device)
        report["n_masked_eval"] = int(len(ev_y))
        with replaying_encoder(model) as stand_in:
            if fitted:
                _init_head(model, head, tr_y)
            loss0, acc0 = _evaluate(model, stand_in, ev_x, ev_y, device)
            if fitted:
                opt = torch.optim.AdamW(list(head.values()), lr=lr, weight_decay=0.0)
                gen = torch.Generator().manual_seed(seed)
                model.train()
                running = []
                for _ in range(steps):
                    pick = torch.randint(len(tr_y), (min(head_batch_size, len(tr_y)),), generator=gen)
                    stand_in.output = BaseModelOutput(last_hidden_state=tr_x[pick].to(device)[None])  # [1, n, hidden]
                    y = tr_y[pick].to(device)[None]
                    loss = model(input_ids=y, labels=y).loss
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    running.append(float(loss.detach()))
                model.eval()
                loss1, acc1 = _evaluate(model, stand_in, ev_x, ev_y, device)
                report.update(loss_before=loss0, accuracy_before=acc0, loss=loss1, accuracy=acc1,
                              train_loss=float(np.mean(running[-20:])) if running else loss0,
                              steps=steps, n_texts_train=len(train_texts), n_masked_train=int(len(tr_y)))
            else:
                report.update(loss=loss0, accuracy=acc0)
    model.to("cpu").eval()
    if fitted:
        tying = ("the checkpoint's own untied decoder" if own_decoder else "decoder tied to the input embeddings")
        report["message"] = (f"masked-LM head fitted on the frozen encoder ({tying}): "
                             f"loss {report['loss_before']:.3f} -> {report['loss']:.3f}, accuracy "
                             f"{report['accuracy']:.1%} on {report['n_masked_eval']} held-out masked tokens")
        report["settings"] = settings
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with atomic_path(folder / "head.safetensors") as tmp:
                save_file({n: p.detach().contiguous().cpu() for n, p in head.items()}, str(tmp))
            atomic_write_json(folder / "report.json", report)
            report["cache"] = str(folder)
        except OSError:
            pass  # a read-only cache only costs time
    else:
        report["message"] = (f"masked-LM head from the checkpoint: loss {report['loss']:.3f}, accuracy "
                             f"{report['accuracy']:.1%} on {report['n_masked_eval']} held-out masked tokens")
    return model, report


# =============================================================================================
# the masked-LM model of a checkpoint, and its quality
# =============================================================================================
def mlm_model(model_spec: str, corpus: str, *, steps: int = MLM_HEAD_STEPS, max_texts: int = MLM_HEAD_MAX_TEXTS,
              seed: int = 0, after: Literal["pretrained", "refit"] = "pretrained", encoder: str | None = None):
    """A masked-LM model: the checkpoint's MLM head (or one fitted on its frozen encoder), optionally on another encoder.

    Args:
        model_spec: the pre-trained model (hub id, directory, ``offline``).
        corpus: texts for fitting a head (see :func:`headcount.tasks.mlm_texts`); a seeded
            subset of ``max_texts`` of them.
        steps / max_texts / seed: passed to :func:`fit_mlm_head`.
        after: with ``encoder``: load its weights under the pre-trained head (``pretrained``) or
            fit a head on it (``refit``).
        encoder: a fine-tuned checkpoint of the same model.

    Returns:
        ``(model, tokenizer, info)``; ``info["mlm_head"]`` is the fit report.

    >>> model, tok, info = mlm_model("offline", "offline/corpus")   # doctest: +SKIP
    """
    if after not in ("pretrained", "refit"):
        raise HeadcountError(f"unknown MLM head choice {after!r}; use 'pretrained' or 'refit'")
    texts = mlm_texts(corpus, max_examples=int(max_texts), seed=int(seed))
    fit = dict(steps=int(steps), max_texts=int(max_texts), seed=int(seed))
    tokenizer = load_tokenizer(model_spec)
    if encoder is not None and after == "refit":
        model, report = fit_mlm_head(str(encoder), texts, tokenizer=tokenizer, **fit)
        return model, tokenizer, {"mlm_head": report, "encoder": str(encoder), "after": "refit"}
    model, report = fit_mlm_head(model_spec, texts, tokenizer=tokenizer, **fit)
    info = {"mlm_head": report}
    if encoder is not None:
        tuned = load_model(str(encoder), head="base")
        missing, unexpected = model.base_model.load_state_dict(tuned.state_dict(), strict=False)
        if missing:
            raise HeadcountError(f"{encoder} lacks encoder weights of {model_spec}: {', '.join(missing[:3])}")
        info.update(encoder=str(encoder), after="pretrained", ignored=sorted(unexpected))
    return model.eval(), tokenizer, info


def evaluate_mlm(model, batches, mask=None) -> dict:
    """Masked-LM loss and accuracy over masked tokens (decoding only those; see
    :func:`headcount.evaluation.masked_positions_only`).

    Args:
        model: a masked-LM model.
        batches: from :func:`headcount.tasks.mlm_batches`.
        mask: optional :class:`~headcount.masks.Mask` applied as gates.

    Returns:
        ``{"score": accuracy, "accuracy", "loss", "n_masked"}`` (as ``evaluate_batches``).

    >>> evaluate_mlm(model, batches)["score"]       # doctest: +SKIP
    0.41
    """
    return evaluate_batches(model, batches, MLM_METRIC, mask=mask)
