"""Self-attention pattern classes (Kovaleva et al. 2019) on mean attention maps.

The five classes, in this order everywhere ([`CLASSES`][headcount.analysis.patterns.CLASSES]):

- ``vertical``: most attention goes to the special tokens ([CLS], [SEP]) whatever the query;
- ``diagonal``: attention to the previous / the same / the next token;
- ``vertical+diagonal``: both of the above in one head;
- ``block``: attention stays within the query's own segment (sentence), spread over it;
- ``heterogeneous``: none of these.

Two views of a model's heads, and tools:

1. a transparent rule-based classifier (headcount's own), [`classify_patterns`][headcount.analysis.patterns.features.classify_patterns], on features
   documented in [`pattern_features`][headcount.analysis.patterns.features.pattern_features] and thresholds kept as named constants
   (``VERTICAL_MIN``, ...), applied to per-head MEAN maps: [`mean_attention_maps`][headcount.analysis.patterns.layout.mean_attention_maps] turns
   per-example maps of varying lengths into fixed-size mean maps with the special tokens kept as
   single, aligned rows/columns; class shares are fractions of heads;
2. the CNN of Prasanna et al. (2020), [`PatternCNN`][headcount.analysis.patterns.cnn.PatternCNN] (their six-convolution net by
   default, ``architecture="prasanna"``), trained from user labels with their recipe
   ([`train_pattern_cnn`][headcount.analysis.patterns.cnn.train_pattern_cnn]), saved like a checkpoint ([`save_pattern_cnn`][headcount.analysis.patterns.cnn.save_pattern_cnn],
   [`load_pattern_cnn`][headcount.analysis.patterns.cnn.load_pattern_cnn]) and applied to PER-EXAMPLE maps (one per example and head),
   centre-padded with zeros to one side ([`center_pad`][headcount.analysis.patterns.layout.center_pad]); class shares are counted over
   examples x heads ([`pattern_distribution`][headcount.analysis.patterns.features.pattern_distribution] on ``[n_examples, n_layers, n_heads]`` labels);
3. [`synthetic_attention_maps`][headcount.analysis.patterns.synthetic.synthetic_attention_maps], seeded synthetic maps of every class (tests and demos).

Labelled data for the CNN (``headcount patterns train --maps maps.safetensors --labels
labels.csv``): ``maps.safetensors`` holds one float tensor ``"maps"`` of shape ``[N, S, S]``
(rows are attention distributions of query tokens, S the same for all maps; shorter maps
zero-padded, centred, or top-left with an integer tensor ``"lengths"`` [N]); the
labels are a CSV file with a ``label`` column (one row per map, in order) or a JSON list
(or ``{"labels": [...]}``), each label a class name or its index in [`CLASSES`][headcount.analysis.patterns.CLASSES].
See [`load_labelled_maps`][headcount.analysis.patterns.labels.load_labelled_maps] / [`save_labelled_maps`][headcount.analysis.patterns.labels.save_labelled_maps].

Maps are ``[..., S, S]`` with rows = queries and columns = keys; each row sums to 1.

Modules: [`features`][headcount.analysis.patterns.features] (classes, features, rules), [`layout`][headcount.analysis.patterns.layout] (fixed-size maps, means
over examples), [`synthetic`][headcount.analysis.patterns.synthetic], [`cnn`][headcount.analysis.patterns.cnn], [`labels`][headcount.analysis.patterns.labels] (labelled data files).
"""

from headcount.analysis.patterns.cnn import (
    ARCHITECTURES,
    CNN_EPOCHS,
    MAP_SIDE,
    PRASANNA_MIN_SIZE,
    PatternCNN,
    load_pattern_cnn,
    predict_pattern_ids,
    predict_patterns,
    save_pattern_cnn,
    train_pattern_cnn,
)
from headcount.analysis.patterns.features import (
    BLOCK_MIN,
    BLOCK_MIN_ENTROPY,
    CLASSES,
    DIAGONAL_MIN,
    DIAGONAL_NEIGHBOUR_OFFSETS,
    DIAGONAL_OFFSETS,
    MAP_SIZE,
    VERTICAL_MIN,
    PatternClassification,
    classify_patterns,
    pattern_distribution,
    pattern_features,
)
from headcount.analysis.patterns.labels import load_labelled_maps, save_labelled_maps
from headcount.analysis.patterns.layout import (
    AttentionMaps,
    StructureMeans,
    center_pad,
    commonest_structure_maps,
    mean_attention_maps,
    resample_attention,
)
from headcount.analysis.patterns.synthetic import MAPS_PER_CLASS, SyntheticMaps, synthetic_attention_maps

__all__ = [
    "ARCHITECTURES",
    "BLOCK_MIN",
    "BLOCK_MIN_ENTROPY",
    "CLASSES",
    "CNN_EPOCHS",
    "DIAGONAL_MIN",
    "DIAGONAL_NEIGHBOUR_OFFSETS",
    "DIAGONAL_OFFSETS",
    "MAPS_PER_CLASS",
    "MAP_SIDE",
    "MAP_SIZE",
    "PRASANNA_MIN_SIZE",
    "VERTICAL_MIN",
    "AttentionMaps",
    "PatternCNN",
    "PatternClassification",
    "StructureMeans",
    "SyntheticMaps",
    "center_pad",
    "classify_patterns",
    "commonest_structure_maps",
    "load_labelled_maps",
    "load_pattern_cnn",
    "mean_attention_maps",
    "pattern_distribution",
    "pattern_features",
    "predict_pattern_ids",
    "predict_patterns",
    "resample_attention",
    "save_labelled_maps",
    "save_pattern_cnn",
    "synthetic_attention_maps",
    "train_pattern_cnn",
]
