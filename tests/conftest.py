"""Shared test helpers: tiny random models for every architecture adapter, and batches for them.

Everything here is offline and fast (a tiny model builds in a few milliseconds). Reuse it:

    from conftest import ARCHS, tiny_model, tiny_batch, outputs

    @pytest.mark.parametrize("arch", ARCH_IDS)
    def test_something(arch):
        model = tiny_model(arch, head="classification")      # eval mode, seeded
        batch = tiny_batch(model)                             # input_ids + attention_mask (one row padded)
        logits = outputs(model, batch)                        # the main output tensor

or take the ``arch`` fixture, which runs a test once per row of :data:`ARCHS`.

Adding an architecture = one :class:`Arch` row in :data:`ARCHS` (plus its adapter under
``src/headcount/core/arch/``).

Sizes are chosen so that shape mix-ups fail loudly: 4 heads of size 8 (hidden 32), an
intermediate size of 37 (not a multiple of anything), 3 layers (4 applications for ALBERT).
Weights are drawn with ``initializer_range`` 0.3, large enough that gating one head changes
the logits visibly (the default 0.02 makes heads nearly irrelevant in a random model).
"""

from __future__ import annotations

import copy
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import transformers

#: mypy's inputs (``make typecheck``), not test modules: importing wrong_call.py raises on purpose,
#: and ``--doctest-modules`` (pyproject.toml) would import every module here
collect_ignore = ["typecheck"]

# --- sizes shared by every tiny model ------------------------------------------------------
HIDDEN = 32
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
LAYERS = 3
INTERMEDIATE = 37
VOCAB = 99
MAX_POS = 64
NUM_LABELS = 3
INIT = 0.3

# Tiny models gain nothing from intra-op threads, and on a shared, busy machine the thread pool's
# spin-waits make each tiny op ~100x slower. Tests that need threads can set them themselves.
torch.set_num_threads(1)

# The commands the tests start (subprocesses, Ray workers) inherit one intra-op thread too: with
# one test process per core (``make test``), two such commands on two threads each would
# oversubscribe the cores, where OpenMP's spin-waits cost several-fold.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# pytest-xdist's workers (``make test`` runs the suite on one per core) ignore SIGINT, and a child
# process inherits an ignored signal: the Ctrl-C tests' commands would never see theirs. The
# default handler is reset at exec, so children start with Python's own KeyboardInterrupt.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=INTERMEDIATE,
    max_position_embeddings=MAX_POS,
    initializer_range=INIT,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    num_labels=NUM_LABELS,
)


# Decoders: 4 query heads reading 2 key/value heads (grouped-query attention, 2 per group) of
# size 8, where the family has GQA; special tokens inside the tiny vocabulary. Weights drawn with
# 0.1, not 0.3: a decoder's logits grow with it (|logit| ~ 8 at 0.3 puts fp32 rounding of gate vs
# surgery near 1e-5), and removing heads still moves them by ~2 at 0.1.
KV_HEADS = 2
DECODER_INIT = 0.1
_DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    intermediate_size=INTERMEDIATE,
    max_position_embeddings=MAX_POS,
    initializer_range=DECODER_INIT,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    num_labels=NUM_LABELS,
    tie_word_embeddings=False,
)
_GEMMA = dict(head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM)
_LOCAL = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"])

# ModernBERT's special-token ids default to its 50k vocabulary: bring them into the tiny one.
_MODERNBERT = dict(pad_token_id=0, cls_token_id=1, bos_token_id=1, sep_token_id=2, eos_token_id=2)


@dataclass(frozen=True)
class Arch:
    """One row of the architecture table.

    Attributes:
        id: test id (also the key of :data:`ARCHS`).
        config_class: name of the transformers config class.
        kwargs: config arguments on top of the common tiny sizes (they override them).
        head_projections: how many head-grouped parts of per-head output rows a layer has
            (q, k, v = 3, also when fused into one linear as in ModernBERT; DeBERTa-v2 with
            separate relative-position projections = 5). Used to compute expected parameter
            counts by hand.
        apps_per_layer: how many applications share one physical layer (ALBERT > 1).
        bias: whether the attention and feed-forward linears have biases (ModernBERT: none by default).
        ffn_in_chunks: parts of the feed-forward input projection per neuron (gated GLU block = 2).
        float32_inside: the model computes some steps in float32 even when it is float64
            (ModernBERT's rotary embedding and attention softmax), so finite-difference checks of
            gradients hold to about 1e-4 relative only.
        decoder: a causal language model (``head="lm"``); its rows are in :data:`DECODER_IDS`,
            the encoder tests' ``arch`` fixture runs :data:`ARCH_IDS` (encoders) only.
        kv_heads: decoders: key/value heads per layer (= HEADS without grouped-query attention).
    """

    id: str
    config_class: str
    kwargs: dict = field(default_factory=dict)
    head_projections: int = 3
    apps_per_layer: int = 1
    bias: bool = True
    ffn_in_chunks: int = 1
    float32_inside: bool = False
    decoder: bool = False
    kv_heads: int | None = None

    def config(self, **overrides) -> transformers.PretrainedConfig:
        cls = getattr(transformers, self.config_class)
        return cls(**{**(_DECODER if self.decoder else _COMMON), **self.kwargs, **overrides})


#: The architecture table: one row per adapter configuration worth testing.
ARCH_TABLE: list[Arch] = [
    Arch("bert", "BertConfig"),
    Arch("roberta", "RobertaConfig", dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)),
    Arch("xlm-roberta", "XLMRobertaConfig", dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)),
    # ALBERT defaults: one group, one layer in it, applied at every depth (4 applications).
    Arch("albert", "AlbertConfig", dict(embedding_size=16, num_hidden_layers=4, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0),
         apps_per_layer=4),
    # 2 groups of 2 inner layers, 4 depths: 8 applications of 4 physical layers, each run twice.
    Arch("albert-groups", "AlbertConfig", dict(embedding_size=16, num_hidden_layers=4, num_hidden_groups=2,
                                               inner_group_num=2, classifier_dropout_prob=0.0),
         apps_per_layer=2),
    Arch("distilbert", "DistilBertConfig", dict(dim=HIDDEN, n_heads=HEADS, n_layers=LAYERS, hidden_dim=INTERMEDIATE,
                                                dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0)),
    Arch("electra", "ElectraConfig", dict(embedding_size=16)),
    # Relative attention with separate position projections (pos_key_proj, pos_query_proj).
    Arch("deberta-v2", "DebertaV2Config", dict(relative_attention=True, pos_att_type=["p2c", "c2p"],
                                               share_att_key=False, position_biased_input=False,
                                               max_relative_positions=16, position_buckets=8,
                                               pooler_hidden_size=HIDDEN, pooler_dropout=0.0),
         head_projections=5),
    # DeBERTa-v3 style: relative positions projected by the shared query/key projections.
    Arch("deberta-v2-shared", "DebertaV2Config", dict(relative_attention=True, pos_att_type=["p2c", "c2p"],
                                                      share_att_key=True, position_biased_input=False,
                                                      max_relative_positions=16, position_buckets=8,
                                                      pooler_hidden_size=HIDDEN, pooler_dropout=0.0)),
    # Fused Wqkv (3 head-grouped parts), GLU feed-forward (Wi = input and gate halves), no biases
    # (the released models' defaults); global attention at layers 0 and 2, a sliding window of
    # +-2 tokens at layer 1 (narrower than the tiny batch, so the local mask matters).
    Arch("modernbert", "ModernBertConfig", dict(_MODERNBERT, local_attention=4, global_attn_every_n_layers=2),
         bias=False, ffn_in_chunks=2, float32_inside=True),
    # The same with biases everywhere and mean pooling (a bias must follow its rows and columns).
    Arch("modernbert-bias", "ModernBertConfig", dict(_MODERNBERT, local_attention=4, global_attn_every_n_layers=2,
                                                     attention_bias=True, mlp_bias=True, norm_bias=True,
                                                     classifier_bias=True, classifier_pooling="mean"),
         ffn_in_chunks=2, float32_inside=True),
]

#: Decoders (causal LMs): GQA (4 query heads, 2 KV heads) where the family has it.
ARCH_TABLE += [
    Arch("llama", "LlamaConfig", dict(attention_bias=True, mlp_bias=True), decoder=True, kv_heads=KV_HEADS),
    # a sliding window (4) narrower than the test sequences
    Arch("mistral", "MistralConfig", dict(sliding_window=4), decoder=True, kv_heads=KV_HEADS),
    Arch("qwen2", "Qwen2Config", {}, decoder=True, kv_heads=KV_HEADS),
    # q/k RMSNorm over head_dim, one weight shared by the heads
    Arch("qwen3", "Qwen3Config", dict(head_dim=HEAD_DIM), decoder=True, kv_heads=KV_HEADS),
    Arch("gemma", "GemmaConfig", dict(head_dim=HEAD_DIM), decoder=True, kv_heads=KV_HEADS),
    # logit soft-capping, sliding and global layers
    Arch("gemma2", "Gemma2Config", dict(_GEMMA, **_LOCAL), decoder=True, kv_heads=KV_HEADS),
    Arch("gemma3", "Gemma3TextConfig", dict(_GEMMA, **_LOCAL), decoder=True, kv_heads=KV_HEADS),
    Arch("starcoder2", "Starcoder2Config", dict(residual_dropout=0.0, embedding_dropout=0.0), decoder=True,
         kv_heads=KV_HEADS),
    # fused qkv_proj of unequal parts [q: 4 heads; k: 2; v: 2], fused gate_up_proj
    Arch("phi3", "Phi3Config", dict(resid_pdrop=0.0, embd_pdrop=0.0), decoder=True, kv_heads=KV_HEADS,
         ffn_in_chunks=2),
    # per-head q/k LayerNorm weights [heads, head_dim] (sliced with the heads)
    Arch("cohere", "CohereConfig", dict(use_qk_norm=True), decoder=True, kv_heads=KV_HEADS),
    # multi-head attention, fused query_key_value interleaved per head [h, 3, d]
    Arch("gpt_neox", "GPTNeoXConfig", dict(num_key_value_heads=None, hidden_dropout=0.0, attention_dropout=0.0),
         decoder=True, kv_heads=HEADS),
    # multi-head attention, Conv1D projections (weight [in, out]), fused c_attn
    Arch("gpt2", "GPT2Config", dict(n_inner=INTERMEDIATE, n_positions=MAX_POS, resid_pdrop=0.0, embd_pdrop=0.0,
                                    attn_pdrop=0.0, num_key_value_heads=None, pad_token_id=0),
         decoder=True, kv_heads=HEADS),
]

ARCHS: dict[str, Arch] = {a.id: a for a in ARCH_TABLE}
#: encoders: what the ``arch`` fixture runs (the encoder tests)
ARCH_IDS: list[str] = [a.id for a in ARCH_TABLE if not a.decoder]
#: decoders: what the ``decoder`` fixture runs (tests/core/test_decoders.py)
DECODER_IDS: list[str] = [a.id for a in ARCH_TABLE if a.decoder]

#: what a tiny model is built for -> transformers auto class
MODEL_HEADS = {
    "classification": transformers.AutoModelForSequenceClassification,
    "mlm": transformers.AutoModelForMaskedLM,
    "base": transformers.AutoModel,
    "lm": transformers.AutoModelForCausalLM,
}


def tiny_config(arch: str, **overrides) -> transformers.PretrainedConfig:
    """The tiny config of table row ``arch`` (``overrides`` replace config arguments)."""
    return ARCHS[arch].config(**overrides)


def tiny_model(arch: str, head: str = "classification", seed: int = 0, attn_implementation: str | None = None,
               **overrides) -> torch.nn.Module:
    """A tiny randomly initialised model of table row ``arch``, in eval mode.

    Args:
        arch: an id of :data:`ARCHS` (``"bert"``, ``"albert"``, ...).
        head: ``"classification"`` (3 labels), ``"mlm"``, ``"base"`` or ``"lm"`` (a causal LM).
        seed: the same seed gives the same weights.
        attn_implementation: ``"eager"`` / ``"sdpa"``; None = the transformers default.
        overrides: config arguments.
    """
    config = tiny_config(arch, **overrides)
    torch.manual_seed(seed)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = MODEL_HEADS[head].from_config(config, **kwargs)
    return model.eval()


def tiny_batch(model, batch: int = 2, seq: int = 7, seed: int = 0, labels: bool = False) -> dict:
    """A batch of random token ids for ``model``; row 1 ends in 2 padding positions.

    Returns:
        ``{"input_ids": [batch, seq], "attention_mask": [batch, seq]}``, plus ``"labels"``
        (``[batch]`` class ids, or ``[batch, seq]`` token ids for a masked-LM model) when asked.
    """
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(5, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1 and seq > 3:
        mask[1, -2:] = 0
        pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        ids[1, -2:] = pad
    out = {"input_ids": ids, "attention_mask": mask}
    if labels:
        if hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
            out["labels"] = torch.randint(5, vocab, (batch, seq), generator=g)
        else:
            out["labels"] = torch.randint(0, model.config.num_labels, (batch,), generator=g)
    return out


def outputs(model, batch: dict, **kwargs) -> torch.Tensor:
    """The model's main output tensor: ``logits`` if it has them, else ``last_hidden_state``."""
    with torch.no_grad():
        out = model(**batch, **kwargs)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def clone(model) -> torch.nn.Module:
    """A deep copy of ``model`` (take it before gates or surgery touch the original)."""
    return copy.deepcopy(model)


def save_tiny(model, path: Path) -> Path:
    """``model.save_pretrained(path)`` (safetensors); returns ``path``."""
    model.save_pretrained(path)
    return Path(path)


@pytest.fixture(params=ARCH_IDS)
def arch(request) -> str:
    """Runs the test once per row of the architecture table."""
    return request.param


@pytest.fixture(params=DECODER_IDS)
def decoder(request) -> str:
    """Runs the test once per decoder row of the architecture table."""
    return request.param


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    yield
