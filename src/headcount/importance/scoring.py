"""Importance of heads and MLPs: a scorer returns tensors; selecting and applying live elsewhere.

Methods (all in eval mode, no dropout):

- ``gradient``: the absolute gate gradient at g = 1, L_b being the mean loss the model returns
  for batch b, accumulated over the batches in one of two orders (``accumulate``):

  - ``per-batch``: ``sum_b |dL_b / dg_{l,h}|`` (each batch's gradient, then its absolute value);
  - ``cumulative``: ``sum_b |sum_{b' <= b} dL_b' / dg_{l,h}|``: what run_bertology and Prasanna
    et al.'s ``compute_heads_mlps_importance`` compute, since they never zero the gate's
    gradient between batches and add ``|gate.grad|`` (the running gradient) after each one.

  Both before any division by tokens (the references divide by the token count, which no
  normalisation here needs). MLPs likewise with the MLP gates, and, where the adapter declares a
  norm after the attention block (Gemma 2/3), whole attention blocks with the attention gates
  (``Scores.attention [L]``: what removing a layer's attention, a KV group when n_kv == 1, costs).
- ``gradient-token``: Michel et al.'s per-token form, ``sum_{b,t} |dL_b / dg_{b,t,l,h}|``
  = ``sum |<ctx_h, dL/dctx_h>|`` per token.
- ``ablation``: the exact loss change ``sum_b (L_b(g_{l,h} = 0) - L_b)`` when one head (one MLP)
  alone is gated off: the ground truth the gradient approximates.
- ``entropy``: mean attention entropy per head (nats) over real query tokens; not an
  importance, a description (low = focused).
- ``magnitude``: Frobenius norm of each head's query/key/value rows and output columns; of each
  MLP's two projections. Needs no data.
- ``retrieval`` (Wu et al.'s retrieval score on needle-in-a-haystack tasks) and ``long-range``
  (attention mass outside a sink and a recent window): ``headcount.importance.retrieval``.

The ``embedding`` objectives (``score(..., contrastive=...)``, ``headcount.data.embedding``) keep
eval mode too, except the encoder's ``nn.Dropout`` modules inside the unsupervised loss (its
two views, seeded per batch); their batches are never merged (in-batch negatives).

Only the gates require grad: weights are frozen while scoring, so no weight gradient is
computed or stored.

Shapes: ``[n_layers, n_heads]`` for heads (layers = applications: ALBERT is scored per depth),
``[n_layers]`` for MLPs.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import torch
from torch import nn

from headcount.core.gates import clear_gates, gated, hooks, kept_heads, layout, set_gates
from headcount.data.tasks.base import IGNORE
from headcount.importance.activation import activation_scores
from headcount.importance.retrieval import SCORERS as RETRIEVAL_SCORERS
# scorer_names from here: the registry's names with the built-ins below registered
from headcount.importance.scorers import ScoreContext, Scorer, get_scorer, register_scorer, scorer_names  # noqa: F401
from headcount.importance.scores import (
    ACCUMULATE,
    DEFAULT_ACCUMULATE,
    Scores,
    check_accumulate,
    check_normalize,
)
from headcount.runtime.errors import HeadcountError


@contextmanager
def _scoring_mode(model: nn.Module):
    """Eval mode with every weight frozen (only gates get gradients); restored afterwards."""
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)
        model.train(was_training)


def _forward_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    out = model(**batch)
    if getattr(out, "loss", None) is None:
        raise HeadcountError("the model returned no loss: batches need 'labels' for the chosen objective")
    return out.loss


def _tokens(batch: dict) -> int:
    am = batch.get("attention_mask")
    return int(am.sum()) if am is not None else int(batch["input_ids"].numel())


def _row_label_counts(labels: torch.Tensor) -> torch.Tensor:
    """``[b]`` label entries of each row, as ``_label_count`` counts them (their sum is its count)."""
    if labels.is_floating_point():
        return torch.full((labels.shape[0],), labels[0].numel() if labels.shape[0] else 0, dtype=torch.float64)
    return (labels != IGNORE).reshape(labels.shape[0], -1).sum(-1).double()


def _label_count(batch: dict) -> int:
    """The denominator of the model's mean loss: labels that count (class ids other than -100;
    every entry of float labels). Computed on the CPU batch: no device sync."""
    y = batch.get("labels")
    if y is None:
        return 0
    return int(y.numel()) if y.is_floating_point() else int((y != IGNORE).sum())


def _runtime(model, rt):
    from headcount.runtime.device import runtime

    return rt if rt is not None else runtime(model)


def gradient_scores(model: nn.Module, batches, *, per_token: bool = False, keep_per_example: bool = False,
                    progress=None, rt=None, accumulate: str = DEFAULT_ACCUMULATE, at=None) -> Scores:
    """Gate-gradient importance (``gradient``, or ``gradient-token`` with ``per_token=True``).

    Args:
        model: a model with a registered adapter; any persistent gates (a current mask) stay.
        batches: iterable of dicts of tensors with ``labels`` (the model returns the loss).
        per_token: Michel et al.'s per-token absolute value instead of the batch gradient's.
        keep_per_example: also return per-example contributions ``[n_examples, L, H]`` (each
            example's absolute share of its own batch's gradient, whatever ``accumulate``) and,
            for ``gradient``, the signed shares with each row's batch and label entries
            (``Scores.per_example_signed``: what the estimator's own bootstrap rebuilds it from).
        accumulate: ``per-batch`` or ``cumulative`` (see the module docstring); ``gradient``
            only. Defined over the batches as given, so merging (below) changes neither.
        at: optional [`Mask`][headcount.core.masks.Mask]: the gate values at which the gradient is
            taken (default: all 1); a head it removes scores its gradient at gate 0.
        rt: a ``Runtime`` (device, precision, token budget); default:
            the model's device (or ``$HEADCOUNT_DEVICE``) and its defaults.

    Batches are merged up to ``rt.tokens_per_batch`` tokens per forward pass
    (``pack_batches``); the scores are still those of the batches
    as given: the merged loss is the mean over all label entries, so each original batch b's
    gradient is ``N_merged / N_b`` times the sum of its examples' gate gradients, and the
    absolute value is taken per original batch, as without merging (``cumulative``: of the running
    sum of the original batches' gradients, in their order). Gate gradients are
    accumulated in fp64 on the model's device and copied to the CPU once.

    Returns:
        [`Scores`][headcount.importance.scores.Scores] with ``heads [L, H]`` and ``mlps [L]``, and
        ``attention [L]`` (the attention gates', accumulated as the MLPs') where the adapter declares
        a norm after the attention block (``Block.attention_output``), else None.

    >>> s = gradient_scores(model, batches)         # doctest: +SKIP
    >>> s.heads.shape                               # doctest: +SKIP
    torch.Size([6, 12])
    """
    from headcount.data.tasks.batching import batch_groups, pack_batches, padding_id
    from headcount.runtime.device import to_device

    check_accumulate(accumulate, "gradient-token" if per_token else "gradient")
    rt = _runtime(model, rt)
    n_layers, n_heads = layout(model)
    device = rt.device
    heads = torch.zeros(n_layers, n_heads, dtype=torch.float64, device=device)
    mlps = torch.zeros(n_layers, dtype=torch.float64, device=device)
    # cumulative: the running gradient over the original batches so far ([L, H], [L]), which the
    # references leave in gate.grad because they never zero it
    run_h = torch.zeros(n_layers, n_heads, dtype=torch.float64, device=device)
    run_m = torch.zeros(n_layers, dtype=torch.float64, device=device)
    # whole attention blocks [L], where the adapter declares a norm after them: there a layer's head
    # gradients sum to ~0 (the norm's scale invariance) and only the attention gate's measures
    # removing the layer's attention (a KV group with n_kv == 1); elsewhere nothing is added
    blocks = hooks(model).blocks
    with_attention = any(block.attention_output is not None for block in blocks)
    attention = torch.zeros(n_layers, dtype=torch.float64, device=device) if with_attention else None
    run_a = torch.zeros(n_layers, dtype=torch.float64, device=device)
    per_example, n_examples, n_tokens, done = [], 0, 0, 0
    signed, batch_of, labels_of = [], [], []  # gradient: [b, L, H] signed shares, [b] batch ids, [b] label entries
    with _scoring_mode(model):
        for batch, sizes in pack_batches(batches, rt.tokens_per_batch, rt.pad_multiple, padding_id(model)):
            # per original batch: N_merged / N_b turns the merged mean loss's gradient into its own
            counts = torch.tensor([0] + sizes).cumsum(0)
            labels = [_label_count({"labels": batch["labels"][a:b]}) if "labels" in batch else 0
                      for a, b in zip(counts[:-1].tolist(), counts[1:].tolist())]
            total = sum(labels)
            scale = torch.tensor([total / max(n, 1) for n in labels], dtype=torch.float64)
            n_tokens += _tokens(batch)
            batch = to_device(batch, device)
            b, s = batch["input_ids"].shape
            # one gate per example (per token for Michel): at g = 1 their gradients sum to the
            # gradient of a single [L, H] gate, and the per-example parts come for free.
            width = s if per_token else 1
            g = torch.ones(b, width, n_layers, n_heads, device=device)
            m = torch.ones(b, width, n_layers, device=device)
            if at is not None:  # [L, H], [L] broadcast over examples (tokens)
                g = g * at.heads.to(device=device, dtype=g.dtype)
                m = m * at.mlps.to(device=device, dtype=m.dtype)
            g.requires_grad_(True)
            m.requires_grad_(True)
            # attention gates at 1 (a mask's removed heads are already 0 behind them); [b, width, L]
            a = torch.ones(b, width, n_layers, device=device, requires_grad=True) if with_attention else None
            with gated(model, heads=g, mlps=m, attention=a), rt.autocast():
                loss = _forward_loss(model, batch)
            dg, dm, *da = torch.autograd.grad(loss, [g, m] + ([a] if with_attention else []))  # [b, width, L, H], [b, width, L], fp32
            groups = batch_groups(sizes, device)  # [b]: the original batch of each example
            w = scale.to(device)[groups]  # [b] fp64
            if per_token:
                heads += (dg.abs().sum(dim=1).double() * w[:, None, None]).sum(0)
                mlps += (dm.abs().sum(dim=1).double() * w[:, None]).sum(0)
                if with_attention:
                    attention += (da[0].abs().sum(dim=1).double() * w[:, None]).sum(0)
                example = dg.abs().sum(dim=1).double() * w[:, None, None]
            else:
                eg = dg[:, 0].double() * w[:, None, None]  # [b, L, H]: each example's part of its batch's gradient
                em = dm[:, 0].double() * w[:, None]
                # each original batch's gradient (its examples are contiguous), then its absolute value;
                # sums of slices rather than index_add_, whose CUDA atomics would change the order
                gh = torch.stack([part.sum(0) for part in eg.split(sizes)])  # [n_batches, L, H]
                gm = torch.stack([part.sum(0) for part in em.split(sizes)])  # [n_batches, L]
                ga = (torch.stack([part.sum(0) for part in (da[0][:, 0].double() * w[:, None]).split(sizes)])
                      if with_attention else None)  # [n_batches, L], as the MLPs'
                if accumulate == "cumulative":  # running sums after each original batch, in order
                    gh = run_h + gh.cumsum(0)
                    gm = run_m + gm.cumsum(0)
                    run_h, run_m = gh[-1], gm[-1]
                    if with_attention:
                        ga = run_a + ga.cumsum(0)
                        run_a = ga[-1]
                heads += gh.abs().sum(0)
                mlps += gm.abs().sum(0)
                if with_attention:
                    attention += ga.abs().sum(0)
                example = eg.abs()
            if keep_per_example:
                per_example.append(example.float())  # each example's share of its batch's score
                if not per_token:  # the estimator sum_b |G_b| is rebuilt from these on a resample
                    signed.append(eg.float().cpu())
                    batch_of.append(torch.repeat_interleave(torch.arange(done, done + len(sizes)), torch.tensor(sizes)))
                    labels_of.append(_row_label_counts(batch["labels"].cpu()) if "labels" in batch
                                     else torch.zeros(b, dtype=torch.float64))
            n_examples += b
            done += len(sizes)
            if progress:
                progress(n_examples)  # examples done (ScoreContext.progress)
    return Scores(
        heads=heads.float().cpu(), mlps=mlps.float().cpu(),
        attention=attention.float().cpu() if with_attention else None,
        method="gradient-token" if per_token else "gradient",
        n_examples=n_examples, n_tokens=n_tokens,
        per_example=torch.cat(per_example).cpu() if per_example else None,
        per_example_signed=torch.cat(signed) if signed else None,
        example_batches=torch.cat(batch_of) if batch_of else None,
        example_labels=torch.cat(labels_of) if labels_of else None,
        meta={**rt.meta(), "accumulate": "per-token" if per_token else accumulate},
    )


@torch.no_grad()
def ablation_scores(model: nn.Module, batches, progress=None, rt=None) -> Scores:
    """Exact loss change when each head (each MLP) alone is gated off, summed over batches.

    The batches are used as given (each one's mean loss is the quantity summed), moved to the
    model's device once; losses stay on the device until the end.
    """
    from headcount.runtime.device import to_device

    rt = _runtime(model, rt)
    n_layers, n_heads = layout(model)
    device = rt.device
    batches = list(batches)
    n_tokens = sum(_tokens(b) for b in batches)
    n_examples = sum(int(b["input_ids"].shape[0]) for b in batches)
    batches = [to_device(b, device) for b in batches]
    heads = torch.zeros(n_layers, n_heads, dtype=torch.float64, device=device)
    mlps = torch.zeros(n_layers, dtype=torch.float64, device=device)

    def total(**gates) -> torch.Tensor:
        with gated(model, **gates), rt.autocast():
            return torch.stack([_forward_loss(model, b).double() for b in batches]).sum()

    with _scoring_mode(model):
        with rt.autocast():
            base = torch.stack([_forward_loss(model, b).double() for b in batches]).sum()
        done = 0
        for layer in range(n_layers):
            kept = set(kept_heads(hooks(model).blocks[layer].out_projection, n_heads))
            for head in range(n_heads):
                if head in kept:
                    g = torch.ones(n_layers, n_heads, device=device)
                    g[layer, head] = 0
                    heads[layer, head] = total(heads=g) - base
                done += 1
                if progress:
                    progress(done)
            m = torch.ones(n_layers, device=device)
            m[layer] = 0
            mlps[layer] = total(mlps=m) - base
    return Scores(heads=heads.float().cpu(), mlps=mlps.float().cpu(), method="ablation", n_examples=n_examples,
                  n_tokens=n_tokens, meta=rt.meta())


@torch.no_grad()
def entropy_scores(model: nn.Module, batches, progress=None, rt=None) -> Scores:
    """Mean attention entropy (nats) of each head over real (non-padding) query tokens.

    Batches are merged up to the token budget (entropy is a per-token sum: merging changes nothing).
    """
    from headcount.core.attention import attention_maps
    from headcount.data.tasks.batching import pack_batches, padding_id
    from headcount.runtime.device import to_device

    rt = _runtime(model, rt)
    n_layers, n_heads = layout(model)
    device = rt.device
    total = torch.zeros(n_layers, n_heads, dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    n_examples = n_tokens = done = 0
    kept_of = [kept_heads(hooks(model).blocks[layer].out_projection, n_heads) for layer in range(n_layers)]
    with _scoring_mode(model):
        for batch, sizes in pack_batches(batches, rt.tokens_per_batch, rt.pad_multiple, padding_id(model)):
            n_examples += int(batch["input_ids"].shape[0])
            n_tokens += _tokens(batch)
            batch = to_device(batch, device)
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            maps = attention_maps(model, device=device, precision=rt.precision, **inputs)  # per layer [batch, kept, seq, seq]
            am = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).to(torch.float64)  # [batch, seq]
            for layer, p in enumerate(maps):
                ent = -(p.double() * torch.log(p.double().clamp_min(1e-12))).sum(-1)  # [batch, kept, seq]
                per_head = (ent * am[:, None, :]).sum(dim=(0, 2))  # [kept]
                total[layer, kept_of[layer]] += per_head
            count += am.sum()
            done += len(sizes)
            if progress:
                progress(n_examples)  # examples done (ScoreContext.progress)
    heads = (total / count.clamp_min(1.0)).float().cpu()
    for layer in range(n_layers):
        kept = set(kept_of[layer])
        for head in range(n_heads):
            if head not in kept:
                heads[layer, head] = float("nan")
    return Scores(heads=heads, mlps=torch.full((n_layers,), float("nan")), method="entropy",
                  n_examples=n_examples, n_tokens=n_tokens, meta=rt.meta())


@torch.no_grad()
def magnitude_scores(model: nn.Module) -> Scores:
    """Frobenius norm per head (q/k/v rows + output columns) and per MLP (both projections)."""
    h = hooks(model)
    n_layers, n_heads = layout(model)
    d = h.head_dim
    heads = torch.zeros(n_layers, n_heads)
    mlps = torch.zeros(n_layers)
    for layer, block in enumerate(h.blocks):
        kept = kept_heads(block.out_projection, n_heads)
        for pos, head in enumerate(kept):
            # The head's rows in every head-grouped part of each projection (a fused QKV holds
            # three parts); its columns of the output projection.
            sq = sum(float(p.weight[r].float().pow(2).sum()) for p, r in block.head_rows([pos], len(kept), d))
            cols = slice(pos * d, (pos + 1) * d)
            sq += float(block.out_projection.weight[:, cols].float().pow(2).sum())
            heads[layer, head] = sq ** 0.5
        mlps[layer] = float(block.ffn_in.weight.float().pow(2).sum() + block.ffn_out.weight.float().pow(2).sum()) ** 0.5
    return Scores(heads=heads, mlps=mlps, method="magnitude")


def score(model: nn.Module, batches=(), method: str | Scorer = "gradient", normalize: str = "none",
          mask=None, keep_per_example: bool = False, progress=None, *, device=None, precision=None,
          tokens_per_batch: int | None = None, accumulate: str = DEFAULT_ACCUMULATE,
          at_mask: bool = False, contrastive=None, options=None) -> Scores:
    """Score heads and MLPs of ``model`` on ``batches`` (the public verb behind ``headcount score``).

    Args:
        model: any model with a registered adapter, with the head for the objective.
        batches: dicts of tensors with ``labels``; ignored by ``magnitude``.
        method: a registered scorer's name ([`headcount.importance.scorers.scorer_names`][headcount.importance.scorers.scorer_names]), or the
            [`Scorer`][headcount.importance.scorers.Scorer] itself (a command that found it passes it on).
        normalize: one of ``NORMALIZE``.
        mask: optional [`Mask`][headcount.core.masks.Mask] held fixed while scoring (pruning loop):
            a head it removes scores 0 (gradient methods: its gate is 0 and the scored gate 1).
        at_mask: gradient methods: take the gradient at the mask's gate values instead, as
            run_bertology and Prasanna et al. do (their gate tensor is the mask with
            ``requires_grad``): a removed head (MLP) scores its gradient at gate 0, which their
            layer-wise normalisation counts; the loss is the same.
        keep_per_example: keep per-example contributions (gradient methods).
        device: ``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``; None: ``$HEADCOUNT_DEVICE``, else the
            model's device (see ``headcount.runtime.device``); or a resolved
            ``Runtime`` (its precision and budget are used). The model is
            moved there and stays.
        precision: ``auto`` | ``fp32`` | ``bf16`` (autocast); None: ``$HEADCOUNT_PRECISION``, else auto.
        tokens_per_batch: token budget of one forward pass (batches merged; same scores);
            None: the device's default; 0: the batches as given.
        accumulate: ``ACCUMULATE`` (``gradient``; ``ablation``'s gradient comparison): ``per-batch``
            sums each batch's |gradient|, ``cumulative`` the |running gradient| as run_bertology and
            Prasanna et al. do. Recorded as ``meta["accumulate"]`` (``per-token`` for ``gradient-token``).
        contrastive: a ``Contrastive`` for the ``embedding`` objectives:
            the loss is the contrastive one (``headcount.data.embedding.contrastive``; batches from
            ``embedding_batches``), batches are never merged (in-batch
            negatives), and its settings are recorded in ``meta``.
        options: the scorer's own options (``ScoreContext.options``): an instance of its options
            class (``Scorer.options``, e.g. ``RetrievalOptions``), or a mapping of its fields
            (``{"max_new_tokens": 20}``); None: its defaults. A field it does not declare is refused.

    The device, precision and token budget are recorded in ``Scores.meta``.

    >>> s = score(model, batches, method="gradient", normalize="layer+global")   # doctest: +SKIP
    """
    from headcount.runtime.device import runtime

    scorer = method if isinstance(method, Scorer) else get_scorer(method)
    options = scorer.options_of(options)  # checked before the model is touched
    check_normalize(normalize)
    check_accumulate(accumulate, scorer)
    if contrastive is not None:
        tokens_per_batch = 0  # in-batch negatives: a batch is the unit of the loss, never merged
    rt = runtime(model, device, precision, tokens_per_batch)
    at = mask if at_mask and scorer.gate_gradient else None
    fixed = (set_gates(model, heads=mask.heads.to(rt.device), mlps=mask.mlps.to(rt.device))
             if mask is not None and at is None else None)
    t0 = time.perf_counter()
    objective = nullcontext()
    if contrastive is not None and scorer.needs_loss and scorer.needs_data:
        from headcount.data.embedding import contrastive as contrastive_loss

        objective = contrastive_loss(model, contrastive)
    elif contrastive is not None and not scorer.needs_loss:  # attention only: the first texts, no loss
        batches = [{k: v for k, v in b.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
                   for b in batches]
    ctx = ScoreContext(rt=rt, keep_per_example=keep_per_example and scorer.per_example, progress=progress,
                       accumulate=accumulate, at=at, options=options)
    try:
        with objective:
            s = scorer.fn(model, batches, ctx)
    finally:
        if fixed is not None:
            clear_gates(model, fixed)
    s = replace(s, meta={**s.meta, **(contrastive.meta() if contrastive is not None else {}),
                         "seconds": round(time.perf_counter() - t0, 3)})
    return s.normalized(normalize) if normalize != "none" else s


def rank_agreement(a: Scores, b: Scores) -> dict:
    """Spearman and Kendall rank correlation of two head-score grids (finite entries)."""
    from scipy.stats import kendalltau, spearmanr

    x, y = a.heads.flatten().numpy(), b.heads.flatten().numpy()
    ok = torch.isfinite(a.heads.flatten()).numpy() & torch.isfinite(b.heads.flatten()).numpy()
    if ok.sum() < 3:
        return {"spearman": float("nan"), "kendall": float("nan")}
    return {"spearman": float(spearmanr(x[ok], y[ok])[0]), "kendall": float(kendalltau(x[ok], y[ok])[0])}


# -- the built-in scorers: each declared once (the registry: headcount.importance.scorers) -------------------------
def _gradient(model, batches, ctx: ScoreContext) -> Scores:
    return gradient_scores(model, batches, keep_per_example=ctx.keep_per_example, progress=ctx.progress, rt=ctx.rt,
                           accumulate=ctx.accumulate, at=ctx.at)


def _gradient_token(model, batches, ctx: ScoreContext) -> Scores:
    return gradient_scores(model, batches, per_token=True, keep_per_example=ctx.keep_per_example,
                           progress=ctx.progress, rt=ctx.rt, at=ctx.at)


def _ablation(model, batches, ctx: ScoreContext) -> Scores:
    batches = list(batches)
    s = ablation_scores(model, batches, progress=ctx.progress, rt=ctx.rt)
    grad = gradient_scores(model, batches, rt=ctx.rt, accumulate=ctx.accumulate)  # how well the gradient ranks
    return replace(s, meta={**s.meta, "rank_agreement_with_gradient": rank_agreement(s, grad),
                            "accumulate": ctx.accumulate})


def _entropy(model, batches, ctx: ScoreContext) -> Scores:
    return entropy_scores(model, batches, progress=ctx.progress, rt=ctx.rt)


def _activation(model, batches, ctx: ScoreContext) -> Scores:
    return activation_scores(model, batches, progress=ctx.progress, rt=ctx.rt)


def _magnitude(model, batches, ctx: ScoreContext) -> Scores:
    return replace(magnitude_scores(model), meta=ctx.rt.meta())


for _s in (
    Scorer("gradient", _gradient, gate_gradient=True, accumulations=ACCUMULATE, per_example=True,
           description="Michel et al.'s gate gradient, summed over batches (--accumulate per-batch | cumulative)"),
    Scorer("gradient-token", _gradient_token, gate_gradient=True, per_example=True,
           description="Michel et al.'s per-token form: sum over tokens of |dL/dg|"),
    Scorer("ablation", _ablation, accumulations=ACCUMULATE, progress_unit="heads",
           description="the exact loss change when one head (MLP) alone is gated off"),
    Scorer("entropy", _entropy, needs_loss=False, can_prune=False, scores_mlps=False,
           description="mean attention entropy per head (a description, not an importance)"),
    Scorer("activation", _activation, needs_loss=False,
           description="Wanda-sp (FLAP's baseline): input-channel norms of each head's (MLP's) output "
                       "projection times its weight columns, over calibration text; no gradient"),
    Scorer("magnitude", _magnitude, needs_data=False, needs_loss=False,
           description="Frobenius norm of each head's (MLP's) weights; needs no data"),
    *RETRIEVAL_SCORERS,  # retrieval, long-range (headcount.importance.retrieval)
):
    register_scorer(_s)
del _s
