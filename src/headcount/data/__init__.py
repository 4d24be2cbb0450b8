"""Tasks and objectives: what a model is evaluated and scored on.

Holds the task registry, GLUE (declared as YAML under ``tasks/specs/``), local files and the offline
data ([`tasks`][headcount.data.tasks]), the sentence-embedding objective (``embedding``), output heads fitted on a
frozen encoder (task head, masked-LM head: [`heads`][headcount.data.heads]), evaluation over prepared batches
([`evaluation`][headcount.data.evaluation]) and the content fingerprints of models and task data ([`fingerprint`][headcount.data.fingerprint]).

May import: ``headcount.core``, ``headcount.runtime``.
"""
