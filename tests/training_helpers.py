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


# -- a stand-in for headcount.tasks until the real package lands (documented shapes only) ---------
def install_fake_tasks(monkeypatch) -> bool:
    """Install a minimal ``headcount.tasks`` API (YAML + CSV tasks only) when the real one is absent."""
    import csv
    from dataclasses import dataclass

    import numpy as np
    import yaml

    import sys
    import types

    try:
        import headcount.tasks as T
    except ImportError:
        T = types.ModuleType("headcount.tasks")
        monkeypatch.setitem(sys.modules, "headcount.tasks", T)
        import headcount

        monkeypatch.setattr(headcount, "tasks", T, raising=False)
    if hasattr(T, "get_task") and hasattr(T, "encode"):
        return False

    @dataclass
    class TaskData:
        task: object
        split: str
        texts: list
        labels: np.ndarray

    class Task:
        def __init__(self, path):
            path = Path(path)
            spec = yaml.safe_load(path.read_text())
            self.root, self.spec = path.parent, spec
            self.name, self.kind = spec["name"], spec.get("kind", "classification")
            self.text_fields = tuple(spec["text"])
            self.labels = tuple(spec["labels"]) if spec.get("labels") else None
            self.num_labels = 1 if self.kind == "regression" else len(self.labels)
            self.metric = spec.get("metric", "accuracy")
            self.train_split, self.validation_split = "train", "validation"

        def splits(self):
            return list(self.spec["files"])

        def load(self, split, max_examples=None, seed=0):
            with open(self.root / self.spec["files"][split]) as f:
                rows = list(csv.DictReader(f))
            if max_examples is not None and max_examples < len(rows):
                idx = sorted(np.random.default_rng(seed).choice(len(rows), max_examples, replace=False))
                rows = [rows[i] for i in idx]
            texts = [tuple(r[c] for c in self.text_fields) for r in rows]
            if self.kind == "regression":
                labels = np.array([float(r[self.spec["label"]]) for r in rows], dtype=np.float32)
            else:
                labels = np.array([self.labels.index(r[self.spec["label"]]) for r in rows], dtype=np.int64)
            return TaskData(self, split, texts, labels)

    def get_task(name):
        if not str(name).endswith((".yaml", ".yml")) or not Path(name).is_file():
            from headcount.errors import HeadcountError

            raise HeadcountError(f"unknown task {name!r}")
        return Task(name)

    def encode(data, tokenizer, max_length=128, cache_dir=None):
        cols = list(zip(*data.texts))
        enc = tokenizer(*cols, truncation=True, max_length=max_length)
        out = []
        for i in range(len(data.texts)):
            ex = {"input_ids": enc["input_ids"][i], "labels": data.labels[i].item()}
            if "token_type_ids" in enc:
                ex["token_type_ids"] = enc["token_type_ids"][i]
            out.append(ex)
        return out

    def make_batches(encoded, batch_size, *, shuffle=False, seed=0, group_by_length=True, pad_token_id=0):
        from headcount.training import DynamicPadding

        order = list(range(len(encoded)))
        if group_by_length:
            order.sort(key=lambda i: -len(encoded[i]["input_ids"]))
        regression = isinstance(encoded[0]["labels"], float)
        pad = DynamicPadding(pad_token_id, regression=regression)
        return [pad([encoded[i] for i in order[j:j + batch_size]]) for j in range(0, len(order), batch_size)]

    def compute_metrics(metric, predictions, labels):
        preds = predictions.argmax(-1) if predictions.ndim == 2 else predictions
        acc = float((preds == labels).mean())
        return {"score": acc, "accuracy": acc}

    for name, fn in dict(get_task=get_task, encode=encode, make_batches=make_batches,
                         compute_metrics=compute_metrics).items():
        monkeypatch.setattr(T, name, fn, raising=False)
    return True


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
