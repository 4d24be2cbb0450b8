"""Labelled maps on disk: ``maps.safetensors`` (tensor ``"maps"`` [N, S, S]) and a CSV/JSON label file."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import save_file
from safetensors.torch import load_file as load_torch_file

from headcount.analysis.patterns.features import CLASSES, _to_numpy
from headcount.analysis.patterns.layout import center_pad
from headcount.runtime.atomic import atomic_path, atomic_write_json, atomic_write_text
from headcount.runtime.errors import HeadcountError
from headcount.runtime.jsonfile import parse_json

#: Label spellings read as ``vertical`` (Kovaleva et al.'s three vertical classes).
_VERTICAL_VARIANTS: tuple[str, ...] = tuple(f"{n}{sep}vertical" for n in ("single", "double", "multiple")
                                             for sep in ("+", "-", ""))


def label_ids(labels, classes: Sequence[str]) -> np.ndarray:
    """Class ids ``[N]`` of labels given as class names (case, spaces and ``_`` for ``+`` forgiven) or ids.

    >>> label_ids(["Vertical", "vertical_diagonal", 4, "double_vertical"], CLASSES).tolist()
    [0, 2, 4, 0]
    """
    norm = {c.lower().replace(" ", "").replace("_", "+"): i for i, c in enumerate(classes)}
    if "vertical" in norm:  # Kovaleva et al.'s single/double/multiple vertical, merged as Prasanna et al. do
        for variant in _VERTICAL_VARIANTS:
            norm.setdefault(variant, norm["vertical"])
    out = []
    for k, lab in enumerate(list(labels)):
        if isinstance(lab, (int, np.integer)) and not isinstance(lab, bool):
            idx = int(lab)
        elif isinstance(lab, str) and re.fullmatch(r"-?[0-9]+", lab.strip()):  # "²" is a digit, not a number
            idx = int(lab.strip())
        elif isinstance(lab, str) and lab.lower().strip().replace(" ", "").replace("_", "+") in norm:
            idx = norm[lab.lower().strip().replace(" ", "").replace("_", "+")]
        else:
            raise HeadcountError(f"label {k} ({lab!r}) is not one of {', '.join(classes)} or 0..{len(classes) - 1}")
        if not 0 <= idx < len(classes):
            raise HeadcountError(f"label {k} ({idx}) is out of range 0..{len(classes) - 1}")
        out.append(idx)
    return np.asarray(out, dtype=np.int64)


def _read_labels(path: Path) -> list:
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv"):
        raise HeadcountError(f"labels must be a .csv (with a 'label' column) or a .json list, got {path.name}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise HeadcountError(f"cannot read labels {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise HeadcountError(f"labels file {path} is not UTF-8 text") from None
    if suffix == ".json":
        try:
            data = parse_json(text, f"labels file {path}")
        except json.JSONDecodeError as e:
            raise HeadcountError(f"{path} is not valid JSON: {e.msg} (line {e.lineno})") from None
        if isinstance(data, dict):
            data = data.get("labels")
        if not isinstance(data, list):
            raise HeadcountError(f"{path} must hold a list of labels or {{\"labels\": [...]}}")
        return data
    return _read_label_csv(path, text)


def _read_label_csv(path: Path, text: str) -> list[str]:
    """The ``label`` column of a label CSV, one row a line (docs/promises.md, "Every row").

    A label is one line: each non-blank line is read as one CSV record on its own, so a quote
    that opens a field and closes lines later (``"0,vertical\n1",block``) is refused with its line
    number instead of gluing two rows into one; so is a line with another number of fields than
    the header.
    """
    lines = re.split(r"\r\n|\r|\n", text)  # a line ends as the csv module ends one
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]

    def cells(n: int, line: str) -> list[str]:
        try:
            return next(csv.reader([line], strict=True))
        except csv.Error as e:
            raise HeadcountError(f"{path}, line {n}: not valid CSV ({e}); a label file holds one map's label a line, "
                                 "a quote must close on its line") from None

    header = [f.strip() for f in cells(*numbered[0])] if numbered else []
    if "label" not in header:
        raise HeadcountError(f"{path} needs a 'label' column (one row per map, in order)")
    key = header.index("label")
    out = []
    for n, line in numbered[1:]:
        row = cells(n, line)
        if len(row) != len(header):
            raise HeadcountError(f"{path}, line {n}: {len(row)} fields, the header has {len(header)} "
                                 f"({', '.join(header)})")
        out.append(row[key].strip())
    return out


def load_labelled_maps(maps_path, labels_path, classes: Sequence[str] = CLASSES) -> tuple[np.ndarray, np.ndarray]:
    """Read user-labelled maps: ``maps.safetensors`` (tensor ``"maps"`` [N, S, S]) and CSV/JSON labels.

    Args:
        maps_path: a .safetensors file with a float tensor named ``maps``, shape ``[N, S, S]``, and
            optionally an integer tensor ``lengths`` ``[N]``: map i is then ``maps[i, :L_i, :L_i]``
            (per-example maps of a padded batch) and is centre-padded back to S x S
            ([`center_pad`][headcount.analysis.patterns.center_pad]), the input the CNN reads.
        labels_path: a .csv with a ``label`` column, or a .json list (or ``{"labels": [...]}``);
            labels are class names or ids, one per map, in order.
        classes: class names the labels refer to.

    Returns:
        ``(maps float32 [N, S, S], labels int64 [N])``; labels may name Kovaleva et al.'s
        ``single_vertical`` / ``double_vertical`` / ``multiple_vertical``, read as ``vertical``.

    Raises:
        HeadcountError: missing files, a wrong format or shape, unknown labels, counts that differ.

    >>> import tempfile, os
    >>> from headcount.analysis.patterns import synthetic_attention_maps
    >>> d = tempfile.mkdtemp(); s = synthetic_attention_maps(1, size=16)
    >>> _ = save_labelled_maps(s.maps, s.labels, os.path.join(d, "m.safetensors"), os.path.join(d, "l.csv"))
    >>> load_labelled_maps(os.path.join(d, "m.safetensors"), os.path.join(d, "l.csv"))[0].shape
    (5, 16, 16)
    """
    mp, lp = Path(maps_path), Path(labels_path)
    if not mp.is_file():
        raise HeadcountError(f"maps file not found: {mp}")
    if not lp.is_file():
        raise HeadcountError(f"labels file not found: {lp}")
    if mp.suffix.lower() != ".safetensors":
        raise HeadcountError(f"maps must be a .safetensors file with a tensor 'maps' [N, S, S], got {mp.name}")
    try:  # read with torch: numpy has no bfloat16 (a bf16 model's maps); every float is cast to float32
        tensors = load_torch_file(str(mp))
    except (SafetensorError, OSError, ValueError) as e:
        raise HeadcountError(f"cannot read {mp}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if "maps" not in tensors:
        raise HeadcountError(f"{mp} has no tensor named 'maps' (found: {', '.join(sorted(tensors)) or 'none'})")
    if tensors["maps"].dtype.is_complex or tensors["maps"].dtype == torch.bool:
        raise HeadcountError(f"'maps' in {mp} must hold real numbers, got {tensors['maps'].dtype}")
    tensors = {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in tensors.items()}
    maps = np.asarray(tensors["maps"], dtype=np.float32)
    if maps.ndim != 3 or maps.shape[1] != maps.shape[2]:
        raise HeadcountError(f"'maps' in {mp} must be [N, S, S], got shape {tuple(maps.shape)}")
    if not np.all(np.isfinite(maps)) or np.any(maps < 0):
        raise HeadcountError(f"'maps' in {mp} must be finite and non-negative")
    if "lengths" in tensors:  # per-example maps stored top-left in a padded [N, S, S]: centre them
        lengths = np.asarray(tensors["lengths"]).reshape(-1)
        if lengths.shape[0] != maps.shape[0] or not np.issubdtype(lengths.dtype, np.integer) \
                or np.any(lengths < 1) or np.any(lengths > maps.shape[1]):
            raise HeadcountError(f"'lengths' in {mp} must hold {maps.shape[0]} integers in 1..{maps.shape[1]}")
        maps = np.stack([center_pad(m[:n, :n], maps.shape[1]) for m, n in zip(maps, lengths.tolist())])
    labels = label_ids(_read_labels(lp), classes)
    if labels.shape[0] != maps.shape[0]:
        raise HeadcountError(f"{mp.name} has {maps.shape[0]} maps but {lp.name} has {labels.shape[0]} labels")
    return maps, labels


def save_labelled_maps(maps, labels, maps_path, labels_path, classes: Sequence[str] = CLASSES) -> tuple[Path, Path]:
    """Write maps and labels in the format [`load_labelled_maps`][headcount.analysis.patterns.labels.load_labelled_maps] reads (atomically).

    Args:
        maps: ``[N, S, S]``.
        labels: ``[N]`` class names or ids.
        maps_path: destination .safetensors.
        labels_path: destination .csv (columns ``index,label``) or .json (a list of names).
        classes: class names.

    Returns:
        The two paths.

    >>> import tempfile, os
    >>> from headcount.analysis.patterns import synthetic_attention_maps
    >>> d = tempfile.mkdtemp(); s = synthetic_attention_maps(1, size=16)
    >>> [p.name for p in save_labelled_maps(s.maps, s.labels, os.path.join(d, "m.safetensors"), os.path.join(d, "l.json"))]
    ['m.safetensors', 'l.json']
    """
    m = np.ascontiguousarray(_to_numpy(maps), dtype=np.float32)
    ids = label_ids(labels, classes)
    if m.ndim != 3 or m.shape[0] != ids.shape[0]:
        raise HeadcountError(f"need maps [N, S, S] and N labels, got {tuple(m.shape)} and {ids.shape[0]}")
    mp, lp = Path(maps_path), Path(labels_path)
    mp.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(mp) as tmp:
        save_file({"maps": m}, str(tmp))
    names = [classes[i] for i in ids.tolist()]
    if lp.suffix.lower() == ".json":
        atomic_write_json(lp, names)
    elif lp.suffix.lower() == ".csv":
        atomic_write_text(lp, "index,label\n" + "".join(f"{i},{n}\n" for i, n in enumerate(names)))
    else:
        raise HeadcountError(f"labels file must end in .csv or .json, got {lp.name}")
    return mp, lp
