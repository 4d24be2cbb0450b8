"""The fresh-run estimate printed under a study's plan, before any job of the run has finished.

Each pending job's cost is counted from what it computes (a FLOP count from its params and the
size of its model, read from the weight files' headers, no weights loaded), turned into seconds
by this machine's float32 matmul speed measured once at the start (under its current load, on the
device the jobs run on) and one calibration factor per kind. The factors were fitted once to the
job times recorded in the docs (see ``FACTOR``); it is a guess, replaced by the measured per-kind
mean (``progress.estimate_seconds``) once jobs finish. A kind without a cost model here gives no
number: the line names it.

FLOPs are the matmul count ``2 * N * tokens`` of a forward pass (``N``: the model's non-embedding
matrix weights; attention's own ``QK^T``/``PV`` and the elementwise work are left to the factor),
three times that for a training step (forward + backward), with ``tokens = examples x max_length``
(an upper bound: batches are padded to their longest text, not to ``max_length``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path

from headcount.experiments.runner.jobs import Job
from headcount.runtime.progress import duration

#: the probe: one float32 matmul of PROBE_N x PROBE_N, PROBE_REPEATS times after one warm-up
#: (2 * 1024^3 * 3 = 6.4 GFLOP: 40 ms at 180 GFLOP/s, 0.6 s at 10)
PROBE_N, PROBE_REPEATS = 1024, 3

#: seconds per counted FLOP at 1 FLOP/s of matmul, per kind: measured seconds (less OVERHEAD_S) x
#: that machine's matmul rate / this module's count of the job. Fitted once to: docs/transfer.md's
#: decoder run (SmolLM2, 2026-12-07, 291 GFLOP/s: fine-tune 63 s, task score 15.5 s, LM score
#: 24.5 s, head fit 21 s, task curve 118.5 s), docs/lottery.md's decoder run (same machine: prune
#: 364-431 s, retrain 43-52 s), and docs/transfer.md's MiniLM run (fine-tune 106-140 s, task grid
#: 3-5 s, head fit 11-15 s, curve 66-104 s, coherence 164 s; its machine taken as 12-01's 180 GFLOP/s,
#: docs/getting-started.md). The two models disagree by about 2x (MiniLM's factors 0.45x the
#: decoder's: max_length 128 pads its short texts less than the count assumes): where both were
#: measured the factor is their geometric mean, so either is within ~1.5x of it.
FACTOR = {
    "finetune": 0.49,  # 0.74 decoder, 0.33 MiniLM
    "lottery.retrain": 0.54,  # decoder only
    "lottery.magnitude": 0.54,  # retrain's: its trainings
    "score": 0.25,  # 0.38 decoder, 0.17 MiniLM
    "transfer-mlm-score": 0.63,  # decoder only
    "transfer-head-fit": 0.36,  # 0.53 decoder, 0.25 MiniLM
    "transfer-curve": 0.48,  # 0.60 decoder, 0.39 MiniLM
    "prune": 0.83,  # decoder only
    "evaluate": 0.48,  # the curve's: forward passes only
    "lottery.patterns": 0.48,  # the curve's (its forward passes), plus PATTERNS_CNN_S
    "transfer-coherence": 3.0e7,  # per permutation x pair x view, not a FLOP (MiniLM run)
}
#: the jobs that compute next to nothing (a layout, statistics of finished results): model loading
#: and writing, a few seconds each
CHEAP = {"transfer-layout", "lottery.stability", "lottery.subnetwork"}
#: what every job costs beside its FLOPs (start, imports, loading), seconds, not scaled by the rate
OVERHEAD_S = 2.0
#: the attention-pattern CNN's 20 epochs of 80 maps (docs/benchmarks.md, bench_timing_targets: 25 s)
PATTERNS_CNN_S = 25.0


def matmul_rate(device: str = "cpu", n: int = PROBE_N, repeats: int = PROBE_REPEATS) -> float:
    """FLOP/s of ``repeats`` float32 ``n x n`` matmuls on ``device``, now (one warm-up first).

    A fixed amount of work (``2 n^3`` per matmul), never a loop until a time: how long it takes
    is the measurement.

    >>> matmul_rate(n=64, repeats=1) > 0
    True
    """
    import torch

    dev = torch.device(device)
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    (a @ b).sum().item()  # warm-up: BLAS threads, kernels
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        c = a @ b
    sync()
    c.sum().item()
    return 2.0 * n**3 * repeats / max(time.perf_counter() - t0, 1e-9)


def _matrices(shapes: Iterable[tuple[str, tuple[int, ...]]]) -> int:
    """Weights of the matrices (2-D and more) whose names are not embeddings: the ones a token's
    forward pass multiplies by (embeddings are looked up; biases and norms are few)."""
    return sum(math.prod(s) for name, s in shapes if len(s) >= 2 and "emb" not in name.lower())


@lru_cache(maxsize=32)
def model_size(spec: str) -> int | None:
    """The non-embedding matrix weights of the model ``spec`` names (an offline name or a
    directory), from its weight files' headers; None when they cannot be read without the network
    (a hub id) or the loading code."""
    from headcount.core.offline_models import OFFLINE, OFFLINE_DECODER, offline_decoder_file, offline_model_dir
    from headcount.runtime.errors import HeadcountError

    try:
        if spec == OFFLINE_DECODER:
            from headcount.core.gguf_header import read_header

            return _matrices(read_header(offline_decoder_file()).tensors.items()) or None
        path = offline_model_dir() if spec == OFFLINE else Path(spec)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
        if not files:
            return None
        from safetensors import safe_open

        shapes = []
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                shapes += [(k, tuple(st.get_slice(k).get_shape())) for k in st.keys()]
        return _matrices(shapes) or None
    except (HeadcountError, OSError, ValueError):
        return None


@lru_cache(maxsize=64)
def split_rows(task: str, split: str | None) -> int | None:
    """Rows of a task's split (``split`` None: its train split), or None when it cannot be read."""
    from headcount.data.tasks import get_task

    try:
        t = get_task(task)
        return len(t.load(split or t.train_split).texts)
    except Exception:  # a task whose data is not here (hub data sets): no number, never a download error
        return None


def _rows(task: str, split: str | None, cap: int | None) -> int | None:
    return cap if cap is not None else split_rows(task, split)


def base_model(job: Job) -> str | None:
    """The model a job runs: its ``model`` param, else that of the upstream job it reads one from."""
    seen = set()
    while job is not None and job.key not in seen:
        seen.add(job.key)
        if job.params.get("model"):
            return job.params["model"]
        ups = job.inputs
        job = ups.get("model") or ups.get("full") or ups.get("mask") or next(iter(ups.values()), None)
    return None


def _val(task: str) -> str | None:
    from headcount.data.tasks import get_task

    try:
        return get_task(task).validation_split
    except Exception:
        return None


def _train_flops(n: int, p: dict) -> float | None:
    """A fine-tuning: ``epochs`` passes of training steps, and an evaluation each epoch (or once)."""
    tr = p.get("train", {})
    length = tr.get("max_length", 128)
    n_train = _rows(p["task"], None, tr.get("max_train_examples"))
    n_eval = _rows(p["task"], _val(p["task"]), tr.get("max_eval_examples"))
    if n_train is None or n_eval is None:
        return None
    epochs = tr.get("epochs", 3)
    evals = math.ceil(epochs) if tr.get("eval_each_epoch", True) else 1
    return 6 * n * n_train * length * epochs + 2 * n * n_eval * length * evals


def _data_tokens(p: dict, key: str = "data", split: str | None = "validation") -> float | None:
    d = p.get(key, {})
    rows = _rows(p["task"], _val(p["task"]) if split == "validation" else split, d.get("max_examples"))
    return None if rows is None else rows * d.get("max_length", 128)


def _flops_finetune(n, p, job):
    return _train_flops(n, p)


def _flops_magnitude(n, p, job):
    """``imp``: a retraining per round; the paper's procedure: one retraining and an evaluation of
    the dev split per round (its search does not retrain)."""
    one = _train_flops(n, p)
    mag = p.get("magnitude", {})
    if one is None:
        return None
    if mag.get("procedure", "imp") == "imp":
        return one * mag.get("rounds", 1)
    tr = p.get("train", {})
    n_eval = _rows(p["task"], _val(p["task"]), tr.get("max_eval_examples"))
    return None if n_eval is None else one + 2 * n * n_eval * tr.get("max_length", 128) * mag.get("rounds", 1)


def _flops_score(n, p, job):
    t = _data_tokens(p, split=None)  # score jobs read the train split by default
    return None if t is None else 6 * n * t


def _flops_forward(n, p, job):
    t = _data_tokens(p)
    return None if t is None else 2 * n * t


def _flops_head_fit(n, p, job):
    """Features of the frozen encoder once (train + dev); the head's own epochs are small."""
    tr = p.get("train", {})
    n_train = _rows(p["task"], None, tr.get("max_train_examples"))
    n_eval = _rows(p["task"], _val(p["task"]), tr.get("max_eval_examples"))
    if n_train is None or n_eval is None:
        return None
    return 2 * n * (n_train + n_eval) * tr.get("max_length", 128)


def _flops_curve(n, p, job):
    """An evaluation per level, per order and random draw."""
    t = _data_tokens(p, "eval")
    if t is None:
        return None
    orders = sum(len(v) for v in p.get("orders", {}).values()) + p.get("random_draws", 0)
    return 2 * n * t * len(p.get("levels", [])) * orders


def _flops_prune(n, p, job):
    """Up to ``1 / step`` steps, each an importance pass (forward + backward) and a stop-rule evaluation."""
    imp = _data_tokens(p)
    stop = _data_tokens(p, "eval_data" if "eval_data" in p else "data")
    if imp is None or stop is None:
        return None
    steps = math.ceil(1 / p.get("prune", {}).get("step", 0.1))
    return steps * (6 * n * imp + 2 * n * stop)


def _cost_coherence(p, job):
    """Permutations x pairs x views (statistics of finished grids: no model)."""
    st = p.get("stats", {})
    return st.get("n_permutations", 9999) * len(p.get("pairs", [])) * len(p.get("views", ["application", "shared"]))


#: kind -> FLOPs of one job from (model size, params, job); None: not countable (data not here)
MODEL_COST: dict[str, Callable] = {
    "finetune": _flops_finetune,
    "lottery.retrain": _flops_finetune,
    "lottery.magnitude": _flops_magnitude,
    "score": _flops_score,
    "transfer-mlm-score": _flops_score,
    "transfer-head-fit": _flops_head_fit,
    "transfer-curve": _flops_curve,
    "prune": _flops_prune,
    "evaluate": _flops_forward,
    "lottery.patterns": _flops_forward,
}
#: kind -> work of one job that runs no model (in the units its FACTOR was fitted in)
OTHER_COST: dict[str, Callable] = {"transfer-coherence": _cost_coherence}


def job_seconds(job: Job, rate: float) -> float | None:
    """Estimated seconds of one job at ``rate`` matmul FLOP/s; None when this module cannot count it."""
    if job.kind in CHEAP:
        return OVERHEAD_S
    if job.kind in OTHER_COST:
        return OVERHEAD_S + FACTOR[job.kind] * OTHER_COST[job.kind](job.params, job) / rate
    if job.kind not in MODEL_COST:
        return None
    spec = base_model(job)
    n = model_size(spec) if spec else None
    flops = MODEL_COST[job.kind](n, job.params, job) if n else None
    if flops is None:
        return None
    extra = PATTERNS_CNN_S if job.kind == "lottery.patterns" else 0.0
    return OVERHEAD_S + extra + FACTOR[job.kind] * flops / rate


def fresh_estimate(jobs: Iterable[Job], rate: float) -> tuple[float, list[str]]:
    """``(seconds of the jobs counted, sorted kinds of those not counted)``."""
    total, unknown = 0.0, set()
    for job in jobs:
        s = job_seconds(job, rate)
        if s is None:
            unknown.add(job.kind)
        else:
            total += s
    return total, sorted(unknown)


def fresh_line(seconds: float, rate: float, unknown: list[str], counted: bool = True) -> str:
    """The estimate line of a run none of whose jobs has finished.

    >>> fresh_line(6000.0, 12.3e9, []).split(";")[0]
    'estimate: ~1h40m on this machine now (matmul 12.3 GFLOP/s measured'
    >>> fresh_line(0.0, 12.3e9, ["retrieval.score"], counted=False)
    'estimate: none for kinds retrieval.score (each done line then gives an ETA)'
    """
    if not counted:
        return f"estimate: none for kinds {', '.join(unknown)} (each done line then gives an ETA)"
    text = (f"estimate: ~{_hm(seconds)} on this machine now (matmul {rate / 1e9:.1f} GFLOP/s measured; a rough "
            "guess from each job's size, within 2-5x of the documented runs, replaced by measured job times as jobs "
            "finish)")
    return text + (f"; none for kinds {', '.join(unknown)}" if unknown else "")


def _hm(seconds: float) -> str:
    """``1h40m`` / ``12m`` / ``40s``: an estimate's precision (``duration`` for measured times).

    >>> _hm(6000), _hm(725), _hm(40)
    ('1h40m', '12m', '40s')
    """
    if seconds >= 3600:
        h, m = divmod(round(seconds / 60), 60)
        return f"{h}h{m:02d}m"
    if seconds >= 60:
        return f"{round(seconds / 60)}m"
    return duration(seconds) if seconds < 1 else f"{round(seconds)}s"


def plan_estimate(jobs: list[Job], device: str = "cpu", rate: float | None = None) -> str:
    """The line for a fresh run of ``jobs``: the probe on ``device`` (unless ``rate`` is given), then
    [`fresh_line`][headcount.experiments.runner.estimate.fresh_line]."""
    kinds = {j.kind for j in jobs}
    if not kinds & (set(MODEL_COST) | set(OTHER_COST) | CHEAP):
        return fresh_line(0.0, 0.0, sorted(kinds), counted=False)
    rate = rate if rate is not None else matmul_rate(device)
    seconds, unknown = fresh_estimate(jobs, rate)
    if len(unknown) == len(kinds):
        return fresh_line(0.0, rate, unknown, counted=False)
    return fresh_line(seconds, rate, unknown)


