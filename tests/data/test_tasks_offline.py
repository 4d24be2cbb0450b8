"""The offline data: fetching (checksums, no-network errors) and the offline tasks.

Tests marked ``offline_data`` need ``headcount data fetch`` to have run (``make test`` runs it
first); they are skipped only when the data is not there. The others need nothing.
"""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from headcount.data.tasks import get_task, is_fetched, offline
from headcount.data.tasks.offline import offline_corpus, vader_dir
from headcount.data.tasks.offline_fetch import VADER_ARCHIVE, fetch
from headcount.runtime.errors import HeadcountError

needs_data = pytest.mark.skipif(not is_fetched(), reason="offline data not fetched: run `headcount data fetch`")

#: the documented split sizes (README and `headcount tasks`): train, validation, test
SIZES = {
    "offline/movies": (8043, 982, 1045),
    "offline/movies-rating": (8481, 1021, 1101),
    "offline/amazon": (2396, 302, 279),
    "offline/nyt": (2317, 326, 287),
    "offline/tweets": (2754, 308, 370),
    "offline/fine-foods": (3575, 397, 1000),
    "offline/pairs": (8043, 982, 1045),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))


def test_documented_sizes_are_the_registered_ones():
    for name, sizes in SIZES.items():
        assert tuple(get_task(name).sizes.values()) == sizes, name
    assert set(SIZES) == {n for n in offline.OFFLINE_TASKS}


def test_not_fetched_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_DATA", str(tmp_path / "empty"))
    offline.clear_caches()
    with pytest.raises(HeadcountError, match="headcount data fetch") as e:
        get_task("offline/movies").load("train")
    assert str(tmp_path / "empty") in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(HeadcountError, match="headcount data fetch"):
        get_task("offline/fine-foods").load("test")
    offline.clear_caches()


def test_no_network_gives_one_line_with_the_command(tmp_path, monkeypatch):
    def pip_without_network(cmd, **kw):
        assert cmd[1:4] == ["-m", "pip", "download"] and "vadersentiment==3.3.2" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: Retrying ...\nERROR: Could not find a version "
                                                         "that satisfies the requirement vadersentiment==3.3.2\n")

    monkeypatch.setattr(subprocess, "run", pip_without_network)
    with pytest.raises(HeadcountError) as e:
        fetch(tmp_path / "data")
    msg = str(e.value)
    assert "\n" not in msg and "no network?" in msg
    assert "pip download --no-deps --no-binary :all: vadersentiment==3.3.2" in msg and "--archive" in msg


def test_fetch_rejects_an_archive_with_the_wrong_checksum(tmp_path):
    bad = tmp_path / VADER_ARCHIVE
    bad.write_bytes(b"not the archive")
    with pytest.raises(HeadcountError, match="not the vadersentiment==3.3.2 source archive"):
        fetch(tmp_path / "data", archive=bad)


def test_cli_fetch_error_is_one_line(tmp_path, capsys, monkeypatch):
    from headcount.cli.app import main

    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "ERROR: x\n"))
    with pytest.raises(SystemExit) as e:
        main(["data", "fetch", "--dir", str(tmp_path / "d")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: could not download")


# --------------------------------------------------------------------------- with the data
@pytest.mark.offline_data
@needs_data
def test_fetch_from_a_local_archive_checks_everything(tmp_path):
    """Re-fetch into a new folder from the already fetched archive: no network, same checksums."""
    archive = vader_dir() / VADER_ARCHIVE
    if not archive.is_file():
        pytest.skip("the fetched archive was removed")
    lines = []
    out = fetch(tmp_path / "copy", archive=archive, log=lines.append)
    assert out["downloaded"] is False and len(out["files"]) == 6
    assert (tmp_path / "copy" / "MANIFEST.json").is_file()
    assert any("vader ground truth" in line for line in lines)
    assert is_fetched(tmp_path / "copy")


@pytest.mark.offline_data
@needs_data
@pytest.mark.parametrize("name", list(SIZES))
def test_offline_task_sizes_and_labels(name):
    task = get_task(name)
    sizes = {s: len(task.load(s)) for s in task.splits()}
    assert tuple(sizes.values()) == SIZES[name]
    train = task.load("train")
    assert len(train.texts[0]) == len(task.text_fields)
    assert all(isinstance(t, str) and t for ex in train.texts[:50] for t in ex)
    if task.kind == "regression":
        assert train.labels.dtype == np.float32 and -4 <= train.labels.min() < 0 < train.labels.max() <= 4
    else:
        counts = np.bincount(train.labels, minlength=task.num_labels)
        assert (counts > 0.25 * len(train)).all()  # no class is rare
    # splits are disjoint
    first = {ex[0] for ex in train.texts}
    assert not first & {ex[0] for ex in task.load("test").texts}


@pytest.mark.offline_data
@needs_data
def test_offline_rules():
    movies, rating = get_task("offline/movies"), get_task("offline/movies-rating")
    # the first line of the movie file: rating 2.27 -> positive, in the same split in both tasks
    first = "The Rock is destined to be the 21st Century's new ''Conan''"
    where = [s for s in movies.splits() if any(t[0].startswith(first) for t in movies.load(s).texts)]
    assert len(where) == 1
    data = movies.load(where[0])
    i = next(i for i, t in enumerate(data.texts) if t[0].startswith(first))
    assert movies.labels[data.labels[i]] == "positive"
    r = rating.load(where[0])
    j = next(i for i, t in enumerate(r.texts) if t[0].startswith(first))
    assert r.labels[j] == pytest.approx(2.2667, abs=1e-3)
    # near-neutral ratings are only in the regression task
    neutral = [t for t, y in zip(r.texts, r.labels) if abs(y) < 0.5]
    assert neutral and not set(neutral) & set(data.texts)
    # pairs: label = same polarity of the two movie sentences
    polarity = {t[0]: y for s in movies.splits() for t, y in zip(movies.load(s).texts, movies.load(s).labels)}
    pairs = get_task("offline/pairs").load("validation")
    for (a, b), y in zip(pairs.texts[:200], pairs.labels[:200]):
        assert y == int(polarity[a] == polarity[b])
    # the MLM corpus holds no validation or test sentence of any offline task
    corpus = set(offline_corpus())
    assert len(corpus) > 15000
    for split in ("validation", "test"):
        assert not corpus & {t[0] for t in movies.load(split).texts}
        assert not corpus & {t[0] for t in get_task("offline/fine-foods").load(split).texts}


@pytest.mark.offline_data
@needs_data
def test_offline_loading_is_fast_and_pairs_have_token_types(monkeypatch):
    """Fast: every offline train split from the files reads and checks each file once (the work,
    asserted here; its time is in bench/bench_timing_targets.py)."""
    from headcount.core.models import load_tokenizer
    from headcount.data.tasks import base, encode, make_batches

    get_task("offline/pairs").load("train")  # first time: parse and check
    offline.clear_caches()
    base._CACHE.clear()
    hashed, sha256_file = [], offline.sha256_file
    monkeypatch.setattr(offline, "sha256_file", lambda path: hashed.append(str(path)) or sha256_file(path))
    for name in SIZES:
        assert len(get_task(name).load("train")) == SIZES[name][0]
    # 7 tasks from 6 files (4 VADER ground-truth sets, 2 fine-food files): each read and checked once
    assert len(hashed) == len(set(hashed)) == len(offline.GROUND_TRUTH) + len(offline.FINE_FOODS) == 6
    tok = load_tokenizer("offline")
    enc = encode(get_task("offline/pairs").load("validation", max_examples=64), tok, max_length=64)
    batch = make_batches(enc, 64, pad_token_id=tok.pad_token_id)[0]
    assert batch["token_type_ids"].max() == 1 and batch["input_ids"].shape[0] == 64
