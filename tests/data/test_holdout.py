"""A task YAML's ``holdout: {fraction, seed}``: a validation split held out of a single train file
(headcount.data.tasks.base.Holdout): deterministic for a seed, disjoint from train, together the
whole file, recorded in the task's description and fingerprint; and the error of a task without a
validation split, which says how to declare one."""

from __future__ import annotations

import numpy as np
import pytest

from headcount.data.fingerprint import task_fingerprint
from headcount.data.tasks import get_task
from headcount.data.tasks.base import holdout_indices
from headcount.runtime.errors import HeadcountError

ROWS = 40


def _write(folder, holdout: str | None = "{fraction: 0.2, seed: 0}", files: str = "{train: reviews.csv}",
           name: str = "task.yaml"):
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["text,label"] + [f"review number {i},{'positive' if i % 3 else 'negative'}" for i in range(ROWS)]
    (folder / "reviews.csv").write_text("\n".join(lines) + "\n")
    (folder / "dev.csv").write_text("text,label\nfine,positive\nbad,negative\n")
    text = f"name: reviews\nfiles: {files}\ntext: [text]\nlabel: label\n"
    if holdout is not None:
        text += f"holdout: {holdout}\n"
    (folder / name).write_text(text)
    return folder / name


def _reference(n: int, fraction: float, seed: int) -> set[int]:
    """The rule as the docs state it: the first round(fraction * n) of a default_rng(seed) permutation."""
    return set(np.random.default_rng(seed).permutation(n)[:round(fraction * n)].tolist())


def _numbers(data) -> list[int]:
    return [int(t[0].rsplit(" ", 1)[1]) for t in data.texts]


def test_holdout_splits_one_file_in_two_disjoint_parts_that_cover_it(tmp_path):
    task = get_task(str(_write(tmp_path / "a")))
    assert task.splits() == ["train", "validation"] and task.validation_split == "validation"
    train, dev = task.load("train"), task.load("validation")
    assert (len(train), len(dev)) == (32, 8)
    held, kept = _numbers(dev), _numbers(train)
    assert set(held) & set(kept) == set() and sorted(held + kept) == list(range(ROWS))
    assert set(held) == _reference(ROWS, 0.2, 0)
    assert held == sorted(held) and kept == sorted(kept)  # each part keeps the file's order
    # the labels travel with their rows
    assert [task.labels[y] for y in dev.labels] == ["positive" if i % 3 else "negative" for i in held]


def test_the_same_seed_gives_the_same_split_another_seed_another(tmp_path):
    first = _numbers(get_task(str(_write(tmp_path / "a"))).load("validation"))
    again = _numbers(get_task(str(_write(tmp_path / "b"))).load("validation"))
    other = _numbers(get_task(str(_write(tmp_path / "c", "{fraction: 0.2, seed: 7}"))).load("validation"))
    assert first == again and first != other
    assert set(other) == _reference(ROWS, 0.2, 7)
    kept, out = holdout_indices(ROWS, 0.25, 3)
    kept2, out2 = holdout_indices(ROWS, 0.25, 3)
    assert np.array_equal(kept, kept2) and np.array_equal(out, out2) and len(out) == 10


def test_the_fraction_and_seed_are_recorded_in_the_description_and_fingerprint(tmp_path):
    task = get_task(str(_write(tmp_path / "a")))
    assert task.describe()["holdout"] == {"split": "validation", "of": "train", "fraction": 0.2, "seed": 0}
    seeds = {task_fingerprint(get_task(str(_write(tmp_path / d, f"{{fraction: 0.2, seed: {s}}}"))))
             for d, s in (("b", 0), ("c", 1))}
    fractions = task_fingerprint(get_task(str(_write(tmp_path / "d", "{fraction: 0.3, seed: 0}"))))
    plain = get_task(str(_write(tmp_path / "e", None, files="{train: reviews.csv, validation: dev.csv}")))
    assert len(seeds) == 2 and fractions not in seeds and None not in seeds
    assert "holdout" not in plain.describe()  # tasks without one describe (and fingerprint) as before


def test_labels_are_inferred_from_the_whole_file(tmp_path):
    folder = tmp_path / "a"
    _write(folder)
    # a label that only a held-out row has is still one of the task's labels
    held = sorted(_reference(ROWS, 0.2, 0))
    lines = ["text,label"] + [f"review number {i},{'rare' if i == held[0] else 'common' if i % 2 else 'other'}"
                              for i in range(ROWS)]
    (folder / "reviews.csv").write_text("\n".join(lines) + "\n")
    task = get_task(str(folder / "task.yaml"))
    assert task.labels == ("common", "other", "rare")
    assert "rare" not in {task.labels[y] for y in task.load("train").labels}


def test_a_bad_row_is_named_by_its_row_in_the_file(tmp_path):
    folder = tmp_path / "a"
    path = _write(folder)
    path.write_text(path.read_text() + "labels: [negative, positive]\n")
    lines = (folder / "reviews.csv").read_text().splitlines()
    lines[5] = "review number 4,neutral"  # the file's row 5, wherever the holdout puts it
    (folder / "reviews.csv").write_text("\n".join(lines) + "\n")
    for split in ("train", "validation"):
        with pytest.raises(HeadcountError, match="row 5: label 'neutral' is not one of: negative, positive"):
            get_task(str(path)).load(split)


@pytest.mark.parametrize("holdout, files, needle", [
    ("0.2", "{train: reviews.csv}", "`holdout` must be {fraction: F, seed: S}"),
    ("{fraction: 1.5}", "{train: reviews.csv}", "holdout.fraction must be a number between 0 and 1"),
    ("{fraction: 0.2, seed: -1}", "{train: reviews.csv}", "holdout.seed must be an integer"),
    ("{fraction: 0.2, sed: 1}", "{train: reviews.csv}", "`holdout` must be"),
    ("{fraction: 0.2}", "{train: reviews.csv, validation: dev.csv}", "keep one of them"),
    ("{fraction: 0.2}", "{all: reviews.csv}", "takes its rows from the train split 'train'"),
    ("{fraction: 0.001}", "{train: reviews.csv}", "leaves no row held out; choose a fraction between 0.025"),
])
def test_bad_holdouts_are_refused_in_one_line(tmp_path, holdout, files, needle):
    path = _write(tmp_path / "a", holdout, files=files)
    with pytest.raises(HeadcountError) as e:
        get_task(str(path)).load("validation")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_task_without_a_validation_split_says_how_to_declare_one(tmp_path):
    path = _write(tmp_path / "a", None)
    task = get_task(str(path))
    assert task.load("train") is not None  # scoring on train works
    with pytest.raises(HeadcountError) as e:
        task.load("validation")
    msg = str(e.value)
    assert msg.startswith("task reviews has no split 'validation' (the split it is evaluated on); splits: train; "
                          f"declare it in {path}: `files: {{train: reviews.csv, validation: FILE}}`")
    assert "holdout: {fraction: 0.2, seed: 0}" in msg
