"""A GGUF conversion is checked before every use (``headcount.core.gguf.check_conversion``).

Its ``gguf-source.json`` records the size and SHA-256 of every file it wrote; a load compares
them. An edited tensor (size and mtime restored), a file replaced by a link to (or a copy of)
another model's conversion, a file added or removed, a record without digests: converted again,
with one ``note:`` line, and the model loaded is the file's own. A link out of the cache folder
is refused with one ``error:`` line and left as it is. An unchanged conversion is not read again
(its digests are looked up by path, size, mtime, inode and ctime).

These read tiny GGUF files with transformers' own reader (~1 s each).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import transformers
from cli_helpers import assert_one_error_line, run_cli
from gguf_files import write_gguf

from headcount.core import gguf
from headcount.core.models import load_model
from headcount.runtime import digests
from headcount.runtime.errors import HeadcountError


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Two tiny GGUF files of the same shapes (other weights), each converted once into a template
    cache, and the weights transformers reads from each file directly."""
    root = tmp_path_factory.mktemp("gguf-integrity")
    files = [write_gguf(root / f"m{i}.gguf", seed=i) for i in (0, 1)]
    want = [transformers.AutoModelForCausalLM.from_pretrained(root, gguf_file=f.name).state_dict() for f in files]
    old = os.environ.get("HEADCOUNT_CACHE")
    os.environ["HEADCOUNT_CACHE"] = str(root / "template")
    try:
        folders = [gguf.convert_gguf(f)[0] for f in files]
    finally:
        os.environ.pop("HEADCOUNT_CACHE") if old is None else os.environ.__setitem__("HEADCOUNT_CACHE", old)
    return root, files, want, [f.name for f in folders]


@pytest.fixture
def cache(made, tmp_path, monkeypatch):
    """A fresh copy of the template cache as ``$HEADCOUNT_CACHE``: ``(files, want, folders)``."""
    root, files, want, names = made
    shutil.copytree(root / "template", tmp_path / "cache")
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    return files, want, [tmp_path / "cache" / "gguf" / n for n in names]


def reads(monkeypatch) -> list:
    """Every read of a GGUF file by transformers' model reader (a conversion, or a load from the file)."""
    seen = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*a, **kw):
        if kw.get("gguf_file"):
            seen.append(kw["gguf_file"])
        return original(*a, **kw)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    return seen


def same(model, want: dict) -> bool:
    got = model.state_dict()
    return set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note: the GGUF conversion")]


def test_the_record_lists_every_file_with_its_size_and_sha256(cache):
    _, _, (folder, _) = cache
    record = json.loads((folder / gguf.SOURCE).read_text())
    on_disk = {p.name for p in folder.iterdir()} - {gguf.SOURCE}
    assert set(record["files"]) == on_disk and {"config.json", "model.safetensors", "tokenizer.json"} <= on_disk
    for name, entry in record["files"].items():
        assert entry == {"size": (folder / name).stat().st_size, "sha256": digests.sha256_file(folder / name)}


def test_an_unchanged_conversion_is_loaded_and_not_hashed_again(cache, monkeypatch, capsys):
    files, want, (folder, _) = cache
    seen = reads(monkeypatch)
    assert same(load_model(str(files[0]), head="lm"), want[0]) and seen == []
    hashed = []
    monkeypatch.setattr(digests, "sha256_file", lambda p: hashed.append(p) or pytest.fail("hashed again"))
    assert gguf.check_conversion(folder, gguf.file_sha256(files[0])) is None
    assert hashed == [] and not notes(capsys.readouterr().err)


@pytest.mark.parametrize("restore_mtime", [False, True])
def test_an_edited_tensor_is_converted_again_with_one_line(cache, monkeypatch, capsys, restore_mtime):
    files, want, (folder, _) = cache
    f = folder / "model.safetensors"
    st = f.stat()
    with open(f, "r+b") as fh:  # one float of the last tensor: same size, other weights
        fh.seek(st.st_size - 4)
        fh.write(b"\x00\x00\x80\x7f")
    if restore_mtime:
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    seen = reads(monkeypatch)
    capsys.readouterr()
    model = load_model(str(files[0]), head="lm")
    err = capsys.readouterr().err
    assert notes(err) == [f"note: the GGUF conversion {folder} has a model.safetensors that changed since it was "
                          f"written (another SHA-256): converting m0.gguf again (the cache is rebuildable)"], err
    assert same(model, want[0]) and seen == ["m0.gguf"]
    assert gguf.find_converted(files[0]) == folder  # whole again: the next load uses it
    load_model(str(files[0]), head="lm")
    assert seen == ["m0.gguf"] and not notes(capsys.readouterr().err)


@pytest.mark.parametrize("how", ["link", "copy"])
def test_a_file_replaced_by_another_models_is_converted_again(cache, capsys, how):
    files, want, (folder, other) = cache
    f = folder / "model.safetensors"
    assert f.stat().st_size == (other / "model.safetensors").stat().st_size  # same shapes: only digests tell
    f.unlink()
    if how == "link":
        f.symlink_to(other / "model.safetensors")
    else:
        shutil.copy2(other / "model.safetensors", f)
    capsys.readouterr()
    assert same(load_model(str(files[0]), head="lm"), want[0])
    assert len(notes(capsys.readouterr().err)) == 1
    assert not f.is_symlink() and (other / "model.safetensors").is_file()  # the other conversion untouched
    assert gguf.find_converted(files[1]) == other


def test_a_folder_replaced_by_a_link_to_another_conversion_is_converted_again(cache, capsys):
    files, want, (folder, other) = cache
    shutil.rmtree(folder)
    folder.symlink_to(other)
    capsys.readouterr()
    assert same(load_model(str(files[0]), head="lm"), want[0])
    assert notes(capsys.readouterr().err)[0].startswith(f"note: the GGUF conversion {folder} is a link (to {other})")
    assert folder.is_dir() and not folder.is_symlink() and gguf.find_converted(files[1]) == other


@pytest.mark.parametrize("change", ["added", "removed", "no digests", "other source"])
def test_a_conversion_that_is_not_what_was_written_is_converted_again(cache, capsys, change):
    files, want, (folder, _) = cache
    record = folder / gguf.SOURCE
    doc = json.loads(record.read_text())
    if change == "added":  # a file transformers would read besides the conversion's own
        (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    elif change == "removed":
        (folder / "tokenizer.json").unlink()
    elif change == "no digests":  # what headcount before this check wrote
        del doc["files"]
        record.write_text(json.dumps(doc))
    else:
        doc["sha256"] = "0" * 64
        record.write_text(json.dumps(doc))
    capsys.readouterr()
    assert same(load_model(str(files[0]), head="lm"), want[0])
    line, = notes(capsys.readouterr().err)
    assert {"added": "holds model.safetensors.index.json, which the conversion did not write",
            "removed": "lacks tokenizer.json", "no digests": "records no digests",
            "other source": "records another GGUF file"}[change] in line
    assert gguf.find_converted(files[0]) == folder


@pytest.mark.parametrize("what", ["file", "folder", "added"])
def test_a_link_out_of_the_cache_is_refused_and_left_alone(cache, tmp_path, capsys, what):
    """Refused whatever else is wrong with the conversion ("added": a link under a name the
    conversion did not write, beside an edited config.json), never followed or removed."""
    files, _, (folder, _) = cache
    outside = tmp_path / "elsewhere"
    shutil.copytree(folder, outside)  # the very bytes of the conversion: refused all the same
    link = {"file": folder / "model.safetensors", "folder": folder, "added": folder / "extra.safetensors"}[what]
    if what == "file":
        link.unlink()
        link.symlink_to(outside / "model.safetensors")
    elif what == "added":
        (folder / "config.json").write_text("{}")
        link.symlink_to(outside / "model.safetensors")
    else:
        shutil.rmtree(folder)
        folder.symlink_to(outside)
    before = {p.name: p.read_bytes() for p in outside.iterdir()}
    with pytest.raises(HeadcountError, match=f"{link} is a link out of the GGUF cache"):
        load_model(str(files[0]), head="lm")
    code, out, err = run_cli(capsys, "info", "--model", files[0])
    assert_one_error_line(code, err)
    assert "is a link out of the GGUF cache" in err and not out
    assert link.is_symlink() and {p.name: p.read_bytes() for p in outside.iterdir()} == before


def test_headcount_info_on_an_edited_conversion_says_so_in_one_line(cache, capsys):
    files, _, (folder, _) = cache
    with open(folder / "model.safetensors", "r+b") as fh:
        fh.seek(-4, os.SEEK_END)
        fh.write(b"\x01\x02\x03\x04")
    code, out, err = run_cli(capsys, "info", "--model", files[0])
    assert code == 0 and "layers: 2" in out
    # one note says why; the rest is the reconversion's progress (a few plain lines off a terminal)
    others = [line for line in err.splitlines() if line.strip() and line not in notes(err)]
    assert len(notes(err)) == 1 and all("GGUF" in line and "\r" not in line for line in others), err
    assert len(others) <= 5, err
