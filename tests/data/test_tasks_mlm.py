"""Tokenization cache, batching, masked-LM masking, and fitting a masked-LM head, on a tiny
tokenizer (a word-piece vocabulary written here) and a tiny random encoder saved to tmp_path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from headcount.data.mlm_head import fit_mlm_head
from headcount.data.tasks import (
    TaskData,
    encode,
    get_task,
    make_batches,
    mlm_batches,
    mlm_texts,
    tokenize,
)
from headcount.runtime.errors import HeadcountError

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the a cat dog bird sat ran flew on under over mat log tree big small red blue and then it was "
         "happy sad very not good bad film movie plot actor").split()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A folder with a tiny tokenizer and a tiny random encoder without a masked-LM head."""
    d = tmp_path_factory.mktemp("tiny")
    vocab = d / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + WORDS + [f"##{c}" for c in "sdy"]) + "\n")
    tok = transformers.BertTokenizer(vocab=str(vocab), do_lower_case=True)
    tok.save_pretrained(d)
    config = transformers.BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64, initializer_range=0.3)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tok(tiny_dir):
    return transformers.AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def sentences(n: int, seed: int = 0, lo: int = 3, hi: int = 30) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi)))) for _ in range(n)]


def story(n: int, seed: int = 0) -> list[str]:
    """Sentences with structure a head can learn: 'the <animal> <verb> <prep> the <thing>'."""
    rng = np.random.default_rng(seed)
    animals = {"cat": "sat", "dog": "ran", "bird": "flew"}
    out = []
    for _ in range(n):
        a = rng.choice(list(animals))
        out.append(f"the {a} {animals[a]} {rng.choice(['on', 'under', 'over'])} the {rng.choice(['mat', 'log', 'tree'])}")
    return out


def pair_task(tmp_path):
    import pandas as pd

    rows = [{"a": s, "b": t, "label": ["bad", "good"][i % 2]}
            for i, (s, t) in enumerate(zip(sentences(40, 1), sentences(40, 2)))]
    pd.DataFrame(rows).to_csv(tmp_path / "train.csv", index=False)
    (tmp_path / "pair.yaml").write_text("files: {train: train.csv}\ntext: [a, b]\n")
    return get_task(str(tmp_path / "pair.yaml"))


# --------------------------------------------------------------------------- encode
def test_encode_pairs_token_types_and_labels(tmp_path, tok):
    task = pair_task(tmp_path)
    data = task.load("train")
    enc = encode(data, tok, max_length=16)
    assert len(enc) == 40
    ex = enc[0]
    assert ex["input_ids"][0] == tok.cls_token_id and ex["input_ids"][-1] == tok.sep_token_id
    assert len(ex["input_ids"]) <= 16 and len(ex["token_type_ids"]) == len(ex["input_ids"])
    assert set(ex["token_type_ids"]) == {0, 1}  # second sentence marked
    assert ex["input_ids"].count(tok.sep_token_id) == 2
    assert [e["labels"] for e in enc] == data.labels.tolist()
    assert "attention_mask" not in ex


def test_tokenization_is_cached_on_disk(tmp_path, tok, monkeypatch):
    data = TaskData(get_task("glue/sst2"), "train", [(s,) for s in sentences(30)], np.zeros(30, dtype=np.int64))
    first = encode(data, tok, max_length=12)
    assert first.cache_file and first.cache_file.startswith(str(tmp_path / "cache" / "tokens"))

    def no_tokenizing(*a, **k):
        raise AssertionError("tokenized again instead of reading the cache")

    monkeypatch.setattr(type(tok), "__call__", no_tokenizing)
    again = encode(data, tok, max_length=12)  # served from the cache
    assert again.ids.tolist() == first.ids.tolist() and again.cache_file == first.cache_file
    with pytest.raises(AssertionError, match="tokenized again"):
        encode(data, tok, max_length=13)  # another length is another key
    with pytest.raises(AssertionError, match="tokenized again"):
        encode(data, tok, max_length=12, cache_dir=False)


# --------------------------------------------------------------------------- make_batches
def test_make_batches_pads_and_groups(tok):
    texts = sentences(50, seed=3, lo=1, hi=40)
    labels = np.arange(50) % 3
    data = TaskData(get_task("glue/mnli"), "train", [(s,) for s in texts], labels.astype(np.int64))
    enc = encode(data, tok, max_length=32)
    lengths = enc.lengths
    batches = make_batches(enc, 8, pad_token_id=tok.pad_token_id)
    assert [len(b["input_ids"]) for b in batches] == [8] * 6 + [2]
    widths = []
    for b in batches:
        mask = b["attention_mask"]
        assert b["input_ids"].shape == mask.shape == b["token_type_ids"].shape
        assert b["input_ids"].shape[1] == int(mask.sum(1).max())  # padded to the longest in the batch
        assert (b["input_ids"][mask == 0] == tok.pad_token_id).all()
        assert b["labels"].dtype == torch.long
        widths.append(b["input_ids"].shape[1])
    assert widths == sorted(widths, reverse=True)  # grouped: longest first
    ungrouped = make_batches(enc, 8, group_by_length=False, pad_token_id=tok.pad_token_id)
    pad = lambda bs: sum(int((b["attention_mask"] == 0).sum()) for b in bs)  # noqa: E731
    assert pad(batches) < pad(ungrouped)
    # every example exactly once, labels travel with their example
    seen = sorted(int(m.sum()) for b in batches for m in b["attention_mask"])
    assert seen == sorted(lengths.tolist())
    assert sorted(int(x) for b in batches for x in b["labels"]) == sorted(labels.tolist())


def test_make_batches_shuffle_is_seeded(tok):
    data = TaskData(get_task("glue/stsb"), "train", [(s, s) for s in sentences(300, seed=4)],
                    np.linspace(0, 5, 300).astype(np.float32))
    enc = encode(data, tok, max_length=64)
    a = make_batches(enc, 16, shuffle=True, seed=1)
    b = make_batches(enc, 16, shuffle=True, seed=1)
    c = make_batches(enc, 16, shuffle=True, seed=2)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
    assert not all(x["labels"].shape == y["labels"].shape and torch.equal(x["labels"], y["labels"])
                   for x, y in zip(a, c))
    assert a[0]["labels"].dtype == torch.float32
    assert sorted(float(v) for x in a for v in x["labels"]) == pytest.approx(sorted(data.labels.tolist()))
    # shuffled batches are still grouped: padding stays well below an ungrouped shuffle
    plain = make_batches(enc, 16, shuffle=True, seed=1, group_by_length=False)
    pad = lambda bs: sum(int((x["attention_mask"] == 0).sum()) for x in bs)  # noqa: E731
    assert pad(a) < 0.5 * pad(plain)


# --------------------------------------------------------------------------- masking
def test_mlm_masking_statistics(tok):
    texts = sentences(600, seed=5, lo=8, hi=40)
    batches = mlm_batches(texts, tok, max_length=48, batch_size=32, seed=0)
    original = tokenize([(t,) for t in texts], tok, max_length=48)
    assert sum(len(b["input_ids"]) for b in batches) == 600
    special = torch.tensor(tok.all_special_ids)
    n_cand = n_masked = n_mask_tok = n_same = 0
    for b in batches:
        ids, labels, attn = b["input_ids"], b["labels"], b["attention_mask"]
        chosen = labels != -100
        candidates = attn.bool() & ~torch.isin(torch.where(chosen, labels, ids), special)
        assert not (chosen & ~candidates).any()  # never a special token or padding
        assert (chosen.sum(1) >= 1).all()  # every sequence predicts something
        n_cand += int(candidates.sum())
        n_masked += int(chosen.sum())
        n_mask_tok += int((ids[chosen] == tok.mask_token_id).sum())
        n_same += int((ids[chosen] == labels[chosen]).sum())
        assert (ids[~chosen] != tok.mask_token_id).all()
    assert 0.14 < n_masked / n_cand < 0.165
    assert 0.77 < n_mask_tok / n_masked < 0.83
    # kept 10% plus random replacements that happen to draw the same token (1/len(WORDS+pieces))
    assert 0.08 < n_same / n_masked < 0.13
    n_random = n_masked - n_mask_tok - n_same
    assert 0.08 < n_random / n_masked < 0.12
    # the labels are the original tokens
    assert sum(int((b["labels"] != -100).sum()) for b in batches) == n_masked
    assert len(original) == 600


def test_mlm_masking_is_deterministic(tok):
    texts = sentences(100, seed=6)
    a = mlm_batches(texts, tok, seed=7, batch_size=16)
    b = mlm_batches(texts, tok, seed=7, batch_size=16)
    c = mlm_batches(texts, tok, seed=8, batch_size=16)
    for x, y in zip(a, b):
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"])
    assert any(not torch.equal(x["labels"], y["labels"]) for x, y in zip(a, c))


def test_mlm_texts_sources(tmp_path, tok):
    task = pair_task(tmp_path)
    texts = mlm_texts(str(tmp_path / "pair.yaml"))
    assert len(texts) == 80  # both sentences of each pair
    assert texts[:2] == list(task.load("train").texts[0])
    (tmp_path / "corpus.txt").write_text("first line\n\n  second line  \nthird\n")
    assert mlm_texts(str(tmp_path / "corpus.txt")) == ["first line", "second line", "third"]
    sub = mlm_texts(str(tmp_path / "pair.yaml"), max_examples=10, seed=1)
    assert len(sub) == 10 and sub == mlm_texts(str(tmp_path / "pair.yaml"), max_examples=10, seed=1)
    with pytest.raises(HeadcountError, match="not found"):
        mlm_texts(str(tmp_path / "missing.txt"))


# --------------------------------------------------------------------------- fitting a head
def test_fit_mlm_head_on_a_tiny_encoder(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    texts = story(240)
    model, report = fit_mlm_head(str(tiny_dir), texts, steps=150, lr=1e-2, max_texts=240, max_length=16,
                                 cache_dir=tmp_path / "heads", device="cpu")
    assert report["fitted"] is True and report["cached"] is False
    assert report["loss"] < report["loss_before"] - 0.2, report
    assert report["accuracy"] > report["accuracy_before"]
    assert "fitted" in report["message"] and report["n_masked_eval"] > 0
    # the decoder is the input embedding matrix, and the encoder did not move
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    saved = load_file(str(tiny_dir / "model.safetensors"))
    for name, p in model.base_model.named_parameters():
        assert torch.equal(p, saved[name]), name
    # the second call reads the cache: same head, same report
    again, report2 = fit_mlm_head(str(tiny_dir), texts, steps=150, lr=1e-2, max_texts=240, max_length=16,
                                  cache_dir=tmp_path / "heads", device="cpu")
    assert report2["cached"] is True and report2["loss"] == report["loss"]
    for (n, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        assert torch.equal(p, q), n


def test_checkpoint_with_mlm_head_is_not_refitted(tiny_dir, tmp_path):
    config = transformers.AutoConfig.from_pretrained(tiny_dir)
    torch.manual_seed(1)
    transformers.BertForMaskedLM(config).save_pretrained(tmp_path / "mlm")
    transformers.AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(tmp_path / "mlm")
    model, report = fit_mlm_head(str(tmp_path / "mlm"), story(40), max_length=16, cache_dir=tmp_path / "heads")
    assert report["fitted"] is False and "loss" in report and "from the checkpoint" in report["message"]
    assert not (tmp_path / "heads").exists()
