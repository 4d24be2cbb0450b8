"""Pure analysis on tensors and arrays: statistics of scores and masks, attention patterns.

No models are loaded here; studies call these functions on saved scores, masks and maps. Grids
are ``[layer, head]`` (or any shape: they are flattened), masks ``1 = kept``; random procedures
take a ``seed`` and are deterministic for it; an undefined statistic is ``nan``, never an error.

- [`correlation`][headcount.analysis.correlation]: coherence of two score grids (Spearman, Kendall tau-b, top-k overlap,
  layer mass, per-layer normalisation, [`compare_scores`][headcount.analysis.correlation.compare_scores], [`pairwise_matrix`][headcount.analysis.correlation.pairwise_matrix]);
- [`resampling`][headcount.analysis.resampling]: bootstrap intervals (over examples, paired by id, hierarchical over seeds);
- [`permutation`][headcount.analysis.permutation]: permutation tests, global or within layers;
- [`agreement`][headcount.analysis.agreement]: stability of masks over seeds (Krippendorff's alpha, Cochran's Q, Jaccard);
- [`subnetworks`][headcount.analysis.subnetworks]: super-survivors, random and bad controls (the reference's too), agreement
  of subnetworks across seeds and tasks;
- [`summaries`][headcount.analysis.summaries]: pruning curves, values across seeds; [`paired`][headcount.analysis.paired]: paired tests over seeds;
- [`coherence`][headcount.analysis.coherence], [`removal`][headcount.analysis.removal]: the transfer study's analyses built on these;
  [`patterns`][headcount.analysis.patterns]: attention pattern classes; [`plots`][headcount.analysis.plots]: figures drawn from saved results.

Everything public is importable from ``headcount.analysis``.

May import: ``headcount.importance``, ``headcount.core``, ``headcount.runtime`` (not
``headcount.train``, its sibling layer).
"""

from headcount.analysis import (
           agreement,
           correlation,
           helpers,
           paired,
           permutation,
           resampling,
           subnetworks,
           summaries,
)
from headcount.analysis.agreement import *  # noqa: F401,F403
from headcount.analysis.correlation import *  # noqa: F401,F403
from headcount.analysis.helpers import *  # noqa: F401,F403
from headcount.analysis.paired import PairedResult, at_chance, paired_sign_flip_test, seed_interval  # noqa: F401  (claims over seeds)
from headcount.analysis.permutation import *  # noqa: F401,F403
from headcount.analysis.resampling import *  # noqa: F401,F403
from headcount.analysis.subnetworks import *  # noqa: F401,F403
from headcount.analysis.summaries import *  # noqa: F401,F403

__all__ = [name for m in (helpers, correlation, resampling, permutation, agreement, subnetworks, summaries)
           for name in m.__all__]
