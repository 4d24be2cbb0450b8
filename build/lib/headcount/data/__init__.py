"""Tasks and objectives: what a model is evaluated and scored on.

Holds the task registry, GLUE (declared as YAML under ``tasks/specs/``), local files and the offline
data (:mod:`.tasks`), the sentence-embedding objective (:mod:`.embedding`), output heads fitted on a
frozen encoder (task head, masked-LM head: :mod:`.heads`), evaluation over prepared batches
(:mod:`.evaluation`) and the content fingerprints of models and task data (:mod:`.fingerprint`).

May import: :mod:`headcount.core`, :mod:`headcount.runtime`.
"""
