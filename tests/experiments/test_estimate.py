"""The fresh-run estimate (experiments/runner/estimate.py): FLOP counts per kind against a hand
count, the printed line, the measured ETA winning on a resumed run, unknown kinds, the probe."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console
from safetensors.torch import save_file

from headcount.experiments.runner import estimate as E
from headcount.experiments.runner.jobs import Job
from headcount.experiments.runner.progress import Reporter


@pytest.fixture()
def tiny(tmp_path):
    """A model directory whose weight headers hold 2 matrices (4x8, 8x4: 64 weights), an embedding
    (100x4, not counted) and a bias (not counted)."""
    save_file({"layer.0.w1": torch.zeros(4, 8), "layer.0.w2": torch.zeros(8, 4),
               "embeddings.word_embeddings.weight": torch.zeros(100, 4), "layer.0.b": torch.zeros(8)},
              str(tmp_path / "model.safetensors"))
    E.model_size.cache_clear()
    return str(tmp_path)


TASK = "offline/tweets"


def test_model_size_counts_matrices_only(tiny):
    assert E.model_size(tiny) == 4 * 8 + 8 * 4


def test_flops_per_kind_match_a_hand_count(tiny):
    n = 64
    train = {"max_length": 16, "epochs": 2, "max_train_examples": 10, "max_eval_examples": 5}
    ft = Job("ft", "finetune", "math:fsum", {"model": tiny, "task": TASK, "train": train})
    # 2 epochs x 10 examples x 16 tokens of training (6 N a token) + 2 evaluations of 5 x 16 (2 N)
    assert E.MODEL_COST["finetune"](n, ft.params, ft) == 6 * n * 10 * 16 * 2 + 2 * n * 5 * 16 * 2
    data = {"max_examples": 7, "max_length": 8}
    sc = Job("sc", "score", "math:fsum", {"task": TASK, "data": data}, deps={"model": ft})
    assert E.base_model(sc) == tiny  # read through the upstream fine-tune
    assert E.MODEL_COST["score"](n, sc.params, sc) == 6 * n * 7 * 8
    ev = Job("ev", "evaluate", "math:fsum", {"task": TASK, "data": data}, deps={"model": ft})
    assert E.MODEL_COST["evaluate"](n, ev.params, ev) == 2 * n * 7 * 8
    cv = {"task": TASK, "eval": data, "levels": [0.25, 0.5], "random_draws": 1, "orders": {"task": {"1": "task"}}}
    assert E.MODEL_COST["transfer-curve"](n, cv, None) == 2 * n * 7 * 8 * 2 * (1 + 1)
    pr = {"task": TASK, "data": data, "eval_data": {"max_examples": 3, "max_length": 8}, "prune": {"step": 0.25}}
    assert E.MODEL_COST["prune"](n, pr, None) == 4 * (6 * n * 7 * 8 + 2 * n * 3 * 8)
    # seconds: the overhead plus factor x FLOPs / rate
    rate = 1e9
    assert E.job_seconds(sc, rate) == pytest.approx(E.OVERHEAD_S + E.FACTOR["score"] * 6 * n * 7 * 8 / rate)


def test_line_format():
    line = E.fresh_line(6000.0, 12.3e9, [])
    assert line == ("estimate: ~1h40m on this machine now (matmul 12.3 GFLOP/s measured; a rough guess from each "
                    "job's size, within 2-5x of the documented runs, replaced by measured job times as jobs finish)")
    assert E.fresh_line(125.0, 1e9, ["x"]).endswith("; none for kinds x")


def test_unknown_kind_says_none(tiny):
    toy = Job("t", "toy", "math:fsum", {"x": 1})
    line = E.plan_estimate([toy], rate=1e9)
    assert line.startswith("estimate: none for kinds toy") and "~" not in line
    ft = Job("ft", "finetune", "math:fsum", {"model": tiny, "task": TASK,
                                               "train": {"max_train_examples": 4, "max_eval_examples": 4}})
    mixed = E.plan_estimate([toy, ft], rate=1e9)
    assert mixed.startswith("estimate: ~") and mixed.endswith("; none for kinds toy")
    hub = Job("h", "finetune", "math:fsum", {"model": "nobody/not-here", "task": TASK})
    assert E.plan_estimate([hub], rate=1e9).startswith("estimate: none for kinds finetune")


def _lines(**kw) -> list[str]:
    buf = io.StringIO()
    jobs = [Job("a", "score", "math:fsum", {"x": 1})]
    with Reporter(1, console=Console(file=buf, width=200), pending=jobs, **kw):
        pass
    return buf.getvalue().splitlines()


def test_reporter_prints_fresh_estimate_only_before_any_job_finished():
    fresh = lambda: "estimate: ~5m on this machine now (...)"  # noqa: E731
    assert _lines(fresh=fresh)[1] == "estimate: ~5m on this machine now (...)"
    resumed = _lines(fresh=fresh, timed=[("score", 10.0)])  # a resumed run: the measured ETA stays
    assert resumed[1].startswith("estimate: about 10s (an estimate")


def test_quiet_prints_nothing_and_never_probes():
    called = []
    buf = io.StringIO()
    with Reporter(1, quiet=True, console=Console(file=buf), pending=[Job("a", "score", "math:fsum", {})],
                  fresh=lambda: called.append(1) or "x"):
        pass
    assert buf.getvalue() == "" and called == []


def test_matmul_probe_is_positive_and_sized_by_its_work(monkeypatch):
    calls = []
    real = torch.Tensor.__matmul__

    def counting(a, b):
        calls.append(a.shape)
        return real(a, b)

    monkeypatch.setattr(torch.Tensor, "__matmul__", counting)
    assert E.matmul_rate(n=32, repeats=2) > 0
    assert calls == [(32, 32)] * 3  # a warm-up and the 2 timed: a fixed amount of work, no timed loop
