"""Run every bench/bench_*.py in turn (alphabetical), printing their output as it comes.

    python bench/run_all.py              # full benches (what `make bench` runs)
    python bench/run_all.py --quick      # passes --quick (and any other argument) to every bench
    python bench/run_all.py -k pruned    # only benches whose file name contains "pruned"

A bench is a script named bench_<what>.py in this folder; adding one needs no change here.
Exit status: 0 when every bench ran to completion, 1 otherwise (the others still run).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Run every bench/bench_*.py in turn.")
    p.add_argument("-k", dest="match", default="", help="only benches whose file name contains this")
    args, passthrough = p.parse_known_args(argv)
    scripts = sorted(s for s in HERE.glob("bench_*.py") if args.match in s.name)
    if not scripts:
        print(f"no bench/bench_*.py matches {args.match!r}", file=sys.stderr)
        return 1
    failed, start = [], time.perf_counter()
    for script in scripts:
        print(f"=== {script.name} {' '.join(passthrough)}".rstrip(), flush=True)
        t = time.perf_counter()
        code = subprocess.call([sys.executable, str(script), *passthrough], cwd=HERE.parent)
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"=== {script.name}: {status} in {time.perf_counter() - t:.0f} s\n", flush=True)
        if code != 0:
            failed.append(script.name)
    print(f"{len(scripts) - len(failed)}/{len(scripts)} benches ran in {time.perf_counter() - start:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
