"""GGUF files: what loads them, and their conversions to plain checkpoints (read once, then reused).

transformers reads a GGUF file (``from_pretrained(folder, gguf_file=name)``) by parsing it and
dequantising every tensor to float32: ~20 s for the 98 MB offline decoder on 2 CPU cores, and
the config and the tokenizer parse it again. [`convert_gguf`][headcount.core.gguf.convert_gguf]
does that once and saves the result as a checkpoint folder (``config.json``,
``model.safetensors``, the tokenizer) under ``$HEADCOUNT_CACHE/gguf/<sha256>-transformers-<v>/``;
[`gguf_source`][headcount.core.gguf.gguf_source] then loads from that folder, which holds the same
float32 tensors (about 1 s). The folder is keyed by the file's contents and transformers'
version (its dequantisation and name mapping could change), so an edited file or another
transformers is read from the GGUF file again. ``headcount data fetch`` converts the offline
decoder; any other GGUF file is converted by calling ``convert_gguf`` (a 7B file's float32
checkpoint takes ~28 GB: nothing is converted without being asked).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import transformers

from headcount.runtime.digests import file_sha256
from headcount.runtime.errors import HeadcountError
from headcount.runtime.lock import lock_file, unlock_file
from headcount.runtime.paths import cache_root

INSTALL_GGUF = "pip install gguf accelerate"
#: the file a finished conversion holds last (the folder appears by one rename: it is whole or absent)
SOURCE = "gguf-source.json"
#: the file a conversion writes first into its temporary folder: what marks a folder left by a
#: killed conversion as headcount's to remove (a folder without it is never emptied)
PARTIAL = ".headcount-partial"



def is_gguf(path) -> bool:
    return str(path).endswith(".gguf")


def check_gguf(path: Path) -> Path:
    """A GGUF file must exist, start with the magic ``GGUF``, and the readers must be installed."""
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
    return path


def reader_version() -> str:
    """The version of what reads GGUF files (transformers): part of a conversion's key."""
    return transformers.__version__


def converted_dir(path: str | os.PathLike) -> Path:
    """Where the conversion of GGUF file ``path`` is (or would be) kept."""
    return cache_root() / "gguf" / f"{file_sha256(Path(path))[:24]}-transformers-{reader_version()}"


def find_converted(path: str | os.PathLike) -> Path | None:
    """The finished conversion of ``path``, or None (not converted, or for another transformers)."""
    try:
        folder = converted_dir(path)
    except OSError:
        return None
    return folder if (folder / SOURCE).is_file() and (folder / "config.json").is_file() else None


def gguf_source(path: str) -> tuple[str, dict]:
    """What ``from_pretrained`` loads ``path`` from: ``(folder, {"gguf_file": name})`` for a GGUF
    file, its converted folder and ``{}`` when there is one, ``(path, {})`` for anything else."""
    if is_gguf(path) and Path(path).is_file():
        folder = find_converted(path)
        if folder is not None:
            return str(folder), {}
        return str(Path(path).parent), {"gguf_file": Path(path).name}
    return path, {}


def dequantised(model):
    """A model read from GGUF holds plain float tensors (transformers dequantises every weight) but
    stays flagged as quantised, which makes ``save_pretrained`` refuse it: drop the flag, so that a
    pruned copy saves as the float model it is."""
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    return model


def convert_gguf(path: str | os.PathLike) -> tuple[Path, bool]:
    """Read GGUF file ``path`` once (config, causal-LM weights dequantised to float32, tokenizer)
    and keep it as a checkpoint folder that [`gguf_source`][headcount.core.gguf.gguf_source] loads from.

    Returns:
        ``(folder, converted_now)``: False when the conversion was there already.

    Raises:
        HeadcountError: the file does not read, or the cache cannot be written (one line).
    """
    path = check_gguf(Path(path))
    done = find_converted(path)
    if done is not None:
        return done, False
    folder = converted_dir(path)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HeadcountError(f"cannot write the GGUF conversion under {folder.parent}: {e.strerror or e}") from None
    # one conversion of a file at a time (a second process waits, then finds it done); holding the
    # lock also means no other process is writing a temporary folder of this key: any left is dead
    fd = lock_file(folder.parent, f"converting {path.name}", name=f".{folder.name}.lock", wait=True)
    try:
        done = find_converted(path)
        if done is not None:
            return done, False
        _remove_partials(folder)
        return _convert(path, folder), True
    finally:
        unlock_file(fd)


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


def _convert(path: Path, folder: Path) -> Path:
    """Read ``path`` and write its conversion to ``folder`` (under the conversion lock)."""
    kwargs = {"gguf_file": path.name}
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        (tmp / PARTIAL).write_text(f"a GGUF conversion in progress (pid {os.getpid()}); removed when it ends\n")
    except OSError as e:
        raise HeadcountError(f"cannot write the GGUF conversion under {folder.parent}: {e.strerror or e}") from None
    try:
        try:  # reading: a file that starts like GGUF but does not parse (or cannot be read)
            model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, **kwargs)
            tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, **kwargs)
        except Exception as e:
            raise HeadcountError(f"cannot read GGUF file {str(path)!r}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
        try:  # writing: the folder appears whole by one rename, or not at all
            dequantised(model).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / SOURCE).write_text(json.dumps({"gguf": str(path), "sha256": file_sha256(path),
                                                  "transformers": reader_version()}, indent=1) + "\n")
            os.replace(tmp, folder)
            (folder / PARTIAL).unlink()  # (a kill before this leaves the mark in a finished folder: harmless)
        except OSError as e:
            raise HeadcountError(f"cannot write the GGUF conversion {folder}: {e.strerror or e}") from None
        except Exception as e:  # a model transformers cannot save: the conversion, not a traceback
            raise HeadcountError(f"cannot write the GGUF conversion {folder}: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
