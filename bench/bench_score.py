"""headcount score / prune vs a run_bertology-style baseline, same model, examples and batch size.

Baseline (what run_bertology does): every weight requires grad (weight gradients computed and
stored), every batch padded to max length, a fixed [L, H] head_mask-like gate.
headcount: only the gates require grad, dynamic padding, batches grouped by length, and the
pruning loop physically shrinks its working copy between steps.

Model: MiniLM-L6-sized (6 layers, 12 heads, hidden 384, intermediate 1536), random weights; on a
GPU (or ``--model base``) BERT-base-sized (``BertConfig()``).
Text: variable-length token sequences (lengths drawn like sentence lengths: 8..128, median ~30).
Prints speed-ups (targets: score >= 2x, pruning trace >= 2.5x with the same final mask) and the
achieved FLOP/s: on the CPU as a fraction of this machine's measured matmul peak; on a GPU as
the fraction of the card's bf16 dense peak (2 x forward FLOPs counted / time / peak; the peak
from the device name, e.g. H200/H100 989 TFLOP/s, or ``--peak``), for fp32 and bf16 scoring.

    python bench/bench_score.py                    # CPU, 256 examples
    python bench/bench_score.py --device cuda      # BERT-base, 4,096 examples, fp32 and bf16
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

from headcount.core.gates import gated, layout
from headcount.core.masks import Mask
from headcount.data.evaluation import evaluate_batches
from headcount.importance.pruning import PruneConfig, iterative_prune, select_lowest
from headcount.importance.scoring import score

#: bf16 dense tensor-core peak (FLOP/s) by device-name fragment; --peak overrides
BF16_PEAK = {"H200": 989e12, "H100": 989e12, "GH200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12,
             "L4": 121e12, "RTX 4090": 165e12}


def make_model(size="minilm", device="cpu"):
    if size == "base":
        cfg = transformers.BertConfig(num_labels=2)
    else:
        cfg = transformers.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                      intermediate_size=1536, num_labels=2)
    torch.manual_seed(0)
    return transformers.AutoModelForSequenceClassification.from_config(cfg).eval().to(device)


def make_examples(n, seed=0, max_len=128):
    g = torch.Generator().manual_seed(seed)
    lengths = (torch.distributions.LogNormal(3.3, 0.55).sample((n,)).clamp(8, max_len)).long()
    ex = []
    for i, n_tok in enumerate(lengths.tolist()):
        ids = torch.randint(1000, 30000, (n_tok,), generator=g)
        ex.append((ids, int(ids[1] % 2)))
    return ex


def pad(examples, length=None):
    longest = length or max(len(x) for x, _ in examples)
    ids = torch.zeros(len(examples), longest, dtype=torch.long)
    am = torch.zeros_like(ids)
    for i, (x, _) in enumerate(examples):
        ids[i, : len(x)] = x
        am[i, : len(x)] = 1
    return {"input_ids": ids, "attention_mask": am, "labels": torch.tensor([y for _, y in examples])}


def _grouped(examples):
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    return [examples[i] for i in order]


def batches_padded(examples, bs, max_len=128):
    """The same batches as :func:`batches_dynamic` (same examples together), padded to max length."""
    grouped = _grouped(examples)
    return [pad(grouped[i:i + bs], max_len) for i in range(0, len(grouped), bs)]


def batches_dynamic(examples, bs):
    grouped = _grouped(examples)
    return [pad(grouped[i:i + bs]) for i in range(0, len(grouped), bs)]


def baseline_scores(model, batches, mask=None):
    """run_bertology's compute_heads_importance: weights require grad, head_mask gate, padded."""
    n_layers, n_heads = layout(model)
    device = next(model.parameters()).device
    for p in model.parameters():
        p.requires_grad_(True)
    heads = torch.zeros(n_layers, n_heads, device=device)
    base = (mask.heads if mask is not None else torch.ones(n_layers, n_heads)).to(device)
    for b in batches:
        b = {k: v.to(device) for k, v in b.items()}
        g = base.clone().requires_grad_(True)
        with gated(model, heads=g):
            loss = model(**b).loss
        loss.backward()
        heads += g.grad.abs()
        model.zero_grad(set_to_none=True)
    for p in model.parameters():
        p.requires_grad_(False)
    return heads.cpu()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bf16_peak(device, given=None):
    """The card's bf16 dense peak (FLOP/s): --peak, else by device name; None when unknown."""
    if given:
        return given * 1e12
    name = torch.cuda.get_device_name(device)
    for key, value in sorted(BF16_PEAK.items(), key=lambda kv: -len(kv[0])):
        if key in name:
            return value
    return None


def matmul_peak(seconds=1.0):
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    return 2 * 2048**3 * n / (time.perf_counter() - t0)


def score_flops(model, batches):
    """Matmul FLOPs of forward + backward to the activations only (no weight grads: ~1x forward)."""
    c = model.config
    h, i, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    total = 0
    for b in batches:
        bs, s = b["input_ids"].shape
        per_layer = 2 * bs * s * (4 * h * h + 2 * h * i) + 2 * 2 * bs * s * s * h
        total += 2 * L * per_layer  # forward + backward wrt activations; no weight gradients
    return total


def main(argv=None):
    from headcount.runtime.device import resolve_device

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    ap.add_argument("--model", choices=["minilm", "base"], default=None, help="default: base on a GPU, else minilm")
    ap.add_argument("--examples", type=int, default=None, help="default: 4096 on a GPU, 256 on the CPU (quick: 128)")
    ap.add_argument("--peak", type=float, default=None, help="bf16 dense peak in TFLOP/s (default: from the GPU's name)")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    size = args.model or ("base" if gpu else "minilm")
    n = args.examples or (4096 if gpu else (128 if args.quick else 256))
    model = make_model(size, device)
    examples = make_examples(n)
    padded, dynamic = batches_padded(examples, 32), batches_dynamic(examples, 32)
    where = (f"device {device}{' (' + torch.cuda.get_device_name(device) + ')' if gpu else ''}, torch "
             f"{torch.__version__}, transformers {transformers.__version__}, model {size}, {n} examples, batch 32")
    print(f"bench_score: {where}")
    if gpu:  # first calls pay for cuBLAS/cuDNN set-up: not what is measured
        score(model, dynamic[:4], device=device, precision="fp32")
        score(model, dynamic[:4], device=device, precision="bf16")
        baseline_scores(model, padded[:2])
    sync(device)

    t0 = time.perf_counter()
    ref = baseline_scores(model, padded)
    sync(device)
    t_base = time.perf_counter() - t0
    flops = score_flops(model, dynamic)
    runs = {}
    for precision in (("fp32", "bf16") if gpu else ("fp32",)):
        # GPU: the batches as given (the old behaviour), lengths rounded up to 32 only (a budget of 1
        # token merges nothing), and rounded + merged to the default token budget
        for budget in ((0, 1, None) if gpu else (None,)):
            t0 = time.perf_counter()
            ours = score(model, dynamic, device=device, precision=precision, tokens_per_batch=budget)
            sync(device)
            runs[(precision, budget)] = (time.perf_counter() - t0, ours)
    for (precision, budget), (t_ours, ours) in runs.items():
        corr = torch.corrcoef(torch.stack([ref.flatten(), ours.heads.flatten()]))[0, 1]
        label = f"{precision}, " + {0: "batches as given", 1: "lengths rounded, batches as given"}.get(
            budget, f"lengths rounded, {ours.meta['tokens_per_batch']} tokens/pass")
        print(f"score [{device}, {label}]: baseline (fp32) {t_base:.2f} s, headcount {t_ours:.2f} s, "
              f"speed-up {t_base / t_ours:.2f}x (target >= 2x); scores agree r={float(corr):.5f}")
        achieved = flops / t_ours
        if gpu:
            peak = bf16_peak(device, args.peak)
            frac = f"{achieved / peak:.3f} of the bf16 dense peak {peak / 1e12:.0f} TFLOP/s" if peak else \
                "bf16 peak unknown for this GPU (pass --peak)"
            print(f"score [{device}, {label}]: achieved {achieved / 1e12:.2f} TFLOP/s = {frac}")
        else:
            peak = matmul_peak()
            print(f"score [{device}, {label}]: achieved {achieved / 1e9:.1f} GFLOP/s = {achieved / peak:.2f} of "
                  f"measured matmul peak {peak / 1e9:.1f} GFLOP/s")

    # pruning trace: same number of steps, same schedule, importance on train, stop on dev
    if gpu:  # the trace on a quarter of the examples: the loop's overhead, not the scoring again
        examples = examples[: n // 4]
        padded, dynamic = batches_padded(examples, 32), batches_dynamic(examples, 32)
    dev = make_examples(max(len(examples) // 2, 32), seed=1)
    dev_padded, dev_dynamic = batches_padded(dev, 32), batches_dynamic(dev, 32)
    steps = 3 if args.quick else 5
    cfg = dict(threshold=0.01, step=0.1, step_of="total", max_steps=steps)

    def base_eval(m, mask):
        r = evaluate_batches(m, dev_padded, "accuracy", mask=mask, device=device, precision="fp32", tokens_per_batch=0)
        return r["score"], r["loss"]

    def base_loop():
        # mask-only loop: full recompute with weight grads and padding, gates only (no shrinking)
        mask = Mask.full(*layout(model))
        base_eval(model, mask)
        for _ in range(steps):
            s = baseline_scores(model, padded, mask)
            from headcount.importance.scores import normalize_scores

            h, _ = normalize_scores(s, torch.zeros(s.shape[0]), "layer+global")
            mask = Mask(select_lowest(h, mask.heads, int(0.1 * mask.heads.numel())), mask.mlps)
            base_eval(model, mask)
        return mask

    t0 = time.perf_counter()
    base_mask = base_loop()
    sync(device)
    t_base = time.perf_counter() - t0

    def our_eval(m, mask):
        r = evaluate_batches(m, dev_dynamic, "accuracy", mask=mask, device=device, precision="fp32")
        return r["score"], r["loss"]

    t0 = time.perf_counter()
    result = iterative_prune(model, lambda m, k: score(m, dynamic, mask=k, normalize="layer+global", device=device,
                                                       precision="fp32"), our_eval, PruneConfig(**cfg))
    sync(device)
    t_ours = time.perf_counter() - t0
    same = bool(torch.equal(result.mask.heads, base_mask.heads))
    print(f"prune trace [{device}, fp32] ({steps} steps, {len(examples)} examples): baseline {t_base:.2f} s, "
          f"headcount {t_ours:.2f} s, speed-up {t_base / t_ours:.2f}x (target >= 2.5x); same final mask: {same}")


if __name__ == "__main__":
    main()
