"""What an architecture adapter tells the generic code.

An adapter is the only place that knows attribute paths such as
``encoder.layer[i].attention.self.query``. Generic code (gates, surgery, scoring) sees
[`Block`][headcount.core.arch.base.Block] objects: one per *application* of a transformer layer, in execution order.
ALBERT applies one shared layer at every depth, so its blocks repeat the same modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass(frozen=True)
class Block:
    """One application of a transformer layer.

    Attributes:
        layer: the module that runs once per application (its pre-hook tells the gates
            which application is running).
        attention: the module whose ``forward`` is replaced when every head is removed.
        head_projections: linears whose *output rows* are grouped by head
            (query, key, value, and relative-position projections where they exist).
        out_projection: the linear whose *input columns* are grouped by head;
            head gates multiply its input (the per-head context vectors).
        ffn_in: the feed-forward input projection (rows = neurons).
        ffn_out: the feed-forward output projection (columns = neurons); MLP gates multiply
            its output, bias included.
        head_chunks: per entry of ``head_projections``, how many head-grouped parts its rows
            hold, one after the other (default: 1 each). A fused query/key/value projection
            is 3 parts of ``[n_heads * head_dim]`` rows; removing a head removes its rows in
            every part.
        ffn_in_chunks: how many neuron-indexed parts the rows of ``ffn_in`` hold (default 1).
            A gated feed-forward block (GLU: ``act(x W_in) * (x W_gate)``) fused into one
            linear is 2 parts of ``[intermediate]`` rows; removing neuron i removes row i of
            every part.
        head_units: decoders (grouped-query attention): per entry of ``head_projections``, the
            unit of each of its head-grouped parts, outer to inner: ``"q"`` (query heads) or
            ``"kv"`` (key/value heads). Separate projections: ``("q",), ("kv",), ("kv",)``; a
            fused ``[q; k; v]`` projection of unequal parts: ``(("q", "kv", "kv"),)``. Default:
            every part ``"q"`` (an encoder's head is its own key/value head).
        head_interleave: per head projection, how many parts sit *inside* each head (rows
            ``[heads, interleave, head_dim]``, a fused projection interleaved per head); default 1.
        ffn_in_extra: more feed-forward input projections whose rows are neurons (a gated MLP
            with separate ``gate_proj`` and ``up_proj``: ``ffn_in`` is one, this holds the other).
        per_head: ``(module, parameter name, unit)`` of tensors whose dim 0 is heads of that unit
            (per-head q/k norm weights ``[n_heads, head_dim]``, attention sinks ``[n_heads]``):
            surgery slices them like the projections' rows.
        mlp_output: where the feed-forward block's contribution to the residual stream leaves:
            the module whose output is added to the residual, which the MLP gate multiplies.
            Default (None): ``ffn_out`` (its output, bias included). A family that normalises the
            block's output before the residual add ("sandwich" norms, Gemma 2/3's
            ``post_feedforward_layernorm``) names that norm: an RMSNorm is scale-invariant, so a
            gate in front of it would have a zero gradient whatever the block does. The module must
            map zeros to zeros (an RMSNorm does), so that gate 0 equals the pruned block.
        attention_output: the same for the attention block (Gemma 2/3's ``post_attention_layernorm``);
            default ``out_projection``. The attention gate multiplies what this module adds to the
            residual beyond what it adds with every head removed (the out projection's bias, or
            the norm of it), so attention gate 0 equals removing every head. Head gates stay at
            ``out_projection``'s input either way: zeroing one head's context is removing it.

    A projection may be a transformers ``Conv1D`` (weight ``[in, out]``): its "rows" are then
    weight columns; surgery and the weight-based scorers handle both (``out_dim``).
    """

    layer: nn.Module
    attention: nn.Module
    head_projections: tuple[nn.Linear, ...]
    out_projection: nn.Linear
    ffn_in: nn.Linear
    ffn_out: nn.Linear
    head_chunks: tuple[int, ...] = ()
    ffn_in_chunks: int = 1
    head_units: tuple[tuple[str, ...], ...] = ()
    head_interleave: tuple[int, ...] = ()
    ffn_in_extra: tuple[nn.Module, ...] = ()
    per_head: tuple[tuple[nn.Module, str, str], ...] = field(default=())
    mlp_output: nn.Module | None = None
    attention_output: nn.Module | None = None

    def __post_init__(self):
        if self.head_chunks and len(self.head_chunks) != len(self.head_projections):
            raise ValueError("head_chunks needs one entry per head projection")
        if self.head_units and len(self.head_units) != len(self.head_projections):
            raise ValueError("head_units needs one entry per head projection")
        if any(u not in ("q", "kv") for units in self.head_units for u in units):
            raise ValueError("head_units entries are 'q' or 'kv'")

    def mlp_gate_point(self) -> nn.Module:
        """The module whose output the MLP gate multiplies (``mlp_output``, else ``ffn_out``)."""
        return self.ffn_out if self.mlp_output is None else self.mlp_output

    def attention_gate_point(self) -> nn.Module:
        """The module whose output the attention gate scales (``attention_output``, else ``out_projection``)."""
        return self.out_projection if self.attention_output is None else self.attention_output

    def units(self) -> list[tuple[nn.Module, tuple[str, ...], int]]:
        """``(projection, units of its parts, interleave)`` for every head projection."""
        chunks = self.head_chunks or (1,) * len(self.head_projections)
        units = self.head_units or tuple(("q",) * c for c in chunks)
        inter = self.head_interleave or (1,) * len(self.head_projections)
        return list(zip(self.head_projections, units, inter))

    def unit_rows(self, q: list[int], n_q: int, kv: list[int] | None, n_kv: int,
                  head_dim: int) -> list[tuple[nn.Module, torch.Tensor]]:
        """``(projection, row indices)`` selecting query heads at positions ``q`` (of the ``n_q``
        the projections hold now) and key/value heads at positions ``kv`` (of ``n_kv``; repeats
        allowed: a K/V head kept twice). ``kv=None`` leaves out the key/value parts (a projection
        made only of them is then left out too).

        >>> b = Block(nn.Identity(), nn.Identity(), (nn.Linear(2, 8),), nn.Linear(4, 2), nn.Identity(),
        ...           nn.Identity(), head_units=(("q", "kv", "kv"),))
        >>> [(_, rows)] = b.unit_rows([1], 2, [0, 0], 1, head_dim=2)
        >>> rows.tolist()   # q head 1, kv head 0 twice
        [2, 3, 4, 5, 4, 5, 6, 7, 6, 7]
        """
        out = []
        for proj, units, inter in self.units():
            rows, offset = [], 0
            for unit in units:
                pos, n = (q, n_q) if unit == "q" else (kv, n_kv)
                if pos is not None:
                    width = inter * head_dim  # rows of one head in this part: [interleave, head_dim]
                    rows += [offset + p * width + j for p in pos for j in range(width)]
                offset += n * inter * head_dim
            if rows or all(u == "q" for u in units):
                out.append((proj, torch.tensor(rows, dtype=torch.long)))
        return out

    def head_parts(self) -> list[tuple[nn.Linear, int]]:
        """``(projection, parts)`` for every head projection (parts = head-grouped chunks of rows)."""
        chunks = self.head_chunks or (1,) * len(self.head_projections)
        return list(zip(self.head_projections, chunks))

    def head_rows(self, positions: list[int], n_kept: int, head_dim: int) -> list[tuple[nn.Linear, torch.Tensor]]:
        """``(projection, row indices)`` of the heads at ``positions`` (of the ``n_kept`` heads the
        projections hold now), for every head projection: what surgery keeps, what a per-head
        weight norm sums over."""
        if self.head_units or self.head_interleave:  # a decoder's layout: its query-head rows
            return self.unit_rows(positions, n_kept, None, 0, head_dim)
        return [(proj, grouped_rows(positions, head_dim, n_kept, chunks)) for proj, chunks in self.head_parts()]

    def ffn_in_rows(self, positions: list[int], n_kept: int) -> torch.Tensor:
        """Rows of ``ffn_in`` of the neurons at ``positions`` (of the ``n_kept`` it holds now)."""
        return grouped_rows(positions, 1, n_kept, self.ffn_in_chunks)


def grouped_rows(positions: list[int], width: int, n_groups: int, chunks: int = 1) -> torch.Tensor:
    """Row indices of the groups at ``positions`` in a linear whose rows are laid out as
    ``[chunks, n_groups, width]`` (a head: width = head_dim; a neuron: width = 1).

    >>> grouped_rows([1], width=2, n_groups=3, chunks=2).tolist()   # rows of group 1 in both chunks
    [2, 3, 8, 9]
    """
    return torch.tensor([c * n_groups * width + p * width + j
                         for c in range(chunks) for p in positions for j in range(width)], dtype=torch.long)


def kv_plan(q_heads: list[int], group: int) -> list[int]:
    """The key/value heads that serve the query heads ``q_heads`` (original ids, ascending) of a
    grouped-query layer (``group`` = n_q / n_kv query heads per KV head in the architecture).

    transformers maps query head i to key/value head ``i // num_key_value_groups``, the same
    quotient for every head. A kept KV group g with n_g query heads left gets ``n_g / c`` slots
    (its K/V head repeated), ``c = gcd(n_g)``: the largest uniform quotient that keeps every
    query head reading its own K/V head. Even cuts repeat nothing; uneven ones grow the cache.

    Returns:
        the original KV head of each slot, in slot order (repeats = K/V heads stored twice).

    >>> kv_plan([0, 1, 4, 5], group=2)    # whole KV groups 0 and 2: 2 slots, quotient 2
    [0, 2]
    >>> kv_plan([0, 1, 2, 4], group=3)    # 3 heads read KV 0, 1 reads KV 1: gcd 1
    [0, 0, 0, 1]
    """
    counts: dict[int, int] = {}
    for h in q_heads:
        counts[h // group] = counts.get(h // group, 0) + 1
    c = math.gcd(*counts.values()) if counts else 1
    return [g for g, n in counts.items() for _ in range(n // c)]


def out_dim(module: nn.Module) -> int:
    """The weight dimension that holds a projection's outputs: 0 for ``nn.Linear``
    (``[out, in]``), 1 for a transformers ``Conv1D`` (``[in, out]``, GPT-2's projections)."""
    return 1 if type(module).__name__ == "Conv1D" else 0


@dataclass(frozen=True)
class Layout:
    """How many layers and heads: the grid that gates, scores and masks are indexed by.

    Read from the config and the module tree (no hooks are installed). It unpacks as
    ``(n_layers, n_heads)``, the shape of a head gate grid.

    Attributes:
        n_layers: applications of a transformer layer, in execution order (ALBERT: its one
            shared layer counts once per depth).
        n_heads: heads per application in the architecture (surgery removes some, never
            renumbers: removed heads keep their index in the grid).
        head_dim: size of one head's context vector.
        groups: applications grouped by the physical layer they run, ``((0,), (1,), ...)``;
            ALBERT: one group of every application.
        n_kv_heads: decoders: key/value heads per layer in the architecture (grouped-query
            attention: fewer than ``n_heads``, query head h reads KV head
            ``h // (n_heads / n_kv_heads)``); None for encoders.

    >>> n_layers, n_heads = Layout(6, 12, 32, tuple((i,) for i in range(6)))
    >>> (n_layers, n_heads)
    (6, 12)
    """

    n_layers: int
    n_heads: int
    head_dim: int
    groups: tuple[tuple[int, ...], ...]
    n_kv_heads: int | None = None

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads if self.n_kv_heads else 1

    def __iter__(self):
        return iter((self.n_layers, self.n_heads))

    def __getitem__(self, i: int) -> int:
        return (self.n_layers, self.n_heads)[i]

    def __len__(self) -> int:
        return 2

    @property
    def shared(self) -> bool:
        """Some physical layer runs at more than one depth (ALBERT)."""
        return len(self.groups) != self.n_layers


class Adapter:
    """Base class: subclasses name the model types they serve and where the modules are."""

    #: ``config.model_type`` values this adapter serves.
    model_types: tuple[str, ...] = ()
    #: the architectures' names as papers write them (the docs' list of supported models).
    family: tuple[str, ...] = ()
    #: a causal language model with a key/value cache (query heads read KV heads): declared by the
    #: adapter, never inferred from a model's name; [`require_decoder`][headcount.core.arch.registry.require_decoder]
    #: asks it for every command that needs one.
    is_decoder: bool = False

    # --- sizes (from the config) -------------------------------------------------------
    def num_heads(self, config) -> int:
        return int(config.num_attention_heads)

    def head_dim(self, config) -> int:
        return int(getattr(config, "attention_head_size", 0) or config.hidden_size // self.num_heads(config))

    def num_kv_heads(self, config) -> int | None:
        """Key/value heads per layer (decoders); None: an encoder, whose heads have no KV level."""
        return None

    def intermediate_size(self, config) -> int:
        return int(config.intermediate_size)

    # --- module paths ------------------------------------------------------------------
    def base(self, model: nn.Module) -> nn.Module:
        """The bare encoder model (``BertModel`` inside ``BertForSequenceClassification``)."""
        return getattr(model, "base_model", model)

    #: submodules of the bare encoder model that only a task head reads (BERT's pooler): a
    #: checkpoint without them gets them new with the head, a model without them drops them
    task_head_parts: tuple[str, ...] = ("pooler",)

    def is_body_tensor(self, model: nn.Module, name: str) -> bool:
        """Whether tensor ``name`` (a state-dict key of ``model`` or of a checkpoint loaded into
        it, with or without the base model's prefix) belongs to the encoder body: the bare
        encoder model, less its ``task_head_parts``. A missing or unexpected body tensor means
        a broken checkpoint; a task head's (``classifier.*``, an MLM head) may be new or dropped.

        Examples:
            >>> import transformers
            >>> m = transformers.BertForSequenceClassification(transformers.BertConfig(
            ...     hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, vocab_size=10))
            >>> a = Adapter()
            >>> [a.is_body_tensor(m, k) for k in ("bert.encoder.layer.1.output.dense.weight", "encoder.layer.0.x",
            ...                                   "classifier.weight", "bert.pooler.dense.bias")]
            [True, True, False, False]
        """
        base = self.base(model)
        prefix = getattr(model, "base_model_prefix", "") or ""
        if prefix and name.startswith(prefix + "."):
            name = name[len(prefix) + 1:]
        first = name.split(".", 1)[0]
        children = {n for n, _ in base.named_children()} | {n for n, _ in base.named_parameters(recurse=False)} \
            | {n for n, _ in base.named_buffers(recurse=False)}
        return first in children and first not in self.task_head_parts

    def max_tokens(self, config) -> int | None:
        """The longest input (in tokens, special tokens included) the model's position embeddings
        take (or, rotary, were trained for); None: no such limit (relative positions only)."""
        n = getattr(config, "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def encoder(self, model: nn.Module) -> nn.Module:
        """The module whose forward runs every block once (its pre-hook resets counters)."""
        raise NotImplementedError

    def blocks(self, model: nn.Module) -> list[Block]:
        """One [`Block`][headcount.core.arch.base.Block] per application, in execution order."""
        raise NotImplementedError

    def layout(self, model: nn.Module) -> Layout:
        """The model's [`Layout`][headcount.core.arch.base.Layout] (from its config and module tree; nothing is installed)."""
        groups: dict[int, list[int]] = {}
        blocks = self.blocks(model)
        for app, block in enumerate(blocks):
            groups.setdefault(id(block.layer), []).append(app)
        return Layout(len(blocks), self.num_heads(model.config), self.head_dim(model.config),
                      tuple(tuple(g) for g in groups.values()), self.num_kv_heads(model.config))

    # --- what surgery needs to change besides weights ---------------------------------
    def set_heads(self, attention: nn.Module, n_heads: int, n_kv: int, head_dim: int) -> None:
        """After surgery: ``n_heads`` query heads read ``n_kv`` key/value slots (decoders;
        encoders: ``n_kv == n_heads``). Default: ``set_num_heads``."""
        self.set_num_heads(attention, n_heads, head_dim)

    def set_num_heads(self, attention: nn.Module, n_heads: int, head_dim: int) -> None:
        """Update the attention module's head-count attributes after surgery."""
        for name in ("num_attention_heads", "n_heads"):
            if hasattr(attention, name):
                setattr(attention, name, n_heads)
        if hasattr(attention, "all_head_size"):
            attention.all_head_size = n_heads * head_dim

    def task_head_reads_all_positions(self, model: nn.Module) -> bool:
        """Whether the sequence-classification head reads every position (e.g. mean pooling)
        rather than only the first one and the pooled output (BERT-style heads: False).

        Tells ``headcount.data.heads.fit_task_head`` what to cache of the frozen encoder's output.
        """
        return False

    def attention_without_heads(self, attention: nn.Module, hidden_states: torch.Tensor, *args, **kwargs):
        """Forward of an attention module with no head left (gate semantics: every g = 0).

        Default: the module returns the per-head context ``[batch, seq, 0]`` and no weights;
        the output projection that follows then yields its bias.
        """
        return hidden_states.new_zeros(*hidden_states.shape[:-1], 0), None
