"""The model core: architectures, gates, surgery and masks, with no task and no data.

Holds the architecture adapters (``arch``: the only place that names an architecture), head and
MLP gates ([`gates`][headcount.core.gates]), the [`Mask`][headcount.core.masks.Mask] value ([`masks`][headcount.core.masks]), physical
pruning and pruned checkpoints ([`surgery`][headcount.core.surgery]), model specs resolved ([`model_spec`][headcount.core.model_spec],
the packaged models of [`offline_models`][headcount.core.offline_models], a checkpoint's files checked by
[`checkpoint_check`][headcount.core.checkpoint_check]), model and tokenizer loading ([`models`][headcount.core.models]),
attention maps on demand ([`attention`][headcount.core.attention]) and ONNX / plain-transformers export ([`export`][headcount.core.export]).

May import: ``headcount.runtime``.
"""
