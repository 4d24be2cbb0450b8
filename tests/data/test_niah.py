"""Needle-in-a-haystack tasks (``headcount.data.tasks.niah``): the seeded generator, its templates and
needles, the needle span, RULER-style files, ``kind: niah`` task YAML, the answer-only labels of the
lm objective, and the success rules.

Only ``test_offline_niah_*`` reads the fetched offline data (skipped without it); the others use
the small haystack and word-piece tokenizer of ``niah_helpers``.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest
import torch
from niah_helpers import (
    CHAT_TEMPLATE,
    SENTENCES,
    niah_tokenizer,
    tiny_niah_model,
    write_niah_task,
)

from headcount.data.tasks import get_task, is_fetched, list_tasks
from headcount.data.tasks.base import IGNORE
from headcount.data.tasks.niah import (
    NEEDLES,
    REFERENCE_DEPTHS,
    TEMPLATES,
    NiahSpec,
    exact_match,
    find_needle_idx,
    generate,
    niah_batches,
    rouge1_recall,
)
from headcount.importance.pipeline import DataConfig, batches_for, metric_for
from headcount.runtime.errors import HeadcountError


@pytest.fixture(scope="module")
def tok():
    return niah_tokenizer()


def spec(**kw) -> NiahSpec:
    return NiahSpec(**{"lengths": (120,), "depths": (0.0, 0.5, 1.0), "examples": 6, **kw})


def test_the_same_seed_gives_the_same_examples_and_another_seed_others(tok):
    a = generate(SENTENCES, tok, spec=spec())
    assert [e.prompt for e in a] == [e.prompt for e in generate(SENTENCES, tok, spec=spec())]
    assert [e.answer for e in a] != [e.answer for e in generate(SENTENCES, tok, spec=spec(seed=1))]
    # example i does not depend on which others are made (a subset is the same examples)
    assert [e.prompt for e in generate(SENTENCES, tok, spec=spec(), indices=[4, 1])] == [a[4].prompt, a[1].prompt]
    assert len({e.answer for e in a}) == len(a)  # fresh pass keys


@pytest.mark.parametrize("template", list(TEMPLATES))
@pytest.mark.parametrize("needle", NEEDLES)
def test_prompts_fill_their_length_and_the_span_is_the_answer(tok, template, needle):
    tok.chat_template = CHAT_TEMPLATE
    for e in generate(SENTENCES, tok, spec=spec(template=template, needle=needle)):
        n = len(e.input_ids)
        assert n <= e.length and n >= e.length - 12, (n, e.length)  # cut within a word or two of the length
        assert list(e.input_ids) == tok(e.prompt, add_special_tokens=not TEMPLATES[template].chat)["input_ids"]
        s, t = e.span
        assert tok.decode(e.input_ids[s:t]).replace(" ", "") == e.answer.lower().replace(" ", "")
        assert e.prompt.count(e.needle) == 1 and e.answer in e.needle
        assert e.target.strip() == e.answer and list(e.target_ids) == tok(e.target, add_special_tokens=False)["input_ids"]
    if template == "passkey" and needle == "passkey":
        assert re.fullmatch(r"The pass key is \d{5}\. Remember it\.", e.needle)
    if needle == "digits":
        assert len(e.answer) == 7 and e.answer.isdigit()


def test_depth_places_the_needle_from_first_to_last(tok):
    spec_ = spec(depths=REFERENCE_DEPTHS, examples=len(REFERENCE_DEPTHS), lengths=(200,), template="book")
    where = []
    for e in generate(SENTENCES, tok, spec=spec_):
        context = e.prompt[:e.prompt.index("Based on the content")]
        at = context.index(e.needle)
        where.append(at / len(context))
        if e.depth == 0:
            assert at == 0
        elif e.depth == 1:
            assert context.endswith(e.needle)
        else:  # at the start of a haystack text, at or before the depth
            assert context[at - 2] in ".!" and at / len(context) <= e.depth + 0.02
    assert where == sorted(where) and where[-1] > 0.9


def test_a_needle_holds_the_answer_its_question_asks_for():
    rng = np.random.default_rng(0)
    from headcount.data.tasks.niah import make_needle

    for kind in NEEDLES:
        needle, question, prefix, answer = make_needle(kind, rng)
        assert answer in needle and question.endswith("?") and answer not in question
        assert needle.startswith(prefix.rsplit(" ", 1)[0]) or kind == "digits"
    assert len(make_needle("passkey", rng, digits=9)[3]) == 9


def test_bad_parameters_are_one_line_errors(tok):
    for bad, match in (({"needle": "haiku"}, "needle"), ({"template": "nope"}, "template"),
                       ({"depths": (1.5,)}, "depths"), ({"lengths": (10,)}, "lengths"), ({"examples": 0}, "examples"),
                       ({"digits": 0}, "digits")):
        with pytest.raises(HeadcountError, match=match):
            NiahSpec(**bad)
    with pytest.raises(HeadcountError, match="too short"):
        generate(SENTENCES, tok, spec=spec(lengths=(20,)))
    tok.chat_template = None
    with pytest.raises(HeadcountError, match="chat template"):
        generate(SENTENCES, tok, spec=spec(template="book-chat"))
    with pytest.raises(HeadcountError, match="no text"):
        generate(["", "  "], tok, spec=spec())


def test_without_a_tokenizer_lengths_count_words():
    for e in generate(SENTENCES, None, spec=spec(lengths=(80,))):
        assert 70 <= len(e.prompt.split()) <= 80 and e.input_ids is None and e.span is None


def test_the_reference_needle_search():
    """``find_needle_idx``: the first window whose token set overlaps the needle's by more than 90%."""
    assert find_needle_idx([9, 1, 2, 3, 9, 1, 2, 3], [1, 2, 3]) == (1, 4)
    assert find_needle_idx([3, 2, 1, 7], [1, 2, 3]) == (0, 3)  # a set: order does not matter
    assert find_needle_idx([1, 2, 9], [1, 2, 3]) is None


def _rouge_score_rouge1_recall(target: str, prediction: str) -> float:
    """rouge_score 0.1.2's ``RougeScorer(['rouge1']).score(target, prediction)['rouge1'].recall``
    without the stemmer, transcribed (tokenize.tokenize, _create_ngrams, _score_ngrams)."""
    def tokens(text):
        text = re.sub(r"[^a-z0-9]+", " ", text.lower())
        return [x for x in re.split(r"\s+", text) if re.match(r"^[a-z0-9]+$", x)]

    t, p = Counter(tokens(target)), Counter(tokens(prediction))
    overlap = sum(min(t[w], p[w]) for w in t)
    return overlap / max(sum(t.values()), 1)


@pytest.mark.parametrize("target, response", [
    ("take a walk in Chaoyang Park and have a cup of Espresso in the evening",
     "The best thing to do is to take a walk in the park."),
    ("48213", "The pass key is 48213."), ("48213", "4821 3"), ("a a b", "a b b"), ("", "anything"),
    ("records were once again broken, and in some cases smashed", "Records were broken!"),
])
def test_rouge1_recall_is_rouge_scores(target, response):
    assert rouge1_recall(target, response) == pytest.approx(_rouge_score_rouge1_recall(target, response))


def test_exact_match_needs_every_answer():
    assert exact_match(["48213"], "the PASS key is 48213") and not exact_match(["48213"], "4821")
    assert exact_match(["Espresso"], "a cup of espresso") and not exact_match(["1", "2"], "1 only")


def test_niah_batches_label_the_answer_only(tok, tmp_path):
    task = get_task(str(write_niah_task(tmp_path)))
    batches = niah_batches(task, tok, split="validation", batch_size=4)
    assert [len(b.examples) for b in batches] == [4, 2]
    for b in batches:
        for r, e in enumerate(b.examples):
            p, t = len(e.input_ids), len(e.target_ids)
            assert b["input_ids"][r, :p].tolist() == list(e.input_ids)
            assert (b["labels"][r, p:p + t] == torch.tensor(e.target_ids)).all()
            assert (b["labels"][r, :p] == IGNORE).all() and (b["labels"][r, p + t:] == IGNORE).all()
            assert b["attention_mask"][r].sum() == p + t
        assert tok.eos_token_id in b.stop_ids and b.decode([4, 13]) == tok.decode([4, 13])
        # the reference's stop set: line breaks only (it decodes on after end-of-sequence)
        assert tok.eos_token_id not in b.newline_ids and b.stop_ids == b.newline_ids | {tok.eos_token_id}
        assert b.newline_ids == {i for i in range(len(tok)) if "\n" in tok.decode([i])}
    # the lm objective and the task objective both give these batches; the stop metric is next-token accuracy
    data = DataConfig(split="validation", batch_size=4)
    for objective in ("lm", "task"):
        again = batches_for(task, tok, objective, data)
        assert all(torch.equal(a["labels"], b["labels"]) for a, b in zip(again, batches))
        assert metric_for(task, objective) == "lm_accuracy"
    with pytest.raises(HeadcountError, match="needle-in-a-haystack"):
        batches_for(task, tok, "mlm", data)


def test_the_answer_loss_is_the_cross_entropy_of_the_answer_tokens(tok, tmp_path):
    """``--objective lm`` on a niah task: the model's loss is the mean cross-entropy of the target's
    tokens given everything before them, nothing of the prompt."""
    model = tiny_niah_model(tok)
    batch = niah_batches(get_task(str(write_niah_task(tmp_path))), tok, split="train", batch_size=3)[0]
    with torch.no_grad():
        loss = model(**batch).loss
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    terms = []
    for r, e in enumerate(batch.examples):
        p = len(e.input_ids)
        for k, token in enumerate(e.target_ids):
            terms.append(-torch.log_softmax(logits[r, p + k - 1], -1)[token])
    assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)


def test_positions_longer_than_the_model_are_one_line(tok, tmp_path):
    task = get_task(str(write_niah_task(tmp_path, lengths=[400])))
    short = niah_tokenizer()
    short.model_max_length = 300
    with pytest.raises(HeadcountError, match="longer than the model's 300 positions"):
        niah_batches(task, short, split="validation")


def test_task_yaml_declares_a_generator(tmp_path, tok):
    path = write_niah_task(tmp_path, needle="fact", template="book", lengths=[100, 140], examples=5, seed=7)
    task = get_task(str(path))
    assert task.kind == "niah" and task.metric == "exact_match" and task.splits() == ["train", "validation", "test"]
    val = task.examples("validation", tok)
    assert [e.length for e in val] == [100, 140, 100, 140, 100] and all(e.needle.startswith("The best") for e in val)
    assert [e.prompt for e in val] != [e.prompt for e in task.examples("test", tok)]  # each split its own examples
    assert len(task.examples("validation", tok, max_examples=2)) == 2
    data = task.load("validation")
    assert len(data) == 5 and data.labels[0] == val[0].answer
    for body, match in (("kind: niah\nniah: {needle: nope}\n", "needle"), ("kind: niah\nniah: {colour: red}\n", "colour"),
                        ("kind: niah\nniah: {haystack: missing.txt}\n", "not a file"),
                        ("kind: niah\nlabel: x\n", "unknown key 'label'"),
                        ("kind: niah\nniah: {}\nfiles: {validation: a.jsonl}\n", "not both")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(body)
        with pytest.raises(HeadcountError, match=match):
            get_task(str(bad))


def test_ruler_style_files(tmp_path, tok):
    hay = " ".join(SENTENCES[:6])
    rows = [{"index": 0, "input": f"Some special magic numbers are hidden. {hay} One of the special magic numbers for "
                                   f"calm-river is: 4712093. {hay}\nWhat is the special magic number for calm-river?",
             "outputs": ["4712093"], "length": 150, "answer_prefix": " Answer:"},
            {"input": f"{hay} The pass key is 55555. Remember it. What is the pass key?", "outputs": "55555"}]
    (tmp_path / "niah_single_2.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "ruler.yaml").write_text("name: ruler\nkind: niah\nfiles: {validation: niah_single_2.jsonl}\n")
    task = get_task(str(tmp_path / "ruler.yaml"))
    assert task.splits() == ["validation"] and task.train_split == "validation"
    ex = task.examples("validation", tok)
    assert ex[0].prompt.endswith("calm-river? Answer:") and ex[0].answers == ("4712093",)
    assert ex[1].answers == ("55555",) and ex[1].target == " 55555"
    for e in ex:
        s, t = e.span
        assert tok.decode(e.input_ids[s:t]).replace(" ", "") == e.answer
    bad = tmp_path / "bad.jsonl"
    for line, match in (({"input": "no answer here"}, "outputs"), ({"input": "abc", "outputs": ["xyz"]}, "not in the input"),
                        ({"input": "abc", "outputs": [3]}, "outputs a list")):
        bad.write_text(json.dumps(line) + "\n")
        (tmp_path / "bad.yaml").write_text("kind: niah\nfiles: {validation: bad.jsonl}\n")
        with pytest.raises(HeadcountError, match=match):
            get_task(str(tmp_path / "bad.yaml")).examples("validation", tok)


def test_offline_niah_is_registered():
    assert "offline/niah" in list_tasks()
    task = get_task("offline/niah")
    assert task.kind == "niah" and task.sizes == {"train": 100, "validation": 100, "test": 100}


@pytest.mark.skipif(not is_fetched(), reason="offline data not fetched: run `headcount data fetch`")
def test_offline_niah_haystacks_come_from_each_split():
    task = get_task("offline/niah")
    val, test = task.load("validation", max_examples=2), task.load("test", max_examples=2)
    assert all(990 <= len(p[0].split()) <= 1000 for p in val.texts)  # no tokenizer: words
    assert val.texts[0] != test.texts[0] and all(re.fullmatch(r"\d{5}", a) for a in val.labels)



# --------------------------------------------------------------------------- a chat template that fails
#: templates that hit the sandbox, raise (raise_exception, a TypeError, a range the sandbox caps) or do not parse
BAD_CHAT_TEMPLATES = {
    "sandbox": "{{ ''.__class__.__mro__ }}", "immutable": "{{ messages.append(1) }}",
    "raises": "{{ raise_exception('no chat for you') }}", "type-error": "{{ 1 + 'a' }}",
    "range": "{{ range(10**9) | list }}", "syntax": "{% for m in messages %}{{ m['content'] }}",
}


@pytest.mark.parametrize("name", list(BAD_CHAT_TEMPLATES))
def test_a_failing_chat_template_is_one_line_naming_it(name):
    tok = niah_tokenizer()
    tok.chat_template = BAD_CHAT_TEMPLATES[name]
    with pytest.raises(HeadcountError) as e:
        generate(SENTENCES, tok, spec=spec(template="book-chat"))
    message = str(e.value)
    assert "the chat template of the model's tokenizer" in message and "\n" not in message, message
    assert "template passkey or book" in message


@pytest.mark.parametrize("name", ["sandbox", "raises", "syntax"])
def test_score_with_a_failing_chat_template_is_one_line_naming_its_file(tmp_path, capsys, monkeypatch, name):
    from cli_helpers import assert_one_error_line, run_cli
    from niah_helpers import save_niah_checkpoint

    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    ckpt = save_niah_checkpoint(tmp_path / "ckpt")
    tok = niah_tokenizer()
    tok.chat_template = BAD_CHAT_TEMPLATES[name]
    tok.save_pretrained(ckpt)
    saved = [p for p in ckpt.iterdir() if p.name in ("chat_template.jinja", "tokenizer_config.json")
             and BAD_CHAT_TEMPLATES[name][:8] in p.read_text()]
    assert saved, "the template was saved with the tokenizer"
    task = write_niah_task(tmp_path / "task", template="book-chat")
    code, _, err = run_cli(capsys, "score", "--model", ckpt, "--task", task, "--method", "retrieval",
                           "--max-examples", 2, "--max-new-tokens", 2, "--out", tmp_path / "r")
    assert_one_error_line(code, err)
    assert "chat template" in err and str(saved[0]) in err, err


# --------------------------------------------------------------------------- lengths checked before any example
def test_lengths_past_the_models_positions_are_refused_before_any_example_is_built(tmp_path, monkeypatch):
    from headcount.data.tasks import niah_examples

    def no_example(*a, **k):
        raise AssertionError("an example was built before the lengths were checked")

    monkeypatch.setattr(niah_examples, "_example", no_example)
    short = niah_tokenizer()  # model_max_length 512: the tiny Llama's positions
    with pytest.raises(HeadcountError, match="10000000 tokens .* 512 positions"):
        generate(SENTENCES, short, spec=spec(lengths=(100, 10_000_000)))
    task = get_task(str(write_niah_task(tmp_path, lengths=[10_000_000])))
    for call in (lambda: task.examples("validation", short), lambda: niah_batches(task, short, split="validation"),
                 lambda: batches_for(task, short, "lm", DataConfig(split="validation"))):
        with pytest.raises(HeadcountError, match="512 positions"):
            call()
    assert len(generate(SENTENCES, None, spec=spec(lengths=(600,)), indices=[])) == 0  # no tokenizer: words, no limit


def test_score_refuses_lengths_past_the_models_positions_before_any_example(tmp_path, capsys, monkeypatch):
    from cli_helpers import assert_one_error_line, run_cli
    from niah_helpers import save_niah_checkpoint

    from headcount.data.tasks import niah_examples

    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(niah_examples, "_example", lambda *a, **k: pytest.fail("an example was built"))
    ckpt = save_niah_checkpoint(tmp_path / "ckpt")  # 512 positions
    task = write_niah_task(tmp_path / "task", lengths=[10_000_000])
    code, _, err = run_cli(capsys, "score", "--model", ckpt, "--task", task, "--method", "retrieval",
                           "--out", tmp_path / "r")
    assert_one_error_line(code, err)
    assert "10000000" in err and "512 positions" in err, err


def test_a_retrieval_study_job_refuses_lengths_past_the_models_positions_before_any_example(tmp_path, monkeypatch):
    """The study's score job (``scores/retrieval/<t>/seed<s>``) goes through the same check."""
    from niah_helpers import save_niah_checkpoint

    from headcount.data.tasks import niah_examples
    from headcount.experiments.runner import load_study_config
    from headcount.experiments.runner.execution import call_job
    from headcount.experiments.studies.retrieval import expand

    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HEADCOUNT_DEVICE", "cpu")
    monkeypatch.setattr(niah_examples, "_example", lambda *a, **k: pytest.fail("an example was built"))
    save_niah_checkpoint(tmp_path / "ckpt")  # 512 positions
    (tmp_path / "haystack.txt").write_text("\n".join(SENTENCES) + "\n")
    (tmp_path / "study.yaml").write_text("study: retrieval\nmodel: ckpt\ntemplates: [passkey]\nseeds: [1]\n"
                                         "niah: {lengths: [10000000], examples: 2, haystack: haystack.txt}\n")
    job = next(j for j in expand(load_study_config(tmp_path / "study.yaml").config) if j.name.startswith("scores/retrieval"))
    with pytest.raises(HeadcountError, match="10000000 tokens .* 512 positions"):
        call_job(job.fn, job.params, {}, tmp_path / "work", lambda *a: None)
