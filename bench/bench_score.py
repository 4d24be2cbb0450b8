"""headcount score / prune vs a run_bertology-style baseline, same model, examples and batch size.

Baseline (what run_bertology does): every weight requires grad (weight gradients computed and
stored), every batch padded to max length, a fixed [L, H] head_mask-like gate.
headcount: only the gates require grad, dynamic padding, batches grouped by length, and the
pruning loop physically shrinks its working copy between steps.

Model: MiniLM-L6-sized (6 layers, 12 heads, hidden 384, intermediate 1536), random weights.
Text: variable-length token sequences (lengths drawn like sentence lengths: 8..128, median ~30).
Prints speed-ups (targets: score >= 2x, pruning trace >= 2.5x with the same final mask) and the
achieved FLOP/s as a fraction of this machine's measured matmul peak.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

from headcount.evaluation import evaluate_batches
from headcount.gates import gated, layout
from headcount.masks import Mask
from headcount.pruning import PruneConfig, iterative_prune, select_lowest
from headcount.scoring import score


def make_model():
    cfg = transformers.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                  intermediate_size=1536, num_labels=2)
    torch.manual_seed(0)
    return transformers.AutoModelForSequenceClassification.from_config(cfg).eval()


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
    for p in model.parameters():
        p.requires_grad_(True)
    heads = torch.zeros(n_layers, n_heads)
    base = mask.heads if mask is not None else torch.ones(n_layers, n_heads)
    for b in batches:
        g = base.clone().requires_grad_(True)
        with gated(model, heads=g):
            loss = model(**b).loss
        loss.backward()
        heads += g.grad.abs()
        model.zero_grad(set_to_none=True)
    for p in model.parameters():
        p.requires_grad_(False)
    return heads


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    n = 128 if args.quick else 256
    model = make_model()
    examples = make_examples(n)
    padded, dynamic = batches_padded(examples, 32), batches_dynamic(examples, 32)

    t0 = time.perf_counter()
    ref = baseline_scores(model, padded)
    t_base = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = score(model, dynamic)
    t_ours = time.perf_counter() - t0
    corr = torch.corrcoef(torch.stack([ref.flatten(), ours.heads.flatten()]))[0, 1]
    peak = matmul_peak()
    achieved = score_flops(model, dynamic) / t_ours
    print(f"score: baseline {t_base:.2f} s, headcount {t_ours:.2f} s, speed-up {t_base / t_ours:.2f}x "
          f"(target >= 2x); scores agree r={float(corr):.5f}")
    print(f"score: achieved {achieved / 1e9:.1f} GFLOP/s = {achieved / peak:.2f} of measured matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s")

    # pruning trace: same number of steps, same schedule, importance on train, stop on dev
    dev = make_examples(n // 2, seed=1)
    dev_padded, dev_dynamic = batches_padded(dev, 32), batches_dynamic(dev, 32)
    steps = 3 if args.quick else 5
    cfg = dict(threshold=0.01, step=0.1, step_of="total", max_steps=steps)

    def base_eval(m, mask):
        r = evaluate_batches(m, dev_padded, "accuracy", mask=mask)
        return r["score"], r["loss"]

    def base_loop():
        # mask-only loop: full recompute with weight grads and padding, gates only (no shrinking)
        mask = Mask.full(*layout(model))
        base_eval(model, mask)
        for _ in range(steps):
            s = baseline_scores(model, padded, mask)
            from headcount.scoring import normalize_scores

            h, _ = normalize_scores(s, torch.zeros(s.shape[0]), "layer+global")
            mask = Mask(select_lowest(h, mask.heads, int(0.1 * mask.heads.numel())), mask.mlps)
            base_eval(model, mask)
        return mask

    t0 = time.perf_counter()
    base_mask = base_loop()
    t_base = time.perf_counter() - t0

    def our_eval(m, mask):
        r = evaluate_batches(m, dev_dynamic, "accuracy", mask=mask)
        return r["score"], r["loss"]

    t0 = time.perf_counter()
    result = iterative_prune(model, lambda m, k: score(m, dynamic, mask=k, normalize="layer+global"), our_eval,
                             PruneConfig(**cfg))
    t_ours = time.perf_counter() - t0
    same = bool(torch.equal(result.mask.heads, base_mask.heads))
    print(f"prune trace ({steps} steps): baseline {t_base:.2f} s, headcount {t_ours:.2f} s, "
          f"speed-up {t_base / t_ours:.2f}x (target >= 2.5x); same final mask: {same}")


if __name__ == "__main__":
    main()
