"""Which heads read far back: Wu et al.'s retrieval score (``retrieval``, arXiv 2404.15574) and the
attention mass outside a sink and a recent window (``long-range``). Both describe attention; neither
reads a loss, and neither can drive pruning.

``retrieval``, as the reference computes it (nightdessert/Retrieval_Head @3ac171a,
``retrieval_head_detection.py``): for each needle-in-a-haystack example
([`headcount.data.tasks.niah`][headcount.data.tasks.niah]), prefill the prompt without its last
token (the model's own attention implementation), then decode greedily from that token, up to
``max_new_tokens`` (the reference's 50), with eager attention so that the probabilities exist.
At every step, for every layer and query head, take the position of the last query's largest
attention weight (over every key, as ``topk(1)``); if it lies in the needle span (the answer's
tokens in the prompt) and the token just generated equals the prompt's token there, add
``1 / (span length)`` to that head. Decoding stops after a token holding a line break (``stop:
newline``, the reference's ``<0x0A>``: it decodes on after an end-of-sequence token, up to its 50),
or (``stop: eos-or-newline``) also after an end-of-sequence token. An example counts only if the
retrieval succeeded: the ROUGE-1 recall of the decoded answer against the needle's answer exceeds
0.5 (``success: rouge1``, the reference's ``score > 50``; ``exact``: the answer appears verbatim),
with the reference's scorer (``rouge: porter``, rouge_score with its Porter stemmer) or without
the stemmer (``rouge: plain``; the same on pass keys and digit strings). A head's score is the mean of its
per-example sums over the counted examples. That arithmetic can exceed 1: a model that repeats the
needle (a base model often does) copies each needle token again, and each copy adds ``1 / span``
again (``copies: reference``, the default). ``copies: once`` counts each needle position at most
once per head and example, so a head's score is the share of the needle it copied (at most 1). Generation is the model's ordinary forward with
transformers' cache, one example at a time (the reference's batch of one); no modelling code is
patched: the probabilities are read from each attention module's output, as
``headcount.core.attention.attention_maps`` does.

``long-range``: one ordinary forward pass per batch (eager attention); for every real query
position that has keys outside the first ``sink`` real tokens and its last ``window`` real keys
(itself included), the attention mass on those keys, averaged over all such positions of all
texts. Per key/value head (decoders): the max over the query heads of its group (a KV head must
serve its neediest query head; ``kv_reduce: mean``: their mean), written as ``kv_groups``
``[L, n_kv]`` as ``--unit kv-groups`` writes it.
"""

from __future__ import annotations


import numpy as np
import torch
from torch import nn

from headcount.core.arch import get_adapter, require_decoder
from headcount.core.attention import attention_taps
from headcount.core.gates import hooks, kept_heads
from headcount.data.tasks.niah import ROUGE_RULES, exact_match, rouge1_recall
from headcount.importance.scorer_options import (
    COPY_RULES,
    KV_REDUCE,
    MAX_NEW_TOKENS_RANGE,
    SINK_RANGE,
    STOP_RULES,
    SUCCESS_RULES,
    WINDOW_RANGE,
    LongRangeOptions,
    RetrievalOptions,
)
from headcount.importance.scorers import ScoreContext, Scorer
from headcount.importance.scores import Scores, kv_pool
from headcount.runtime.errors import HeadcountError

# the scorers' options (their defaults, ranges and choices) are declared in headcount.importance.scorer_options
MAX_NEW_TOKENS = RetrievalOptions.max_new_tokens  # the reference's decoding length
COPY_NOTES = {"reference": "the reference's arithmetic: every copy of a needle token adds 1/span, so a head "
                           "that copies a repeated needle again scores above 1",
              "once": "each needle position counted once per head and example: a head's score is the share "
                      "of the needle it copied (at most 1)"}
ROUGE_SUCCESS = 0.5
SINK, WINDOW = LongRangeOptions.sink, LongRangeOptions.window


def _decoder_grid(model: nn.Module, method: str):
    return require_decoder(model, f"--method {method}")


def _kept(model, n_layers: int, n_heads: int) -> list[list[int]]:
    blocks = hooks(model).blocks
    return [kept_heads(blocks[layer].out_projection, n_heads) for layer in range(n_layers)]


def _examples(batches, stop_rule: str = STOP_RULES[0]):
    """``(example, decode, stop ids)`` of niah batches (``headcount.data.tasks.niah.NiahBatch``):
    the batch's ``newline_ids`` for ``stop_rule`` ``newline``, its ``stop_ids`` (end-of-sequence too)
    otherwise."""
    out = []
    for b in batches:
        if not hasattr(b, "examples"):
            raise HeadcountError("--method retrieval needs a needle-in-a-haystack task (--task offline/niah, or a task "
                                 "YAML with kind: niah)")
        stops = getattr(b, "newline_ids", b.stop_ids) if stop_rule == "newline" else b.stop_ids
        out.extend((e, b.decode, stops) for e in b.examples)
    if not out:
        raise HeadcountError("--method retrieval got no examples")
    return out


def copy_hits(positions: torch.Tensor, token: int, prompt_ids: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    """Whether each head's attention argmax (``positions``, any shape) lies in ``span`` on a prompt
    token equal to the ``token`` just generated (bool, the shape of ``positions``).

    >>> copy_hits(torch.tensor([1, 2, 7]), 5, torch.tensor([0, 5, 6, 5]), (1, 3)).tolist()
    [True, False, False]
    """
    start, end = span
    hit = (positions >= start) & (positions < end)
    return hit & (prompt_ids[positions.clamp(0, prompt_ids.shape[0] - 1)] == token)  # in the span: a prompt position


def copies(positions: torch.Tensor, token: int, prompt_ids: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    """One decoding step of the reference's ``retrieval_calculate``: ``1 / span length`` for each head
    whose attention argmax (``positions``, any shape) lies in ``span`` on a prompt token equal to
    the ``token`` just generated, else 0 (float64, the shape of ``positions``).

    >>> copies(torch.tensor([1, 2, 7]), 5, torch.tensor([0, 5, 6, 5]), (1, 3)).tolist()
    [0.5, 0.0, 0.0]
    """
    start, end = span
    return copy_hits(positions, token, prompt_ids, span).double() / (end - start)


def mean_over_counted(per_example: torch.Tensor, counted) -> torch.Tensor:
    """A head's retrieval score: the mean of its per-example sums over the counted examples
    (``per_example [n, L, H]``, ``counted [n]`` bools); 0 where none counts (NaN stays NaN: heads gone).

    >>> mean_over_counted(torch.tensor([[[1.0]], [[0.5]], [[0.25]]]), [True, False, True]).tolist()
    [[0.625]]
    """
    ok = torch.as_tensor(counted, dtype=torch.bool)
    if not ok.any():
        return torch.where(torch.isnan(per_example[0]), per_example[0], 0.0)
    return per_example[ok].double().mean(0)


@torch.no_grad()
def retrieve(model: nn.Module, example, stops, max_new_tokens: int = MAX_NEW_TOKENS, rt=None,
             copy_rule: str = COPY_RULES[0]):
    """One example of the reference's ``decode``: ``(counts [L, H] float64, generated token ids)``.

    ``counts[l, h]``: ``1 / span length`` for every step at which head h of application l put its
    largest weight on a needle-span position holding the token just generated (NaN for heads that
    are gone); with ``copy_rule="once"``, for every such position, however often it is copied.
    Decoding stops after a token of ``stops``, at ``max_new_tokens``, or at the model's last position.
    """
    from headcount.runtime.device import runtime

    rt = rt if rt is not None else runtime(model)
    n_layers, n_heads = _decoder_grid(model, "retrieval")
    kept = _kept(model, n_layers, n_heads)
    ids = torch.as_tensor(example.input_ids, dtype=torch.long, device=rt.device)[None]  # [1, prompt]
    limit = get_adapter(model).max_tokens(model.config)
    steps = max_new_tokens if limit is None else min(max_new_tokens, limit - ids.shape[1] + 1)
    if steps < 1 or ids.shape[1] < 2:
        raise HeadcountError(f"a prompt of {ids.shape[1]} tokens leaves no position to generate in "
                             f"(the model has {limit})")
    counts = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    start, end = example.span
    seen = torch.zeros(n_layers, n_heads, end - start, dtype=torch.bool)  # copy_rule "once": positions copied
    for layer, heads in enumerate(kept):
        gone = sorted(set(range(n_heads)) - set(heads))
        counts[layer, gone] = float("nan")
    argmax: dict[int, torch.Tensor] = {}

    def tap(app, weights):  # weights [1, kept, 1, keys]: the last query's row
        if weights is not None and weights.shape[1]:
            argmax[app] = weights[0, :, -1].argmax(-1)  # [kept]

    with rt.autocast():
        # the model's own attention implementation; only the cache is kept
        cache = model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1).cache
    prompt = ids[0]
    step_in, generated = ids[:, -1:], []
    with attention_taps(model, tap):
        for _ in range(steps):
            argmax.clear()
            with rt.autocast():
                out = model(input_ids=step_in, cache=cache, use_cache=True)
            cache = out.cache
            token = out.logits[0, -1].argmax()
            t = int(token)
            for app, pos in argmax.items():
                if copy_rule == "once":
                    pos = pos.cpu()
                    hit = copy_hits(pos, t, prompt.cpu(), example.span)  # [kept]
                    heads = torch.as_tensor(kept[app])[hit]
                    seen[app, heads, pos[hit] - start] = True
                else:
                    counts[app, kept[app]] += copies(pos, t, prompt, example.span).cpu()
            generated.append(t)
            if t in stops:
                break
            step_in = token.view(1, 1)
    if copy_rule == "once":
        counts += seen.sum(-1).double() / (end - start)  # NaN (gone) stays NaN
    return counts, generated


@torch.no_grad()
def retrieval_scores(model: nn.Module, batches, *, max_new_tokens: int = MAX_NEW_TOKENS,
                     success: str = RetrievalOptions.success, copy_rule: str = RetrievalOptions.copies,
                     stop: str = RetrievalOptions.stop, rouge: str = RetrievalOptions.rouge,
                     progress=None, rt=None) -> Scores:
    """Wu et al.'s retrieval score of every query head ``[L, H]`` (see the module docstring).

    Args:
        model: a decoder with its language-model head.
        batches: ``NiahBatch``es ([`niah_batches`][headcount.data.tasks.niah.niah_batches]).
        max_new_tokens: decoding length (the reference's 50).
        success: ``rouge1`` (the reference) or ``exact``: which examples count.
        copy_rule: ``reference`` (every copy adds ``1 / span``: a head's score can exceed 1 when the
            model repeats the needle) or ``once`` (each needle position once: at most 1).
        stop: ``newline`` (the reference: after a line-break token only) or ``eos-or-newline``.
        rouge: ``porter`` (the reference's ROUGE-1 with the Porter stemmer) or ``plain`` (without it).

    Returns:
        [`Scores`][headcount.importance.scores.Scores]: ``heads`` the mean over counted examples (0 when none
        counts), ``mlps`` NaN, ``per_example [n_examples, L, H]`` each example's counts (0 for the
        examples that do not count: ``heads`` = their sum / the examples counted), and
        ``meta["retrieval"]``: the success rule, the examples' answers (``counted`` says which
        count) and the needle accuracy (the share of examples whose answer appears verbatim).
        [`headcount.analysis.retrieval.retrieval_interval`][headcount.analysis.retrieval.retrieval_interval] adds the bootstrap interval.
    """
    from headcount.runtime.device import runtime

    if success not in SUCCESS_RULES:
        raise HeadcountError(f"unknown success rule {success!r}; choose one of {', '.join(SUCCESS_RULES)}")
    for name, value, rules in (("copy rule", copy_rule, COPY_RULES), ("stop rule", stop, STOP_RULES),
                               ("rouge rule", rouge, ROUGE_RULES)):
        if value not in rules:
            raise HeadcountError(f"unknown {name} {value!r}; choose one of {', '.join(rules)}")
    MAX_NEW_TOKENS_RANGE.check(max_new_tokens, "max_new_tokens")
    rt = rt if rt is not None else runtime(model)
    n_layers = _decoder_grid(model, "retrieval").n_layers
    was_training = model.training
    model.eval()
    rows, counted, records = [], [], []
    try:
        for done, (ex, decode, stops) in enumerate(_examples(batches, stop), 1):
            counts, generated = retrieve(model, ex, stops, max_new_tokens, rt, copy_rule)
            response = decode(generated).strip()
            recall = rouge1_recall(" ".join(ex.answers), response, rouge)
            exact = exact_match(ex.answers, response)
            ok = recall > ROUGE_SUCCESS if success == "rouge1" else exact
            rows.append(counts if ok else torch.where(torch.isnan(counts), counts, 0.0))  # uncounted: 0
            counted.append(ok)
            records.append({"answer": ex.answer, "response": response[:200], "rouge1_recall": round(recall, 4),
                            "exact": exact, "counted": ok, "tokens": len(ex.input_ids),
                            "depth": ex.depth, "span": list(ex.span)})
            if progress:
                progress(done)
    finally:
        model.train(was_training)
    per = torch.stack(rows)  # [n_examples, L, H] float64
    n_ok = int(sum(counted))
    meta = {**rt.meta(), "retrieval": {"success": success, "rouge": rouge, "stop": stop, "copies": copy_rule,
                                       "copies_note": COPY_NOTES[copy_rule],
                                       "max_new_tokens": max_new_tokens, "n_counted": n_ok,
                                       "needle_accuracy": float(np.mean([r["exact"] for r in records])),
                                       "examples": records}}
    return Scores(heads=mean_over_counted(per, counted).float(), mlps=torch.full((n_layers,), float("nan")),
                  method="retrieval", n_examples=len(rows), n_tokens=sum(r["tokens"] for r in records), meta=meta,
                  per_example=per.float())


@torch.no_grad()
def long_range_scores(model: nn.Module, batches, *, sink: int = SINK, window: int = WINDOW,
                      kv_reduce: str = LongRangeOptions.kv_reduce,
                      progress=None, rt=None) -> Scores:
    """The attention mass each query head puts outside a sink and a recent window ``[L, H]``, and
    per key/value head ``meta["kv_groups"] [L, n_kv]`` (see the module docstring).

    Raises:
        HeadcountError: an encoder; texts too short for any query position to have such keys.
    """
    from headcount.runtime.device import runtime, to_device

    SINK_RANGE.check(sink, "sink")
    WINDOW_RANGE.check(window, "window")
    if kv_reduce not in KV_REDUCE:
        raise HeadcountError(f"unknown kv_reduce {kv_reduce!r}; choose one of {', '.join(KV_REDUCE)}")
    rt = rt if rt is not None else runtime(model)
    grid = _decoder_grid(model, "long-range")
    n_layers, n_heads = grid
    kept = _kept(model, n_layers, n_heads)
    total = torch.zeros(n_layers, n_heads, dtype=torch.float64, device=rt.device)
    count, n_examples, n_tokens = 0, 0, 0
    state: dict = {}

    def tap(app, weights):  # [b, kept, q, k]
        if weights is None or not weights.shape[1]:
            return
        mass = (weights * state["far"][:, None].to(weights.dtype)).sum(-1).double()  # [b, kept, q]
        total[app, kept[app]] += (mass * state["queries"][:, None]).sum(dim=(0, 2))

    was_training = model.training
    model.eval()
    try:
        for done, batch in enumerate(batches, 1):
            inputs = to_device({k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}, rt.device)
            real = inputs.get("attention_mask", torch.ones_like(inputs["input_ids"])).bool()  # [b, s]
            rank = real.long().cumsum(-1) - 1  # [b, s]: a token's place among the real ones
            # [b, q, k]: real keys past the sink and before the query's window (the query itself is in it)
            state["far"] = real[:, None, :] & (rank[:, None, :] >= sink) & (rank[:, None, :] <= rank[:, :, None] - window)
            state["queries"] = (real & (rank >= sink + window)).double()  # [b, q]: queries that have such keys
            with attention_taps(model, tap), rt.autocast():
                model(**inputs)
            count += int(state["queries"].sum())
            n_examples += int(real.shape[0])
            n_tokens += int(real.sum())
            if progress:
                progress(n_examples)  # examples done (ScoreContext.progress)
    finally:
        model.train(was_training)
    if count == 0:
        raise HeadcountError(f"--method long-range: no query position has keys outside the first {sink} tokens and "
                             f"its last {window} (texts of more than {sink + window} tokens are needed; "
                             "a longer --max-length, or a smaller window)")
    heads = (total / count).cpu()
    for layer, ks in enumerate(kept):
        heads[layer, sorted(set(range(n_heads)) - set(ks))] = float("nan")
    kv = kv_pool(heads, grid.n_kv_heads, kv_reduce)  # [L, n_kv]: max or mean over each group's query heads
    return Scores(heads=heads.float(), mlps=torch.full((n_layers,), float("nan")), method="long-range",
                  n_examples=n_examples, n_tokens=n_tokens,
                  meta={**rt.meta(), "sink": sink, "window": window, "kv_reduce": kv_reduce, "n_queries": count,
                        "kv_groups": kv.tolist()})


# -- the scorers (registered with the built-ins at the end of headcount.importance.scoring) -------------------------
def _retrieval(model, batches, ctx: ScoreContext) -> Scores:
    o: RetrievalOptions = ctx.options
    return retrieval_scores(model, batches, max_new_tokens=o.max_new_tokens, success=o.success, copy_rule=o.copies,
                            stop=o.stop, rouge=o.rouge, progress=ctx.progress, rt=ctx.rt)


def _long_range(model, batches, ctx: ScoreContext) -> Scores:
    o: LongRangeOptions = ctx.options
    return long_range_scores(model, batches, sink=o.sink, window=o.window, kv_reduce=o.kv_reduce,
                             progress=ctx.progress, rt=ctx.rt)


SCORERS = (
    Scorer("retrieval", _retrieval, needs_loss=False, can_prune=False, per_example=True, scores_mlps=False,
           options=RetrievalOptions,
           description="Wu et al.'s retrieval score: how often a head's attention argmax copies the needle while "
                       "decoding (needle-in-a-haystack tasks; --max-new-tokens, --success, --copies)"),
    Scorer("long-range", _long_range, needs_loss=False, can_prune=False, scores_mlps=False, options=LongRangeOptions,
           description="attention mass outside the first --sink tokens and the last --window keys; per KV head "
                       "the max over its query heads (kv_groups)"),
)
