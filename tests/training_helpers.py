"""Helpers for the training and magnitude tests: a tiny pre-trained-looking checkpoint with a
word-level tokenizer, and a learnable synthetic task written as a task YAML over CSV files.

The task: label 1 iff the word ``good`` occurs in the sentence (a single token decides it, so a
2-layer model with hidden size 32 learns it in a few dozen steps).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import transformers

WORDS = ["the", "a", "movie", "film", "plot", "was", "is", "very", "quite", "long", "short", "actor", "story",
         "scene", "music", "ending", "and", "but", "it", "this", "that", "not", "really", "some", "many",
         "people", "time", "camera", "light", "dark", "fast", "slow", "old", "new", "big", "small", "good"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tokenizer(path: Path) -> transformers.PreTrainedTokenizerBase:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(SPECIAL + WORDS) + "\n")
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)
    return tok


def make_checkpoint(path: Path, seed: int = 0, head: str = "base", num_labels: int = 2, **overrides) -> Path:
    """A tiny random BERT (base model: a 'pre-trained encoder') + tokenizer saved in ``path``."""
    path = Path(path)
    tok = make_tokenizer(path)
    cfg = dict(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=48, max_position_embeddings=64, num_labels=num_labels)
    cfg.update(overrides)
    config = transformers.BertConfig(**cfg)
    torch.manual_seed(seed)
    cls = transformers.BertModel if head == "base" else transformers.BertForSequenceClassification
    model = cls(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def sentences(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    plain = [w for w in WORDS if w != "good"]
    rows = []
    for i in range(n):
        words = [rng.choice(plain) for _ in range(rng.randint(3, 20))]
        label = i % 2
        if label:
            words[rng.randrange(len(words))] = "good"
        rows.append((" ".join(words), label))
    rng.shuffle(rows)
    return rows


def make_task(folder: Path, n_train: int = 192, n_dev: int = 64, n_labels: int = 2) -> Path:
    """Write ``train.csv``, ``dev.csv`` and ``task.yaml``; return the YAML path.

    With ``n_labels`` > 2 the labels are ``l0, l1, ...`` (class = the 0/1 label, so the extra
    classes are never used: what matters is only the head's size).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = ["negative", "positive"] if n_labels == 2 else [f"l{i}" for i in range(n_labels)]
    for name, n, seed in (("train.csv", n_train, 1), ("dev.csv", n_dev, 2)):
        lines = ["sentence,label"] + [f"{s},{names[y]}" for s, y in sentences(n, seed)]
        (folder / name).write_text("\n".join(lines) + "\n")
    (folder / "task.yaml").write_text(
        "name: has-good\nkind: classification\nfiles: {train: train.csv, validation: dev.csv}\n"
        f"text: [sentence]\nlabel: label\nlabels: [{', '.join(names)}]\nmetric: accuracy\n"
    )
    return folder / "task.yaml"


def stop_after(steps: int):
    """A TrainerCallback that raises KeyboardInterrupt after ``steps`` optimizer steps."""

    class Stop(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= steps:
                raise KeyboardInterrupt(f"stopped after {steps} steps")

    return Stop()


def one_thread(tmp_path_factory):
    """A module-scoped fixture body: tiny models train fastest on one thread (and do not slow
    to a crawl when other processes compete for the cores); tokenization caches go to a
    temporary folder."""
    import os

    n = torch.get_num_threads()
    old = os.environ.get("HEADCOUNT_CACHE")
    torch.set_num_threads(1)
    os.environ["HEADCOUNT_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    try:
        yield
    finally:
        torch.set_num_threads(n)
        if old is None:
            os.environ.pop("HEADCOUNT_CACHE", None)
        else:
            os.environ["HEADCOUNT_CACHE"] = old
