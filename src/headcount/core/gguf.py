"""GGUF files: what loads them, and their conversions to plain checkpoints (read once, then reused).

transformers reads a GGUF file (``from_pretrained(folder, gguf_file=name)``) by parsing it and
dequantising every tensor to float32: ~20 s for the 98 MB offline decoder on 2 CPU cores (2.5
min and 3.4 GB of memory for the 253 MB Gemma 3 270M file), and the config and the tokenizer
parse it again.
[`convert_gguf`][headcount.core.gguf.convert_gguf] does that once and saves the result as a
checkpoint folder (``config.json``, ``model.safetensors``, the tokenizer) under
``$HEADCOUNT_CACHE/gguf/<sha256>-transformers-<v>/``; [`gguf_source`][headcount.core.gguf.gguf_source],
which every loader of a model, tokenizer or config goes through, then loads from that folder,
which holds the same float32 tensors (about 1 s). The folder is keyed by the file's contents and
transformers' version (its dequantisation and name mapping could change), so an edited file or
another transformers is read from the GGUF file again.

Any GGUF file a command loads is converted the first time (``headcount data fetch`` converts the
offline decoder ahead), after one ``note:`` line on stderr that says where and about how much it
takes: 4 bytes (float32) per parameter of the header's tensors (read without the tensor data,
``headcount.core.gguf_header``) plus the tokenizer; a 7B file's conversion takes ~28 GB. A
conversion the disk has no room for is not started. ``HEADCOUNT_GGUF_CACHE=off``
(``headcount.runtime.paths``) switches this off: every load reads the GGUF file and nothing is
written. A cache that cannot be written (read-only, full, not a folder) is not an error: the
file is read itself, with one ``note:`` line per process. A command that reads only the config
(``headcount kv-budget``) uses a conversion when there is one and never makes one.

A conversion is checked before every use ([`check_conversion`][headcount.core.gguf.check_conversion]):
``gguf-source.json`` records the size and SHA-256 of every file it wrote, and a load compares them
(the SHA-256 is cached by path, size, mtime, inode and ctime, so a check of an unchanged folder
costs a ``stat`` per file; an edited file, a missing or an added one is hashed or found at once).
A conversion that is not what was written (an edited tensor, a file replaced by a link to another
conversion, one written by an older headcount without digests) is converted again, with one
``note:`` line on stderr; a link out of the cache folder is refused (one line), never followed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import transformers

from headcount.core.gguf_header import read_header
from headcount.core.layout_check import check_gguf_layout
from headcount.runtime.digests import file_sha256
from headcount.runtime.errors import HeadcountError
from headcount.runtime.lock import lock_file, unlock_file
from headcount.runtime.paths import GGUF_CACHE_ENV, cache_root, gguf_cache_on, sha256_file
from headcount.runtime.progress import tqdm_lines

INSTALL_GGUF = "pip install gguf accelerate"
#: the file a finished conversion holds last (the folder appears by one rename: it is whole or absent)
SOURCE = "gguf-source.json"
#: the file a conversion writes first into its temporary folder: what marks a folder left by a
#: killed conversion as headcount's to remove (a folder without it is never emptied)
PARTIAL = ".headcount-partial"
#: bytes of the converted tokenizer per token of the vocabulary (``tokenizer.json``, indented, holds
#: each token with its id, and the merges): 72 for the offline decoder (3.5 MB), 127 for Gemma 3
#: (33 MB); the larger, so that the estimate a conversion is refused by is not short
TOKENIZER_BYTES_PER_TOKEN = 128


class CacheNotWritten(HeadcountError):
    """A conversion could not be written (the cache is read-only, full, or not a folder):
    [`gguf_source`][headcount.core.gguf.gguf_source] then reads the GGUF file itself, with one note."""


#: the conversions (their folders) this process could not write: read from the GGUF file, noted once
_NOT_WRITTEN: set[str] = set()


def is_gguf(path) -> bool:
    return str(path).endswith(".gguf")


def check_gguf(path: Path) -> Path:
    """A GGUF file must exist, start with the magic ``GGUF``, the readers must be installed, and
    its header must parse and hold the tensors of the layout it declares
    (``headcount.core.layout_check.check_gguf_layout``: before anything is built)."""
    if not path.is_file():
        raise HeadcountError(f"GGUF file not found: {path}")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise HeadcountError(f"cannot read GGUF file {path}: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise HeadcountError(f"{path} is not a GGUF file (it does not start with the GGUF magic)")
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise HeadcountError(f"reading GGUF files needs {' and '.join(missing)}: run `{INSTALL_GGUF}` "
                             "(or `pip install 'headcount[offline]'`)")
    check_gguf_layout(path)
    return path


def reader_version() -> str:
    """The version of what reads GGUF files (transformers): part of a conversion's key."""
    return transformers.__version__


def converted_dir(path: str | os.PathLike) -> Path:
    """Where the conversion of GGUF file ``path`` is (or would be) kept."""
    return cache_root() / "gguf" / f"{file_sha256(Path(path))[:24]}-transformers-{reader_version()}"


def find_converted(path: str | os.PathLike) -> Path | None:
    """The finished conversion of ``path`` when it is whole, or None (not converted, for another
    transformers, or not what was written: [`convert_gguf`][headcount.core.gguf.convert_gguf] makes it again).

    Raises:
        HeadcountError: the conversion (or a file in it) is a link out of the cache folder.
    """
    try:
        folder, digest = converted_dir(path), file_sha256(Path(path))
    except OSError:
        return None
    return folder if os.path.lexists(folder) and check_conversion(folder, digest) is None else None


def gguf_source(path: str, convert: bool = True) -> tuple[str, dict]:
    """What ``from_pretrained`` loads ``path`` from: for a GGUF file its conversion and ``{}``
    (made by [`convert_gguf`][headcount.core.gguf.convert_gguf] the first time: checked, and made
    again when it is not whole), or ``(folder, {"gguf_file": name})``, the file itself, when
    ``HEADCOUNT_GGUF_CACHE=off`` or the conversion cannot be written (one note, once per process);
    ``(path, {})`` for anything else.

    ``convert``: False for a caller that reads the config alone (``headcount kv-budget``): the
    conversion when there is a whole one, else the file (no model's worth of weights written for it).
    """
    if not (is_gguf(path) and Path(path).is_file()):
        return path, {}
    direct = str(Path(path).parent), {"gguf_file": Path(path).name}
    if not gguf_cache_on():
        return direct
    if not convert:
        found = find_converted(path)
        return (str(found), {}) if found is not None else direct
    try:
        key = str(converted_dir(path))
    except OSError:
        return direct  # the file cannot be read: loading it says why
    if key in _NOT_WRITTEN:
        return direct
    try:
        return str(convert_gguf(path)[0]), {}
    except CacheNotWritten as e:
        _NOT_WRITTEN.add(key)
        print(f"note: {e}; reading {Path(path).name} itself instead (every load parses it again; "
              f"{GGUF_CACHE_ENV}=off does so without trying)", file=sys.stderr)
        return direct


def conversion_bytes(path: str | os.PathLike) -> tuple[int, int]:
    """About what the conversion of GGUF file ``path`` takes on disk, from its header alone:
    ``(weights, tokenizer)`` bytes: 4 (float32) per parameter of its tensors, and
    ``TOKENIZER_BYTES_PER_TOKEN`` per token of its vocabulary."""
    header = read_header(path)
    tokens = header.metadata.get("tokenizer.ggml.tokens")  # ("array", n): strings are counted, not kept
    n_tokens = tokens[1] if isinstance(tokens, tuple) else len(tokens) if isinstance(tokens, list) else 0
    return 4 * header.parameter_count(), TOKENIZER_BYTES_PER_TOKEN * n_tokens


def _size(n: int) -> str:
    """``n`` bytes for a person: ``1.1 GB``, ``538 MB``, ``75 KB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{n} bytes"


def check_conversion(folder: Path, digest: str) -> str | None:
    """None when ``folder`` is the whole conversion of the GGUF file whose SHA-256 is ``digest``;
    otherwise what is wrong with it, as a phrase (it is then converted again): a file missing,
    added, of another size or content than ``gguf-source.json`` records, a link inside the
    cache, a record without digests (an older headcount's).

    Raises:
        HeadcountError: the folder or one of its files is a link out of the cache folder.
    """
    try:
        return _check_conversion(folder, digest)
    except OSError as e:  # gone or replaced while it was read (another process converting it again)
        return f"could not be read ({e.strerror or e})"


def _check_conversion(folder: Path, digest: str) -> str | None:
    root = folder.parent
    if folder.is_symlink():
        return f"is a link (to {_inside_cache(folder, root)})"
    if not folder.is_dir():
        return "is not a folder"
    entries = sorted(folder.iterdir())
    for p in entries:  # links first, all of them: one out of the cache is refused, whatever else is wrong
        if p.is_symlink():
            return f"has a {p.name} that is a link (to {_inside_cache(p, root)})"
    record = folder / SOURCE
    try:
        doc = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"has no readable {SOURCE} (a conversion cut short)"
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not files:
        return f"records no digests of its files in {SOURCE} (an older headcount wrote it)"
    if doc.get("sha256") != digest or doc.get("transformers") != reader_version():
        return "records another GGUF file or transformers version"
    names = {p.name for p in entries} - {SOURCE, PARTIAL}
    added = sorted(names - set(files))
    if added:
        return f"holds {added[0]}, which the conversion did not write"
    for name, want in sorted(files.items()):
        if Path(name).name != name or name in ("", ".", "..", SOURCE) or not isinstance(want, dict):
            return f"has a {SOURCE} that lists {name!r}, not a file of the conversion"
        f = folder / name
        if not f.is_file():
            return f"lacks {name}"
        size = f.stat().st_size
        if size != want.get("size"):
            return f"has a {name} of {size} bytes, the conversion wrote {want.get('size')}"
        if file_sha256(f) != want.get("sha256"):
            return f"has a {name} that changed since it was written (another SHA-256)"
    return None


def _inside_cache(link: Path, root: Path) -> Path:
    """Where ``link`` leads, when that is inside the conversions' folder ``root``; refused otherwise."""
    target = link.resolve()
    try:
        target.relative_to(root.resolve())
    except ValueError:
        raise HeadcountError(f"{link} is a link out of the GGUF cache (to {target}); refusing to load it: "
                             f"remove {link} (the cache is rebuildable)") from None
    return target


def dequantised(model):
    """A model read from GGUF holds plain float tensors (transformers dequantises every weight) but
    stays flagged as quantised, which makes ``save_pretrained`` refuse it: drop the flag, so that a
    pruned copy saves as the float model it is."""
    model.hf_quantizer = None
    model.is_quantized = False  # (transformers' Trainer refuses a model flagged so: "purely quantized")
    if getattr(model, "quantization_method", None) is not None:
        del model.quantization_method
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    return model


def convert_gguf(path: str | os.PathLike) -> tuple[Path, bool]:
    """Read GGUF file ``path`` once (config, causal-LM weights dequantised to float32, tokenizer)
    and keep it as a checkpoint folder that [`gguf_source`][headcount.core.gguf.gguf_source] loads from.

    Before it writes it says, in one ``note:`` line on stderr, about how much it will take (4
    bytes per parameter of the header's tensors, plus the tokenizer) and where.

    Returns:
        ``(folder, converted_now)``: False when the conversion was there already.

    Raises:
        CacheNotWritten: the cache cannot be written (read-only, full, not a folder), or
            transformers cannot save what it read (one line).
        HeadcountError: the file does not read.
    """
    path = check_gguf(Path(path))
    folder = converted_dir(path)
    digest = file_sha256(path)
    if os.path.lexists(folder) and check_conversion(folder, digest) is None:
        return folder, False
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheNotWritten(f"cannot write the GGUF conversion under {folder.parent}: {e.strerror or e}") from None
    # one conversion of a file at a time (a second process waits, then finds it done); holding the
    # lock also means no other process is writing a temporary folder of this key: any left is dead
    try:
        fd = lock_file(folder.parent, f"converting {path.name}", name=f".{folder.name}.lock", wait=True)
    except HeadcountError as e:  # cannot create the lock file (a read-only cache), or it is not headcount's
        raise CacheNotWritten(f"cannot write the GGUF conversion under {folder.parent}: {e}") from None
    try:
        _remove_partials(folder)
        again = os.path.lexists(folder)
        if again:
            problem = check_conversion(folder, digest)
            if problem is None:
                return folder, False
            print(f"note: the GGUF conversion {folder} {problem}: converting {path.name} again "
                  "(the cache is rebuildable)", file=sys.stderr)
        _announce(path, folder, quiet=again)
        if again:
            _discard(folder)
        return _convert(path, folder, digest), True
    finally:
        unlock_file(fd)


def _announce(path: Path, folder: Path, quiet: bool = False) -> None:
    """Refuse a conversion the disk has no room for; else say (unless ``quiet``: converted
    again, which its own note says) what it will take and where."""
    weights, tokenizer = conversion_bytes(path)
    need = weights + tokenizer
    try:
        free = shutil.disk_usage(folder.parent).free
    except OSError:
        free = None
    if free is not None and need > free:
        raise CacheNotWritten(f"the GGUF conversion of {path.name} needs about {_size(need)}, and "
                              f"{folder.parent} has {_size(free)} free")
    if not quiet:
        print(f"note: converting {path.name} once to a float32 checkpoint of about {_size(need)} "
              f"({weights // 4:,} parameters x 4 bytes, plus a tokenizer of about {_size(tokenizer)}) in {folder}; "
              f"later loads read it ({GGUF_CACHE_ENV}=off: read the GGUF file every time, write nothing)",
              file=sys.stderr)


def _discard(folder: Path) -> None:
    """Remove a conversion that is not whole (under the conversion lock): marked as partial, then
    renamed to a temporary name, then removed; a kill on the way leaves the marked folder (found
    not whole again), an empty temporary one or a marked one (both removed by the next conversion)."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            folder.unlink()  # a link inside the cache (one out of it was refused) or a stray file
            return
        (folder / PARTIAL).write_text("a GGUF conversion that was not whole; removed\n")
        aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))  # empty: replaced
        os.replace(folder, aside)
    except OSError as e:
        raise CacheNotWritten(f"cannot remove the GGUF conversion {folder} that is not whole: "
                              f"{e.strerror or e}") from None
    shutil.rmtree(aside, ignore_errors=True)


def _remove_partials(folder: Path) -> None:
    """Remove the temporary folders that killed conversions of ``folder`` left (``.<name>.*`` holding
    :data:`PARTIAL`; an empty one, killed before it wrote that, is removed by ``rmdir``)."""
    for d in folder.parent.glob(f".{folder.name}.*"):
        if d.is_symlink() or not d.is_dir():
            continue
        if (d / PARTIAL).is_file():
            shutil.rmtree(d, ignore_errors=True)
        else:
            try:
                d.rmdir()
            except OSError:
                pass  # not empty and not marked: not headcount's


def _convert(path: Path, folder: Path, digest: str) -> Path:
    """Read ``path`` (SHA-256 ``digest``) and write its conversion to ``folder`` (under the
    conversion lock), recording the size and SHA-256 of every file it writes."""
    kwargs = {"gguf_file": path.name}
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        (tmp / PARTIAL).write_text(f"a GGUF conversion in progress (pid {os.getpid()}); removed when it ends\n")
    except OSError as e:
        raise CacheNotWritten(f"cannot write the GGUF conversion under {folder.parent}: {e.strerror or e}") from None
    try:
        try:  # reading: a file that starts like GGUF but does not parse (or cannot be read); its
            # progress bar (tqdm, drawn past transformers' own switch): a line per PLAIN_EVERY_S off a terminal
            with tqdm_lines() as lines, contextlib.redirect_stderr(lines):
                model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, **kwargs)
                tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, **kwargs)
        except Exception as e:
            raise HeadcountError(f"cannot read GGUF file {str(path)!r}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
        try:  # writing: the folder appears whole by one rename, or not at all
            dequantised(model).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
                     for p in sorted(tmp.iterdir()) if p.name != PARTIAL}
            (tmp / SOURCE).write_text(json.dumps({"gguf": str(path), "sha256": digest, "transformers": reader_version(),
                                                  "files": files}, indent=1) + "\n")
            os.replace(tmp, folder)
            (folder / PARTIAL).unlink()  # (a kill before this leaves the mark in a finished folder: harmless)
            # hashed again under the final names: what later checks look up (a stat each, not a read)
            problem = check_conversion(folder, digest)
        except OSError as e:
            raise CacheNotWritten(f"cannot write the GGUF conversion {folder}: {e.strerror or e}") from None
        except Exception as e:  # a model transformers cannot save: the file still loads as it is
            raise CacheNotWritten(f"cannot write the GGUF conversion {folder}: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if problem is not None:  # pragma: no cover - written and found otherwise at once (a disk error)
        raise HeadcountError(f"the GGUF conversion {folder} {problem} just after it was written")
    return folder
