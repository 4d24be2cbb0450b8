"""headcount.data.heads: heads fitted on a frozen encoder whose outputs are replayed.

What could go wrong: the replayed output is not what the head reads (loss differs from the full
model's), a module's ``forward`` is reassigned (hooks of other libraries break), the encoder moves,
or the caller's ``requires_grad`` flags come back changed.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_model
from training_helpers import make_checkpoint, sentences
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPooling

from headcount.data.heads import fit_task_head, replaying_encoder
from headcount.data.mlm_head import fit_mlm_head
from headcount.runtime.errors import HeadcountError

ARCHS = ["bert", "albert", "distilbert", "deberta-v2"]


@pytest.fixture(autouse=True)
def _one_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _batches(model, n=3):
    return [tiny_batch(model, batch=4, seq=9, seed=i, labels=True) for i in range(n)]


@pytest.mark.parametrize("arch", ARCHS)
def test_a_replayed_encoder_output_gives_the_full_models_loss(arch):
    for head in ("classification", "mlm"):
        model = tiny_model(arch, head=head)
        batch = tiny_batch(model, batch=3, seq=8, labels=True)
        encoder = model.base_model
        with torch.no_grad():
            full = model(**batch).loss
            out = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            given = (BaseModelOutputWithPooling(last_hidden_state=out[0], pooler_output=out.pooler_output)
                     if getattr(out, "pooler_output", None) is not None else BaseModelOutput(last_hidden_state=out[0]))
            with replaying_encoder(model) as stand_in:
                assert model.base_model is stand_in and "forward" not in encoder.__dict__
                stand_in.output = given
                replayed = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        assert model.base_model is encoder  # put back
        torch.testing.assert_close(replayed, full, rtol=1e-5, atol=1e-6)


def test_replaying_needs_an_encoder_below_a_head():
    model = tiny_model("bert", head="base")  # the encoder itself: nothing to stand in for
    with pytest.raises(HeadcountError, match="no encoder"):
        with replaying_encoder(model):
            pass


@pytest.mark.parametrize("arch", ARCHS)
def test_fit_task_head_trains_the_head_only_and_restores_requires_grad(arch):
    model = tiny_model(arch, head="classification")
    encoder = model.base_model
    prefix = model.base_model_prefix + "."
    for n, p in encoder.named_parameters():  # the caller froze the embeddings ...
        if "embeddings" in n:
            p.requires_grad_(False)
    head = [p for n, p in model.named_parameters() if not n.startswith(prefix)]
    head[-1].requires_grad_(False)  # ... and one head parameter: trained now, frozen again after
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    assert not all(flags.values()) and any(flags.values())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen = []

    def progress(line):  # runs inside the fit: no module's forward may be reassigned meanwhile
        seen.append(("forward" in encoder.__dict__, "forward" in model.__dict__, model.base_model is encoder))

    r = fit_task_head(model, _batches(model), lr=1e-2, epochs=2, weight_decay=0.0, seed=0, progress=progress)
    assert r["steps"] == 6 and r["trainable_params"] == sum(p.numel() for p in head)
    assert seen == [(False, False, False)] * 2  # the stand-in, not a patched encoder, during the fit
    assert model.base_model is encoder and not model.training
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags  # each its own, not all True
    for n, p in model.named_parameters():
        if n.startswith(prefix):
            assert torch.equal(p, before[n]), n  # the encoder did not move
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if not n.startswith(prefix))


def test_fit_task_head_restores_flags_when_it_fails():
    model = tiny_model("bert", head="classification")
    model.base_model.embeddings.word_embeddings.weight.requires_grad_(False)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    bad = _batches(model, 1)
    bad[0]["labels"] = bad[0]["labels"][:1]  # a label count that does not match the batch

    with pytest.raises(Exception):
        fit_task_head(model, bad, lr=1e-2, epochs=1, weight_decay=0.0)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert model.base_model.__class__.__name__ != "_Replay" and "forward" not in model.base_model.__dict__


def test_fit_mlm_head_replays_without_patching_and_leaves_the_encoder(tmp_path, monkeypatch):
    import headcount.data.mlm_head as heads

    ckpt = make_checkpoint(tmp_path / "pre", seed=0)
    calls = []
    evaluate = heads._evaluate

    def spy(model, stand_in, *args, **kwargs):
        encoder = stand_in._encoder
        calls.append(("forward" in encoder.__dict__, model.base_model is stand_in))
        return evaluate(model, stand_in, *args, **kwargs)

    monkeypatch.setattr(heads, "_evaluate", spy)
    texts = [s for s, _ in sentences(120, seed=1)]
    model, report = fit_mlm_head(str(ckpt), texts, steps=30, lr=1e-2, max_texts=120, max_length=24,
                                 cache_dir=tmp_path / "heads", device="cpu")
    assert report["fitted"] and report["steps"] == 30 and report["n_masked_eval"] > 0
    assert calls == [(False, True)] * 2  # before and after fitting, through the stand-in
    assert "forward" not in model.base_model.__dict__ and type(model.base_model).__name__ == "BertModel"
    assert all(p.requires_grad for p in model.parameters())  # as loaded
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def _untied_mlm_checkpoint(path, tie: bool):
    """A tiny masked-LM checkpoint whose config unties the decoder (``tie=False``) and whose stored
    decoder differs from the input embeddings."""
    import transformers

    make_checkpoint(path, seed=0)  # tokenizer and encoder config
    config = transformers.BertConfig.from_pretrained(path, tie_word_embeddings=tie)
    torch.manual_seed(1)
    model = transformers.BertForMaskedLM(config)
    if not tie:
        with torch.no_grad():
            model.cls.predictions.decoder.weight.normal_(0, 0.5)  # its own decoder
        assert not torch.equal(model.get_output_embeddings().weight, model.get_input_embeddings().weight)
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("force", [False, True])
def test_fit_mlm_head_keeps_a_checkpoints_untied_decoder(tmp_path, force):
    saved = _untied_mlm_checkpoint(tmp_path / "untied", tie=False)
    decoder = saved.cls.predictions.decoder.weight.detach().clone()
    texts = [s for s, _ in sentences(80, seed=1)]
    model, report = fit_mlm_head(str(tmp_path / "untied"), texts, steps=5, lr=1e-2, max_texts=80, max_length=24,
                                 cache_dir=tmp_path / "heads", device="cpu", force=force)
    out, emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert out is not emb and not torch.allclose(out, emb)  # not tied to the embeddings
    assert report["decoder"] == "checkpoint" and report["fitted"] is force
    if not force:  # the checkpoint's head, as stored
        assert torch.equal(out.detach(), decoder)
    else:  # fitted: the decoder is one of the head's own parameters, trained from the stored one
        assert not torch.equal(out.detach(), decoder) and torch.allclose(out.detach(), decoder, atol=0.2)


def test_fit_mlm_head_ties_when_the_config_ties_or_no_decoder_is_stored(tmp_path):
    texts = [s for s, _ in sentences(80, seed=1)]
    fit = dict(steps=3, lr=1e-2, max_texts=80, max_length=24, device="cpu")
    _untied_mlm_checkpoint(tmp_path / "tied", tie=True)
    model, report = fit_mlm_head(str(tmp_path / "tied"), texts, cache_dir=tmp_path / "h1", **fit)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert report["decoder"] == "tied" and not report["fitted"]
    # untied in the config, but only an encoder stored: the random decoder is replaced by the embeddings
    ckpt = make_checkpoint(tmp_path / "encoder", seed=0, tie_word_embeddings=False)
    model, report = fit_mlm_head(str(ckpt), texts, cache_dir=tmp_path / "h2", **fit)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert report["decoder"] == "tied" and report["fitted"]
