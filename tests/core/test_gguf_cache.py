"""GGUF conversions (``headcount.core.gguf``): read once into ``$HEADCOUNT_CACHE/gguf/``, then
loaded from there; keyed by the file's contents. transformers' GGUF reader is replaced by a tiny
decoder here (the real file's conversion is checked against its own tensors in
tests/core/test_offline_decoder.py)."""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import tiny_model
from gguf_files import write_gguf

from headcount.core import gguf
from headcount.core.models import load_model
from headcount.runtime.errors import HeadcountError


class _Tokenizer:
    """What convert_gguf asks of a tokenizer: save_pretrained."""

    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A tiny GGUF file (it passes check_gguf), and a GGUF reader that returns a tiny Llama for it
    (counting reads) instead of reading it."""
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    write_gguf(path)
    model = tiny_model("llama", head="lm")
    reads = []

    def read_model(folder, gguf_file=None, **kw):
        if gguf_file is None:  # a plain folder: the real loader
            return original(folder, **kw)
        reads.append(gguf_file)
        return model

    original = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", read_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda folder, gguf_file=None, **kw: _Tokenizer())
    return path, model, reads


def test_a_conversion_is_made_once_and_then_loaded_from(fake):
    path, model, reads = fake
    assert gguf.find_converted(path) is None
    # a reader of the config alone takes the file itself and converts nothing
    assert gguf.gguf_source(str(path), convert=False) == (str(path.parent), {"gguf_file": "tiny.gguf"})
    assert reads == [] and gguf.find_converted(path) is None
    folder, now = gguf.convert_gguf(path)
    assert now and reads == ["tiny.gguf"]
    assert {"config.json", "model.safetensors", "tokenizer.json", gguf.SOURCE} <= {p.name for p in folder.iterdir()}
    assert gguf.gguf_source(str(path)) == (str(folder), {})
    assert gguf.convert_gguf(path) == (folder, False) and reads == ["tiny.gguf"]  # not read again
    # nothing but the finished folder (and the conversion's lock file) is left in the cache
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted([folder.name, f".{folder.name}.lock"])
    loaded = load_model(str(path), head="lm")
    assert reads == ["tiny.gguf"]  # loaded from the conversion
    want = model.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_an_edited_file_is_not_read_from_its_old_conversion(fake):
    path, _, _ = fake
    folder, _ = gguf.convert_gguf(path)
    write_gguf(path, seed=1)
    assert gguf.find_converted(path) is None and gguf.converted_dir(path) != folder
    assert gguf.gguf_source(str(path), convert=False)[1] == {"gguf_file": "tiny.gguf"}


def test_another_transformers_reads_the_file_again(fake, monkeypatch):
    path, _, _ = fake
    gguf.convert_gguf(path)
    monkeypatch.setattr(gguf, "reader_version", lambda: "0.0.0-other")
    assert gguf.find_converted(path) is None


def test_a_file_that_does_not_parse_is_one_line_and_leaves_nothing(fake, monkeypatch):
    path, _, _ = fake

    def broken(folder, gguf_file=None, **kw):
        raise ValueError("unknown tensor type 99\nmore")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", broken)
    with pytest.raises(HeadcountError, match=r"cannot read GGUF file .*ValueError: unknown tensor type 99$"):
        gguf.convert_gguf(path)
    folder = gguf.converted_dir(path)
    assert [p.name for p in folder.parent.iterdir()] == [f".{folder.name}.lock"]


def test_an_unwritable_cache_is_one_line(fake, tmp_path, monkeypatch):
    path, _, _ = fake
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("HEADCOUNT_CACHE", str(blocker))
    with pytest.raises(HeadcountError, match="cannot write the GGUF conversion"):
        gguf.convert_gguf(path)
    assert blocker.read_text().startswith("a file")


def test_data_fetch_reads_the_offline_decoder_once(fake, monkeypatch):
    """``headcount data fetch``'s decoder line: read into the cache the first time, found after."""
    from headcount.core import offline_models

    path, _, reads = fake
    monkeypatch.setattr(offline_models, "offline_decoder_file", lambda: path)
    first = offline_models.offline_decoder_status(convert=True)
    assert "read once into" in first and str(gguf.converted_dir(path)) in first and reads == ["tiny.gguf"]
    assert "converted: " in offline_models.offline_decoder_status(convert=True) and reads == ["tiny.gguf"]
    assert "\n" not in offline_models.offline_decoder_status()  # without convert: the one line it always was


def test_a_killed_conversions_leftovers_are_removed_and_nothing_else(fake):
    """A conversion killed midway leaves its marked temporary folder: the next conversion (which
    holds the lock, so no live conversion owns it) removes it, and the empty one a kill right after
    ``mkdtemp`` leaves; a folder of the same pattern without the mark is somebody's: kept whole."""
    path, _, _ = fake
    folder = gguf.converted_dir(path)
    folder.parent.mkdir(parents=True)
    dead = folder.parent / f".{folder.name}.dead1234"
    dead.mkdir()
    (dead / gguf.PARTIAL).write_text("killed\n")
    (dead / "model.safetensors").write_bytes(b"\x00" * 1024)
    empty = folder.parent / f".{folder.name}.empty123"
    empty.mkdir()
    users = folder.parent / f".{folder.name}.mine"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    assert gguf.convert_gguf(path) == (folder, True)
    assert not dead.exists() and not empty.exists()
    assert (users / "notes.txt").read_text() == "mine"
    assert not (folder / gguf.PARTIAL).exists()


def test_a_second_conversion_waits_for_the_first_and_reuses_it(fake):
    """While one conversion holds the lock another waits, then finds the folder done (not read twice)."""
    import threading

    from headcount.runtime.lock import lock_file, unlock_file

    path, _, reads = fake
    folder = gguf.converted_dir(path)
    folder.parent.mkdir(parents=True)
    fd = lock_file(folder.parent, "a test holding it", name=f".{folder.name}.lock")
    result = []
    waiter = threading.Thread(target=lambda: result.append(gguf.convert_gguf(path)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and reads == []  # blocked on the lock
    gguf._convert(path, folder, gguf.file_sha256(path))  # what the holder does
    unlock_file(fd)
    waiter.join(10)
    assert result == [(folder, False)] and reads == ["tiny.gguf"]


def test_a_full_disk_while_writing_is_one_line_and_leaves_no_conversion(fake, monkeypatch):
    """ENOSPC while the tokenizer is written (after the weights): one line naming it, the temporary
    folder removed, no conversion in place (tests/core/test_gguf_processes.py fills a real tmpfs)."""
    import errno

    path, _, _ = fake

    def full(self, folder):
        (folder / "tokenizer.json").write_text('{"half')
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_Tokenizer, "save_pretrained", full)
    with pytest.raises(HeadcountError, match=r"cannot write the GGUF conversion .*: No space left on device$"):
        gguf.convert_gguf(path)
    folder = gguf.converted_dir(path)
    assert [p.name for p in folder.parent.iterdir()] == [f".{folder.name}.lock"]
    assert gguf.find_converted(path) is None
    assert gguf.gguf_source(str(path)) == (str(path.parent), {"gguf_file": "tiny.gguf"})
