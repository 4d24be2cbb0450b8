"""Needle-in-a-haystack tasks: ``offline/niah`` and task YAML ``kind: niah`` (generated, or RULER-style
jsonl files), their haystacks, and their batches (the prompt then the answer; labels: the answer's
tokens only, so the causal-LM loss of a batch is the needle answer's loss).

The examples are made by [`headcount.data.tasks.niah_examples`][headcount.data.tasks.niah_examples]
(the generator, its templates and needles, the needle span, RULER-style rows, the success rules),
re-exported here: ``headcount.data.tasks.niah`` is the one module to import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headcount.data.tasks.base import IGNORE, Source, Task, TaskData, subset_indices
from headcount.data.tasks.batching import batch_order, pad_batch
from headcount.data.tasks.niah_examples import (
    ACTIVITIES,
    ADJECTIVES,
    CITIES,
    NEEDLES,
    NOUNS,
    REFERENCE_DEPTHS,
    ROUGE_RULES,
    TEMPLATES,
    NiahExample,
    NiahSpec,
    Template,
    chat_template_source,
    check_positions,
    exact_match,
    find_needle_idx,
    generate,
    make_needle,
    render,
    rouge1_recall,
    ruler_examples,
)
from headcount.data.tasks.offline import SPLITS, OfflineSource, ground_truth, split_of
from headcount.data.tasks.tables import Table, read_table, read_text
from headcount.runtime.errors import HeadcountError

#: the keys a ``kind: niah`` task YAML may have (``niah``: the generator's parameters; ``files``: RULER-style jsonl)
YAML_KEYS = ("name", "kind", "niah", "files", "train_split", "validation_split", "description")
KIND, METRIC = "niah", "exact_match"


# --------------------------------------------------------------------------- haystacks and files
def offline_haystack(split: str) -> list[str]:
    """The haystack texts of ``split`` from the offline data (``headcount data fetch``): the movie,
    Amazon and NYT snippets whose split is ``split`` (by the offline tasks' hash rule) and the
    fine-food reviews of that split; the tweets are left out (handles and links)."""
    root = os.environ.get("HEADCOUNT_DATA")
    out = [s for key in ("movies", "amazon", "nyt") for _, _, s in ground_truth(key, root) if split_of(s) == split]
    out += OfflineSource("fine-foods").read(split).columns["review"]
    return list(dict.fromkeys(out))


def _file_haystack(path: Path, split: str) -> list[str]:
    lines = [line.strip() for line in read_text(path).splitlines() if line.strip()]
    return [t for t in lines if split_of(t) == split] or lines  # a short file serves every split whole


# --------------------------------------------------------------------------- the task
class NiahSource(Source):
    """The splits of a niah task: generated ones, or RULER-style jsonl files (``files``)."""

    def __init__(self, spec: NiahSpec | None = None, files: Mapping[str, Path] | None = None, base: Path | None = None):
        self.spec, self.files, self.base = spec, dict(files or {}), base

    def splits(self) -> list[str]:
        return list(self.files) if self.files else list(SPLITS)

    def cache_key(self, split: str) -> tuple:
        return ("niah", repr(self.spec), tuple(sorted((k, str(v)) for k, v in self.files.items())), split)

    def haystack(self, split: str) -> list[str]:
        h = self.spec.haystack
        if h == "offline":
            return offline_haystack(split)
        p = Path(h).expanduser()
        return _file_haystack(p if p.is_absolute() or self.base is None else self.base / p, split)

    def __repr__(self) -> str:
        return f"NiahSource({self.spec!r})" if not self.files else f"NiahSource(files={self.files})"


@dataclass(frozen=True, eq=False, repr=False)
class NiahTask(Task):
    """A needle-in-a-haystack task: prompts with an answer. ``kind`` ``niah``; its metric is the
    share of greedy answers that hold the needle's answer (``exact_match``). Build the examples with
    [`examples`][headcount.data.tasks.niah.NiahTask.examples] (with the model's tokenizer)."""

    def __post_init__(self):  # not a classification or regression task: none of Task's checks apply
        pass

    def examples(self, split: str | None = None, tokenizer=None, max_examples: int | None = None,
                 seed: int = 0) -> list[NiahExample]:
        """The examples of ``split`` (default: the validation split), a seeded subset of
        ``max_examples`` of them in order; in ``tokenizer``'s tokens (None: words)."""
        split = self.validation_split if split is None else split
        self.check_split(split)
        src: NiahSource = self.source  # type: ignore[assignment]
        if src.files:
            table = read_table(src.files[split])
            idx = subset_indices(len(table), max_examples, seed)
            rows = Table({k: [v[i] for i in idx] for k, v in table.columns.items()} if idx is not None
                         else table.columns, table.where)
            return ruler_examples(rows, f"task {self.name}, split {split} ({table.where})", tokenizer)
        check_positions(src.spec, tokenizer)  # before the haystack is read and any example built
        idx = subset_indices(src.spec.examples, max_examples, seed)
        return generate(src.haystack(split), tokenizer, spec=src.spec, indices=None if idx is None else idx.tolist(),
                        stream=SPLITS.index(split) if split in SPLITS else 0)

    def load(self, split: str | None = None, max_examples: int | None = None, seed: int = 0) -> TaskData:
        """Prompts (lengths in words) and their answers as ``texts`` / ``labels``."""
        ex = self.examples(split, None, max_examples, seed)
        return TaskData(self, self.validation_split if split is None else split, [(e.prompt,) for e in ex],
                        np.asarray([e.answer for e in ex], dtype=object))


def niah_task(name: str = "offline/niah", spec: NiahSpec | None = None, description: str | None = None,
              base: Path | None = None) -> NiahTask:
    """A generated niah task (``offline/niah``: pass keys at 1,000 tokens, the reference's ten
    depths, 100 examples per split, haystacks from the offline data).

    >>> niah_task().describe()["kind"]
    'niah'
    """
    spec = spec or NiahSpec()
    return NiahTask(name=name, kind=KIND, text_fields=("prompt",), labels=None, metric=METRIC,
                    source=NiahSource(spec, base=base), sizes={s: spec.examples for s in SPLITS},
                    description=description or f"needle in a haystack: {spec.needle} needles, "
                                               f"{'/'.join(map(str, spec.lengths))} tokens, template {spec.template}")


def niah_task_yaml(doc: dict, path: Path) -> NiahTask:
    """The task of a ``kind: niah`` task YAML: ``niah:`` the generator's parameters ([`NiahSpec`][headcount.data.tasks.niah.NiahSpec]),
    or ``files:`` RULER-style jsonl files per split."""
    unknown = [k for k in doc if k not in YAML_KEYS]
    if unknown:
        raise HeadcountError(f"{path}: unknown key {unknown[0]!r} for a niah task; keys: {', '.join(YAML_KEYS)}")
    name = doc.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise HeadcountError(f"{path}: `name` must be a string")
    files, params = doc.get("files"), doc.get("niah")
    if files is not None and params is not None:
        raise HeadcountError(f"{path}: a niah task is generated (`niah:`) or read from files (`files:`), not both")
    if files is not None:
        if not isinstance(files, dict) or not files or not all(isinstance(f, str) and f for f in files.values()):
            raise HeadcountError(f"{path}: `files` must map split names to RULER-style .jsonl files")
        resolved = {str(s): (Path(f).expanduser() if Path(f).expanduser().is_absolute() else path.parent / f)
                    for s, f in files.items()}
        for s, f in resolved.items():
            if f.suffix.lower() != ".jsonl" or not f.is_file():
                raise HeadcountError(f"{path}: files.{s}: {f} is not a .jsonl file")
        splits = list(resolved)
        train = doc.get("train_split") or ("train" if "train" in splits else splits[0])
        validation = doc.get("validation_split") or next((s for s in ("validation", "dev", "test") if s in splits),
                                                         splits[0])
        return NiahTask(name=name, kind=KIND, text_fields=("prompt",), labels=None, metric=METRIC,
                        source=NiahSource(files=resolved), train_split=train, validation_split=validation,
                        description=str(doc.get("description", f"needle in a haystack, RULER-style files ({path.name})")))
    params = params or {}
    if not isinstance(params, dict):
        raise HeadcountError(f"{path}: `niah` must be a mapping of the generator's parameters")
    known = {f for f in NiahSpec.__dataclass_fields__}
    bad = [k for k in params if k not in known]
    if bad:
        raise HeadcountError(f"{path}: niah.{bad[0]} is not a parameter; parameters: {', '.join(sorted(known))}")
    spec = NiahSpec(**params)
    if spec.haystack != "offline":
        p = Path(spec.haystack).expanduser()
        if not (p if p.is_absolute() else path.parent / p).is_file():
            raise HeadcountError(f"{path}: niah.haystack: {spec.haystack} is not a file (or `offline`)")
    return niah_task(name, spec, doc.get("description"), base=path.parent)


# --------------------------------------------------------------------------- batches
class NiahBatch(dict):
    """A batch of niah examples: ``input_ids`` / ``attention_mask`` / ``labels`` as every batch (the
    prompt then the target, right-padded; labels: the target's tokens, ``-100`` elsewhere), and as
    attributes, which a model's ``**batch`` never sees: ``examples`` (the [`NiahExample`][headcount.data.tasks.niah.NiahExample]s of its
    rows), ``decode`` (token ids -> text), ``stop_ids`` (tokens that end an answer: the
    end-of-sequence tokens and any token holding a line break) and ``newline_ids`` (the tokens
    holding a line break only: where the reference stops, decoding on after an end-of-sequence
    token)."""

    examples: list
    decode: object
    stop_ids: frozenset
    newline_ids: frozenset


def stop_ids(tokenizer, eos: bool = True) -> frozenset:
    """The ids of tokens whose text holds a line break, and (``eos``) the end-of-sequence ids."""
    lines, ends = _line_and_end_ids(tokenizer)
    return lines | ends if eos else lines


def _line_and_end_ids(tokenizer) -> tuple[frozenset, frozenset]:
    """``(ids of tokens whose text holds a line break, end-of-sequence ids)`` (decodes the vocabulary once)."""
    end = tokenizer.eos_token_id
    ends = frozenset(end if isinstance(end, (list, tuple)) else [] if end is None else [end])
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return frozenset(i for i, t in enumerate(texts) if "\n" in t), ends


def niah_batches(task: NiahTask, tokenizer, *, split: str | None = None, max_examples: int | None = None,
                 seed: int = 0, batch_size: int = 32, group_by_length: bool = True) -> list[NiahBatch]:
    """[`NiahBatch`][headcount.data.tasks.niah.NiahBatch]es of ``task``'s examples in ``tokenizer``'s tokens.

    Raises:
        HeadcountError: a prompt and its answer longer than the model's positions (the
            tokenizer's ``model_max_length``, which ``load_tokenizer`` sets).
    """
    examples = task.examples(split or task.train_split, tokenizer, max_examples, seed)
    limit = getattr(tokenizer, "model_max_length", None)
    lengths = np.asarray([len(e.input_ids) + len(e.target_ids) for e in examples])
    if isinstance(limit, int) and limit < 10**8 and lengths.max() > limit:
        raise HeadcountError(f"task {task.name}: a haystack of {int(lengths.max())} tokens (prompt and answer) is "
                             f"longer than the model's {limit} positions; use shorter niah lengths")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    newlines, ends = _line_and_end_ids(tokenizer)
    stops = newlines | ends
    out = []
    for idx in batch_order(lengths, batch_size, group_by_length=group_by_length):
        rows = [examples[i] for i in idx]
        b = NiahBatch(pad_batch([list(e.input_ids) + list(e.target_ids) for e in rows], pad))
        labels = b["input_ids"].clone().fill_(IGNORE)  # [batch, seq]: the target's tokens only
        for r, e in enumerate(rows):
            p, t = len(e.input_ids), len(e.target_ids)
            labels[r, p:p + t] = b["input_ids"][r, p:p + t]
        b["labels"] = labels
        b.examples, b.decode, b.stop_ids = rows, lambda ids: tokenizer.decode(ids, skip_special_tokens=True), stops
        b.newline_ids = newlines
        out.append(b)
    return out


def is_niah(task) -> bool:
    """Whether ``task`` is a needle-in-a-haystack task (its examples are prompts with an answer)."""
    return isinstance(task, NiahTask)


__all__ = ["ACTIVITIES", "ADJECTIVES", "CITIES", "KIND", "METRIC", "NEEDLES", "NOUNS", "REFERENCE_DEPTHS",
           "ROUGE_RULES", "TEMPLATES", "NiahBatch", "NiahExample", "NiahSource", "NiahSpec", "NiahTask", "Template",
           "chat_template_source", "check_positions", "exact_match",
           "find_needle_idx", "generate", "is_niah", "make_needle", "niah_batches", "niah_task", "niah_task_yaml",
           "offline_haystack", "render", "rouge1_recall", "ruler_examples", "stop_ids"]
