"""Fine-tuning and structured retraining (headcount.train) on a tiny model and a learnable task."""

from __future__ import annotations

import json

import pytest
import torch
from training_helpers import make_checkpoint, make_task, one_thread, stop_after

from headcount.core.masks import Mask
from headcount.core.models import load_model
from headcount.core.surgery import load_pruned
from headcount.runtime.errors import HeadcountError
from headcount.train import DynamicPadding, LengthGroupedEpochSampler, TrainConfig, evaluate, finetune

#: learns the has-"good" task to 100% in 96 steps (~3 s on 2 CPU cores). Every seed 1-20 reaches 100%
#: by epoch 5 of 8; the former lr=1e-2, 3 epochs stayed at chance for half of the seeds, so whether
#: seed 1 learnt rested on a trajectory that other CPU kernels change.
FAST = TrainConfig(lr=3e-3, batch_size=16, epochs=8, save_steps=4, use_cpu=True)


_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("training")
    return {"pre": str(make_checkpoint(root / "pre")), "task": str(make_task(root / "task")), "root": root}


@pytest.fixture(scope="module")
def baseline(world, tmp_path_factory):
    """One uninterrupted run (seed 1): compared with a second run and with a resumed run."""
    out = tmp_path_factory.mktemp("baseline")
    return finetune(world["pre"], world["task"], seed=1, config=FAST, out_dir=out), out


def _inputs(n=4):
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(5, 40, (n, 9), generator=g), "attention_mask": torch.ones(n, 9, dtype=torch.long)}


def test_finetune_learns_the_task_and_writes_its_files(world, baseline):
    metrics, out = baseline
    assert metrics["final"]["score"] >= 0.85  # chance is 0.5
    assert [round(e["epoch"]) for e in metrics["epochs"]] == list(range(1, 9))
    assert metrics["head"] == "new" and "new 2-output" in metrics["head_note"]
    assert metrics["tokens_per_s"] > 0 and metrics["train_seconds"] > 0
    assert metrics["n_params"] == metrics["n_params_before"] and metrics["mask"] is None
    assert json.loads((out / "metrics.json").read_text())["final"] == metrics["final"]
    assert not (out / "checkpoints").exists()  # removed once finished
    model = load_model(str(out / "model"), head="classification", num_labels=2)
    again = evaluate(model, world["task"], tokenizer=None, max_length=128)
    assert again["score"] == pytest.approx(metrics["final"]["score"])


def test_same_seed_same_metrics(world, baseline, tmp_path):
    metrics, _ = baseline
    again = finetune(world["pre"], world["task"], seed=1, config=FAST, out_dir=tmp_path / "again")
    assert again["final"] == metrics["final"] and again["epochs"] == metrics["epochs"]


def test_resume_after_interruption_gives_the_same_metrics(world, baseline, tmp_path):
    metrics, _ = baseline
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):  # dies at step 18, mid-epoch 2; last checkpoint: step 16
        finetune(world["pre"], world["task"], seed=1, config=FAST, out_dir=out, callbacks=[stop_after(18)])
    assert (out / "checkpoints" / "checkpoint-16").is_dir() and not (out / "metrics.json").exists()
    resumed = finetune(world["pre"], world["task"], seed=1, config=FAST, out_dir=out)
    assert resumed["resumed_from"] == "checkpoint-16"
    assert resumed["final"] == metrics["final"] and resumed["epochs"] == metrics["epochs"]
    # a finished run is not trained again
    assert finetune(world["pre"], world["task"], seed=1, config=FAST, out_dir=out) == resumed
    with pytest.raises(HeadcountError, match="different run"):
        finetune(world["pre"], world["task"], seed=2, config=FAST, out_dir=out)


def test_structured_retraining_keeps_heads_removed(world, tmp_path):
    mask = Mask.full(2, 4).without_heads([(0, 1), (0, 3), (1, 0)]).without_mlps([1])
    m = finetune(world["pre"], world["task"], mask=mask, seed=1, config=FAST, out_dir=tmp_path / "pruned")
    assert m["mask"]["heads_kept"] == 5 and m["mask"]["mlps_kept"] == 1 and m["n_params"] < m["n_params_before"]
    model = load_model(str(tmp_path / "pruned" / "model"), head="classification", num_labels=2)
    layers = model.base_model.encoder.layer
    assert layers[0].attention.self.query.weight.shape[0] == 2 * 8  # 2 heads of size 8 left
    assert layers[1].attention.self.value.weight.shape[0] == 3 * 8
    assert layers[0].attention.output.dense.weight.shape[1] == 2 * 8
    assert layers[1].intermediate.dense.weight.shape[0] == 0 and layers[1].output.dense.bias is None
    # the checkpoint reloads with identical outputs
    twin = load_pruned(tmp_path / "pruned" / "model")
    x = _inputs()
    with torch.no_grad():
        assert torch.equal(model(**x).logits, twin(**x).logits)
    assert evaluate(model, world["task"])["score"] == pytest.approx(m["final"]["score"])


def test_structured_retraining_starts_from_the_pretrained_weights(world, tmp_path):
    from headcount.train import prepare_model

    pre = load_model(world["pre"], head="base")
    mask = Mask.full(2, 4).without_heads([(0, 0)])
    model, _, info = prepare_model(world["pre"], world["task"], mask=mask, seed=3)
    q0 = pre.encoder.layer[0].attention.self.query.weight
    assert torch.equal(model.base_model.encoder.layer[0].attention.self.query.weight, q0[8:])  # heads 1..3
    assert info["head"] == "new"


def test_gate_mode_trains_with_fixed_gates_and_records_them(world, tmp_path):
    mask = Mask.full(2, 4).without_heads([(1, 2)])
    m = finetune(world["pre"], world["task"], mask=mask, mask_mode="gate", seed=1, config=FAST,
                 out_dir=tmp_path / "gated")
    assert m["mask"]["mode"] == "gate" and m["n_params"] == m["n_params_before"]
    model = load_model(str(tmp_path / "gated" / "model"), head="classification", num_labels=2)
    assert model.base_model.encoder.layer[1].attention.self.query.weight.shape[0] == 32  # shapes kept
    rec = model.config.headcount_pruning
    assert rec["gates"]["heads"][1] == [1, 1, 0, 1]
    assert evaluate(model, world["task"])["score"] == pytest.approx(m["final"]["score"])


def test_label_count_mismatch(world, tmp_path):
    three = str(make_task(tmp_path / "three", n_labels=3))
    # a new head: fine, and said so
    m = finetune(world["pre"], three, seed=0, config=TrainConfig(lr=1e-2, batch_size=32, epochs=1,
                                                                  max_train_examples=32, max_eval_examples=16),
                 out_dir=tmp_path / "new3")
    assert m["head"] == "new" and "3-output" in m["head_note"]
    # a fine-tuned 2-label classifier: error
    clf = make_checkpoint(tmp_path / "clf", head="classification", num_labels=2)
    with pytest.raises(HeadcountError, match="classifier with 2 labels"):
        finetune(str(clf), three, seed=0, config=FAST, out_dir=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_mask_for_another_shape(world, tmp_path):
    with pytest.raises(HeadcountError, match="mask is for 3 layers x 4 heads"):
        finetune(world["pre"], world["task"], mask=Mask.full(3, 4), seed=0, config=FAST, out_dir=tmp_path / "x")


def test_a_saved_tokenizer_is_the_same_file_whatever_it_tokenized_before(world, tmp_path):
    import transformers
    from training_helpers import make_tokenizer

    from headcount.core.surgery import save_pruned, shrink
    from headcount.train.finetuning import _save_model

    tok = make_tokenizer(tmp_path / "tok")
    model = load_model(world["pre"], head="classification", num_labels=2)
    _save_model(model, tok, tmp_path / "fresh", {})
    batch = tok(["the movie was very long and the plot was slow", "a film"], padding=True, truncation=True,
                max_length=8)
    assert [len(ids) for ids in batch["input_ids"]] == [8, 8]  # it padded and truncated: its backend remembers
    assert tok.backend_tokenizer.padding is not None and tok.backend_tokenizer.truncation["max_length"] == 8
    _save_model(model, tok, tmp_path / "used", {})
    files = sorted(p.name for p in (tmp_path / "fresh").iterdir())
    assert "tokenizer.json" in files and files == sorted(p.name for p in (tmp_path / "used").iterdir())
    for name in files:  # byte-identical, tokenizer.json included
        assert (tmp_path / "fresh" / name).read_bytes() == (tmp_path / "used" / name).read_bytes(), name
    assert tok.backend_tokenizer.truncation["max_length"] == 8  # the caller's tokenizer is left as it was
    # a pruned checkpoint writes its tokenizer the same way
    pruned = shrink(load_model(world["pre"], head="classification", num_labels=2), Mask.full(2, 4).without_heads([(0, 1)]))
    save_pruned(pruned, tmp_path / "pruned", tokenizer=tok)
    assert (tmp_path / "pruned" / "tokenizer.json").read_bytes() == (tmp_path / "fresh" / "tokenizer.json").read_bytes()
    # the saved tokenizer still pads and truncates when asked to
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "used")
    ask = dict(padding="max_length", truncation=True, max_length=6)
    assert reloaded(["a film", "the plot was very long and slow"], **ask)["input_ids"] == \
        tok(["a film", "the plot was very long and slow"], **ask)["input_ids"]


def test_dynamic_padding_and_length_grouping():
    pad = DynamicPadding(0, pad_to_multiple_of=4)
    b = pad([{"input_ids": [2, 7, 3], "token_type_ids": [0, 0, 0], "labels": 1}, {"input_ids": [2, 3], "token_type_ids": [0, 0], "labels": 0}])
    assert b["input_ids"].shape == (2, 4) and b["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert b["labels"].dtype == torch.long
    assert DynamicPadding(0, regression=True)([{"input_ids": [1], "labels": 0.5}])["labels"].dtype == torch.float32
    lengths = [5, 60, 7, 58, 6, 61, 8, 59] * 8
    s = LengthGroupedEpochSampler(lengths, batch_size=4, seed=1)
    e0 = list(s)
    assert sorted(e0) == list(range(64)) and list(s) == e0  # the same epoch, the same order
    s.set_epoch(1)
    assert list(s) != e0
    spread = [max(lengths[i] for i in e0[j:j + 4]) - min(lengths[i] for i in e0[j:j + 4]) for j in range(0, 64, 4)]
    assert sorted(spread)[len(spread) // 2] <= 3  # most batches hold examples of similar length


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_bf16(world, tmp_path):
    from dataclasses import replace

    m = finetune(world["pre"], world["task"], seed=1, config=replace(FAST, use_cpu=False), out_dir=tmp_path / "gpu")
    assert m["device"].startswith("cuda") and m["bf16"] == torch.cuda.is_bf16_supported()
    assert m["final"]["score"] >= 0.85
