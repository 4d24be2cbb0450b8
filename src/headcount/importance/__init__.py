"""Importance and pruning: which heads and MLPs matter, and removing the ones that don't.

Holds the scorer registry ([`scorers`][headcount.importance.scorers]) and the built-in scorers ([`scoring`][headcount.importance.scoring]), iterative
pruning to a threshold ([`pruning`][headcount.importance.pruning]), magnitude pruning's weight-mask primitives
(``magnitude``), the settings the commands and studies share ([`settings`][headcount.importance.settings]) and the glue that
builds a model, batches and a metric for an objective ([`pipeline`][headcount.importance.pipeline]).

May import: ``headcount.data``, ``headcount.core``, ``headcount.runtime``.
"""
