"""The runtime: what every layer above may use, and nothing of headcount's own science.

Holds the user-facing error (:mod:`.errors`), atomic writes and temporary names (:mod:`.atomic`),
the ownership record of an output folder (:mod:`.record`) and the ``--out`` guard built on it
(:mod:`.io`), the distributed launcher's environment (:mod:`.launch`), the one device and precision
rule (:mod:`.device`), the ranges of numeric settings (:mod:`.bounds`) and the safe YAML reader
(:mod:`.yamlfile`).

May import: the standard library and third-party packages only; no other ``headcount`` package
(the layer contract in ``pyproject.toml``, checked by import-linter, enforces it).
"""
