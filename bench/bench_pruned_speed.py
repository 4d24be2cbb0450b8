"""Latency of a physically pruned BERT-base vs the unpruned one, against the FLOP prediction.

Model: BERT-base sized (``BertConfig()``: 12 layers, 12 heads of 64, hidden 768, intermediate
3072), random weights, bare encoder (``BertModel``), default attention implementation.
Input: batch 32 x 128 tokens, no padding. CPU (or ``--device cuda``, ``--precision bf16``),
``torch.inference_mode()``, torch threads = all cores. Pruned: 6 of the 12 heads removed in every layer and the MLP removed in 6 of the 12
layers, by ``headcount.core.surgery`` (the model keeps its idle gate hooks, as a loaded pruned
checkpoint does).

Measured speed-up = unpruned latency / pruned latency (best of the timed runs, the two models
interleaved so that load on the machine hits both alike). Theoretical speed-up = ratio of
matmul FLOPs, counted analytically per layer: Q/K/V and output projections, attention scores
(QK^T) and context (PV), and the two feed-forward projections. Embeddings, LayerNorm,
softmax, GELU, residual adds and the pooler are excluded from both counts (they are the same,
or smaller, in the pruned model). Target: measured / theoretical >= 0.9.

    python bench/bench_pruned_speed.py            # BERT-base, ~1 minute on 2 cores
    python bench/bench_pruned_speed.py --quick    # a small config, a few seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import transformers

from headcount.core.gates import layout
from headcount.core.surgery import count_parameters, prune_heads, prune_mlps

TARGET = 0.9


def layer_flops(tokens: int, batch: int, seq: int, hidden: int, heads: int, head_dim: int, intermediate: int,
                mlp: bool) -> int:
    """Matmul FLOPs (2 per multiply-add) of one encoder layer with ``heads`` heads left."""
    inner = heads * head_dim
    qkv = 3 * 2 * tokens * hidden * inner
    scores = 2 * batch * heads * seq * seq * head_dim  # Q K^T
    context = 2 * batch * heads * seq * seq * head_dim  # P V
    out = 2 * tokens * inner * hidden
    ffn = 2 * 2 * tokens * hidden * intermediate if mlp else 0
    return qkv + scores + context + out + ffn


def model_flops(cfg, batch: int, seq: int, heads_per_layer: list[int], mlps: list[bool]) -> int:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return sum(layer_flops(batch * seq, batch, seq, cfg.hidden_size, h, head_dim, cfg.intermediate_size, m)
               for h, m in zip(heads_per_layer, mlps))


def half_pruned_pair(cfg, prepare=lambda m: m.eval()):
    """Two identical random ``BertModel``s (seed 0), the second with half the heads of every layer
    and half the MLPs removed (seeded choice). ``prepare`` readies each model before surgery.

    Returns ``(full, pruned, heads, mlps, generator)``: the generator continues the seeded stream
    (the batch is drawn from it).
    """
    torch.manual_seed(0)
    full = prepare(transformers.BertModel(cfg))
    torch.manual_seed(0)
    pruned = prepare(transformers.BertModel(cfg))
    n_layers, n_heads = layout(pruned)
    g = torch.Generator().manual_seed(0)
    heads = {layer: torch.randperm(n_heads, generator=g)[: n_heads // 2].tolist() for layer in range(n_layers)}
    mlps = sorted(torch.randperm(n_layers, generator=g)[: n_layers // 2].tolist())
    prune_heads(pruned, heads)
    prune_mlps(pruned, mlps)
    return full, pruned, heads, mlps, g


def timed(model, batch: dict, precision: str = "fp32") -> float:
    device = batch["input_ids"].device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        model(**batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return time.perf_counter() - t


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small config (4 layers, hidden 256), batch 8 x 64")
    p.add_argument("--warmup", type=int, default=None, help="warm-up runs per model (default 1; quick: 2)")
    p.add_argument("--runs", type=int, default=None, help="timed runs per model (default 3; quick: 10)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--precision", default=None, help="fp32 | bf16 (autocast) | auto (default: fp32, and bf16 too on a GPU)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 32; quick: 8)")
    args = p.parse_args(argv)
    from headcount.runtime.device import resolve_device, resolve_precision

    if args.precision is None:  # a GPU: both precisions (fp32 and bf16 autocast); the CPU: fp32
        both = resolve_device(args.device).type == "cuda"
        rest = list(argv if argv is not None else __import__("sys").argv[1:])
        results = [main(rest + ["--precision", prec]) for prec in (("fp32", "bf16") if both else ("fp32",))]
        return results[-1]

    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)

    if args.quick:
        cfg = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                                      intermediate_size=1024)
        batch_size, seq = 8, 64
        warmup, runs = args.warmup or 2, args.runs or 10
    else:
        cfg = transformers.BertConfig()  # BERT-base
        batch_size, seq = 32, 128
        warmup, runs = args.warmup or 1, args.runs or 3
    if device.type == "cuda":  # GPU timings are short and noisy: more of them
        warmup, runs = args.warmup or 3, args.runs or 20
    batch_size = args.batch or batch_size
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()

    full, pruned, heads, mlps, g = half_pruned_pair(cfg, lambda m: m.eval().to(device))
    n_layers, n_heads = layout(pruned)

    ids = torch.randint(1000, cfg.vocab_size, (batch_size, seq), generator=g)
    batch = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}

    kept_heads = [n_heads - len(heads[layer]) for layer in range(n_layers)]
    kept_mlps = [layer not in mlps for layer in range(n_layers)]
    flops_full = model_flops(cfg, batch_size, seq, [n_heads] * n_layers, [True] * n_layers)
    flops_pruned = model_flops(cfg, batch_size, seq, kept_heads, kept_mlps)

    times = {"full": [], "pruned": []}
    with torch.inference_mode():
        for _ in range(warmup):
            timed(full, batch, precision)
            timed(pruned, batch, precision)
        for _ in range(runs):  # interleaved: a busy moment on the machine hits both models
            times["full"].append(timed(full, batch, precision))
            times["pruned"].append(timed(pruned, batch, precision))

    best = {k: min(v) for k, v in times.items()}
    measured = best["full"] / best["pruned"]
    theoretical = flops_full / flops_pruned
    ratio = measured / theoretical
    name = "quick config" if args.quick else "BERT-base"
    print(f"bench_pruned_speed: {name} ({n_layers} layers x {n_heads} heads, hidden {cfg.hidden_size}, "
          f"intermediate {cfg.intermediate_size}), batch {batch_size} x {seq} tokens, device {device}"
          f"{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}, {precision}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, attention {full.config._attn_implementation}, "
          f"{warmup} warm-up + {runs} timed runs per model")
    print(f"  pruned: {sum(kept_heads)}/{n_layers * n_heads} heads kept (half of every layer), "
          f"MLPs removed in layers {mlps}")
    print(f"  parameters     {count_parameters(full):>14,} -> {count_parameters(pruned):,}")
    print(f"  matmul GFLOPs  {flops_full / 1e9:>14.1f} -> {flops_pruned / 1e9:.1f}  "
          "(encoder layers only: QKV/O projections, QK^T, PV, FFN)")
    for k in ("full", "pruned"):
        flops = flops_full if k == "full" else flops_pruned
        print(f"  {k:<7} latency  best {best[k] * 1e3:8.1f} ms   median {statistics.median(times[k]) * 1e3:8.1f} ms"
              f"   ({flops / best[k] / 1e9:.0f} GFLOP/s)")
    print(f"  measured speed-up     {measured:.2f}x")
    print(f"  theoretical speed-up  {theoretical:.2f}x (FLOPs)")
    print(f"  ratio [{device}, {precision}] {ratio:.2f}  (target >= {TARGET}: {'met' if ratio >= TARGET else 'NOT met'})")
    return {"measured": measured, "theoretical": theoretical, "ratio": ratio, "times": times}


if __name__ == "__main__":
    main()
