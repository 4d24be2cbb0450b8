"""Scoring decoders: ``--objective lm`` (the causal-LM next-token loss on a task's texts) with the
gate-gradient scorer, through the CLI, checked against an independent autograd of the same loss."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import assert_one_error_line, run_cli
from conftest import HEADS, LAYERS, tiny_model
from training_helpers import make_task, make_tokenizer

from headcount.data.tasks import get_task, lm_batches


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    tiny_model("qwen3", head="lm").save_pretrained(root / "qwen3")
    make_tokenizer(root / "qwen3").save_pretrained(root / "qwen3")
    task = make_task(root / "task", n_train=12, n_dev=8)
    return root, task


def test_lm_objective_scores_are_the_gate_gradients_of_the_next_token_loss(world, capsys):
    root, task = world
    code, out, err = run_cli(capsys, "score", "--model", root / "qwen3", "--task", task, "--objective", "lm",
                             "--method", "gradient", "--max-examples", 12, "--batch-size", 4, "--out", root / "s")
    assert code == 0, err
    scores = json.loads((root / "s" / "scores.json").read_text())
    assert scores["objective"] == "lm" and len(scores["heads"]) == LAYERS and len(scores["heads"][0]) == HEADS
    # the same quantity by hand: sum over batches of |dL_b/dg| at g = 1, L_b the model's mean next-token loss
    from headcount.core.gates import gated
    from headcount.core.models import load_model, load_tokenizer

    model, tok = load_model(str(root / "qwen3"), head="lm"), load_tokenizer(str(root / "qwen3"))
    texts = [" ".join(t) for t in get_task(str(task)).load("train", max_examples=12, seed=0).texts]
    want = torch.zeros(LAYERS, HEADS, dtype=torch.float64)
    for batch in lm_batches(texts, tok, max_length=128, batch_size=4):
        g = torch.ones(LAYERS, HEADS, requires_grad=True)
        with gated(model, heads=g):
            model(**batch).loss.backward()
        want += g.grad.abs().double()
    got = torch.tensor(scores["heads"], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), (got, want)
    assert bool((got > 0).all())


def test_lm_objective_is_refused_for_encoders(world, capsys, tmp_path):
    root, task = world
    from training_helpers import make_checkpoint

    bert = make_checkpoint(tmp_path / "bert")
    for cmd in ("score", "prune"):
        code, _, err = run_cli(capsys, cmd, "--model", bert, "--task", task, "--objective", "lm",
                               "--out", tmp_path / cmd)
        assert_one_error_line(code, err)
        assert "needs a decoder" in err and not (tmp_path / cmd).exists()


def test_lm_accuracy_is_next_token_accuracy_by_hand(world):
    """The stop metric of ``prune --objective lm``: the top-1 prediction at t against the token at
    t + 1 over real tokens (padding and the first position never count); perplexity = exp(loss)."""
    from headcount.core.models import load_model, load_tokenizer
    from headcount.data.evaluation import LM_METRIC, evaluate_batches

    root, task = world
    model, tok = load_model(str(root / "qwen3"), head="lm"), load_tokenizer(str(root / "qwen3"))
    texts = [" ".join(t) for t in get_task(str(task)).load("validation", max_examples=8, seed=0).texts]
    batches = lm_batches(texts, tok, max_length=128, batch_size=3)
    got = evaluate_batches(model, batches, LM_METRIC, tokens_per_batch=0)
    hits = n = 0
    loss = 0.0
    with torch.no_grad():
        for b in batches:
            out = model(**b)
            for row in range(b["input_ids"].shape[0]):
                real = int(b["attention_mask"][row].sum())
                pred = out.logits[row, : real - 1].argmax(-1)
                hits += int((pred == b["input_ids"][row, 1:real]).sum())
                n += real - 1
            loss += float(out.loss) * int((b["labels"] != -100).sum())
    assert got["n_tokens"] == n and got["score"] == pytest.approx(hits / n)
    assert got["perplexity"] == pytest.approx(float(torch.tensor(loss / n).exp()), rel=1e-4)
    merged = evaluate_batches(model, batches, LM_METRIC)  # batches merged to the token budget: the same
    assert merged["score"] == pytest.approx(got["score"]) and merged["loss"] == pytest.approx(got["loss"], rel=1e-5)


@pytest.mark.parametrize("unit", ["heads", "kv-groups"])
def test_prune_with_the_lm_objective(world, capsys, tmp_path, unit):
    """``prune --objective lm`` stops on next-token accuracy on the validation texts."""
    from headcount.core.masks import Mask

    root, task = world
    code, out, err = run_cli(capsys, "prune", "--model", root / "qwen3", "--task", task, "--objective", "lm",
                             "--unit", unit, "--threshold", "0.5", "--step", "0.25", "--max-examples", 12,
                             "--max-eval-examples", 8, "--out", tmp_path / "p")
    assert code == 0, err
    mask = Mask.load(tmp_path / "p" / "mask.json")
    assert mask.meta["objective"] == "lm" and mask.meta["metric_name"] == "lm_accuracy"
    assert "lm_accuracy" in out and (tmp_path / "p" / "trace.csv").is_file()
    assert mask.n_heads_kept < LAYERS * HEADS  # the loop ran: heads went
    if unit == "kv-groups":
        groups = mask.heads.view(LAYERS, 2, -1).sum(-1)
        assert bool(((groups == 0) | (groups == HEADS // 2)).all())


@pytest.mark.parametrize("arch", ["llama", "gpt2", "phi3", "bert"])
def test_activation_scorer_is_wanda_sp_by_hand(arch):
    """heads[l, h] = sum over head h's output-projection input channels j of rms_j(X) * sum_i |W_ij|
    (rms over real tokens); a head held at gate 0 scores 0. Decoders and encoders alike."""
    from conftest import ARCHS, tiny_batch

    from headcount.core.arch import get_adapter
    from headcount.core.arch.base import out_dim
    from headcount.core.masks import Mask
    from headcount.importance.scoring import score

    model = tiny_model(arch, head="lm" if ARCHS[arch].decoder else "classification")
    batch = tiny_batch(model)
    got = score(model, [batch], method="activation")
    blocks = get_adapter(model).blocks(model)
    seen = {}
    handles = [b.out_projection.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0]))
               for i, b in enumerate(blocks)]
    with torch.no_grad():
        model(**batch)
    for hd in handles:
        hd.remove()
    m = batch["attention_mask"].bool()
    for layer, block in enumerate(blocks):
        x = seen[layer][m].double()  # [real tokens, channels]
        rms = x.pow(2).mean(0).sqrt()
        col = block.out_projection.weight.abs().double().sum(dim=out_dim(block.out_projection))
        want = (rms * col).view(HEADS, -1).sum(1)
        assert torch.allclose(got.heads[layer].double(), want, rtol=1e-4), (layer, got.heads[layer], want)
    assert bool((got.mlps > 0).all())
    masked = score(model, [batch], method="activation", mask=Mask.for_model(model).without_heads([(1, 2)]),
                   at_mask=True)
    assert masked.heads[1, 2] == 0 and masked.heads[1, 1] > 0


def test_unit_kv_groups_scores_and_prunes_whole_groups(tmp_path, capsys):
    """``--unit kv-groups``: scores.json gets each group's summed query-head scores; prune removes
    whole groups (mask.json's kv_groups, and shrinking it shrinks the KV cache); refused without GQA."""
    from training_helpers import make_checkpoint

    from headcount.core.masks import Mask
    from headcount.core.models import load_model
    from headcount.core.surgery import kv_summary, shrink

    task = make_task(tmp_path / "task", n_train=16, n_dev=16)
    model = tiny_model("llama", head="classification", num_labels=2)
    model.save_pretrained(tmp_path / "llama")
    make_tokenizer(tmp_path / "llama").save_pretrained(tmp_path / "llama")
    code, _, err = run_cli(capsys, "score", "--model", tmp_path / "llama", "--task", task, "--unit", "kv-groups",
                           "--max-examples", 16, "--out", tmp_path / "s")
    assert code == 0, err
    s = json.loads((tmp_path / "s" / "scores.json").read_text())
    heads = torch.tensor(s["heads"])
    assert s["unit"] == "kv-groups"
    assert torch.allclose(torch.tensor(s["kv_groups"]), heads.view(LAYERS, 2, 2).sum(-1))
    code, _, err = run_cli(capsys, "prune", "--model", tmp_path / "llama", "--task", task, "--unit", "kv-groups",
                           "--threshold", "0.01", "--step", "0.3", "--max-examples", 16, "--max-eval-examples", 16,
                           "--out", tmp_path / "p")
    assert code == 0, err
    mask = Mask.load(tmp_path / "p" / "mask.json")
    assert mask.meta["unit"] == "kv-groups" and mask.n_kv_heads == 2
    groups = mask.heads.view(LAYERS, 2, 2)
    assert bool(((groups.sum(-1) == 0) | (groups.sum(-1) == 2)).all())  # whole groups only
    gone = int((mask.kv_groups == 0).sum())
    assert gone > 0
    small = shrink(load_model(str(tmp_path / "llama"), head="classification"), mask)
    assert kv_summary(small) == {"kv_heads_total": 6, "kv_heads_kept": 6 - gone, "kv_heads_repeated": 0}
    bert = make_checkpoint(tmp_path / "bert")
    for cmd in ("score", "prune"):
        code, _, err = run_cli(capsys, cmd, "--model", bert, "--task", task, "--unit", "kv-groups",
                               "--out", tmp_path / f"bad-{cmd}")
        assert_one_error_line(code, err)
        assert "needs a decoder with grouped-query attention" in err and not (tmp_path / f"bad-{cmd}").exists()
