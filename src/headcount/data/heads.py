"""A task head fitted on a frozen encoder, and the replay both head fits use.

A fit runs the frozen encoder once, keeps what the head reads, and replays it to the head:

- ``fit_task_head``: a classifier's head (the parameters outside ``model.base_model``; a
  pooler inside the encoder stays frozen) on the encoder's output at the first position and its
  pooled output (``[n_examples, hidden]`` each), for a number of epochs (AdamW, batches in a seeded
  order, dropout on in the head).
- the masked-LM head ([`headcount.data.mlm_head.fit_mlm_head`][headcount.data.mlm_head.fit_mlm_head]) replays the same way.

Replaying: [`replaying_encoder`][headcount.data.heads.replaying_encoder] puts a stand-in module in the encoder's place for the
duration of the fit (the model's own forward, head and loss run unchanged on the given encoder
output); no module's ``forward`` is reassigned, and every parameter gets its own
``requires_grad`` back afterwards.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

from headcount.core.arch import get_adapter
from headcount.runtime.device import place
from headcount.runtime.errors import HeadcountError

__all__ = ["fit_task_head", "replaying_encoder"]


# =============================================================================================
# replaying cached encoder outputs to a head
# =============================================================================================
class _Replay(nn.Module):
    """Stands in for a model's encoder: ``forward`` returns ``output`` (set by the caller).

    Other attributes are read from the real encoder (some heads read e.g. its embeddings), which
    is not registered as a submodule: its parameters stay out of the model while it stands aside.
    """

    def __init__(self, encoder: nn.Module):
        super().__init__()
        object.__setattr__(self, "_encoder", encoder)
        self.output = None

    def forward(self, *args, **kwargs):
        if self.output is None:
            raise HeadcountError("no encoder output to replay")
        return self.output

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            encoder = self.__dict__.get("_encoder")
            if encoder is None:
                raise
            return getattr(encoder, name)


@contextmanager
def replaying_encoder(model: nn.Module):
    """Inside the block, the model's encoder is a stand-in that returns ``stand_in.output``.

    The encoder module (``model.base_model``) is put back afterwards, unchanged: only the
    attribute of ``model`` that holds it is swapped (``model.base_model_prefix``).

    >>> with replaying_encoder(model) as stand_in:          # doctest: +SKIP
    ...     stand_in.output = BaseModelOutput(last_hidden_state=hidden)   # [batch, seq, hidden]
    ...     loss = model(input_ids=ids, labels=labels).loss
    """
    prefix = getattr(model, "base_model_prefix", "")
    encoder = getattr(model, prefix, None) if prefix else None
    if not isinstance(encoder, nn.Module) or encoder is model:
        raise HeadcountError("the model has no encoder below its head (no base_model_prefix module)")
    stand_in = _Replay(encoder)
    setattr(model, prefix, stand_in)
    try:
        yield stand_in
    finally:
        setattr(model, prefix, encoder)


@contextmanager
def _trainable(model: nn.Module, params):
    """Only ``params`` require gradients inside the block; every parameter's own flag after it."""
    own = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in own:
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        yield
    finally:
        for p, flag in own:
            p.requires_grad_(flag)


# =============================================================================================
# a task head on a frozen encoder
# =============================================================================================
def _output(kind, seq, pooled):
    """An encoder output of class ``kind`` holding ``seq`` (and ``pooled`` where the class has a
    pooled output): what the head reads, nothing else (no cache, no attentions)."""
    if kind is None or not hasattr(kind, "__dataclass_fields__"):
        kind = BaseModelOutputWithPooling
    extra = {"pooler_output": pooled} if "pooler_output" in kind.__dataclass_fields__ else {}
    return kind(last_hidden_state=seq, **extra)


def fit_task_head(model, batches, *, lr: float, epochs: float, weight_decay: float, seed: int = 0,
                  progress=None, device=None) -> dict:
    """Train only a classifier's task head (the parameters outside ``model.base_model``) on a frozen encoder.

    The encoder runs once over ``batches`` (no gradient); its outputs at the first position
    and its pooled output, all a sequence-classification head reads, are kept and replayed to the
    head for every epoch (AdamW, batches in a seeded random order, dropout on in the head).

    Args:
        model: a sequence-classification model (its encoder is left unchanged).
        batches: task batches with ``labels`` (``headcount.data.tasks.make_batches``).
        lr / epochs / weight_decay: AdamW settings; a fractional epoch count runs that share of
            the last epoch's batches.
        seed: order of the batches.
        progress: called with one line per epoch.
        device: where to train ([`headcount.runtime.device.place`][headcount.runtime.device.place]: the model is moved there; None:
            ``$HEADCOUNT_DEVICE`` when set, else where the model is).

    Returns:
        ``{"steps", "train_loss", "trainable_params"}``; the model is left in eval mode with
        each parameter's ``requires_grad`` as it was.

    >>> fit_task_head(model, batches, lr=1e-3, epochs=10, weight_decay=0.0)["steps"]      # doctest: +SKIP
    250
    """
    base = model.base_model
    device = place(model, device)  # the encoder pass and the head's training both run there
    in_base = {id(p) for p in base.parameters()}
    head = [p for p in model.parameters() if id(p) not in in_base]
    if not head:
        raise HeadcountError("the model has no task head outside its encoder")
    # BERT-style heads read the first position and the pooled output only: cache [batch, 1, hidden];
    # a head that pools every position (the adapter says) needs [batch, seq, hidden] and the mask.
    all_positions = get_adapter(model).task_head_reads_all_positions(model)
    cached, kind = [], None
    model.eval()
    with torch.no_grad():
        for b in batches:
            inputs = {k: v.to(device) for k, v in b.items() if k != "labels"}
            out = base(**inputs)
            kind = type(out)  # replayed as the same output class (a decoder's head reads its .cache)
            seq = out[0] if all_positions else out[0][:, :1]
            pooled = getattr(out, "pooler_output", None)  # [batch, hidden] or None
            replay = {"input_ids": inputs["input_ids"] if all_positions else inputs["input_ids"][:, :1]}
            if all_positions and "attention_mask" in inputs:
                replay["attention_mask"] = inputs["attention_mask"]
            cached.append((seq.detach().clone(), None if pooled is None else pooled.detach().clone(),
                           b["labels"].to(device), replay))
    rng = np.random.default_rng(seed)
    n_steps = int(math.ceil(epochs * len(cached)))
    losses, step = [], 0
    try:
        with _trainable(model, head):
            opt = torch.optim.AdamW(head, lr=lr, weight_decay=weight_decay)
            model.train()
            with replaying_encoder(model) as stand_in:
                while step < n_steps:
                    for i in rng.permutation(len(cached)):
                        if step >= n_steps:
                            break
                        seq, pooled, labels, replay = cached[i]
                        stand_in.output = _output(kind, seq, pooled)
                        loss = model(**replay, labels=labels).loss
                        opt.zero_grad(set_to_none=True)
                        loss.backward()
                        opt.step()
                        losses.append(float(loss.detach()))
                        step += 1
                    if progress:
                        progress(f"epoch {step / len(cached):.1f}: loss {np.mean(losses[-len(cached):]):.4f}")
    finally:
        model.eval()
    return {"steps": step, "train_loss": float(np.mean(losses[-len(cached):])) if losses else float("nan"),
            "trainable_params": int(sum(p.numel() for p in head))}
