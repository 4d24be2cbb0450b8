"""Run every bench/bench_*.py in turn (alphabetical), printing their output as it comes.

    python bench/run_all.py              # full benches (what `make bench` runs)
    python bench/run_all.py --quick      # passes --quick (and any other argument) to every bench
    python bench/run_all.py -k pruned    # only benches whose file name contains "pruned"
    python bench/run_all.py --device cuda   # every bench on the GPU (`make bench-gpu`; < 5 min on one H200)

Every bench takes ``--device``; at the end the ratio lines of every bench are printed again,
under one line naming the device, torch and transformers versions.

A bench is a script named bench_<what>.py in this folder; adding one needs no change here.
``bench_onnx.py`` (onnxruntime latency of the pruned BERT-base) needs ``headcount[export]`` (onnx,
onnxruntime; ``make env`` installs it) and prints one "skipped" line without it.
Exit status: 0 when every bench ran to completion, 1 otherwise (the others still run).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _where(spec: str) -> str:
    """Device (and GPU name), default precision there, torch and transformers versions."""
    import torch
    import transformers

    from headcount.runtime.device import device_name, resolve_device, resolve_precision

    dev = resolve_device(spec)
    name = device_name(dev)
    return (f"device {dev}{f' ({name})' if name != 'cpu' else ''}, auto precision {resolve_precision('auto', dev)}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Run every bench/bench_*.py in turn.")
    p.add_argument("-k", dest="match", default="", help="only benches whose file name contains this")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto: passed to every bench")
    args, passthrough = p.parse_known_args(argv)
    passthrough = ["--device", args.device, *passthrough]
    scripts = sorted(s for s in HERE.glob("bench_*.py") if args.match in s.name)
    if not scripts:
        print(f"no bench/bench_*.py matches {args.match!r}", file=sys.stderr)
        return 1
    failed, start, ratios = [], time.perf_counter(), []
    for script in scripts:
        print(f"=== {script.name} {' '.join(passthrough)}".rstrip(), flush=True)
        t = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(script), *passthrough], cwd=HERE.parent,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in proc.stdout:  # shown as it comes, and the ratios kept for the summary
            print(line, end="", flush=True)
            if any(word in line for word in ("speed-up", "ratio", "peak")):
                ratios.append(f"{script.stem}: {line.strip()}")
        code = proc.wait()
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"=== {script.name}: {status} in {time.perf_counter() - t:.0f} s\n", flush=True)
        if code != 0:
            failed.append(script.name)
    print(f"=== summary: {_where(args.device)}")
    for line in ratios:
        print(f"  {line}")
    print(f"{len(scripts) - len(failed)}/{len(scripts)} benches ran in {time.perf_counter() - start:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
