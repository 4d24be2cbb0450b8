"""Fine-tuning throughput: headcount's `finetune` vs a plain `Trainer` that pads to max length.

Same model (MiniLM-L6-sized random BERT: 6 layers, 12 heads, hidden 384, intermediate 1536), same
training split (6,400 variable-length synthetic sentences: lengths like sentence lengths, 8..126
words, median ~27), same hyper-parameters (batch 32, lr 2e-5, max length 128), the same number of
optimizer steps (batches drawn from the epoch each side would run).

- baseline: the tokenizer pads every example to 128 tokens, `default_data_collator`, random order;
- headcount: `headcount.train.finetune` (dynamic padding, length-grouped batches).

Throughput = real (non-padding) training tokens per second of training (evaluation excluded).
Target: headcount >= 1.5x the baseline. One run each; prints the ratio.

    python bench/bench_finetune.py            # 10 steps each (~1-3 min on 2 CPU cores)
    python bench/bench_finetune.py --quick    # 4 steps each
    python bench/bench_finetune.py --device cuda   # BERT-base-sized, 100 steps each, bf16 where supported
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import torch
import transformers

from headcount.train import TrainConfig, finetune, use_bf16

BATCH = 32
MAX_LENGTH = 128
N_WORDS = 2000


def make_checkpoint(folder: Path, size: str = "minilm") -> Path:
    """A random MiniLM-L6-sized (or BERT-base-sized) encoder and a word-level tokenizer (one token per word)."""
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(special + [f"w{i}" for i in range(N_WORDS)])}
    tok = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)
    if size == "base":
        cfg = transformers.BertConfig(vocab_size=len(vocab))
    else:
        cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=384, num_hidden_layers=6,
                                      num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512)
    torch.manual_seed(0)
    transformers.BertModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def make_task(folder: Path, n_train: int, n_dev: int, seed: int = 0) -> Path:
    """Variable-length sentences (lengths log-normal, like real sentences), label = a word's parity."""
    rng = random.Random(seed)
    torch.manual_seed(seed)

    def rows(n):
        lengths = torch.distributions.LogNormal(3.3, 0.55).sample((n,)).clamp(8, MAX_LENGTH - 2).long().tolist()
        out = []
        for n_words in lengths:
            words = [rng.randrange(N_WORDS) for _ in range(n_words)]
            out.append(f"{' '.join(f'w{w}' for w in words)},{'odd' if words[0] % 2 else 'even'}")
        return out

    (folder / "train.csv").write_text("\n".join(["sentence,label", *rows(n_train)]) + "\n")
    (folder / "dev.csv").write_text("\n".join(["sentence,label", *rows(n_dev)]) + "\n")
    (folder / "task.yaml").write_text(
        "name: bench-parity\nkind: classification\nfiles: {train: train.csv, validation: dev.csv}\n"
        "text: [sentence]\nlabel: label\nlabels: [even, odd]\nmetric: accuracy\n"
    )
    return folder / "task.yaml"


class _Examples(torch.utils.data.Dataset):
    def __init__(self, enc, labels):
        self.enc, self.labels = enc, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.enc["input_ids"][i], "token_type_ids": self.enc["token_type_ids"][i],
                "attention_mask": self.enc["attention_mask"][i], "labels": self.labels[i]}


def baseline(model_dir: Path, task_yaml: Path, steps: int, out: Path, bf16: bool, use_cpu: bool = False) -> dict:
    """A plain Trainer: every example padded to MAX_LENGTH, default collator, random sampler."""
    import csv

    rows = list(csv.DictReader((task_yaml.parent / "train.csv").open()))
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    enc = tok([r["sentence"] for r in rows], padding="max_length", truncation=True, max_length=MAX_LENGTH)
    labels = [int(r["label"] == "odd") for r in rows]
    transformers.set_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=2e-5,
        include_num_input_tokens_seen="non_padding",
        weight_decay=0.0, max_grad_norm=1.0, eval_strategy="no", save_strategy="no", report_to="none",
        disable_tqdm=True, logging_strategy="no", seed=0, bf16=bf16, use_cpu=use_cpu,
        dataloader_pin_memory=torch.cuda.is_available() and not use_cpu,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Examples(enc, labels),
                                   data_collator=transformers.default_data_collator)
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    result = trainer.train()
    seconds = result.metrics["train_runtime"]
    tokens = int(trainer.state.num_input_tokens_seen)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "padded_tokens": steps * BATCH * MAX_LENGTH}


def warm_up(model_dir: Path, device: torch.device, bf16: bool) -> None:
    """One forward/backward pass at each padded size, so neither side pays first-call costs."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2).to(device)
    for seq in (32, MAX_LENGTH):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=torch.randint(5, 100, (BATCH, seq), device=device),
                        labels=torch.zeros(BATCH, dtype=torch.long, device=device))
        out.loss.backward()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 steps each")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps each (default 10)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto (both sides train there)")
    ap.add_argument("--precision", default="auto", help="auto (bf16 on GPUs that support it) | fp32 | bf16")
    ap.add_argument("--model", choices=["minilm", "base"], default=None, help="default: base on a GPU, else minilm")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from headcount.runtime.device import resolve_device, trainer_settings

    where = trainer_settings(args.device, args.precision)  # use_cpu, bf16 (cuda:N: the only visible GPU)
    device = resolve_device("cpu" if where["use_cpu"] else "cuda:0")
    gpu = device.type == "cuda"
    size = args.model or ("base" if gpu else "minilm")
    steps = args.steps or (100 if gpu else (4 if args.quick else 10))
    # a training split the size of a small GLUE task: length grouping works on megabatches of 50
    # batches, so both sides draw `steps` batches from a realistic epoch, not a tiny one
    n_train = 4 * 50 * BATCH
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    bf16 = use_bf16(TrainConfig(**where))
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp:
        tmp = Path(tmp)
        os.environ["HEADCOUNT_CACHE"] = str(tmp / "cache")  # tokenization cache: thrown away with tmp
        model_dir = make_checkpoint(tmp / "model", size)
        task = make_task(tmp, n_train=n_train, n_dev=BATCH)
        warm_up(model_dir, device, bf16)

        t = time.perf_counter()
        ours = finetune(str(model_dir), str(task), seed=0, out_dir=tmp / "headcount",
                        config=TrainConfig(batch_size=BATCH, max_steps=steps, max_length=MAX_LENGTH,
                                           eval_each_epoch=False, max_eval_examples=BATCH, **where))
        t_ours = time.perf_counter() - t
        t = time.perf_counter()
        base = baseline(model_dir, task, steps, tmp / "baseline", bf16, use_cpu=not gpu)
        t_base = time.perf_counter() - t

    ratio = ours["tokens_per_s"] / base["tokens_per_s"]
    padding = 1 - base["tokens"] / base["padded_tokens"]
    name = f" ({torch.cuda.get_device_name(device)})" if gpu else ""
    print(f"model: {'BERT-base' if size == 'base' else 'MiniLM-L6'}-sized random BERT; {steps} steps of {BATCH} "
          f"examples; {base['tokens']:,} real tokens ({padding:.0%} of a max-length batch is padding); "
          f"device {ours.get('device', device)}{name}, dtype {'bf16' if bf16 else 'fp32'}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    print(f"baseline (plain Trainer, pad to {MAX_LENGTH}): {base['tokens_per_s']:,.0f} tokens/s "
          f"({base['seconds']:.1f} s training, {t_base:.1f} s in all)")
    print(f"headcount finetune (dynamic padding + length grouping): {ours['tokens_per_s']:,.0f} tokens/s "
          f"({ours['train_seconds']:.1f} s training, {t_ours:.1f} s in all)")
    print(f"speed-up [{device}, {'bf16' if bf16 else 'fp32'}]: {ratio:.2f}x (target >= 1.5x) "
          f"{'OK' if ratio >= 1.5 else 'BELOW TARGET'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
