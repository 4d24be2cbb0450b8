"""Scoring a SmolLM2-shaped decoder with the gate-gradient scorer (``--objective lm``) vs a plain
transformers loop that computes the same gradients: time and peak memory.

Model: SmolLM2-135M's shape (see ``bench_decoder.py``), random weights, fp32, sdpa attention.
Data: ``--sequences`` random token sequences of ``--tokens`` tokens (the target size is 64 x 512),
labels = the tokens (the model shifts them), the first position ignored (as ``lm_batches`` does),
batches of ``--batch``.

Baseline (written here, plain transformers + torch): every weight requires grad (as a model fresh
from ``from_pretrained`` does), one ``[L, H]`` head gate and one ``[L]`` MLP gate requiring grad,
applied by forward pre-hooks on each ``o_proj`` (the input viewed as ``[.., H, head_dim]``) and
forward hooks on each MLP, ``loss.backward()`` per batch, ``|grad|`` of the gates summed per
batch, ``model.zero_grad()``. headcount: ``headcount.importance.scoring.score(model, batches,
method="gradient")`` (gates only require grad, batches merged to the CPU token budget).

Each side runs in its own child process (same seed, same model and batches), so that its peak
resident memory (``ru_maxrss``) is its own; the parent prints the ratios of time and of peak memory
and checks the scores agree. headcount runs twice: with its default token budget (batches merged)
and with the batches as given (``tokens_per_batch=0``, the baseline's batch). Target: time >= 2x.

The FLOP bound beside it: both sides run the forward pass and the backward pass's input
gradients (every layer's, down to the first layer's ``o_proj``); only the baseline also computes
every weight's gradient, about as many FLOPs as the forward pass again (a linear layer's weight
gradient is one more matmul of its size; the attention scores ``QK^T`` and ``PV`` have none). So
skipping the weight gradients saves at most ``(F + dX + dW) / (F + dX)``, about 1.5x: the issue's
2x is above what doing fewer FLOPs can give, and the rest must come from memory traffic.

    python bench/bench_decoder_score.py                      # 64 x 512 (long on 2 CPU cores)
    python bench/bench_decoder_score.py --sequences 8        # 8 x 512
    python bench/bench_decoder_score.py --quick              # 8 layers, 8 x 128
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decoder import layer_dims, smollm2_config  # noqa: E402

TARGET = 2.0


def scoring_flops(cfg, sequences: int, tokens: int, weight_grads: bool) -> int:
    """Matmul FLOPs (2 per multiply-add) of scoring ``sequences`` x ``tokens`` with the LM loss:
    forward, the backward's input gradients (attention backward: 4 matmuls to the forward's 2),
    and with ``weight_grads`` every linear layer's (and the tied LM head's) weight gradient."""
    n = sequences * tokens
    pairs = sequences * tokens * (tokens + 1) // 2
    linear = 2 * n * (cfg.num_hidden_layers * sum(layer_dims(cfg, cfg.num_attention_heads, cfg.num_key_value_heads,
                                                              cfg.intermediate_size).values())
                      + cfg.hidden_size * cfg.vocab_size)
    attention = cfg.num_hidden_layers * 2 * 2 * cfg.num_attention_heads * cfg.head_dim * pairs
    return (linear + attention) + (linear + 2 * attention) + (linear if weight_grads else 0)


def make_batches(cfg, sequences: int, tokens: int, batch: int, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, cfg.vocab_size, (sequences, tokens), generator=g)
    out = []
    for i in range(0, sequences, batch):
        x = ids[i:i + batch]
        labels = x.clone()
        labels[:, 0] = -100
        out.append({"input_ids": x, "attention_mask": torch.ones_like(x), "labels": labels})
    return out


def baseline(model, batches) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain loop: weights require grad, gates by hooks, loss.backward per batch."""
    cfg = model.config
    n_layers, n_heads, d = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim
    for p in model.parameters():
        p.requires_grad_(True)
    heads = torch.zeros(n_layers, n_heads)
    mlps = torch.zeros(n_layers)
    g = torch.ones(n_layers, n_heads, requires_grad=True)
    m = torch.ones(n_layers, requires_grad=True)
    handles = []
    for i, layer in enumerate(model.model.layers):
        def head_gate(module, args, i=i):
            x = args[0]
            return (x.view(*x.shape[:-1], n_heads, d) * g[i][:, None]).view_as(x)

        def mlp_gate(module, args, out, i=i):
            return out * m[i]

        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(head_gate))
        handles.append(layer.mlp.register_forward_hook(mlp_gate))
    model.train(False)
    for b in batches:
        model(**b).loss.backward()
        heads += g.grad.abs()
        mlps += m.grad.abs()
        g.grad = m.grad = None
        model.zero_grad(set_to_none=True)
    for h in handles:
        h.remove()
    return heads, mlps


def child(args) -> None:
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    cfg = smollm2_config(args.layers)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    batches = make_batches(cfg, args.sequences, args.tokens, args.batch)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    if args.only == "baseline":
        heads, mlps = baseline(model, batches)
    else:
        from headcount.importance.scoring import score

        for p in model.parameters():  # as headcount's loader leaves them
            p.requires_grad_(False)
        s = score(model, batches, method="gradient", tokens_per_batch=args.tokens_per_batch)
        heads, mlps = s.heads, s.mlps
    elapsed = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    json.dump({"seconds": elapsed, "rss_before_kb": before, "rss_peak_kb": peak, "heads": heads.tolist(),
               "mlps": mlps.tolist()}, open(args.save, "w"))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="8 layers, 8 sequences of 128 tokens")
    p.add_argument("--sequences", type=int, default=None, help="default 64 (quick: 8)")
    p.add_argument("--tokens", type=int, default=None, help="tokens per sequence (default 512; quick: 128)")
    p.add_argument("--layers", type=int, default=None, help="default 30 (quick: 8)")
    p.add_argument("--batch", type=int, default=4, help="sequences per batch (default 4)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu only (accepted for bench/run_all.py)")
    p.add_argument("--only", choices=["baseline", "headcount"], help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    p.add_argument("--tokens-per-batch", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.sequences = args.sequences or (8 if args.quick else 64)
    args.tokens = args.tokens or (128 if args.quick else 512)
    args.layers = args.layers or (8 if args.quick else 30)
    if args.only:
        child(args)
        return {}
    if args.device not in ("cpu", "auto"):
        print(f"bench_decoder_score: skipped on --device {args.device} (a CPU bench)")
        return {}
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        # headcount twice: batches merged to the CPU token budget (the default), and as given (0)
        for side, budget in (("baseline", None), ("headcount", None), ("headcount-unmerged", 0)):
            out = Path(tmp) / f"{side}.json"
            cmd = [sys.executable, __file__, "--only", side.split("-")[0], "--save", str(out), "--sequences",
                   str(args.sequences), "--tokens", str(args.tokens), "--layers", str(args.layers), "--batch",
                   str(args.batch), "--threads", str(args.threads)]
            subprocess.run(cmd + ([] if budget is None else ["--tokens-per-batch", str(budget)]), check=True)
            res[side] = json.loads(out.read_text())
    b, h = res["baseline"], res["headcount"]
    ref = torch.tensor(b["heads"]).flatten()
    ours = torch.tensor(h["heads"]).flatten()
    r = float(torch.corrcoef(torch.stack([ref, ours]))[0, 1])
    rel = float(((ref - ours).abs().max() / ref.abs().max()))
    speed = b["seconds"] / h["seconds"]
    cfg = smollm2_config(args.layers)
    bound = (scoring_flops(cfg, args.sequences, args.tokens, True)
             / scoring_flops(cfg, args.sequences, args.tokens, False))
    mem = {k: v["rss_peak_kb"] / 1024 for k, v in res.items()}
    grow = {k: (v["rss_peak_kb"] - v["rss_before_kb"]) / 1024 for k, v in res.items()}
    print(f"bench_decoder_score: SmolLM2-135M shape ({args.layers} layers), random weights, fp32, "
          f"{args.sequences} sequences x {args.tokens} tokens, batch {args.batch}, cpu, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {args.threads} threads")
    print(f"  baseline (plain transformers loop, weight grads) {b['seconds']:8.1f} s, peak RSS {mem['baseline']:7.0f} MB "
          f"(+{grow['baseline']:.0f} MB while scoring)")
    print(f"  headcount score --method gradient               {h['seconds']:8.1f} s, peak RSS {mem['headcount']:7.0f} MB "
          f"(+{grow['headcount']:.0f} MB while scoring; batches merged to the CPU token budget)")
    u = res["headcount-unmerged"]
    print(f"  headcount, --tokens-per-batch 0 (as given)      {u['seconds']:8.1f} s, peak RSS "
          f"{mem['headcount-unmerged']:7.0f} MB (+{grow['headcount-unmerged']:.0f} MB while scoring)")
    print(f"  scores agree: r = {r:.5f}, max relative difference {rel:.1e}")
    print(f"  speed-up {speed:.2f}x  (target >= {TARGET}x: {'met' if speed >= TARGET else 'NOT met'}); "
          f"FLOP bound of skipping the weight gradients {bound:.2f}x: {speed / bound:.2f} of it")
    print(f"  peak memory ratio {mem['baseline'] / mem['headcount']:.2f} (growth while scoring: "
          f"{grow['baseline'] / max(grow['headcount'], 1):.2f})")
    print(f"  unmerged: speed-up {b['seconds'] / u['seconds']:.2f}x, peak memory ratio "
          f"{mem['baseline'] / mem['headcount-unmerged']:.2f} (growth while scoring: "
          f"{grow['baseline'] / max(grow['headcount-unmerged'], 1):.2f})")
    return {"speedup": speed, "flop_bound": bound, "memory": mem, "r": r}


if __name__ == "__main__":
    main()
