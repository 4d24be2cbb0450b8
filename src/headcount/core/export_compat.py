"""Exported checkpoints that transformers 4.x reads as 5.x does: the legacy config and tokenizer keys.

transformers 5 keeps every rotary-embedding setting in one ``rope_parameters`` dict (nested by
layer type where layers differ: ``{"full_attention": {...}, "sliding_attention": {...}}``) and
writes nothing else; 4.x (tested: 4.57) never reads that dict, takes its own defaults (rope_theta
10,000 where the model was trained with 100,000) and answers wrong without an error. 5.x also
names its tokenizers-library tokenizer ``TokenizersBackend``, a class 4.x lacks (it then refuses
to load it). [`add_legacy_keys`][headcount.core.export_compat.add_legacy_keys] writes, beside what
5.x wrote, the keys 4.x reads.

Which legacy keys a family had is not listed here by architecture: 5.x's own config classes
still read them (so that 4.x checkpoints load), so each candidate key is tried on the model's
5.x config class with a marker value, and it is written when the marker lands in the entry of
``rope_parameters`` that the key stands for. 5.x gives ``rope_parameters`` precedence over those
keys when both are present, and the caller checks that the file reads back to the same settings.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from headcount.runtime.atomic import atomic_write_json

#: 4.x config keys that hold one field of a ``rope_parameters`` entry: (key, field). Each family
#: reads some of them (flat: rope_theta / rotary_emb_base; per layer type: global and local names)
ROPE_KEYS = (
    ("rope_theta", "rope_theta"),
    ("rotary_emb_base", "rope_theta"),
    ("global_rope_theta", "rope_theta"),
    ("local_rope_theta", "rope_theta"),
    ("rope_local_base_freq", "rope_theta"),
    ("partial_rotary_factor", "partial_rotary_factor"),
    ("rotary_pct", "partial_rotary_factor"),
)
#: marker values for the probe, unlike any default (a theta, a fraction of the head size)
MARKERS = {"rope_theta": 12345.0, "partial_rotary_factor": 0.375}
#: 4.x's ``rope_scaling``: the entry without the fields that have keys of their own
SCALING_KEY, SCALING_PROBE = "rope_scaling", {"rope_type": "linear", "factor": 3.0}
#: tokenizer classes 5.x writes that 4.x lacks -> the class both read (5.x keeps it as an alias)
TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def _entries(params) -> dict:
    """``{path: entry}`` of a ``rope_parameters`` dict: ``{None: params}`` when flat, else one
    entry per layer type (a nested dict's values are dicts)."""
    if not isinstance(params, dict) or not params:
        return {}
    nested = {k: v for k, v in params.items() if isinstance(v, dict)}
    return nested if nested and len(nested) == len(params) else {None: params}


def _landing(cls, key: str, value, field: str, marker) -> list:
    """The paths of the entries where ``cls(**{key: value})`` puts ``marker`` into ``field``
    (empty: the class does not read ``key``, or refuses the probe)."""
    import transformers  # lazy: the command line imports export without transformers

    log = transformers.utils.logging
    level = log.get_verbosity()
    log.set_verbosity_error()  # a probe built from defaults alone may warn about them (token ids)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe = cls(**{key: value})
    except Exception:  # a class whose defaults alone do not validate: no legacy key for it
        return []
    finally:
        log.set_verbosity(level)
    return [p for p, e in _entries(getattr(probe, "rope_parameters", None)).items() if e.get(field) == marker]


def legacy_config_keys(config) -> dict:
    """The keys to add to the ``config.json`` of ``config`` (a 5.x config) for 4.x: ``rope_theta``
    and the family's other names for the theta and the rotary fraction, and ``rope_scaling`` where
    the rope type is not ``default``. Empty for a config without rotary embeddings."""
    entries = _entries(getattr(config, "rope_parameters", None))
    if not entries:
        return {}
    cls, extra = type(config), {}
    for key, field in ROPE_KEYS:
        values = {repr(entries[p][field]): entries[p][field]
                  for p in _landing(cls, key, MARKERS[field], field, MARKERS[field]) if p in entries and field in entries[p]}
        if len(values) == 1:  # one value for all the entries the key sets; else 4.x cannot say it
            extra[key] = next(iter(values.values()))
    for p in _landing(cls, SCALING_KEY, dict(SCALING_PROBE), "factor", SCALING_PROBE["factor"]):
        entry = entries.get(p) or {}
        if entry.get("rope_type", "default") != "default":
            extra[SCALING_KEY] = {k: v for k, v in entry.items() if k not in MARKERS}
            break
    return extra


def add_legacy_keys(out_dir: Path, config) -> dict:
    """Add the 4.x keys to ``out_dir/config.json`` (replacing a stale one 5.x carried over: they
    must say what ``rope_parameters`` says, which 5.x reads first) and
    rename a tokenizer class 4.x lacks in ``out_dir/tokenizer_config.json``; returns the keys
    added to the config. Each file is rewritten atomically."""
    path = Path(out_dir) / "config.json"
    data = json.loads(path.read_text())
    extra = legacy_config_keys(config)
    if extra:
        atomic_write_json(path, {**data, **extra})
    tok = Path(out_dir) / "tokenizer_config.json"
    if tok.is_file():
        tok_data = json.loads(tok.read_text())
        name = tok_data.get("tokenizer_class")
        if name in TOKENIZER_CLASSES:
            atomic_write_json(tok, {**tok_data, "tokenizer_class": TOKENIZER_CLASSES[name]})
    return extra


def drop_legacy_keys(out_dir: Path, keys) -> None:
    """Remove ``keys`` from ``out_dir/config.json`` again (when 5.x did not read them back alike)."""
    path = Path(out_dir) / "config.json"
    data = json.loads(path.read_text())
    atomic_write_json(path, {k: v for k, v in data.items() if k not in keys})


__all__ = ["legacy_config_keys", "add_legacy_keys", "drop_legacy_keys"]
