"""The runtime: what every layer above may use, and nothing of headcount's own science.

Holds the user-facing error ([`errors`][headcount.runtime.errors]), atomic writes and temporary names ([`atomic`][headcount.runtime.atomic]),
the ownership record of an output folder ([`record`][headcount.runtime.record]) and the ``--out`` guard built on it
([`io`][headcount.runtime.io]), the distributed launcher's environment ([`launch`][headcount.runtime.launch]), the one device and precision
rule (``device``), the ranges of numeric settings ([`bounds`][headcount.runtime.bounds]) and the safe YAML reader
([`yamlfile`][headcount.runtime.yamlfile]).

May import: the standard library and third-party packages only; no other ``headcount`` package
(the layer contract in ``pyproject.toml``, checked by import-linter, enforces it).
"""
