"""The masked-LM objective: a corpus, reproducible masking, and a head for checkpoints without one.

Masking (as the original pre-training data script): in each sequence, ``max(1, round(0.15 * n))``
of its ``n`` ordinary tokens (not special, not padding) are chosen; of those, 80% become the
mask token, 10% a random ordinary token, 10% stay; ``labels`` hold the original id there and
``-100`` elsewhere. Everything is drawn from one ``torch.Generator`` seeded with ``seed``, so the
same texts, tokenizer and seed give the same batches.

A checkpoint without masked-LM weights (the offline default is a sentence encoder) gets a head
fitted on the frozen encoder: the decoder is tied to the input embeddings, only the head's own
parameters (transform, layer norm, output bias) are trained, on the encoder's hidden states at
masked positions (computed once). Fitting starts from square head linears = identity and the
output bias = log unigram frequency of the targets (``loss_before`` is that start), then runs
AdamW for a few hundred steps over batches of masked positions. The fitted parameters are
cached on disk (``$HEADCOUNT_CACHE/mlm-heads``).
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import HeadcountError
from ..io import atomic_path, atomic_write_json
from .base import subset_indices
from .batching import batch_order, pad_batch, tokenize, tokenizer_fingerprint
from .paths import cache_root, sha256_text
from .tables import read_text

IGNORE = -100


# --------------------------------------------------------------------------- corpus
def mlm_texts(source: str, max_examples: int | None = None, seed: int = 0) -> list[str]:
    """Texts for the masked-LM objective.

    Args:
        source: ``offline/corpus`` (train-split texts of all offline data), a task name or task
            YAML (the texts of its train split; both sentences of a pair), a ``.txt`` file (one
            text per non-empty line), or a ``datasets`` id ``path[:config][@split]`` read from its
            ``text`` column (e.g. ``Salesforce/wikitext:wikitext-2-raw-v1``; needs a network).
        max_examples: keep a seeded random subset of this many texts (in corpus order).
        seed: seed of that subset.

    >>> texts = mlm_texts("offline/corpus", max_examples=1000)   # doctest: +SKIP
    """
    texts = _corpus(str(source))
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise HeadcountError(f"the masked-LM corpus {source!r} has no text")
    idx = subset_indices(len(texts), max_examples, seed)
    return texts if idx is None else [texts[i] for i in idx]


def _corpus(source: str) -> list[str]:
    from .registry import get_task, list_tasks

    if source == "offline/corpus":
        from .offline import offline_corpus

        return offline_corpus()
    p = Path(source).expanduser()
    if source in list_tasks() or p.suffix.lower() in (".yaml", ".yml"):
        task = get_task(source)
        data = task.load(task.train_split)
        return [t for ex in data.texts for t in ex]
    if p.suffix.lower() == ".txt" or p.is_file():
        return [line.strip() for line in read_text(p).splitlines() if line.strip()]
    if p.suffix or source.startswith((".", "/", "~")):
        raise HeadcountError(f"corpus file not found: {source}")
    return _hub_texts(source)


def _hub_texts(spec: str) -> list[str]:
    path, _, split = spec.partition("@")
    path, _, config = path.partition(":")
    if path.count("/") > 1 or not path:
        raise HeadcountError(f"unknown corpus {spec!r}: use offline/corpus, a task name, a .txt file, "
                             "or a datasets id like Salesforce/wikitext:wikitext-2-raw-v1")
    try:
        import datasets

        ds = datasets.load_dataset(path, config or None, split=split or "train")
    except Exception as e:
        raise HeadcountError(f"cannot load corpus {spec!r} through `datasets` ({type(e).__name__}); "
                             "without a network use offline/corpus, a task, or a .txt file") from None
    column = "text" if "text" in ds.column_names else next(
        (c for c, f in ds.features.items() if getattr(f, "dtype", None) == "string"), None)
    if column is None:
        raise HeadcountError(f"corpus {spec!r} has no text column")
    return [t for t in ds[column] if isinstance(t, str)]


# --------------------------------------------------------------------------- masking
def _ordinary_ids(tokenizer) -> np.ndarray:
    special = set(tokenizer.all_special_ids)
    return np.asarray([i for i in range(len(tokenizer)) if i not in special], dtype=np.int64)


def mask_tokens(input_ids, attention_mask, tokenizer, generator, probability: float = 0.15,
                ordinary=None) -> tuple:
    """Mask one padded batch in place of a copy: ``(masked input_ids, labels)``.

    Shapes: ``input_ids``, ``attention_mask`` ``[batch, seq]``.
    """
    import torch

    if tokenizer.mask_token_id is None:
        raise HeadcountError("the tokenizer has no mask token: it cannot serve a masked-LM objective")
    ordinary = torch.as_tensor(_ordinary_ids(tokenizer) if ordinary is None else ordinary)
    if len(ordinary) == 0:
        raise HeadcountError("the tokenizer has no ordinary (non-special) tokens")
    special = torch.as_tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    candidate = attention_mask.bool() & ~torch.isin(input_ids, special)   # [batch, seq]
    n_cand = candidate.sum(dim=1)                                           # [batch]
    k = torch.clamp(torch.floor(n_cand * probability + 0.5), min=1).long()
    k = torch.minimum(k, n_cand)
    r = torch.rand(input_ids.shape, generator=generator)
    r[~candidate] = 2.0                                                     # never chosen
    rank = r.argsort(dim=1).argsort(dim=1)                                  # rank of each position
    chosen = rank < k[:, None]
    u = torch.rand(input_ids.shape, generator=generator)
    to_mask = chosen & (u < 0.8)
    to_random = chosen & (u >= 0.8) & (u < 0.9)
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]
    out = input_ids.clone()
    out[to_mask] = tokenizer.mask_token_id
    out[to_random] = random_ids[to_random]
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE))
    return out, labels


def mlm_batches(texts: Sequence[str], tokenizer, *, max_length: int = 128, batch_size: int = 32,
                seed: int = 0, probability: float = 0.15, cache_dir=None) -> list[dict]:
    """Padded, masked batches for the masked-LM loss.

    Args:
        texts: from :func:`mlm_texts`.
        tokenizer: a tokenizer with a mask token.
        max_length / batch_size: truncation length; sequences per batch (grouped by length).
        seed: the masking seed (same seed, same batches).
        probability: share of ordinary tokens chosen per sequence (at least one each).
        cache_dir: tokenization cache (see :func:`headcount.tasks.encode`).

    Returns:
        Batches ``{"input_ids", "attention_mask", "token_type_ids"?, "labels"}`` (labels
        ``-100`` where nothing is predicted).

    >>> batches = mlm_batches(["a first text", "another one"], tokenizer, seed=0)   # doctest: +SKIP
    >>> (batches[0]["labels"] != -100).sum() >= 2                                    # doctest: +SKIP
    tensor(True)
    """
    import torch

    if not 0 < probability < 1:
        raise HeadcountError(f"the masking probability must be in (0, 1), not {probability}")
    texts = [t for t in texts]
    if not texts:
        raise HeadcountError("no texts for the masked-LM objective")
    enc = tokenize([(t,) for t in texts], tokenizer, max_length=max_length, cache_dir=cache_dir)
    gen = torch.Generator().manual_seed(int(seed))
    ordinary = _ordinary_ids(tokenizer)
    o = enc.offsets
    batches = []
    for idx in batch_order(enc.lengths, batch_size, group_by_length=True):
        seqs = [enc.ids[o[i]:o[i + 1]] for i in idx]
        types = None if enc.type_ids is None else [enc.type_ids[o[i]:o[i + 1]] for i in idx]
        b = pad_batch(seqs, tokenizer.pad_token_id or 0, types)
        b["input_ids"], b["labels"] = mask_tokens(b["input_ids"], b["attention_mask"], tokenizer, gen,
                                                  probability, ordinary)
        batches.append(b)
    return batches


# --------------------------------------------------------------------------- head fitting
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
        from safetensors import safe_open

        for f in files:
            with safe_open(str(f), framework="pt") as st:
                keys.extend(st.keys())
        return keys
    for name in ("pytorch_model.bin",):
        if (d / name).is_file():
            import torch

            return list(torch.load(d / name, map_location="meta", weights_only=True, mmap=True))
    return None


def has_mlm_head(model_spec: str, model) -> bool:
    """Whether the checkpoint stores masked-LM head weights (else they were newly created)."""
    from ..models import resolve

    keys = _checkpoint_keys(resolve(model_spec))
    if keys is None:  # a hub id not cached locally: trust the config's architectures
        return any("MaskedLM" in a or "ForPreTraining" in a for a in (model.config.architectures or []))
    tops = {n.split(".")[0] for n in _head_parameters(model)}
    return any(k.split(".")[0] in tops for k in keys)


def _model_fingerprint(model_spec: str) -> str:
    from ..models import resolve

    path = resolve(model_spec)
    d = Path(path)
    h = hashlib.sha256(str(d.resolve() if d.is_dir() else path).encode())
    if d.is_dir():
        for f in sorted(d.iterdir()):
            if f.suffix in (".safetensors", ".bin", ".json") and f.is_file():
                st = f.stat()
                h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


@contextmanager
def _base_output(model):
    """Replace the base model's forward by one that returns given hidden states.

    The head is position-wise, so hidden states of masked positions packed as one sequence
    ``[1, n_masked, hidden]`` go through the model's own head and loss unchanged.
    """
    from transformers.modeling_outputs import BaseModelOutput

    base = model.base_model
    holder = {}
    own = base.__dict__.get("forward")  # an instance-level forward (hooks of other libraries)

    def forward(*args, **kwargs):
        return BaseModelOutput(last_hidden_state=holder["h"])

    base.forward = forward
    try:
        yield holder
    finally:
        if own is None:
            del base.forward
        else:
            base.forward = own


def _features(model, batches, device) -> tuple:
    """Hidden states at masked positions ``[n_masked, hidden]`` and their targets ``[n_masked]``."""
    import torch

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
    import torch
    from torch import nn

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


def _evaluate(model, holder, feats, targets, device, chunk: int = 1024) -> tuple[float, float]:
    import torch

    total, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(targets), chunk):
            h, y = feats[i:i + chunk].to(device), targets[i:i + chunk].to(device)
            holder["h"] = h[None]
            out = model(input_ids=y[None], labels=y[None])
            total += float(out.loss) * len(y)
            correct += int((out.logits[0].argmax(-1) == y).sum())
            n += len(y)
    return total / n, correct / n


def fit_mlm_head(model_spec: str, texts: Sequence[str], *, steps: int = 200, lr: float = 3e-3,
                 head_batch_size: int = 128, batch_size: int = 32, max_length: int = 128,
                 max_texts: int = 1000, eval_fraction: float = 0.1, seed: int = 0,
                 probability: float = 0.15, force: bool = False, cache_dir=None, device=None,
                 tokenizer=None):
    """A masked-LM model for ``model_spec``; fits its head first when the checkpoint has none.

    Args:
        model_spec: hub id, checkpoint folder, or ``offline``.
        texts: corpus (e.g. :func:`mlm_texts`); at most ``max_texts`` are used (seeded subset),
            ``eval_fraction`` of them held out for the reported loss and accuracy.
        steps / lr / head_batch_size: AdamW steps over batches of masked positions.
        batch_size / max_length / probability / seed: as :func:`mlm_batches`.
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
    import torch

    from ..models import load_model, load_tokenizer

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
    if out_emb.weight is not in_emb.weight:
        out_emb.weight = in_emb.weight  # the decoder is the input embedding matrix
    fitted = force or not has_mlm_head(model_spec, model)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    settings = {"steps": steps, "lr": lr, "head_batch_size": head_batch_size, "batch_size": batch_size,
                "max_length": max_length, "max_texts": max_texts, "eval_fraction": eval_fraction,
                "seed": seed, "probability": probability}
    head = _head_parameters(model)
    key = hashlib.sha256(json.dumps([_model_fingerprint(model_spec), tokenizer_fingerprint(tokenizer),
                                     sha256_text(*texts), settings, sorted(head)], sort_keys=True).encode()).hexdigest()[:32]
    folder = (Path(cache_dir) if cache_dir else cache_root() / "mlm-heads") / key
    if fitted and not force and (folder / "head.safetensors").is_file() and (folder / "report.json").is_file():
        from safetensors.torch import load_file

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
    for p in model.parameters():
        p.requires_grad_(False)
    ev_x, ev_y = _features(model, eval_batches, device)
    if fitted:  # the frozen encoder runs once; the head trains on its outputs
        tr_x, tr_y = _features(model, mlm_batches(train_texts, tokenizer, max_length=max_length,
                                                  batch_size=batch_size, seed=seed,
                                                  probability=probability), device)
    report = {"model": model_spec, "fitted": fitted, "cached": False, "n_texts_eval": len(eval_texts),
              "n_masked_eval": int(len(ev_y))}
    with _base_output(model) as holder:
        if fitted:
            _init_head(model, head, tr_y)
        loss0, acc0 = _evaluate(model, holder, ev_x, ev_y, device)
        if fitted:
            for p in head.values():
                p.requires_grad_(True)
            opt = torch.optim.AdamW(list(head.values()), lr=lr, weight_decay=0.0)
            gen = torch.Generator().manual_seed(seed)
            model.train()
            running = []
            for step in range(steps):
                pick = torch.randint(len(tr_y), (min(head_batch_size, len(tr_y)),), generator=gen)
                holder["h"] = tr_x[pick].to(device)[None]             # [1, n, hidden]
                y = tr_y[pick].to(device)[None]
                loss = model(input_ids=y, labels=y).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                running.append(float(loss.detach()))
            model.eval()
            loss1, acc1 = _evaluate(model, holder, ev_x, ev_y, device)
            report.update(loss_before=loss0, accuracy_before=acc0, loss=loss1, accuracy=acc1,
                          train_loss=float(np.mean(running[-20:])) if running else loss0,
                          steps=steps, n_texts_train=len(train_texts), n_masked_train=int(len(tr_y)))
        else:
            report.update(loss=loss0, accuracy=acc0)
    for p in model.parameters():
        p.requires_grad_(True)
    model.to("cpu").eval()
    if fitted:
        report["message"] = (f"masked-LM head fitted on the frozen encoder (decoder tied to the input embeddings): "
                             f"loss {report['loss_before']:.3f} -> {report['loss']:.3f}, accuracy "
                             f"{report['accuracy']:.1%} on {report['n_masked_eval']} held-out masked tokens")
        report["settings"] = settings
        try:
            from safetensors.torch import save_file

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

