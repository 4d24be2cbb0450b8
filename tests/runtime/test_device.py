"""The device rule (headcount.runtime.device), packing batches to a token budget, bf16 rank equivalence,
and the study runner's device pool; all on the CPU (CUDA counts are faked where needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from conftest import tiny_batch, tiny_model

from headcount.data.evaluation import MLM_METRIC, evaluate_batches, masked_positions_only
from headcount.data.tasks.batching import pack_batches, padding_id
from headcount.experiments.runner.local import DevicePool, LocalExecutor
from headcount.importance.scoring import score
from headcount.runtime.device import (
    default_tokens_per_batch,
    job_environment,
    pad_multiple,
    place,
    pool_devices,
    resolve_device,
    resolve_precision,
    runtime,
    trainer_settings,
)
from headcount.runtime.errors import HeadcountError


# --- the rule -----------------------------------------------------------------------------------
def test_resolve_device_specs_and_refusals(monkeypatch):
    monkeypatch.delenv("HEADCOUNT_DEVICE", raising=False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto", n_cuda=0) == torch.device("cpu")
    assert resolve_device("AUTO", n_cuda=2).type == "cuda"
    assert resolve_device("cuda:1", n_cuda=2) == torch.device("cuda", 1)
    for bad, n in (("cuda", 0), ("cuda:0", 0), ("cuda:2", 2), ("gpu", 1), ("cuda:x", 1)):
        with pytest.raises(HeadcountError) as e:
            resolve_device(bad, n_cuda=n)
        assert "\n" not in str(e.value)
    monkeypatch.setenv("HEADCOUNT_DEVICE", "cpu")
    assert resolve_device(None, n_cuda=4) == torch.device("cpu")  # the environment, when no argument
    assert resolve_device("cuda:3", n_cuda=4) == torch.device("cuda", 3)  # the argument wins


def test_precision_and_per_device_defaults(monkeypatch):
    monkeypatch.delenv("HEADCOUNT_PRECISION", raising=False)
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32" and resolve_precision(None, cpu) == "fp32"
    assert resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(HeadcountError):
        resolve_precision("fp16", cpu)
    monkeypatch.setenv("HEADCOUNT_PRECISION", "bf16")
    assert resolve_precision(None, cpu) == "bf16"
    assert pad_multiple(cpu) == 8 and pad_multiple(torch.device("cuda", 0)) == 32
    assert default_tokens_per_batch(torch.device("cuda", 0)) > default_tokens_per_batch(cpu)
    assert trainer_settings("cpu", "fp32") == {"use_cpu": True, "bf16": False}


def test_place_keeps_the_model_where_it_is_unless_told(monkeypatch):
    monkeypatch.delenv("HEADCOUNT_DEVICE", raising=False)
    model = tiny_model("bert")
    assert place(model) == torch.device("cpu")
    monkeypatch.setenv("HEADCOUNT_DEVICE", "cuda")
    if not torch.cuda.is_available():
        with pytest.raises(HeadcountError, match="no CUDA GPU"):
            place(model)  # the environment asks for a GPU this machine does not have
    rt = runtime(model, "cpu", "fp32", 0)
    assert (rt.tokens_per_batch, rt.pad_multiple) == (0, 1)  # 0: the batches as given
    assert rt.meta()["device"] == "cpu" and rt.meta()["precision"] == "fp32"


def test_unavailable_device_is_one_error_line_exit_2(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from headcount.cli.app import main

    with pytest.raises(SystemExit) as e:
        main(["score", "--device", "cuda:0", "--out", str(tmp_path / "s")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: device cuda:0 is not there")
    assert not (tmp_path / "s" / "scores.json").exists()


# --- the device pool ----------------------------------------------------------------------------
def test_pool_devices_with_fake_gpu_counts():
    assert pool_devices("auto", n_cuda=0) == ["cpu"]
    assert pool_devices("auto", n_cuda=4) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert pool_devices("cuda", n_cuda=2) == ["cuda:0", "cuda:1"]
    assert pool_devices("cuda:1", n_cuda=2) == ["cuda:1"]
    assert pool_devices("cpu", n_cuda=8) == ["cpu"]
    with pytest.raises(HeadcountError):
        pool_devices("cuda", n_cuda=0)
    # each pooled GPU job sees only its GPU, and calls it cuda:0
    assert job_environment("cuda:2") == {"CUDA_VISIBLE_DEVICES": "2", "HEADCOUNT_DEVICE": "cuda:0"}


def test_device_pool_hands_out_each_device_once():
    pool = DevicePool(["cuda:0", "cuda:1", "cuda:2"])
    got = [pool.acquire() for _ in range(3)]
    assert got == ["cuda:0", "cuda:1", "cuda:2"] and pool.acquire() is None
    pool.release("cuda:2")
    pool.release("cuda:0")
    assert pool.acquire() == "cuda:0"  # lowest index first
    with pytest.raises(HeadcountError):
        DevicePool([])


@pytest.mark.slow
def test_pooled_local_run_equals_the_sequential_one(tmp_path, monkeypatch):
    """Two worker processes (a fake pool of two CPU 'devices') give the same job files as one
    process; each job's meta.json names its device."""
    import toy_study  # noqa: F401  (registers the toy study type)

    from headcount.experiments.runner import run_study

    monkeypatch.setenv("TOY_COUNT_DIR", str(tmp_path))
    cfg = tmp_path / "toy.yaml"
    cfg.write_text("study: toy_study:toy\nvalues: [1, 2, 3]\nsteps: 2\nfactor: 2.0\n")
    run_study(cfg, tmp_path / "seq", quiet=True, report=False)
    summary = run_study(cfg, tmp_path / "pool", executor=LocalExecutor(devices=["cpu", "cpu"]), quiet=True,
                        report=False)
    assert sorted(summary.ran) == ["combine", "make-1", "make-2", "make-3", "square"]

    def files(run: Path) -> dict:
        return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted((run / "jobs").rglob("*"))
                if p.is_file() and p.name != "meta.json"}

    assert files(tmp_path / "seq") == files(tmp_path / "pool")
    metas = [json.loads(p.read_text()) for p in (tmp_path / "pool" / "jobs").rglob("meta.json")]
    assert metas and all(m["device"] == "cpu" and m["precision"] == "fp32" for m in metas)


# --- packing: a speed knob that changes no result -----------------------------------------------
def _cls_batches(model, n_batches=5, size=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n_batches):
        seq = 12 - i  # grouped by length: longest first
        ids = torch.randint(5, 99, (size, seq), generator=g)
        am = torch.ones_like(ids)
        am[0, seq - 3:] = 0  # some padding inside the batch too
        out.append({"input_ids": ids, "attention_mask": am, "labels": torch.randint(0, 3, (size,), generator=g)})
    return out


def test_pack_batches_merges_neighbours_within_the_budget():
    bs = [{"input_ids": torch.ones(2, n, dtype=torch.long), "labels": torch.zeros(2, dtype=torch.long)}
          for n in (9, 7, 3)]
    packed = list(pack_batches(bs, tokens_per_batch=4 * 16, pad_to_multiple_of=8))
    assert [sizes for _, sizes in packed] == [[2], [2, 2]]  # 9 -> 16 alone; 7 and 3 -> 8 merged
    assert packed[0][0]["input_ids"].shape == (2, 16)
    second = packed[1][0]
    assert second["input_ids"].shape == (4, 8) and second["attention_mask"][2:, 3:].sum() == 0
    assert [sizes for _, sizes in pack_batches(bs, tokens_per_batch=16, pad_to_multiple_of=8)] == [[2], [2], [2]]
    assert [b["input_ids"].shape for b, _ in pack_batches(bs, 1, 8)] == [(2, 16), (2, 8), (2, 8)]  # rounding only
    assert [b["input_ids"].shape for b, _ in pack_batches(bs, 0)] == [(2, 9), (2, 7), (2, 3)]  # as given


@pytest.mark.parametrize("method", ["gradient", "gradient-token", "entropy"])
def test_merged_batches_give_the_scores_of_the_batches_as_given(method):
    model = tiny_model("bert")
    batches = _cls_batches(model)
    alone = score(model, batches, method=method, keep_per_example=True, device="cpu", tokens_per_batch=0)
    merged = score(model, batches, method=method, keep_per_example=True, device="cpu", tokens_per_batch=10_000)
    torch.testing.assert_close(merged.heads, alone.heads, rtol=1e-4, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(merged.mlps, alone.mlps, rtol=1e-4, atol=1e-6, equal_nan=True)
    if method != "entropy":
        torch.testing.assert_close(merged.per_example, alone.per_example, rtol=1e-4, atol=1e-7)
    assert merged.meta["tokens_per_batch"] == 10_000 and merged.meta["device"] == "cpu"


def test_merged_masked_lm_batches_give_the_same_scores_and_accuracy():
    model = tiny_model("bert", head="mlm")
    batches = []
    for b in _cls_batches(model, seed=1):
        labels = torch.full_like(b["input_ids"], -100)
        labels[:, 1:4] = b["input_ids"][:, 1:4]  # a different number of masked tokens per batch
        labels[1:, 4] = b["input_ids"][1:, 4]
        batches.append({"input_ids": b["input_ids"], "attention_mask": b["attention_mask"], "labels": labels})
    with masked_positions_only(model):
        alone = score(model, batches, device="cpu", tokens_per_batch=0)
        merged = score(model, batches, device="cpu", tokens_per_batch=10_000)
    torch.testing.assert_close(merged.heads, alone.heads, rtol=1e-4, atol=1e-6)
    a = evaluate_batches(model, batches, MLM_METRIC, device="cpu", tokens_per_batch=0)
    m = evaluate_batches(model, batches, MLM_METRIC, device="cpu", tokens_per_batch=10_000)
    assert a["accuracy"] == m["accuracy"] and a["n_masked"] == m["n_masked"]
    assert m["loss"] == pytest.approx(a["loss"], rel=1e-5)


def test_merged_evaluation_equals_evaluation_as_given():
    model = tiny_model("bert")
    batches = _cls_batches(model)
    a = evaluate_batches(model, batches, "accuracy", device="cpu", tokens_per_batch=0)
    m = evaluate_batches(model, batches, "accuracy", device="cpu", tokens_per_batch=10_000)
    assert a["score"] == m["score"] and a["n_examples"] == m["n_examples"] == 15
    assert m["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert m["device"] == "cpu" and m["precision"] == "fp32"


def test_a_decoder_classifier_scores_and_evaluates_the_same_on_widened_batches():
    """A decoder's sequence classifier reads each row's last token that is not ``pad_token_id``:
    positions that packing adds (rounding to 8, merging) must hold that id, not 0."""
    model = tiny_model("llama", pad_token_id=3)
    g = torch.Generator().manual_seed(0)
    batches = []
    for seq in (11, 10, 9):  # none a multiple of 8: every batch is widened
        ids = torch.randint(5, 99, (3, seq), generator=g)
        am = torch.ones_like(ids)
        am[0, seq - 3:] = 0
        ids[0, seq - 3:] = 3  # the batch's own padding holds the id, as make_batches pads
        batches.append({"input_ids": ids, "attention_mask": am, "labels": torch.randint(0, 3, (3,), generator=g)})
    a = evaluate_batches(model, batches, "accuracy", device="cpu", tokens_per_batch=0)
    m = evaluate_batches(model, batches, "accuracy", device="cpu", tokens_per_batch=10_000)
    assert m["loss"] == pytest.approx(a["loss"], rel=1e-5) and a["score"] == m["score"]
    alone = score(model, batches, device="cpu", tokens_per_batch=0)
    merged = score(model, batches, device="cpu", tokens_per_batch=10_000)
    torch.testing.assert_close(merged.heads, alone.heads, rtol=1e-4, atol=1e-6)
    widened = next(b for b, _ in pack_batches(batches, 10_000, 8, padding_id(model)))
    assert widened["input_ids"].shape[1] == 16 and (widened["input_ids"][:, 11:] == 3).all()


# --- bf16: rank-equivalent scores ---------------------------------------------------------------
def test_bf16_autocast_scores_are_rank_equivalent_to_fp32():
    """A small random BERT (4 layers x 8 heads = 32 heads, hidden 128) scored on 256 examples:
    the per-head gradient importances under CPU bf16 autocast rank like the fp32 ones.
    (The 3-layer x 4-head conftest model has too few, too close scores for a stable Spearman.)"""
    from scipy.stats import spearmanr

    cfg = transformers.BertConfig(vocab_size=200, hidden_size=128, num_hidden_layers=4, num_attention_heads=8,
                                  intermediate_size=256, max_position_embeddings=64, num_labels=2,
                                  initializer_range=0.1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg).eval()
    g = torch.Generator().manual_seed(0)
    batches = []
    for seq in (40, 32, 28, 24, 20, 16, 12, 8):
        ids = torch.randint(5, 200, (32, seq), generator=g)
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                        "labels": (ids[:, 1] % 2).long()})
    fp32 = score(model, batches, device="cpu", precision="fp32")
    bf16 = score(model, batches, device="cpu", precision="bf16")
    assert bf16.meta["precision"] == "bf16" and fp32.meta["precision"] == "fp32"
    assert not torch.equal(fp32.heads, bf16.heads)  # bf16 really ran
    rho = spearmanr(fp32.heads.flatten().numpy(), bf16.heads.flatten().numpy())[0]
    assert rho >= 0.99, rho


def test_attention_maps_come_back_where_the_inputs_were():
    from headcount.core.attention import attention_maps

    model = tiny_model("bert")
    batch = tiny_batch(model)
    maps = attention_maps(model, device="cpu", precision="bf16", **batch)
    assert maps[0].dtype == torch.float32 and maps[0].device == batch["input_ids"].device
    rows = maps[0].sum(-1)[batch["attention_mask"].bool()[:, None, :].expand_as(maps[0].sum(-1))]
    torch.testing.assert_close(rows, torch.ones_like(rows), atol=2e-2, rtol=0)


# --- on a GPU (skipped without one; `pytest -k gpu` on the GPU machine) ---------------------------
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
def test_gpu_scores_evaluation_and_maps_match_the_cpu():
    from headcount.core.attention import attention_maps
    from headcount.core.masks import Mask

    model = tiny_model("bert")
    batches = _cls_batches(model)
    mask = Mask.full(3, 4).without_heads([(0, 1)])
    cpu = score(model, batches, device="cpu", keep_per_example=True, mask=mask)
    cpu_eval = evaluate_batches(model, batches, "accuracy", device="cpu", mask=mask)
    gpu = score(model, batches, device="cuda", precision="fp32", keep_per_example=True, mask=mask)
    assert next(model.parameters()).device.type == "cuda"  # moved once, and stays
    assert gpu.heads.device.type == "cpu" and gpu.meta["device"].startswith("cuda")
    torch.testing.assert_close(gpu.heads, cpu.heads, rtol=1e-3, atol=1e-5)
    torch.testing.assert_close(gpu.per_example, cpu.per_example, rtol=1e-3, atol=1e-6)
    gpu_eval = evaluate_batches(model, batches, "accuracy", precision="fp32", mask=mask)
    assert gpu_eval["score"] == cpu_eval["score"] and gpu_eval["loss"] == pytest.approx(cpu_eval["loss"], rel=1e-4)
    for method in ("gradient-token", "ablation", "entropy", "magnitude"):
        s = score(model, batches, method=method, precision="bf16")
        assert s.heads.device.type == "cpu" and s.meta["precision"] == "bf16"
    batch = tiny_batch(model)
    maps = attention_maps(model, **batch)  # CPU inputs, model on the GPU: CPU maps
    assert maps[0].device.type == "cpu"


@needs_gpu
def test_gpu_bf16_scores_are_rank_equivalent():
    from scipy.stats import spearmanr

    cfg = transformers.BertConfig(vocab_size=200, hidden_size=128, num_hidden_layers=4, num_attention_heads=8,
                                  intermediate_size=256, max_position_embeddings=64, num_labels=2,
                                  initializer_range=0.1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg).eval().cuda()
    g = torch.Generator().manual_seed(0)
    batches = []
    for seq in (40, 32, 28, 24, 20, 16, 12, 8):
        ids = torch.randint(5, 200, (32, seq), generator=g)
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": (ids[:, 1] % 2).long()})
    fp32 = score(model, batches, precision="fp32")
    bf16 = score(model, batches, precision="bf16")
    assert spearmanr(fp32.heads.flatten().numpy(), bf16.heads.flatten().numpy())[0] >= 0.99


def test_study_device_in_config_and_on_the_command_line(tmp_path):
    import toy_study  # noqa: F401

    from headcount.experiments.runner import parse_study_config, run_study

    base = "study: toy_study:toy\nvalues: [1]\nsteps: 1\nfactor: 2.0\n"
    with pytest.raises(HeadcountError, match=r"line 5: 'device'.*auto, cpu, cuda or cuda:N"):
        parse_study_config(base + "device: gpu\n")
    # the device is not part of the config's identity: a run resumes on another machine
    assert parse_study_config(base + "device: cpu\n").hash == parse_study_config(base).hash
    cfg = tmp_path / "toy.yaml"
    cfg.write_text(base + "device: cpu\n")
    if not torch.cuda.is_available():
        with pytest.raises(HeadcountError, match="no CUDA GPU"):
            run_study(cfg, tmp_path / "run", device="cuda", quiet=True)  # refused before anything is written
        assert not (tmp_path / "run").exists()
