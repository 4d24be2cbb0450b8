"""What a ``--model`` spec names, resolved once: ``offline`` and ``offline-decoder`` (the packaged
models), a GGUF file, a local checkpoint folder (its files checked before anything loads), or a
hub id (passed on as it is, without the network).
"""

from __future__ import annotations

import os
from pathlib import Path

from headcount.core.checkpoint_check import check_checkpoint_files, check_config
from headcount.core.gguf import check_gguf, is_gguf
from headcount.core.offline_models import OFFLINE, OFFLINE_DECODER, offline_decoder_file, offline_model_dir
from headcount.runtime.errors import HeadcountError


class ModelSource(str):
    """A model spec resolved once ([`model_source`][headcount.core.model_spec.model_source]): the string is the spec as given (what
    messages and results name), ``path`` where it loads from; every loader takes it as a spec
    and does not resolve it again.

    >>> src = model_source("/nonexistent/ckpt")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headcount.runtime.errors.HeadcountError: checkpoint directory not found: /nonexistent/ckpt
    """

    path: str

    def __new__(cls, spec: str, path: str):
        obj = super().__new__(cls, spec)
        obj.path = path
        return obj

    def __reduce__(self):
        return ModelSource, (str(self), self.path)


def model_source(spec: str | None) -> ModelSource:
    """``spec`` resolved once ([`resolve`][headcount.core.model_spec.resolve]: its checks run here); a [`ModelSource`][headcount.core.model_spec.ModelSource] is returned as it is."""
    if isinstance(spec, ModelSource):
        return spec
    return ModelSource(OFFLINE if spec is None else spec, resolve(spec))


def resolve(spec: str) -> str:
    """``offline`` -> the packaged folder; ``offline-decoder`` -> the packaged GGUF file; a path ->
    itself (checked); otherwise a hub id."""
    if isinstance(spec, ModelSource):
        return spec.path
    if spec in (None, OFFLINE):
        return str(offline_model_dir())
    if spec == OFFLINE_DECODER:
        return str(check_gguf(offline_decoder_file()))
    if not isinstance(spec, str) or not spec.strip():
        raise HeadcountError("--model must not be empty (use 'offline' for the packaged default model)")
    p = Path(spec).expanduser()
    if is_gguf(spec) and not p.is_dir():
        return str(check_gguf(p))
    looks_local = p.exists() or spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") > 1
    if looks_local:
        if not p.is_dir():
            raise HeadcountError(f"checkpoint directory not found: {spec}")
        if not (p / "config.json").is_file():
            raise HeadcountError(f"not a checkpoint directory (no config.json): {spec}")
        check_config(p / "config.json")
        check_checkpoint_files(p)
        return str(p)
    return spec
