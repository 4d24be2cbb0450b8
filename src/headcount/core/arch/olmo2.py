"""OLMo 2 / OLMo 3: refused. Their q/k RMSNorms run over all heads together
(``RMSNorm(n_heads * head_dim)`` before the heads are split), so removing a head changes the
norm of every other head: no surgery equals gating (measured: 7.7e-3 on a tiny random model).
Registering the refusal gives the reason instead of "not supported".
"""

from __future__ import annotations

from headcount.core.arch.registry import refuse_model_type

refuse_model_type(
    ("olmo2", "olmo3"),
    "its q/k norm runs over all heads of a layer together (RMSNorm over n_heads * head_dim), so removing a "
    "head changes every other head's output: heads cannot be removed exactly",
)
