"""The model core: architectures, gates, surgery and masks, with no task and no data.

Holds the architecture adapters (:mod:`.arch`: the only place that names an architecture), head and
MLP gates (:mod:`.gates`), the :class:`~headcount.core.masks.Mask` value (:mod:`.masks`), physical
pruning and pruned checkpoints (:mod:`.surgery`), model and tokenizer loading (:mod:`.models`),
attention maps on demand (:mod:`.attention`) and ONNX / plain-transformers export (:mod:`.export`).

May import: :mod:`headcount.runtime`.
"""
