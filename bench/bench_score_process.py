"""`headcount score` as a whole process vs a whole-process run_bertology-style script.

What a user waits for: interpreter start, imports, loading the checkpoint and tokenizer, reading and
tokenizing the texts, scoring, writing ``scores.json`` and the figure. Both sides run as
subprocesses of this bench, alternating, ``--repeats`` times each, after one untimed run of
headcount (it fills the OS file cache for both, and headcount's token cache, as any second run
finds them); the min and the median wall times are printed, and their ratio.

- headcount: ``headcount score --model CKPT --task TASK.yaml --max-examples 512 --out DIR``
  (defaults: gradient importance, batch 32, max length 128, dynamic padding, length grouping),
  with ``HEADCOUNT_TIMING=1``, which makes it print one ``timing:`` line (imports, load, data,
  scoring, writing); that line is shown as headcount's own breakdown.
- baseline: a self-contained script written to a temp file, as run_bertology's
  ``compute_heads_importance`` does it: transformers' tokenizer padding every text to 128, every
  weight requiring grad, an ``[L, H]`` gate tensor requiring grad (applied by forward pre-hooks on
  each layer's attention output projection, which scale each head's context: transformers 5 has
  no ``head_mask``), ``|grad|`` of the gates summed per batch of 32, the array saved with numpy.
  It takes its batches in the order headcount does (longest first) so that the two arrays can be
  compared: the agreement (Pearson r) is printed.

Model: MiniLM-L6-shaped (6 layers, 12 heads, hidden 384, intermediate 1536; the offline model's
config), random weights, a 2-label classification head, the offline model's tokenizer, saved to a
temp checkpoint. Texts: 512 of ``offline/movies``'s train split (needs ``headcount data fetch``),
written to a local task (CSV + task YAML). Targets (issue 14): >= 3x; the scoring part itself
keeps >= 0.6 of the matmul peak (``bench_score.py`` measures that fraction).

    python bench/bench_score_process.py              # 3 timed runs of each
    python bench/bench_score_process.py --quick      # 1 timed run of each
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")

BASELINE = textwrap.dedent('''
    """run_bertology-style head importance, whole process (written by bench_score_process.py)."""
    import csv, sys
    import numpy as np
    import torch
    import transformers

    ckpt, data, labels, out = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4]
    device = torch.device(sys.argv[5] if len(sys.argv) > 5 else "cpu")
    tokenizer = transformers.AutoTokenizer.from_pretrained(ckpt)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(ckpt).to(device).eval()
    with open(data, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    texts = [r["text"] for r in rows]
    y = torch.tensor([labels.index(r["label"]) for r in rows])
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=128, return_tensors="pt")
    # headcount's batch order (longest first, stable), so that the two results can be compared
    order = sorted(range(len(texts)), key=lambda i: -int(enc["attention_mask"][i].sum()))
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    d = cfg.hidden_size // H
    for p in model.parameters():  # run_bertology: every weight requires grad
        p.requires_grad_(True)
    head_mask = torch.ones(L, H, device=device, requires_grad=True)

    def gate(layer):
        def hook(module, args):  # scale each head's context = scale its attention probabilities
            x = args[0]
            return (x.view(*x.shape[:-1], H, d) * head_mask[layer].view(H, 1)).view(x.shape),
        return hook

    encoder_layers = model.base_model.encoder.layer
    for i, layer in enumerate(encoder_layers):
        layer.attention.output.dense.register_forward_pre_hook(gate(i))
    importance = torch.zeros(L, H, device=device)
    for start in range(0, len(order), 32):
        idx = order[start:start + 32]
        batch = {k: v[idx].to(device) for k, v in enc.items()}
        loss = model(**batch, labels=y[idx].to(device)).loss
        loss.backward()
        importance += head_mask.grad.abs().detach()
        head_mask.grad = None
        model.zero_grad(set_to_none=True)
    np.save(out, importance.cpu().numpy())
''')


def build_inputs(root: Path, n: int) -> tuple[Path, Path, Path, list[str]]:
    """A random MiniLM-shaped checkpoint with the offline tokenizer, and a local task of n texts."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    from headcount.core.offline_models import offline_model_dir
    from headcount.data.tasks import get_task

    offline = offline_model_dir()
    ckpt = root / "ckpt"
    cfg = transformers.BertConfig.from_pretrained(offline, num_labels=2)
    cfg.architectures = ["BertForSequenceClassification"]
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(cfg).save_pretrained(ckpt)
    for name in TOKENIZER_FILES:
        if (offline / name).is_file():
            shutil.copy(offline / name, ckpt / name)
    task = get_task("offline/movies")
    labels = list(task.labels)
    for split, count in (("train", n), ("validation", 64)):
        data = task.load(split, max_examples=count, seed=0)
        with open(root / f"{split}.csv", "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for (text,), label in zip(data.texts, data.labels.tolist()):
                w.writerow([text, labels[label]])
    yaml = root / "task.yaml"
    yaml.write_text("name: bench-movies\nkind: classification\n"
                    "files: {train: train.csv, validation: validation.csv}\n"
                    f"text: [text]\nlabel: label\nlabels: [{', '.join(labels)}]\nmetric: accuracy\n",
                    encoding="utf-8")
    script = root / "bertology_style.py"
    script.write_text(BASELINE, encoding="utf-8")
    return ckpt, yaml, script, labels


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"bench_score_process: {' '.join(cmd[:3])} ... failed (exit {proc.returncode}):\n"
                 f"{proc.stdout}{proc.stderr}")
    return seconds, proc.stdout + proc.stderr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one timed run of each (default: --repeats)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (both sides run there)")
    ap.add_argument("--examples", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (printed)")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    from headcount.runtime.device import resolve_device

    device = str(resolve_device(args.device))
    hc = Path(sys.executable).with_name("headcount")
    hc_cmd = [str(hc)] if hc.is_file() else [sys.executable, "-m", "headcount"]
    root = Path(tempfile.mkdtemp(prefix="bench_score_process_"))
    try:
        ckpt, task, script, labels = build_inputs(root, args.examples)
        env = {**os.environ, "HEADCOUNT_TIMING": "1", "HEADCOUNT_CACHE": str(root / "cache"),
               "HEADCOUNT_DEVICE": device}
        print(f"bench_score_process: device {device}, MiniLM-shaped random checkpoint, {args.examples} offline/movies "
              f"texts, batch 32, max length 128; {repeats} timed run(s) of each after one untimed headcount run; "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")

        def ours(i):
            return timed([*hc_cmd, "score", "--model", str(ckpt), "--task", str(task), "--max-examples",
                          str(args.examples), "--device", device, "--out", str(root / f"hc{i}")], env)

        def theirs(i):
            return timed([sys.executable, str(script), str(ckpt), str(root / "train.csv"), ",".join(labels),
                          str(root / f"base{i}.npy"), device], env)

        ours("warm")
        t_ours, t_base, breakdown = [], [], ""
        for i in range(repeats):  # alternating: a load change hits both sides alike
            s, log = ours(i)
            t_ours.append(s)
            breakdown = next((line for line in log.splitlines() if line.startswith("timing:")), breakdown)
            t_base.append(theirs(i)[0])
        import json

        import numpy as np

        ref = np.load(root / "base0.npy").ravel()
        got = np.asarray(json.loads((root / "hc0" / "scores.json").read_text())["heads"], dtype=float).ravel()
        r = float(np.corrcoef(ref, got)[0, 1])
        for what, ts in (("headcount score", t_ours), ("bertology-style script", t_base)):
            print(f"{what}: min {min(ts):.2f} s, median {statistics.median(ts):.2f} s "
                  f"({', '.join(f'{t:.2f}' for t in ts)})")
        if breakdown:
            print(f"headcount's own {breakdown} (last run)")
        print(f"score process [{device}]: speed-up {min(t_base) / min(t_ours):.2f}x (min), "
              f"{statistics.median(t_base) / statistics.median(t_ours):.2f}x (median) (target >= 3x); "
              f"scores agree r={r:.5f}")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
