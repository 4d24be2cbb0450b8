"""onnxruntime latency of a physically pruned BERT-base vs the unpruned one, against the FLOP prediction.

Models: built as in ``bench_pruned_speed.py``: BERT-base sized (``BertConfig()``: 12 layers, 12
heads of 64, hidden 768, intermediate 3072), random weights, bare encoder (``BertModel``); pruned:
6 of the 12 heads removed in every layer and the MLP removed in 6 of the 12 layers
(``headcount.core.surgery``). Both are exported by ``headcount.core.export.export_onnx`` (the code behind
``headcount export``: eager attention, opset 17, dynamic axes, checked against PyTorch), then run
by onnxruntime (CPU provider, graph optimisations on, ``--threads`` intra-op threads) on batch x
sequence random tokens without padding.

Measured speed-up = unpruned latency / pruned latency (best of the timed runs, the two sessions
interleaved so that load on the machine hits both alike). Theoretical speed-up = ratio of the
encoder layers' matmul FLOPs (``bench_pruned_speed.model_flops``: Q/K/V/O projections, QK^T, PV,
the two feed-forward projections; embeddings, LayerNorm, softmax, GELU and the pooler left out).

    python bench/bench_onnx.py                 # BERT-base, batch 8 x 128, ~1-2 minutes on 2 busy cores
    python bench/bench_onnx.py --quick         # a small config, a few seconds
    python bench/bench_onnx.py --batch 32 --seq 128 --runs 5

``--device cuda`` uses onnxruntime's CUDA provider when the installed onnxruntime has one
(``onnxruntime-gpu``), else says so and runs on the CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pruned_speed import half_pruned_pair, model_flops  # noqa: E402  (the same models and FLOP count)

from headcount.core.gates import layout  # noqa: E402
from headcount.core.surgery import count_parameters  # noqa: E402


def eager(model):
    """Eager attention: exportable by every architecture (as ``headcount export`` loads models)."""
    model.set_attn_implementation("eager")
    return model.eval()


def main(argv=None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small config (4 layers, hidden 256), batch 4 x 64")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 8; quick: 4)")
    p.add_argument("--seq", type=int, default=None, help="tokens per example (default 128; quick: 64)")
    p.add_argument("--warmup", type=int, default=1, help="warm-up runs per model")
    p.add_argument("--runs", type=int, default=None, help="timed runs per model (default 5; quick: 10)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="onnxruntime intra-op threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (onnxruntime's CUDA provider when installed)")
    p.add_argument("--precision", default=None, help="accepted for run_all; ONNX models run in fp32")
    args = p.parse_args(argv)
    try:
        import onnxruntime as ort

        from headcount.core.export import export_onnx
    except ImportError:
        print("bench_onnx: skipped: needs onnx and onnxruntime (pip install 'headcount[export]')")
        return None
    from headcount.runtime.device import resolve_device

    device = resolve_device(args.device)
    providers = ["CPUExecutionProvider"]
    if device.type == "cuda":
        if "CUDAExecutionProvider" in ort.get_available_providers():
            providers = [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
        else:
            print("bench_onnx: this onnxruntime has no CUDA provider (pip install onnxruntime-gpu): running on the CPU")

    if args.quick:
        cfg = transformers.BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024)
        batch_size, seq, runs = args.batch or 4, args.seq or 64, args.runs or 10
    else:
        cfg = transformers.BertConfig()  # BERT-base
        batch_size, seq, runs = args.batch or 8, args.seq or 128, args.runs or 5
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)

    full, pruned, heads, mlps, g = half_pruned_pair(cfg, eager)
    n_layers, n_heads = layout(pruned)

    t = time.perf_counter()
    sessions, diffs = {}, {}
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.log_severity_level = 3
    for name, model in (("full", full), ("pruned", pruned)):
        data, rows = export_onnx(model)
        diffs[name] = max(r["max_abs_diff"] for r in rows)
        sessions[name] = ort.InferenceSession(data, options, providers=providers)
    export_s = time.perf_counter() - t

    ids = torch.randint(1000, cfg.vocab_size, (batch_size, seq), generator=g)
    feed = {"input_ids": ids.numpy(), "attention_mask": torch.ones_like(ids).numpy(),
            "token_type_ids": torch.zeros_like(ids).numpy()}

    def timed(session) -> float:
        wanted = {i.name for i in session.get_inputs()}
        start = time.perf_counter()
        session.run(None, {k: v for k, v in feed.items() if k in wanted})
        return time.perf_counter() - start

    times = {"full": [], "pruned": []}
    for _ in range(args.warmup):
        timed(sessions["full"])
        timed(sessions["pruned"])
    for _ in range(runs):  # interleaved: a busy moment on the machine hits both models
        times["full"].append(timed(sessions["full"]))
        times["pruned"].append(timed(sessions["pruned"]))

    kept_heads = [n_heads - len(heads[layer]) for layer in range(n_layers)]
    kept_mlps = [layer not in mlps for layer in range(n_layers)]
    flops_full = model_flops(cfg, batch_size, seq, [n_heads] * n_layers, [True] * n_layers)
    flops_pruned = model_flops(cfg, batch_size, seq, kept_heads, kept_mlps)
    best = {k: min(v) for k, v in times.items()}
    measured = best["full"] / best["pruned"]
    theoretical = flops_full / flops_pruned
    ratio = measured / theoretical
    used = sessions["full"].get_providers()[0]
    name = "quick config" if args.quick else "BERT-base"
    print(f"bench_onnx: {name} ({n_layers} layers x {n_heads} heads, hidden {cfg.hidden_size}, intermediate "
          f"{cfg.intermediate_size}), batch {batch_size} x {seq} tokens, onnxruntime {ort.__version__} {used}, "
          f"{args.threads} threads, fp32, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.warmup} warm-up + {runs} timed runs per model")
    print(f"  pruned: {sum(kept_heads)}/{n_layers * n_heads} heads kept (half of every layer), MLPs removed in layers {mlps}")
    print(f"  parameters     {count_parameters(full):>14,} -> {count_parameters(pruned):,}")
    print(f"  export + check {export_s:>12.1f} s   max |onnxruntime - PyTorch|: full {diffs['full']:.1e}, "
          f"pruned {diffs['pruned']:.1e}")
    print(f"  matmul GFLOPs  {flops_full / 1e9:>14.1f} -> {flops_pruned / 1e9:.1f}")
    for k in ("full", "pruned"):
        flops = flops_full if k == "full" else flops_pruned
        print(f"  {k:<7} latency  best {best[k] * 1e3:8.1f} ms   median {statistics.median(times[k]) * 1e3:8.1f} ms"
              f"   ({flops / best[k] / 1e9:.0f} GFLOP/s)")
    print(f"  measured speed-up     {measured:.2f}x (onnxruntime)")
    print(f"  theoretical speed-up  {theoretical:.2f}x (FLOPs)")
    print(f"  ratio [onnxruntime {used}] {ratio:.2f}  (measured / theoretical)")
    return {"measured": measured, "theoretical": theoretical, "ratio": ratio, "times": times, "diffs": diffs}


if __name__ == "__main__":
    main()
