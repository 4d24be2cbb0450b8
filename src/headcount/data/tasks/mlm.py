"""The masked-LM objective: a corpus and reproducible masking.

Masking (as the original pre-training data script): in each sequence, ``max(1, round(0.15 * n))``
of its ``n`` ordinary tokens (not special, not padding) are chosen; of those, 80% become the
mask token, 10% a random ordinary token, 10% stay; ``labels`` hold the original id there and
``-100`` elsewhere. Everything is drawn from one ``torch.Generator`` seeded with ``seed``, so the
same texts, tokenizer and seed give the same batches.

A head for checkpoints without masked-LM weights is fitted by [`headcount.data.mlm_head.fit_mlm_head`][headcount.data.mlm_head.fit_mlm_head]
(still importable from here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from headcount.data.tasks.base import IGNORE, subset_indices
from headcount.data.tasks.batching import batch_order, pad_batch, tokenize
from headcount.data.tasks.offline import offline_corpus
from headcount.data.tasks.registry import get_task, list_tasks
from headcount.data.tasks.tables import read_text
from headcount.runtime.errors import HeadcountError

#: the share of a sequence's ordinary tokens that are masked (BERT's pre-training)
MASK_PROBABILITY = 0.15


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
    if source == "offline/corpus":
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


def mask_tokens(input_ids, attention_mask, tokenizer, generator, probability: float = MASK_PROBABILITY,
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
                seed: int = 0, probability: float = MASK_PROBABILITY, cache_dir=None,
                group_by_length: bool = True) -> list[dict]:
    """Padded, masked batches for the masked-LM loss.

    Args:
        texts: from [`mlm_texts`][headcount.data.tasks.mlm.mlm_texts].
        tokenizer: a tokenizer with a mask token.
        max_length / batch_size: truncation length; sequences per batch (grouped by length).
        seed: the masking seed (same seed, same batches).
        probability: share of ordinary tokens chosen per sequence (at least one each).
        cache_dir: tokenization cache (see [`headcount.data.tasks.encode`][headcount.data.tasks.encode]).
        group_by_length: False: the texts' order in fixed-size batches (see
            [`headcount.importance.pipeline.batches_for`][headcount.importance.pipeline.batches_for]).

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
    for idx in batch_order(enc.lengths, batch_size, group_by_length=group_by_length):
        seqs = [enc.ids[o[i]:o[i + 1]] for i in idx]
        types = None if enc.type_ids is None else [enc.type_ids[o[i]:o[i + 1]] for i in idx]
        b = pad_batch(seqs, tokenizer.pad_token_id or 0, types)
        b["input_ids"], b["labels"] = mask_tokens(b["input_ids"], b["attention_mask"], tokenizer, gen,
                                                  probability, ordinary)
        batches.append(b)
    return batches


def lm_batches(texts: Sequence[str], tokenizer, *, max_length: int = 128, batch_size: int = 32, cache_dir=None,
               group_by_length: bool = True) -> list[dict]:
    """Padded batches for the causal-LM (next-token) loss of a decoder: ``labels`` are the token
    ids themselves (the model shifts them by one), ``-100`` on padding and on the first position.

    Right padding: every position a label counts sees only real tokens before it. The pad id is the
    tokenizer's, else its end-of-sequence id (decoder tokenizers often have no pad token).

    >>> b = lm_batches(["a first text", "another one"], tokenizer)[0]    # doctest: +SKIP
    >>> int((b["labels"] != -100).sum()) == int(b["attention_mask"].sum()) - 2  # doctest: +SKIP
    True
    """
    texts = list(texts)
    if not texts:
        raise HeadcountError("no texts for the causal-LM objective")
    enc = tokenize([(t,) for t in texts], tokenizer, max_length=max_length, cache_dir=cache_dir)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    o = enc.offsets
    batches = []
    for idx in batch_order(enc.lengths, batch_size, group_by_length=group_by_length):
        b = pad_batch([enc.ids[o[i]:o[i + 1]] for i in idx], pad)  # [batch, seq], right-padded
        b["labels"] = b["input_ids"].masked_fill(b["attention_mask"] == 0, IGNORE)
        # the model predicts token t+1 at t, so no position predicts the first token: IGNORE there
        # too (the loss is unchanged) makes the count of labels the count of predicted tokens, which
        # scoring's batch merging weighs batches by
        b["labels"][:, 0] = IGNORE
        batches.append(b)
    return batches
