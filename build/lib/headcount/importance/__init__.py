"""Importance and pruning: which heads and MLPs matter, and removing the ones that don't.

Holds the scorer registry (:mod:`.scorers`) and the built-in scorers (:mod:`.scoring`), iterative
pruning to a threshold (:mod:`.pruning`), magnitude pruning's weight-mask primitives
(:mod:`.magnitude`), the settings the commands and studies share (:mod:`.settings`) and the glue that
builds a model, batches and a metric for an objective (:mod:`.pipeline`).

May import: :mod:`headcount.data`, :mod:`headcount.core`, :mod:`headcount.runtime`.
"""
