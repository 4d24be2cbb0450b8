"""A pruned SmolLM2-shaped decoder: KV-cache bytes, prefill and decoding speed vs their bounds.

Model: SmolLM2-135M's exact shape (``LlamaConfig``: 30 layers, 9 query heads on 3 key/value heads
of 64, hidden 576, MLP 1536 gated, vocab 49,152, tied embeddings), random weights (the shape is
what matters for speed and memory; loading the offline GGUF file would take 20-45 s more), fp32,
sdpa attention, ``torch.inference_mode()``. Pruned by headcount in every layer: one of the 3 KV
groups (a seeded choice: its K/V head and its 3 query heads) with ``shrink`` and half of the MLP
width (768 of 1,536 neurons, seeded) with ``prune_neurons``.

Three measurements, each from this one run (the two models interleaved, best of the timed runs):

1. **KV cache**: the bytes of the tensors of transformers' ``DynamicCache`` after a 2,048-token
   prefill (batch 1), vs the prediction from the mask: ``sum over layers of kept KV groups * 2
   (K and V) * head_dim * tokens * 4 bytes``. Target: within 1% (the pruned cache is 2/3).
2. **Prefill** of 2,048 tokens (batch 1, ``logits_to_keep=1`` as ``generate`` does): measured
   speed-up vs the bound from matmul FLOPs (Q/K/V/O, causal QK^T and PV: half the square, the
   three MLP projections, the LM head on one position). Target: >= 0.9 of the bound.
3. **Decoding** at batch 1 with a 2,048-token cache (the cache cropped back to 2,048 after each
   timed step): measured speed-up vs the bound from the bytes read per token (every weight matrix
   once, the tied embedding as the LM head included, plus the K/V cache). Target: >= 0.8.

    python bench/bench_decoder.py            # SmolLM2 shape, 2,048 tokens: ~3 minutes on 2 idle cores
    python bench/bench_decoder.py --quick    # 8 layers, 512 tokens: well under a minute
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch
import transformers

from headcount.core.masks import Mask
from headcount.core.surgery import count_parameters, kv_summary, prune_neurons, shrink

TARGETS = {"kv": 0.01, "prefill": 0.9, "decode": 0.8}


def smollm2_config(layers: int = 30) -> transformers.LlamaConfig:
    """SmolLM2-135M's shape (its config.json), ``layers`` layers."""
    return transformers.LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                                    max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                                    tie_word_embeddings=True, attn_implementation="sdpa")


def pruned_pair(cfg, seed: int = 0):
    """The full model and a copy with one KV group and half the MLP width removed in every layer.

    Returns ``(full, pruned, mask, neurons)``."""
    torch.manual_seed(seed)
    full = transformers.LlamaForCausalLM(cfg).eval()
    pruned = copy.deepcopy(full)
    g = torch.Generator().manual_seed(seed)
    n_kv, inter = cfg.num_key_value_heads, cfg.intermediate_size
    groups = [(layer, int(torch.randint(n_kv, (1,), generator=g))) for layer in range(cfg.num_hidden_layers)]
    mask = Mask.for_model(full).without_kv_groups(groups)
    neurons = {layer: torch.randperm(inter, generator=g)[: inter // 2].tolist()
               for layer in range(cfg.num_hidden_layers)}
    shrink(pruned, mask)
    prune_neurons(pruned, neurons)
    return full, pruned, mask, neurons


def layer_dims(cfg, q_heads: int, kv_heads: int, inter: int) -> dict[str, int]:
    """Weight elements of one layer's matrices."""
    h, d = cfg.hidden_size, cfg.head_dim
    return {"q": h * q_heads * d, "kv": 2 * h * kv_heads * d, "o": q_heads * d * h, "mlp": 3 * h * inter}


def prefill_flops(cfg, shapes: list[tuple[int, int, int]], seq: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of a batch-1 prefill of ``seq`` tokens, per-layer
    ``(query heads, KV heads, MLP width)``; causal attention counts ``seq (seq + 1) / 2`` pairs."""
    pairs = seq * (seq + 1) // 2
    total = 2 * cfg.hidden_size * cfg.vocab_size  # the LM head on the last position
    for q, kv, inter in shapes:
        total += 2 * seq * sum(layer_dims(cfg, q, kv, inter).values())
        total += 2 * 2 * q * cfg.head_dim * pairs  # QK^T and PV
    return total


def decode_bytes(cfg, shapes: list[tuple[int, int, int]], cache: int, element: int = 4) -> int:
    """Bytes read to decode one token with ``cache`` cached tokens: every weight matrix once (the
    tied embedding read as the LM head; norms and the one embedding row are negligible), the K/V
    cache of every layer."""
    weights = cfg.hidden_size * cfg.vocab_size
    kv = 0
    for q, n_kv, inter in shapes:
        weights += sum(layer_dims(cfg, q, n_kv, inter).values())
        kv += 2 * n_kv * cfg.head_dim * cache
    return (weights + kv) * element


def cache_bytes(cache) -> int:
    """Bytes of every tensor a transformers cache holds."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if isinstance(t, torch.Tensor))


def prefill(model, ids):
    cache = transformers.DynamicCache(config=model.config)
    t = time.perf_counter()
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return time.perf_counter() - t, cache, out.logits[:, -1:].argmax(-1)


def decode_step(model, cache, token) -> float:
    t = time.perf_counter()
    model(input_ids=token, cache=cache, use_cache=True)
    elapsed = time.perf_counter() - t
    cache.crop(-1)  # the next step sees the same cache again
    return elapsed


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 layers, 512 tokens")
    p.add_argument("--seq", type=int, default=None, help="prefill / cache length (default 2048; quick: 512)")
    p.add_argument("--runs", type=int, default=None, help="timed prefills per model (default 3; quick: 3)")
    p.add_argument("--steps", type=int, default=20, help="timed decoding steps per model (default 20)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu only (accepted for bench/run_all.py)")
    args = p.parse_args(argv)
    if args.device not in ("cpu", "auto"):
        print(f"bench_decoder: skipped on --device {args.device} (a CPU bench)")
        return {}
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    cfg = smollm2_config(8 if args.quick else 30)
    seq = args.seq or (512 if args.quick else 2048)
    runs = args.runs or 3

    full, pruned, mask, neurons = pruned_pair(cfg)
    n = cfg.num_hidden_layers
    inter = cfg.intermediate_size
    full_shapes = [(cfg.num_attention_heads, cfg.num_key_value_heads, inter)] * n
    kv_kept = mask.kv_groups.sum(1).int().tolist()
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    pruned_shapes = [(k * group, k, inter - len(neurons[layer])) for layer, k in enumerate(kv_kept)]
    ids = torch.randint(1000, cfg.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1))

    times = {"full": [], "pruned": []}
    steps = {"full": [], "pruned": []}
    caches, tokens = {}, {}
    models = {"full": full, "pruned": pruned}
    with torch.inference_mode():
        for name, model in models.items():  # warm-up
            prefill(model, ids[:, :64])
        for _ in range(runs):  # interleaved: a busy moment on the machine hits both models
            for name, model in models.items():
                elapsed, caches[name], tokens[name] = prefill(model, ids)
                times[name].append(elapsed)
        for name, model in models.items():
            decode_step(model, caches[name], tokens[name])  # warm-up
        for _ in range(args.steps):
            for name, model in models.items():
                steps[name].append(decode_step(model, caches[name], tokens[name]))

    # 1. KV cache
    element = 4
    predicted = {"full": 2 * cfg.head_dim * seq * element * n * cfg.num_key_value_heads,
                 "pruned": 2 * cfg.head_dim * seq * element * int(mask.kv_groups.sum())}
    measured = {k: cache_bytes(caches[k]) for k in caches}
    kv_err = abs(measured["pruned"] - predicted["pruned"]) / predicted["pruned"]
    # 2. prefill, 3. decoding
    best = {k: min(v) for k, v in times.items()}
    step = {k: min(v) for k, v in steps.items()}
    flops = {"full": prefill_flops(cfg, full_shapes, seq), "pruned": prefill_flops(cfg, pruned_shapes, seq)}
    read = {"full": decode_bytes(cfg, full_shapes, seq), "pruned": decode_bytes(cfg, pruned_shapes, seq)}
    pre_ratio = (best["full"] / best["pruned"]) / (flops["full"] / flops["pruned"])
    dec_ratio = (step["full"] / step["pruned"]) / (read["full"] / read["pruned"])

    print(f"bench_decoder: SmolLM2-135M shape ({n} layers x {cfg.num_attention_heads} query / "
          f"{cfg.num_key_value_heads} KV heads, hidden {cfg.hidden_size}, MLP {inter}), random weights, fp32, "
          f"batch 1 x {seq} tokens, cpu, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, attention {full.config._attn_implementation}, "
          f"{runs} prefills + {args.steps} decoding steps per model (best)")
    print(f"  pruned: 1 of {cfg.num_key_value_heads} KV groups and {inter // 2} of {inter} MLP neurons removed "
          f"in every layer; {kv_summary(pruned)}")
    print(f"  parameters      {count_parameters(full):>14,} -> {count_parameters(pruned):,}")
    print(f"  KV cache bytes  {measured['full']:>14,} -> {measured['pruned']:,} (predicted from the mask "
          f"{predicted['full']:,} -> {predicted['pruned']:,}; kept {measured['pruned'] / measured['full']:.4f})")
    print(f"  KV cache ratio [measured/predicted] {measured['pruned'] / predicted['pruned']:.4f}  "
          f"(target within 1%: {'met' if kv_err <= TARGETS['kv'] else 'NOT met'})")
    for k in ("full", "pruned"):
        print(f"  {k:<7} prefill best {best[k]:7.2f} s  median {statistics.median(times[k]):7.2f} s  "
              f"({flops[k] / best[k] / 1e9:.0f} GFLOP/s, {flops[k] / 1e9:.0f} GFLOP)   decode best "
              f"{step[k] * 1e3:7.1f} ms  median {statistics.median(steps[k]) * 1e3:7.1f} ms  "
              f"({read[k] / step[k] / 1e9:.1f} GB/s, {read[k] / 1e6:.0f} MB/token)")
    print(f"  prefill speed-up {best['full'] / best['pruned']:.2f}x, bound {flops['full'] / flops['pruned']:.2f}x "
          f"(FLOPs): ratio {pre_ratio:.2f}  (target >= {TARGETS['prefill']}: "
          f"{'met' if pre_ratio >= TARGETS['prefill'] else 'NOT met'})")
    print(f"  decode speed-up {step['full'] / step['pruned']:.2f}x, bound {read['full'] / read['pruned']:.2f}x "
          f"(bytes read per token): ratio {dec_ratio:.2f}  (target >= {TARGETS['decode']}: "
          f"{'met' if dec_ratio >= TARGETS['decode'] else 'NOT met'})")
    return {"kv_error": kv_err, "prefill_ratio": pre_ratio, "decode_ratio": dec_ratio}


if __name__ == "__main__":
    main()
