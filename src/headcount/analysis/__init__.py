"""Pure analysis on tensors and arrays: statistics of scores and masks, attention patterns.

No models are loaded here; studies call these functions on saved scores, masks and maps.
"""

from . import stats as _stats
from .paired import PairedResult, at_chance, paired_sign_flip_test, seed_interval  # noqa: F401  (claims over seeds)
from .stats import *  # noqa: F401,F403  (re-exported: the names in stats.__all__)

__all__ = list(_stats.__all__)
