"""Wall time of the speed targets that tests used to assert (the tests now assert the work instead).

A test that asserts wall time fails on a busy machine (an alias bomb refused in 1.6 s instead of
< 0.5 s failed a CI run): the tests bound the work done (nodes expanded, files read, epochs run),
and the time is measured here, where a miss is a number to look at, not a failed suite.

    alias bomb      a study config with "billion laughs" (9**9 values in 509 bytes) refused;
                    tests/experiments/test_study_config.py bounds the nodes expanded; target < 0.5 s
    offline load    every offline task's train split, from the fetched files (caches cleared);
                    tests/data/test_tasks_offline.py asserts each file read once; target < 1 s
                    (skipped when the offline data is not fetched)
    pattern CNN     the Prasanna CNN, 20 epochs of 80 synthetic 32x32 maps, batch 16;
                    tests/analysis/test_patterns.py asserts the 20 epochs; target < 20 s

Best of ``--repeats`` runs (default 3; quick: 1). CPU only (``--device`` is accepted and ignored:
none of these runs a model on a device). Each line prints ``ratio`` = time / target (<= 1: met).

    python bench/bench_timing_targets.py            # ~30 s on 2 cores
    python bench/bench_timing_targets.py --quick    # one run of each
"""

from __future__ import annotations

import argparse
import time

BOMB = "lol0: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &{c} [{', '.join(['*' + p] * 9)}]\n" for i, p, c in zip(range(1, 9), "abcdefgh", "bcdefghi"))


def alias_bomb() -> None:
    from headcount.runtime.errors import HeadcountError
    from headcount.runtime.yamlfile import load_yaml_with_lines

    try:
        load_yaml_with_lines("study: demo\n" + BOMB, "bomb.yaml")
    except HeadcountError:
        return
    raise SystemExit("the alias bomb was not refused")


def offline_load() -> bool:
    from headcount.data.tasks import base, get_task, is_fetched, offline

    if not is_fetched():
        return False
    offline.clear_caches()
    base._CACHE.clear()
    for name in offline.OFFLINE_TASKS:
        get_task(name).load("train")
    return True


def pattern_cnn() -> None:
    from headcount.analysis.patterns import synthetic_attention_maps, train_pattern_cnn

    s = synthetic_attention_maps(n_per_class=20, size=32, seed=0)
    train_pattern_cnn(s.maps, s.labels, seed=0, epochs=20, batch_size=16)


def best_of(fn, repeats: int) -> tuple[float, object]:
    best, got = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        got = fn()
        best = min(best, time.perf_counter() - t)
    return best, got


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one run of each")
    p.add_argument("--repeats", type=int, default=None, help="runs of each, the best kept (default 3; quick: 1)")
    p.add_argument("--device", default="cpu", help="accepted for run_all.py; these run on the CPU")
    args = p.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    offline_load()  # the first load parses and checks the files: not timed
    for name, fn, target in (("alias bomb", alias_bomb, 0.5), ("offline load", offline_load, 1.0),
                             ("pattern CNN", pattern_cnn, 20.0)):
        seconds, got = best_of(fn, repeats)
        if got is False:
            print(f"  {name:<13} skipped (the offline data is not fetched: headcount data fetch)")
            continue
        ratio = seconds / target
        print(f"  {name:<13} {seconds:8.3f} s   ratio [cpu] {ratio:.2f} of the target {target:g} s "
              f"({'met' if ratio <= 1 else 'NOT met'})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
