"""A GGUF file's header read without its tensor data: the metadata (scalars, and the lengths of
arrays) and the tensor list (name -> dimensions).

The gguf package's ``GGUFReader`` builds a numpy view of every field and tensor (4 s for the
offline decoder, whose tokenizer arrays hold ~100,000 strings); the checks made before anything
is built (``headcount.core.layout_check.check_gguf_layout``) need only the
numbers the layout is declared by and the tensors' names and shapes, which this reads from a
memory map in one pass (strings in arrays are skipped by their lengths).

Layout (GGUF v2 and v3, either byte order): ``GGUF``, version u32, tensor count u64, metadata
count u64; each metadata entry is a string key, a u32 type and a value (an array: u32 element
type, u64 count, the elements); each tensor is a string name, u32 number of dimensions, u64 per
dimension (innermost first), u32 type, u64 offset. A string is a u64 length and its bytes.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

#: value type -> struct code of the fixed-size ones (8 = string, 9 = array)
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
#: arrays of numbers up to this length are kept (per-layer head counts); longer ones only counted
_KEEP = 4096
_MAX_DIMS = 8


class GGUFHeaderError(ValueError):
    """The header does not parse (cut short, an unknown type, a length past the end of the file)."""


@dataclass
class GGUFHeader:
    """What :func:`read_header` found.

    Attributes:
        version: 2 or 3.
        metadata: key -> value: a number, a string, a list of numbers (arrays up to 4,096
            numbers) or, for longer arrays and arrays of strings, their length as ``("array", n)``.
        tensors: tensor name -> dimensions, innermost first (as GGUF stores them: a ``[rows,
            columns]`` matrix is ``(columns, rows)``).
    """

    version: int
    metadata: dict = field(default_factory=dict)
    tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def parameter_count(self) -> int:
        """The number of weights the tensors hold (each tensor's dimensions multiplied)."""
        return sum(math.prod(dims) for dims in self.tensors.values())


class _Cursor:
    def __init__(self, buf, order: str):
        self.buf, self.order, self.at = buf, order, 0

    def take(self, code: str):
        fmt = self.order + code
        size = struct.calcsize(fmt)
        if self.at + size > len(self.buf):
            raise GGUFHeaderError(f"cut short at byte {self.at}")
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += size
        return value

    def skip(self, n: int) -> None:
        if n < 0 or self.at + n > len(self.buf):
            raise GGUFHeaderError(f"a length of {n} bytes at byte {self.at} runs past the end of the file")
        self.at += n

    def string(self) -> str:
        n = self.take("Q")
        start = self.at
        self.skip(n)
        return bytes(self.buf[start:self.at]).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind in _FIXED:
            return self.take(_FIXED[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise GGUFHeaderError(f"unknown metadata type {kind} at byte {self.at}")
        inner, n = self.take("I"), self.take("Q")
        if inner in _FIXED:
            width = struct.calcsize(_FIXED[inner])
            if n <= _KEEP and inner != 7:
                start = self.at
                self.skip(n * width)
                return list(struct.unpack_from(f"{self.order}{n}{_FIXED[inner]}", self.buf, start))
            self.skip(n * width)
        elif inner == _STRING:
            for _ in range(n):  # each a u64 length and its bytes: ~100,000 of them in a tokenizer
                self.skip(self.take("Q"))
        else:  # arrays of arrays: read (and dropped) element by element
            for _ in range(n):
                self.value(inner)
        return ("array", n)


def read_header(path: str | Path) -> GGUFHeader:
    """The metadata and tensor list of GGUF file ``path`` (its tensor data is not read).

    Raises:
        GGUFHeaderError: the header does not parse.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as fh:
        if Path(path).stat().st_size < 24:
            raise GGUFHeaderError("cut short (smaller than a GGUF header)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if bytes(buf[:4]) != b"GGUF":
                raise GGUFHeaderError("no GGUF magic")
            (version,) = struct.unpack_from("<I", buf, 4)
            order = "<" if version & 0xFFFF else ">"  # a big-endian file's version reads byte-swapped
            cur = _Cursor(buf, order)
            cur.at = 4
            version = cur.take("I")
            if version not in (2, 3):
                raise GGUFHeaderError(f"GGUF version {version} (headcount reads versions 2 and 3)")
            n_tensors, n_meta = cur.take("Q"), cur.take("Q")
            header = GGUFHeader(version)
            for _ in range(n_meta):
                key = cur.string()
                header.metadata[key] = cur.value(cur.take("I"))
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.take("I")
                if n_dims > _MAX_DIMS:
                    raise GGUFHeaderError(f"tensor {name!r} has {n_dims} dimensions")
                header.tensors[name] = tuple(cur.take("Q") for _ in range(n_dims))
                cur.take("I")  # its type
                cur.take("Q")  # its offset in the data section
            return header
