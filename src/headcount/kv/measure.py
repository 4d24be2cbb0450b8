"""Measure one KV budget on a decoder: the bytes its cache holds, needle accuracy, LM loss, speed.

[`measure_kv_budget`][headcount.kv.measure.measure_kv_budget] is the one measurement behind the
retrieval study's ``curve_job`` and ``headcount kv-eval``: for a
[`KVBudget`][headcount.kv.budget.KVBudget] applied with
[`apply_kv_budget`][headcount.kv.cache.apply_kv_budget],

- needle accuracy: greedy ``generate`` with a fresh budget cache per prompt, the answer cut at the
  first line break (or end of sequence), success when the needle's answer appears verbatim; the
  cache's bytes at the end of each generation and the seconds of each decoding step;
- the LM loss (mean next-token cross-entropy) on ordinary texts of the context length, the
  budget's attention in the forward pass (a fresh cache per text), and the cache's bytes after the
  first of those prefills (exactly the context length: what ``KVBudget.kv_bytes`` predicts), with
  each prefill's seconds.

[`lm_chunks`][headcount.kv.measure.lm_chunks] cuts those texts. It lives with the cache it
measures; the niah task's answer rule comes from ``data``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from headcount.data.tasks.niah import exact_match, stop_ids
from headcount.kv.budget import PREFILL_RULES, KVBudget
from headcount.kv.cache import apply_kv_budget
from headcount.runtime.errors import HeadcountError

__all__ = ["lm_chunks", "measure_kv_budget"]


def lm_chunks(task, tokenizer, split: str, n: int, length: int, seed: int,
              texts: Sequence[str] | None = None) -> list[list[int]]:
    """``n`` texts of exactly ``length`` tokens of ordinary text: the task's haystack texts of ``split``
    (or ``texts``) in a seeded order (repeated when they run out), joined by spaces, tokenized once, cut."""
    texts = [" ".join(str(t).split()) for t in (task.source.haystack(split) if texts is None else texts)]
    texts = [t for t in texts if t]
    if not texts:
        raise HeadcountError(f"the haystack of {task.name} has no {split} text for the LM loss")
    order = np.random.default_rng([seed, 7]).permutation(len(texts))
    need, chosen, words, k = n * length, [], 0, 0
    while True:
        while words < need:
            chosen.append(texts[order[k % len(order)]])
            words += len(chosen[-1].split())
            k += 1
        ids = tokenizer(" ".join(chosen), add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) >= need:
            return [list(ids[i * length:(i + 1) * length]) for i in range(n)]
        need += n * length  # fewer tokens than words (never expected): take more texts


class _StepClock:
    """A ``generate`` streamer that only notes when each step's token came: ``put`` is called once
    with the prompt, then once per new token (after its forward pass: ``.cpu()`` has synchronised)."""

    def __init__(self, clock: Callable[[], float]):
        self.clock, self.times, self._prompt = clock, [], True

    def put(self, value) -> None:
        if self._prompt:  # the prompt itself, before any forward pass
            self._prompt = False
            return
        self.times.append(self.clock())

    def end(self) -> None:
        pass


def measure_kv_budget(model, tokenizer, budget: KVBudget, examples, chunks: Sequence[Sequence[int]], *,
                      max_new_tokens: int, device, autocast, progress=None, clock: Callable[[], float] = time.perf_counter,
                      prefill: str = PREFILL_RULES[0]) -> dict:
    """One budget's measurements (no gradient; the model in eval mode on ``device``).

    Args:
        model: a decoder with its LM head (``budget.check_model(model)`` passed).
        tokenizer: its tokenizer (stop tokens, decoding the answers).
        budget: the budget to apply.
        examples: niah examples (``input_ids``, ``answer``, ``answers``, ``depth``).
        chunks: token lists for the LM loss; the first one's prefill gives the measured bytes.
        max_new_tokens: greedy tokens per answer.
        device: where the inputs go.
        autocast: a zero-argument context manager factory (the runtime's ``autocast``).
        progress: ``progress(done, total, detail)`` after each prompt and text (None: silent).
        clock: seconds (timing only; no result depends on it).
        prefill: how streaming heads attend inside one call (``PREFILL_RULES``: ``masked``, ``full``).

    Returns:
        A dict: ``answers`` (per prompt: ``answer``, ``response``, ``exact``, ``tokens``, ``depth``),
        ``kv_bytes`` (the cache after the first text's prefill; None without a text),
        ``element_size``, ``losses`` (per text), ``kv_bytes_end`` (per prompt: the cache when its
        generation ended), ``new_tokens`` (per prompt), ``prefill_s`` (per text: seconds of its
        forward pass), ``first_token_s`` (per prompt: seconds to the first new token) and
        ``decode_s`` (per prompt: seconds of the steps after the first new token, whose count is
        ``new_tokens - 1``).
    """
    stops = stop_ids(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    total = len(examples) + len(chunks)
    done, answers, ends, new_tokens, first_s, decode_s = 0, [], [], [], [], []
    with torch.no_grad():
        for ex in examples:
            ids = torch.as_tensor([ex.input_ids], dtype=torch.long, device=device)
            steps = _StepClock(clock)
            with apply_kv_budget(model, budget, prefill) as cache, autocast():
                start = clock()
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache,
                                     max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                     eos_token_id=sorted(stops), pad_token_id=pad, streamer=steps)
                ends.append(cache.nbytes())
            new = out[0, ids.shape[1]:].tolist()
            new_tokens.append(len(new))
            first_s.append(steps.times[0] - start if steps.times else float("nan"))
            decode_s.append(steps.times[-1] - steps.times[0] if steps.times else 0.0)
            cut = next((i + 1 for i, t in enumerate(new) if t in stops), len(new))  # stop after a line break
            response = tokenizer.decode(new[:cut], skip_special_tokens=True).strip()
            answers.append({"answer": ex.answer, "response": response[:200], "exact": exact_match(ex.answers, response),
                            "tokens": len(ex.input_ids), "depth": ex.depth})
            done += 1
            if progress is not None:
                progress(done, total, f"needles: {sum(a['exact'] for a in answers)} of {done}")
        losses, prefill_s, measured, element = [], [], None, None
        for chunk in chunks:
            ids = torch.as_tensor([chunk], dtype=torch.long, device=device)
            with apply_kv_budget(model, budget, prefill) as cache, autocast():
                start = clock()
                out = model(input_ids=ids, labels=ids, cache=cache, use_cache=True)
                loss = float(out.loss)  # synchronises: the prefill's time ends here
                prefill_s.append(clock() - start)
                if measured is None:  # the cache after a prefill of exactly the context length
                    measured = cache.nbytes()
                    element = next(t.element_size() for layer in cache.layers for part in layer.parts
                                   for t in part.tensors())
            losses.append(loss)
            del out
            done += 1
            if progress is not None:
                progress(done, total, f"LM loss {np.mean(losses):.3f}")
    return {"answers": answers, "kv_bytes": measured, "element_size": element, "losses": losses,
            "kv_bytes_end": ends, "new_tokens": new_tokens, "prefill_s": prefill_s, "first_token_s": first_s,
            "decode_s": decode_s}
