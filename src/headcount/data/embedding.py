"""The sentence-embedding (contrastive) objective: SimCSE's in-batch loss on pooled encoder states.

Two objectives (``--objective``):

- ``embedding`` (unsupervised SimCSE, Gao et al. 2021): each text is encoded twice, the two
  views differing only by dropout; view 1 of text i must pick view 2 of text i among the
  second views of the batch: ``L = CE(cos(z1_i, z2_j) / T, target j = i)`` with ``T = 0.05``.
  No labels: any task's texts (each example's texts joined by a space, as for ``mlm``).
- ``embedding-supervised``: a task of text pairs with a similarity or paraphrase label; the
  same loss with the pair as the two views: anchor ``a_i`` must pick ``b_i`` among the batch's
  ``b_j``. Only *positive* pairs are anchors (classification: the last class, e.g. MRPC's
  ``equivalent``, ``offline/pairs``' ``same``; regression: a label of at least
  [`POSITIVE_SHARE`][headcount.data.embedding.POSITIVE_SHARE] x the split's largest label, STS-B's 4 of 5); every pair's ``b`` is a
  candidate (negatives). No dropout: the pair gives the two views.

Pooling follows the checkpoint's sentence-transformers config (``modules.json`` -> the
``Pooling`` module's ``config.json``: ``mean`` / ``cls`` / ``max``); ``mean`` when there is none.

The two dropout views (unsupervised). The scoring contract is eval mode; inside the loss only
the encoder's ``nn.Dropout`` modules are switched to train mode (embeddings, attention output and
feed-forward output dropout). Attention-probability dropout that reads the attention module's
own ``training`` flag (BERT's eager and SDPA attention) stays off: a named deviation from
SimCSE, which trains with the whole model in train mode. The random state is forked and seeded
with ``(seed, the batch's token ids)`` ([`view_seed`][headcount.data.embedding.view_seed]): the views of a batch are the same
whenever it is seen (every batch of a score run, every step of a pruning run, each head of an
ablation), the global random state is untouched, and scores are deterministic for a seed.

The metric that needs no labels (the pruning loop's stop rule, ``similarity_spearman``): the
Spearman correlation of the pruned model's pairwise cosine similarities of the stop-rule texts
(all pairs, eval mode) with the unpruned model's ([`similarity_agreement`][headcount.data.embedding.similarity_agreement]): 1 for the
unpruned model, lower as pruning changes which texts the model finds similar; the trace's
``loss`` is ``1 - mean cos(z_pruned_i, z_unpruned_i)``. Why not the retrieval accuracy of the
second dropout view ([`view_metrics`][headcount.data.embedding.view_metrics]: the share of texts whose own second view is the most
similar of the batch's; with Wang & Isola's alignment and uniformity)? On all-MiniLM-L6-v2 it
saturates: 1.00 on 128 movie snippets (batches of 32) with 0, 50, 80 or 95% of the heads
removed, while the similarity Spearman falls 0.91, 0.83, 0.55, 0.37 at 20, 50, 80, 95% removed
at random. The supervised stop rule is the STS-B metric: the mean of the Pearson and Spearman
correlations of the pair's cosine similarity with the label (``cosine_pearson_spearman``; eval mode).

Inside ``contrastive`` a model's ``model(**batch)`` returns this loss and ``logits`` that the
ordinary evaluation reads: unsupervised ``[b, 2]`` = (the best other text's similarity, the own
view's similarity) with labels 1, so "accuracy" is retrieval accuracy; supervised ``[b, 1]``
= the pair's cosine similarity, scored with ``pearson_spearman``. Gate gradients flow through
both views (one gate per example gates both of its views). In-batch negatives make the batch
the unit: contrastive batches are never merged (``tokens_per_batch`` 0).
"""

from __future__ import annotations

import json
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from headcount.runtime.errors import HeadcountError

#: the contrastive objectives (``settings.OBJECTIVES`` lists them beside ``task`` and ``mlm``)
EMBEDDING_OBJECTIVES = ("embedding", "embedding-supervised")
POOLINGS = ("mean", "cls", "max")
#: SimCSE's temperature
TEMPERATURE = 0.05
#: regression pairs: positive when the label is at least this share of the split's largest label
POSITIVE_SHARE = 0.8
#: the label-free metric (unsupervised) and the STS metric (supervised) of the stop rule
SIMILARITY_METRIC = "similarity_spearman"
PAIR_METRIC = "cosine_pearson_spearman"
#: the dropout views' retrieval accuracy (a diagnostic: [`view_metrics`][headcount.data.embedding.view_metrics])
RETRIEVAL_METRIC = "retrieval_accuracy"
#: the ordinary metric each contrastive metric is computed with inside ``contrastive``
EVAL_METRIC = {RETRIEVAL_METRIC: "accuracy", PAIR_METRIC: "pearson_spearman"}


def is_embedding(objective: str) -> bool:
    return objective in EMBEDDING_OBJECTIVES


@dataclass(frozen=True)
class Contrastive:
    """How the contrastive loss is computed for one run.

    Attributes:
        supervised: pairs as positives (``embedding-supervised``) instead of dropout views.
        pooling: ``mean`` | ``cls`` | ``max`` ([`pooling_of`][headcount.data.embedding.pooling_of] reads it from the checkpoint).
        temperature: of the cosine similarities (SimCSE: 0.05).
        seed: the dropout views' seed (unsupervised).
    """

    supervised: bool = False
    pooling: str = "mean"
    temperature: float = TEMPERATURE
    seed: int = 0

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise HeadcountError(f"unknown pooling {self.pooling!r}; choose one of {', '.join(POOLINGS)}")
        if not self.temperature > 0:
            raise HeadcountError(f"the temperature must be > 0, got {self.temperature}")

    def meta(self) -> dict:
        return {"contrastive": "supervised" if self.supervised else "unsupervised", "pooling": self.pooling,
                "temperature": self.temperature, "views_seed": self.seed}


# --------------------------------------------------------------------------- pooling
def _read_json(root: str, name: str):
    """``name`` of a checkpoint folder, or of a hub id's files already in the local hub cache
    (never downloaded here); None when absent or unreadable."""
    path = Path(root) / name
    if not Path(root).is_dir():
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(root, name)
        except Exception:  # not a repo id, or no hub library: no config
            found = None
        path = Path(found) if isinstance(found, str) else None
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, ValueError):
        return None


def pooling_of(model_dir) -> str:
    """The pooling of a sentence-transformers checkpoint (a folder, or a hub id whose files are in
    the local hub cache): the ``Pooling`` module named by ``modules.json`` (else ``1_Pooling/``),
    its ``pooling_mode_*`` flag; ``mean`` without one.

    >>> pooling_of("/nonexistent")
    'mean'
    """
    root = str(model_dir)
    folder = "1_Pooling"
    modules = _read_json(root, "modules.json")
    for m in modules if isinstance(modules, list) else []:
        if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling"):
            folder = str(m.get("path", folder))
    cfg = _read_json(root, f"{folder}/config.json")
    if not isinstance(cfg, dict):
        return "mean"
    for mode, key in (("cls", "pooling_mode_cls_token"), ("max", "pooling_mode_max_tokens"),
                      ("mean", "pooling_mode_mean_tokens")):
        if cfg.get(key):
            return mode
    return "mean"


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None, mode: str = "mean") -> torch.Tensor:
    """Sentence embeddings ``[b, d]`` from token states ``[b, s, d]`` (padding excluded).

    >>> pool(torch.tensor([[[1.0], [3.0], [9.0]]]), torch.tensor([[1, 1, 0]])).tolist()
    [[2.0]]
    """
    if attention_mask is None:
        attention_mask = torch.ones(hidden.shape[:2], device=hidden.device)
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)  # [b, s, 1]
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(dim=1)
    if mode == "mean":
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
    raise HeadcountError(f"unknown pooling {mode!r}; choose one of {', '.join(POOLINGS)}")


# --------------------------------------------------------------------------- losses and metrics
def similarities(z1: torch.Tensor, z2: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """``[b1, b2]`` cosine similarities of ``z1 [b1, d]`` and ``z2 [b2, d]`` divided by ``temperature``."""
    return F.cosine_similarity(z1.float()[:, None, :], z2.float()[None, :, :], dim=-1) / temperature


def simcse_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float = TEMPERATURE) -> torch.Tensor:
    """Unsupervised SimCSE: mean cross-entropy of ``cos(z1_i, z2_j) / T`` with target ``j = i``."""
    sim = similarities(z1, z2, temperature)  # [b, b]
    return F.cross_entropy(sim, torch.arange(sim.shape[0], device=sim.device))


def pair_loss(za: torch.Tensor, zb: torch.Tensor, positive: torch.Tensor,
              temperature: float = TEMPERATURE) -> torch.Tensor:
    """Supervised: each positive pair's anchor ``a_i`` must pick ``b_i`` among every ``b_j``.

    ``positive``: ``[b]`` bool. A batch without a positive pair gives 0 (gradient 0).
    """
    sim = similarities(za, zb, temperature)  # [b, b]
    rows = positive.nonzero().flatten()
    if rows.numel() == 0:
        return sim.sum() * 0.0
    return F.cross_entropy(sim[rows], rows)


def view_metrics(z1: torch.Tensor, z2: torch.Tensor) -> dict:
    """Label-free quality of two views ``[b, d]`` of the same texts.

    ``retrieval_accuracy``: share of texts whose own second view is the most similar (cosine)
    of the batch's second views; ``alignment``: mean ``|z1_i - z2_i|^2`` of unit vectors;
    ``uniformity``: ``log mean_{i != j} exp(-2 |z1_i - z1_j|^2)`` (nan for one text).
    """
    sim = similarities(z1, z2, 1.0)
    hits = (sim.argmax(dim=1) == torch.arange(sim.shape[0], device=sim.device)).float()
    u1, u2 = F.normalize(z1.float(), dim=-1), F.normalize(z2.float(), dim=-1)
    alignment = (u1 - u2).pow(2).sum(-1).mean()
    b = u1.shape[0]
    if b > 1:
        d2 = torch.cdist(u1, u1).pow(2)
        off = ~torch.eye(b, dtype=torch.bool, device=d2.device)
        uniformity = float(torch.exp(-2 * d2[off]).mean().log())
    else:
        uniformity = float("nan")
    return {RETRIEVAL_METRIC: float(hits.mean()), "alignment": float(alignment), "uniformity": uniformity}


@torch.no_grad()
def embed(model: nn.Module, batches, pooling: str = "mean", mask=None, *, device=None,
          precision=None) -> torch.Tensor:
    """Unit-length sentence embeddings ``[n_texts, d]`` (fp32, CPU) of the batches' first texts, in
    eval mode (no dropout), with an optional [`Mask`][headcount.core.masks.Mask] held as gates."""
    from headcount.core.gates import clear_gates, set_gates
    from headcount.runtime.device import runtime, to_device

    rt = runtime(model, device, precision, 0)
    was = model.training
    model.eval()
    fixed = (set_gates(model, heads=mask.heads.to(rt.device), mlps=mask.mlps.to(rt.device))
             if mask is not None else None)
    out = []
    try:
        for b in batches:
            b = to_device({k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in b}, rt.device)
            with rt.autocast():
                hidden = encoder_of(model)(**b)[0]  # [b, s, d]
            out.append(F.normalize(pool(hidden.float(), b["attention_mask"], pooling), dim=-1).cpu())
    finally:
        if fixed is not None:
            clear_gates(model, fixed)
        model.train(was)
    return torch.cat(out) if out else torch.zeros(0, 0)


def similarity_agreement(z: torch.Tensor, reference: torch.Tensor) -> dict:
    """How far embeddings ``z [n, d]`` keep the similarity structure of ``reference [n, d]`` (unit rows).

    ``score``: Spearman correlation of the ``n (n - 1) / 2`` pairwise cosine similarities (nan
    below 3 texts); ``fidelity``: mean ``cos(z_i, reference_i)``; ``loss``: ``1 - fidelity``.

    >>> z = torch.nn.functional.normalize(torch.randn(5, 3), dim=-1)
    >>> similarity_agreement(z, z)["score"]
    1.0
    """
    from scipy.stats import spearmanr

    n = z.shape[0]
    fidelity = float((z * reference).sum(-1).mean()) if n else float("nan")
    rho = float("nan")
    if n >= 3:
        i, j = torch.triu_indices(n, n, 1)
        a, b = (z @ z.T)[i, j].double().numpy(), (reference @ reference.T)[i, j].double().numpy()
        rho = 1.0 if np.array_equal(a, b) else float(spearmanr(a, b)[0])
    return {"score": rho, SIMILARITY_METRIC: rho, "fidelity": fidelity, "loss": 1.0 - fidelity}


# --------------------------------------------------------------------------- the two views
def view_seed(seed: int, input_ids: torch.Tensor) -> int:
    """The dropout seed of one batch: ``seed`` mixed with its token ids (the same batch, the same views)."""
    data = np.ascontiguousarray(input_ids.detach().cpu().numpy().astype(np.int64)).tobytes()
    return zlib.crc32(data, zlib.crc32(str(int(seed)).encode())) & 0x7FFFFFFF


def encoder_of(model: nn.Module) -> nn.Module:
    """The encoder the views are taken from (``model.base_model``: the model itself for a bare encoder)."""
    return getattr(model, "base_model", model)


@contextmanager
def dropout_views(model: nn.Module, seed: int):
    """Inside: the encoder's ``nn.Dropout`` modules in train mode (everything else as it was) and
    the random state forked and seeded with ``seed``; both restored afterwards."""
    drops = [m for m in encoder_of(model).modules() if isinstance(m, nn.Dropout)]
    modes = [m.training for m in drops]
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for m in drops:
            m.train(True)
        try:
            yield drops
        finally:
            for m, was in zip(drops, modes):
                m.train(was)


def _hidden(model: nn.Module, forward, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
    kw = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        kw["token_type_ids"] = token_type_ids
    return forward(**kw)[0]  # last hidden state [b, s, d]


def _encode(model, forward, spec: Contrastive, ids, mask, types) -> torch.Tensor:
    return pool(_hidden(model, forward, ids, mask, types), mask, spec.pooling)


def two_views(model: nn.Module, batch: dict, spec: Contrastive, forward=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z1, z2)`` ``[b, d]``: two dropout views of the batch's texts (seeded by [`view_seed`][headcount.data.embedding.view_seed])."""
    forward = forward or encoder_of(model)
    ids, mask, types = batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids")
    with dropout_views(model, view_seed(spec.seed, ids)):
        z1 = _encode(model, forward, spec, ids, mask, types)
        z2 = _encode(model, forward, spec, ids, mask, types)
    return z1, z2


@contextmanager
def contrastive(model: nn.Module, spec: Contrastive):
    """Inside the block, ``model(**batch)`` returns the contrastive loss of ``spec`` (see the module
    docstring for the ``logits`` the evaluation reads). Batches: ``embedding_batches``.

    >>> with contrastive(model, Contrastive(pooling="mean", seed=0)):     # doctest: +SKIP
    ...     loss = model(**batch).loss
    """
    from transformers.modeling_outputs import SequenceClassifierOutput

    base = encoder_of(model)
    # a bare encoder is its own base model: call its class's forward, not the patched attribute
    forward = (lambda **kw: type(model).forward(model, **kw)) if base is model else base

    def patched(input_ids=None, attention_mask=None, token_type_ids=None, labels=None, input_ids_b=None,
                attention_mask_b=None, token_type_ids_b=None, positive=None, **kwargs):
        if spec.supervised:
            if input_ids_b is None:
                raise HeadcountError("supervised embedding batches need text pairs (input_ids_b)")
            za = _encode(model, forward, spec, input_ids, attention_mask, token_type_ids)
            zb = _encode(model, forward, spec, input_ids_b, attention_mask_b, token_type_ids_b)
            pos = positive if positive is not None else torch.ones(za.shape[0], dtype=torch.bool, device=za.device)
            loss = pair_loss(za, zb, pos.bool(), spec.temperature)
            logits = F.cosine_similarity(za.float(), zb.float(), dim=-1)[:, None]  # [b, 1]
        else:
            batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            z1, z2 = two_views(model, batch, spec, forward)
            sim = similarities(z1, z2, spec.temperature)  # [b, b]
            loss = F.cross_entropy(sim, torch.arange(sim.shape[0], device=sim.device))
            own = sim.diagonal()
            eye = torch.eye(sim.shape[0], dtype=torch.bool, device=sim.device)
            other = sim.masked_fill(eye, float("-inf")).amax(dim=1)  # [b]; -inf for a batch of one
            logits = torch.stack([other, own], dim=1)  # [b, 2]: class 1 = the own view is nearest
        return SequenceClassifierOutput(loss=loss, logits=logits)

    model.forward = patched
    try:
        yield model
    finally:
        del model.forward


@torch.no_grad()
def embedding_metrics(model: nn.Module, batches, spec: Contrastive) -> dict:
    """[`view_metrics`][headcount.data.embedding.view_metrics] of the dropout views per batch, averaged over texts (unsupervised)."""
    was = model.training
    model.eval()
    total, n = {}, 0
    try:
        for batch in batches:
            z1, z2 = two_views(model, batch, spec)
            b = int(z1.shape[0])
            for k, v in view_metrics(z1, z2).items():
                total[k] = total.get(k, 0.0) + v * b
            n += b
    finally:
        model.train(was)
    return {k: v / max(n, 1) for k, v in total.items()}


# --------------------------------------------------------------------------- data
def check_pairs(task) -> None:
    """Refuse ``embedding-supervised`` on a task without text pairs."""
    if len(task.text_fields) != 2:
        raise HeadcountError(f"objective embedding-supervised needs a task of text pairs; {task.name} has "
                             f"{len(task.text_fields)} text field (use --objective embedding, or a pair task "
                             "such as offline/pairs, glue/stsb, glue/mrpc)")


def positives(task, labels: np.ndarray) -> np.ndarray:
    """Which pairs are positives: classification: the last class; regression: a label of at least
    [`POSITIVE_SHARE`][headcount.data.embedding.POSITIVE_SHARE] x the largest label."""
    y = np.asarray(labels)
    if task.kind == "regression":
        top = float(np.max(y)) if len(y) else 0.0
        return y >= POSITIVE_SHARE * top
    return y == task.num_labels - 1


def embedding_batches(task, tokenizer, data, split: str, supervised: bool, group_by_length: bool = True) -> list[dict]:
    """Batches for the contrastive objectives (grouped by length unless ``group_by_length`` is
    False, in the order of [`headcount.importance.pipeline.example_order`][headcount.importance.pipeline.example_order]).

    Unsupervised: ``{input_ids, attention_mask, token_type_ids?, labels}`` of each example's
    texts joined by a space (``labels``: ones, the evaluation's "own view is nearest" class).
    Supervised: the first texts as ``input_ids``..., the second as ``input_ids_b``... (both
    padded to one width, so per-token gates fit both), ``labels`` (the task's) and
    ``positive`` ``[b]``.
    """
    from headcount.data.tasks import encode, tokenize
    from headcount.data.tasks.batching import batch_order, pad_batch

    loaded = task.load(split, max_examples=data.max_examples, seed=data.seed)
    pad = tokenizer.pad_token_id or 0
    batches = []
    if not supervised:
        enc = tokenize([(" ".join(t),) for t in loaded.texts], tokenizer, max_length=data.max_length)
        o = enc.offsets
        for idx in batch_order(np.asarray(enc.lengths), data.batch_size, group_by_length=group_by_length):
            seqs = [enc.ids[o[i]:o[i + 1]] for i in idx]
            types = None if enc.type_ids is None else [enc.type_ids[o[i]:o[i + 1]] for i in idx]
            b = pad_batch(seqs, pad, types)
            b["labels"] = torch.ones(len(idx), dtype=torch.long)
            batches.append(b)
        return batches
    check_pairs(task)
    labels = np.asarray(loaded.labels)
    pos = positives(task, labels)
    lengths = encode(loaded, tokenizer, max_length=data.max_length).lengths  # the task's order
    first = tokenize([(t[0],) for t in loaded.texts], tokenizer, max_length=data.max_length)
    second = tokenize([(t[1],) for t in loaded.texts], tokenizer, max_length=data.max_length)
    for idx in batch_order(np.asarray(lengths), data.batch_size, group_by_length=group_by_length):
        seqs, types = [], []
        for enc in (first, second):
            o = enc.offsets
            seqs += [enc.ids[o[i]:o[i + 1]] for i in idx]
            types += [] if enc.type_ids is None else [enc.type_ids[o[i]:o[i + 1]] for i in idx]
        both = pad_batch(seqs, pad, types or None)  # [2b, width]: a then b
        n = len(idx)
        b = {k: v[:n] for k, v in both.items()}
        b.update({f"{k}_b": v[n:] for k, v in both.items()})
        b["labels"] = torch.as_tensor(labels[idx])
        b["positive"] = torch.as_tensor(pos[idx])
        batches.append(b)
    return batches
