"""GPU settings of the studies, checked on the CPU: which jobs ask Ray for a GPU (a pure decision
from the job and the cluster's resources, no Ray cluster needed), the ``precision:`` of a study
config reaching every job as ``HEADCOUNT_PRECISION``, and the transfer study's head fit on the
device rule's device.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from cli_helpers import run_cli
from training_helpers import make_checkpoint, make_task, one_thread

from headcount.experiments.runner import (
    Job,
    Plan,
    RayExecutor,
    RunStore,
    StudyConfig,
    parse_study_config,
    register_study,
)
from headcount.experiments.runner.config import config_hash
from headcount.experiments.runner.local import LocalExecutor
from headcount.experiments.runner.ray_executor import ray_gpus
from headcount.experiments.runner.study import run_study
from headcount.experiments.studies.lottery import LotterySettings, lottery_jobs
from headcount.experiments.studies.transfer import TransferSettings
from headcount.experiments.studies.transfer.plan import transfer_jobs
from headcount.runtime.errors import HeadcountError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

#: job kinds that run a model (a GPU under Ray), and those that do not (masks, statistics, layout)
MODEL_KINDS = {"finetune", "prune", "evaluate", "score", "lottery.retrain", "lottery.magnitude", "lottery.patterns",
               "lottery.pattern-cnn", "transfer-mlm-score", "transfer-head-fit", "transfer-curve"}
OTHER_KINDS = {"lottery.subnetwork", "lottery.stability", "lottery.overlap", "transfer-layout", "transfer-mask",
               "transfer-coherence"}
GPU_CLUSTER = {"CPU": 16.0, "GPU": 2.0, "memory": 1e11}


# -------------------------------------------------------------------------------------- Ray
def test_model_jobs_ask_for_a_gpu_when_the_cluster_has_gpus():
    model, other = Job("m", "toy", "m:f", uses_model=True), Job("o", "toy", "m:f")
    explicit = Job("e", "toy", "m:f", resources={"gpus": 0.25})
    assert ray_gpus(model, GPU_CLUSTER) == 1.0 and ray_gpus(other, GPU_CLUSTER) == 0.0
    assert ray_gpus(model, {"CPU": 16.0}) == 0.0  # no GPU in the cluster: the CPU
    assert ray_gpus(model, GPU_CLUSTER, gpus_per_job=0.5) == 0.5  # two jobs share a GPU
    assert ray_gpus(model, {"GPU": 1.0}, gpus_per_job=2) == 1.0  # never more than there are
    assert ray_gpus(model, GPU_CLUSTER, device="cpu") == 0.0  # the study said cpu
    assert ray_gpus(explicit, GPU_CLUSTER) == 0.25 and ray_gpus(explicit, {}) == 0.25  # its own request wins

    ray = RayExecutor(gpus_per_job=0.5)
    assert ray._options(model, GPU_CLUSTER) == {"num_cpus": 1.0, "num_gpus": 0.5, "max_retries": 1}
    assert ray._options(other, GPU_CLUSTER)["num_gpus"] == 0.0
    assert ray._options(model, {"CPU": 4.0})["num_gpus"] == 0.0
    assert ray._job_env(model, 0.5) == {"HEADCOUNT_DEVICE": "auto"} and ray._job_env(other, 0.0) == {"HEADCOUNT_DEVICE": "cpu"}
    with pytest.raises(HeadcountError, match="needs 0.25 GPU"):  # a local instance cannot grow
        ray._options(explicit, {"CPU": 4.0})
    ray.set_device("cpu")
    assert ray._options(model, GPU_CLUSTER)["num_gpus"] == 0.0 and ray._job_env(model, 0.0)["HEADCOUNT_DEVICE"] == "cpu"
    ray.set_precision("bf16")
    assert ray._job_env(model, 0.0) == {"HEADCOUNT_DEVICE": "cpu", "HEADCOUNT_PRECISION": "bf16"}
    for bad in (0, -1, "1", True, float("inf"), float("nan")):  # the CLI's rule (ray_executor.check_gpus_per_job)
        with pytest.raises(HeadcountError, match="gpus_per_job"):
            RayExecutor(gpus_per_job=bad)


def test_gpus_per_job_reaches_the_ray_executor_from_the_cli_and_the_api(tmp_path, monkeypatch, capsys):
    """``headcount study/demo --executor ray --gpus-per-job X`` and ``run_study(gpus_per_job=X)`` build a
    RayExecutor asking X GPUs per model job (no Ray needed: the executor's check stops the run)."""
    import headcount.cli.commands.demo as demo_command
    from headcount.experiments import run_study as api_run_study
    from headcount.experiments.runner.executors import make_executor
    from headcount.experiments.runner.ray_executor import DEFAULT_GPUS_PER_JOB

    seen = []

    def stop(self):  # RayExecutor.check runs before the run directory is touched
        seen.append(self.gpus_per_job)
        raise HeadcountError("stopped before Ray")

    monkeypatch.setattr(RayExecutor, "check", stop)
    monkeypatch.setattr(demo_command, "is_fetched", lambda: True)
    config = tmp_path / "a.yaml"
    config.write_text("study: test_gpu_settings:probe\ndevice: cpu\n")
    for argv, expected in ((["study", config, "--executor", "ray", "--gpus-per-job", "0.5"], 0.5),
                           (["study", config, "--executor", "ray"], DEFAULT_GPUS_PER_JOB),
                           (["demo", "--executor", "ray", "--gpus-per-job", "2"], 2.0)):
        code, _, err = run_cli(capsys, *argv, "--out", tmp_path / "run")
        assert (code, err.strip(), seen[-1]) == (2, "error: stopped before Ray", expected), argv
    with pytest.raises(HeadcountError, match="stopped before Ray"):
        api_run_study(config, tmp_path / "run", executor="ray", gpus_per_job=0.25, quiet=True)
    assert seen[-1] == 0.25 and not (tmp_path / "run").exists()
    # the local executor refuses it (it runs one job per GPU); so does an executor instance
    with pytest.raises(HeadcountError, match="--gpus-per-job is for the ray executor"):
        api_run_study(config, tmp_path / "run", gpus_per_job=0.5, quiet=True)
    with pytest.raises(HeadcountError, match="executor instance"):
        make_executor(LocalExecutor(), gpus_per_job=0.5)
    assert not (tmp_path / "run").exists()


def _plan_jobs(tmp_path) -> list[Job]:
    pre, task = str(make_checkpoint(tmp_path / "pre")), str(make_task(tmp_path / "task", n_train=8, n_dev=8))
    (tmp_path / "maps.safetensors").write_bytes(b"")
    (tmp_path / "labels.csv").write_text("")
    lottery = LotterySettings(model=pre, tasks=[task, "offline/movies"], seeds=[1, 2],
                              patterns={"cnn": {"maps": str(tmp_path / "maps.safetensors"),
                                                "labels": str(tmp_path / "labels.csv")}})
    transfer = TransferSettings(model=pre, tasks=[task, "offline/movies"], seeds=[1, 2],
                                before_after={"levels": [0.5], "random_control": True})
    return list(Plan(lottery_jobs(lottery) + transfer_jobs(transfer, prefix="transfer/")))


def test_the_studies_mark_every_job_that_runs_a_model(tmp_path):
    jobs = _plan_jobs(tmp_path)
    assert {j.kind for j in jobs} == MODEL_KINDS | OTHER_KINDS  # a new kind must be sorted into one of them
    for job in jobs:
        assert job.uses_model == (job.kind in MODEL_KINDS), job.name
    ray = RayExecutor()
    gpus = {j.name: ray._options(j, GPU_CLUSTER)["num_gpus"] for j in jobs}
    assert {n for n, g in gpus.items() if g == 1.0} == {j.name for j in jobs if j.kind in MODEL_KINDS}
    assert all(ray._options(j, {"CPU": 16.0})["num_gpus"] == 0.0 for j in jobs)
    assert all(Plan([j]).to_json()["jobs"][-1]["uses_model"] == j.uses_model for j in jobs[:5])


# -------------------------------------------------------------------------------------- precision
class ProbeConfig(StudyConfig):
    jobs: int = 1


def seen_env(params, inputs, workdir, progress) -> dict:
    """What a job sees of the device settings."""
    return {k: os.environ.get(k) for k in ("HEADCOUNT_DEVICE", "HEADCOUNT_PRECISION")}


def _expand(config: ProbeConfig) -> list[Job]:
    return [Job(f"probe-{i}", "probe", "test_gpu_settings:seen_env", {"i": i}, uses_model=True)
            for i in range(config.jobs)]


register_study("probe", ProbeConfig, _expand, description="reports the environment its jobs see")


def test_precision_is_validated_and_not_part_of_the_config_identity():
    plain = parse_study_config("study: test_gpu_settings:probe\n")
    bf16 = parse_study_config("study: test_gpu_settings:probe\nprecision: BF16\n")
    assert plain.config.precision == "auto" and bf16.config.precision == "bf16"
    assert plain.hash == bf16.hash == config_hash(ProbeConfig(study="test_gpu_settings:probe", precision="fp32"))
    with pytest.raises(HeadcountError, match=r"line 2.*precision must be one of auto, fp32, bf16"):
        parse_study_config("study: test_gpu_settings:probe\nprecision: fp16\n")


@pytest.mark.slow
@pytest.mark.parametrize("pooled", [False, True], ids=["in-process", "pooled"])
def test_precision_reaches_every_job(tmp_path, monkeypatch, pooled):
    monkeypatch.delenv("HEADCOUNT_PRECISION", raising=False)
    (tmp_path / "a.yaml").write_text("study: test_gpu_settings:probe\njobs: 2\ndevice: cpu\nprecision: bf16\n")
    executor = LocalExecutor(devices=["cpu", "cpu"] if pooled else None)
    run_study(tmp_path / "a.yaml", tmp_path / "run", executor=executor, quiet=True)
    store = RunStore(tmp_path / "run")
    for i in range(2):
        r = store.result(f"probe-{i}")
        assert r.result == {"HEADCOUNT_DEVICE": "cpu", "HEADCOUNT_PRECISION": "bf16"}
        assert r.meta.get("precision") == "bf16"
    assert os.environ.get("HEADCOUNT_PRECISION") is None  # set for the jobs only
    # unset in the config: the jobs see the environment's own (here none)
    (tmp_path / "b.yaml").write_text("study: test_gpu_settings:probe\ndevice: cpu\n")
    run_study(tmp_path / "b.yaml", tmp_path / "run-b", executor=LocalExecutor(), quiet=True)
    assert RunStore(tmp_path / "run-b").result("probe-0").result["HEADCOUNT_PRECISION"] is None


# -------------------------------------------------------------------------------------- demo / study CLI
def test_demo_takes_device_and_both_commands_print_the_total_time(tmp_path, monkeypatch, capsys):
    """``headcount demo --device X`` reaches the runner like ``headcount study --device X``; both
    end with the run's wall time (every model-running job on the GPU; total time printed)."""
    import headcount.cli.commands.demo as demo_command
    import headcount.experiments as api
    from headcount.experiments.runner import RunSummary

    monkeypatch.setattr(demo_command, "is_fetched", lambda: True)
    seen = {}

    def fake(config, out, **options):
        seen.update(options, config=config)
        return RunSummary(out, jobs=3, reused=1, ran=["a", "b"], seconds=185.2)

    monkeypatch.setattr(api, "run_study", fake)
    code, out, err = run_cli(capsys, "demo", "--device", "cpu", "--out", tmp_path / "demo")
    assert code == 0, err
    assert seen["device"] == "cpu" and str(seen["config"]).endswith("demo.yaml")
    assert "jobs: 3 (2 ran, 1 reused) in 3 min 5 s" in out
    monkeypatch.undo()
    # a real (tiny) study: its summary carries the time, and the line says it
    (tmp_path / "a.yaml").write_text("study: test_gpu_settings:probe\njobs: 2\n")
    code, out, err = run_cli(capsys, "study", tmp_path / "a.yaml", "--out", tmp_path / "run", "--device", "cpu",
                             "--no-report", "--quiet")
    assert code == 0, err
    assert re.search(r"jobs: 2 \(2 ran, 0 reused\) in \d+\.\d s", out), out
    assert RunStore(tmp_path / "run").result("probe-1").result["HEADCOUNT_DEVICE"] == "cpu"
    summary = run_study(tmp_path / "a.yaml", tmp_path / "run", quiet=True)  # resumed: nothing ran
    assert summary.ran == [] and summary.reused == 2 and isinstance(summary.seconds, float) and summary.seconds >= 0


def test_demo_refuses_a_device_that_is_not_there(tmp_path, monkeypatch, capsys):
    import headcount.cli.commands.demo as demo_command

    monkeypatch.setattr(demo_command, "is_fetched", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    code, _, err = run_cli(capsys, "demo", "--device", "cuda:3", "--out", tmp_path / "demo")
    assert code == 2 and err.startswith("error: ") and "cuda" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "demo").exists()


# -------------------------------------------------------------------------------------- head fit
def test_head_fit_trains_on_the_device_rules_device(tmp_path, monkeypatch):
    import headcount.data.heads as heads
    import headcount.experiments.studies.transfer.jobs as transfer_jobs_module

    seen = []
    real_place = heads.place

    def spy_place(model, device=None):
        out = real_place(model, device)
        seen.append((device, out, next(model.parameters()).device))
        return out

    monkeypatch.setattr(heads, "place", spy_place)
    monkeypatch.setenv("HEADCOUNT_DEVICE", "cpu")
    pre, task = str(make_checkpoint(tmp_path / "pre")), str(make_task(tmp_path / "task", n_train=16, n_dev=8))
    out = transfer_jobs_module.head_fit_job(
        {"model": pre, "task": task, "seed": 1,
         "train": {"epochs": 1, "batch_size": 8, "max_length": 32, "eval_batch_size": 8}},
        {}, tmp_path / "work", lambda *a, **k: None)
    assert out["frozen_encoder"] and out["steps"] == 2
    # the job passes the device rule's device ($HEADCOUNT_DEVICE here), and the head is trained there
    assert seen and seen[0][0] == torch.device("cpu") and seen[0][1] == seen[0][2] == torch.device("cpu")
