"""A masked-LM head fitted on a frozen encoder, and the MLM model and evaluation built on it.

[`fit_mlm_head`][headcount.data.mlm_head.fit_mlm_head]: for a checkpoint without masked-LM weights (the offline default is a
sentence encoder). The decoder is tied to the input embeddings when the checkpoint's config ties
them (``tie_word_embeddings``, the usual case) or when it stores no decoder of its own; a
checkpoint's own untied decoder is kept (and, fitted, trained as part of the head). Only the head's
own parameters (transform, layer norm, output bias) are trained, on the encoder's hidden states
``[n_masked, hidden]`` at masked positions, replayed to the head
([`headcount.data.heads.replaying_encoder`][headcount.data.heads.replaying_encoder]). Fitting starts from square head linears =
identity and the output bias = log unigram frequency of the targets (``loss_before`` is that
start), then runs AdamW for a few hundred steps over batches of masked positions. The fitted
parameters are cached on disk (``$HEADCOUNT_CACHE/mlm-heads``).

[`mlm_model`][headcount.data.mlm_head.mlm_model] builds the masked-LM model of a checkpoint (its own head or a fitted one,
optionally over a fine-tuned encoder), [`evaluate_mlm`][headcount.data.mlm_head.evaluate_mlm] its loss and accuracy.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from headcount.core.model_spec import resolve
from headcount.core.models import load_model, load_tokenizer
from headcount.data.evaluation import MLM_METRIC, evaluate_batches
from headcount.data.heads import _trainable, replaying_encoder
from headcount.data.tasks.base import subset_indices
from headcount.data.tasks.batching import tokenizer_fingerprint
from headcount.data.tasks.mlm import IGNORE, MASK_PROBABILITY, mlm_batches, mlm_texts
from headcount.runtime.paths import cache_root, sha256_text
from headcount.runtime.atomic import atomic_path, atomic_write_json
from headcount.runtime.device import resolve_device
from headcount.runtime.errors import HeadcountError

#: defaults of [`fit_mlm_head`][headcount.data.mlm_head.fit_mlm_head], declared once: [`mlm_model`][headcount.data.mlm_head.mlm_model], ``load_for`` (``headcount
#: score/prune --objective mlm``) and the transfer study's ``mlm.head_steps`` / ``head_max_texts``
#: read them from here
MLM_HEAD_STEPS = 300
MLM_HEAD_MAX_TEXTS = 2000


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
        texts: corpus (e.g. [`headcount.data.tasks.mlm_texts`][headcount.data.tasks.mlm_texts]); at most ``max_texts`` are used
            (seeded subset), ``eval_fraction`` of them held out for the reported loss and accuracy.
        steps / lr / head_batch_size: AdamW steps over batches of masked positions.
        batch_size / max_length / probability / seed: as [`headcount.data.tasks.mlm_batches`][headcount.data.tasks.mlm_batches].
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
        corpus: texts for fitting a head (see [`headcount.data.tasks.mlm_texts`][headcount.data.tasks.mlm_texts]); a seeded
            subset of ``max_texts`` of them.
        steps / max_texts / seed: passed to [`fit_mlm_head`][headcount.data.mlm_head.fit_mlm_head].
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
    [`headcount.data.evaluation.masked_positions_only`][headcount.data.evaluation.masked_positions_only]).

    Args:
        model: a masked-LM model.
        batches: from [`headcount.data.tasks.mlm_batches`][headcount.data.tasks.mlm_batches].
        mask: optional [`Mask`][headcount.core.masks.Mask] applied as gates.

    Returns:
        ``{"score": accuracy, "accuracy", "loss", "n_masked"}`` (as ``evaluate_batches``).

    >>> evaluate_mlm(model, batches)["score"]       # doctest: +SKIP
    0.41
    """
    return evaluate_batches(model, batches, MLM_METRIC, mask=mask)
