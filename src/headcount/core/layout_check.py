"""A declared layout checked before a model is built from it: query heads that do not split
evenly over the key/value heads (any config), and a GGUF file whose metadata declares layers or
sizes its tensor list does not hold.

transformers builds the model its config describes and only then fills it: a GGUF file declaring
100,000 layers with tensors for 2 builds all 100,000 (minutes, gigabytes) before it finds the
tensors missing, and 4 query heads on 3 key/value heads build and load (each KV head would have
to serve 4/3 query heads; the forward fails, or reads the wrong heads). Both are refused here
with one line, from the header alone (``headcount.core.gguf_header.read_header``,
~0.1 s for the offline decoder; a file's answer is remembered per size, mtime and inode).
"""

from __future__ import annotations

import re
from pathlib import Path

from headcount.core.arch import get_adapter
from headcount.core.gguf_header import GGUFHeaderError, read_header
from headcount.runtime.errors import HeadcountError

_BLOCK = re.compile(r"blk\.(\d+)\.")
_CHECKED: dict[str, None] = {}


def check_head_groups(n_heads, n_kv, what: str) -> None:
    """Refuse ``n_heads`` query heads on ``n_kv`` key/value heads unless every KV head serves
    the same whole number of them (grouped-query attention maps query head h to KV head
    ``h // (n_heads / n_kv)``). ``what`` names the layout in the message.

    >>> check_head_groups(9, 3, "a config")
    >>> check_head_groups(4, 3, "a config")
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: a config declares 4 query heads on 3 key/value heads: ...
    """
    if isinstance(n_heads, bool) or isinstance(n_kv, bool) or not isinstance(n_heads, int) \
            or not isinstance(n_kv, int):
        return
    if n_heads < 1 or n_kv < 1 or n_heads % n_kv:
        raise HeadcountError(f"{what} declares {n_heads} query heads on {n_kv} key/value heads: every key/value "
                             "head must serve the same whole number of query heads (query heads a multiple of "
                             "key/value heads), so no such attention layer exists")


def check_config_layout(config, spec: str) -> None:
    """:func:`check_head_groups` on a model config
    (its adapter reads the head counts; encoders, which have no KV level, pass)."""
    adapter = get_adapter(config)
    n_kv = adapter.num_kv_heads(config)
    if n_kv is not None:
        check_head_groups(adapter.num_heads(config), n_kv, f"the config of {spec!r}")


def check_gguf_layout(path: str | Path) -> None:
    """Refuse a GGUF file whose header does not parse, or whose declared layout its tensors do
    not hold (one line each), before anything is built from it:

    - ``<arch>.block_count`` layers, and a layer with no ``blk.<i>.`` tensor;
    - ``<arch>.attention.head_count`` query heads that do not split evenly over
      ``head_count_kv`` key/value heads (per layer where they are arrays);
    - an ``<arch>.embedding_length`` that is not the width of ``token_embd.weight``.
    """
    path = Path(path)
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_ctime_ns}"
    if key in _CHECKED:
        return
    try:
        header = read_header(path)
    except (GGUFHeaderError, OSError) as e:
        raise HeadcountError(f"cannot read GGUF file {str(path)!r}: its header does not parse: "
                             f"{getattr(e, 'strerror', None) or e}") from None
    meta, tensors = header.metadata, header.tensors
    arch = meta.get("general.architecture")
    if isinstance(arch, str):
        _check_blocks(path, arch, meta.get(f"{arch}.block_count"), tensors)
        _check_heads(path, arch, meta.get(f"{arch}.attention.head_count"),
                     meta.get(f"{arch}.attention.head_count_kv"))
        width = meta.get(f"{arch}.embedding_length")
        embed = tensors.get("token_embd.weight")
        if isinstance(width, int) and embed and embed[0] != width:
            raise HeadcountError(f"GGUF file {path} declares a hidden size of {width} ({arch}.embedding_length) "
                                 f"but its token_embd.weight has rows of {embed[0]}: refusing it before building "
                                 "the model")
    _CHECKED[key] = None


def _check_blocks(path: Path, arch: str, declared, tensors: dict) -> None:
    if isinstance(declared, bool) or not isinstance(declared, int) or declared < 1:
        return  # not declared (or no layers): transformers' reader says what is wrong
    blocks = {int(m.group(1)) for name in tensors if (m := _BLOCK.match(name))}
    first_missing = 0
    while first_missing in blocks:  # at most len(blocks) steps, whatever the declared count
        first_missing += 1
    if first_missing < declared:
        held = len({b for b in blocks if b < declared})
        raise HeadcountError(f"GGUF file {path} declares {declared} layers ({arch}.block_count) but holds tensors "
                             f"for {held} (none for layer {first_missing}, blk.{first_missing}.*): refusing it "
                             "before building the model")


def _check_heads(path: Path, arch: str, heads, kv) -> None:
    what = f"GGUF file {path} ({arch}.attention.head_count / head_count_kv)"
    if isinstance(heads, list) or isinstance(kv, list):  # per layer
        n = max(len(x) for x in (heads, kv) if isinstance(x, list))
        heads = heads if isinstance(heads, list) else [heads] * n
        kv = kv if isinstance(kv, list) else [kv] * n
        for layer, (h, k) in enumerate(zip(heads, kv)):
            if h and k:  # 0: a layer without attention (or KV heads not declared)
                check_head_groups(h, k, f"{what}, layer {layer},")
    elif heads and kv:  # KV heads 0 or absent: as many as query heads
        check_head_groups(heads, kv, what)
