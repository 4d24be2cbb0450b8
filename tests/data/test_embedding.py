"""The embedding (contrastive) objective: SimCSE loss, pooling, seeded dropout views, scores, CLI."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
from cli_helpers import run_cli
from conftest import tiny_batch, tiny_model
from training_helpers import make_checkpoint, make_task, one_thread

from headcount.data.embedding import (
    Contrastive,
    contrastive,
    embed,
    embedding_metrics,
    pair_loss,
    pool,
    pooling_of,
    simcse_loss,
    similarity_agreement,
    two_views,
    view_metrics,
)
from headcount.importance.scoring import score


@pytest.fixture(scope="module", autouse=True)
def _one_thread(tmp_path_factory):
    yield from one_thread(tmp_path_factory)


def _reference_loss(za, zb, rows, t=0.05):
    """Cosine similarity by hand / t, cross-entropy with the own partner as the target, mean over ``rows``."""
    total = 0.0
    for i in rows:
        logits = []
        for j in range(len(zb)):
            a, b = za[i].detach().double(), zb[j].detach().double()
            logits.append(float(a @ b / (a.norm() * b.norm())) / t)
        total += -(logits[i] - math.log(sum(math.exp(x) for x in logits)))
    return total / len(rows)


def test_simcse_loss_equals_reference():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    assert float(simcse_loss(z1, z2)) == pytest.approx(_reference_loss(z1, z2, range(5)), rel=1e-5)
    assert float(simcse_loss(z1, z2, temperature=1.0)) == pytest.approx(_reference_loss(z1, z2, range(5), 1.0), rel=1e-5)


def test_pair_loss_uses_positive_pairs_only():
    g = torch.Generator().manual_seed(1)
    za, zb = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    positive = torch.tensor([True, False, True, False])
    assert float(pair_loss(za, zb, positive)) == pytest.approx(_reference_loss(za, zb, [0, 2]), rel=1e-5)
    assert float(pair_loss(za, zb, torch.zeros(4, dtype=torch.bool))) == 0.0


def _pooling_dir(path, mode):
    (path / "1_Pooling").mkdir(parents=True)
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": mode == "max"}))
    return path


@pytest.mark.parametrize("mode", ["mean", "cls", "max"])
def test_pooling_follows_the_sentence_transformers_config(tmp_path, mode):
    assert pooling_of(_pooling_dir(tmp_path / mode, mode)) == mode
    assert pooling_of(tmp_path / "none") == "mean"  # no config: mean


def test_pool_modes_exclude_padding():
    h = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]]])  # [1, 3, 2]; the last token is padding
    m = torch.tensor([[1, 1, 0]])
    assert pool(h, m, "mean").tolist() == [[2.0, 2.0]]
    assert pool(h, m, "cls").tolist() == [[1.0, 0.0]]
    assert pool(h, m, "max").tolist() == [[3.0, 4.0]]


def _dropout_model():
    return tiny_model("bert", head="base", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def test_two_views_differ_under_dropout_and_repeat_for_a_seed():
    model = _dropout_model()
    batch = tiny_batch(model, batch=3)
    state = torch.get_rng_state()
    z1, z2 = two_views(model, batch, Contrastive(seed=0))
    assert not torch.allclose(z1, z2)  # dropout made two views
    y1, y2 = two_views(model, batch, Contrastive(seed=0))
    assert torch.equal(z1, y1) and torch.equal(z2, y2)  # the same seed, the same views
    w1, _ = two_views(model, batch, Contrastive(seed=1))
    assert not torch.allclose(z1, w1)
    assert torch.equal(torch.get_rng_state(), state)  # the global random state is untouched
    assert not model.training and not any(m.training for m in model.modules())  # eval mode restored
    with torch.no_grad():  # outside the views: eval mode, no dropout
        a = pool(model(**batch)[0], batch["attention_mask"])
        b = pool(model(**batch)[0], batch["attention_mask"])
    assert torch.equal(a, b)


def _batches(model, n=3):
    out = []
    for i in range(n):
        b = tiny_batch(model, batch=4, seed=i)
        b["labels"] = torch.ones(4, dtype=torch.long)
        out.append(b)
    return out


def test_scores_are_deterministic_for_a_seed():
    model = _dropout_model()
    batches = _batches(model)
    a = score(model, batches, contrastive=Contrastive(seed=0))
    b = score(model, batches, contrastive=Contrastive(seed=0))
    c = score(model, batches, contrastive=Contrastive(seed=5))
    assert torch.equal(a.heads, b.heads) and torch.equal(a.mlps, b.mlps)
    assert not torch.allclose(a.heads, c.heads)
    assert a.heads.shape == (3, 4) and bool((a.heads > 0).all())
    assert a.meta["contrastive"] == "unsupervised" and a.meta["tokens_per_batch"] == 0


def test_gradient_token_rows_sum_to_the_scores():
    model = _dropout_model()
    s = score(model, _batches(model, 2), method="gradient-token", keep_per_example=True,
              contrastive=Contrastive(seed=0))
    assert s.per_example.shape == (8, 3, 4)
    torch.testing.assert_close(s.per_example.sum(0), s.heads, rtol=1e-4, atol=1e-6)


def test_contrastive_forward_is_simcse_on_pooled_views():
    model = _dropout_model()
    batch = tiny_batch(model, batch=3)
    spec = Contrastive(seed=3, pooling="cls")
    z1, z2 = two_views(model, batch, spec)
    with contrastive(model, spec), torch.no_grad():
        out = model(**batch, labels=torch.ones(3, dtype=torch.long))
    assert float(out.loss) == pytest.approx(_reference_loss(z1, z2, range(3)), rel=1e-4)
    assert out.logits.shape == (3, 2)
    assert model.forward.__func__ is type(model).forward  # the patch is gone


def test_supervised_uses_the_pairs_as_positives():
    model = tiny_model("bert", head="classification")  # a head is ignored: the encoder's pooled states
    a, b = tiny_batch(model, batch=3, seed=1), tiny_batch(model, batch=3, seed=2)
    positive = torch.tensor([True, True, False])
    batch = {**a, **{f"{k}_b": v for k, v in b.items()}, "labels": torch.tensor([1, 1, 0]), "positive": positive}
    with contrastive(model, Contrastive(supervised=True)), torch.no_grad():
        out = model(**batch)
    with torch.no_grad():
        za = pool(model.base_model(**a)[0], a["attention_mask"])
        zb = pool(model.base_model(**b)[0], b["attention_mask"])
    assert float(out.loss) == pytest.approx(_reference_loss(za, zb, [0, 1]), rel=1e-4)
    torch.testing.assert_close(out.logits[:, 0], torch.nn.functional.cosine_similarity(za, zb, dim=-1))


def test_label_free_metric_is_perfect_on_identical_views():
    z = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    m = view_metrics(z, z)
    assert m["retrieval_accuracy"] == 1.0 and m["alignment"] == pytest.approx(0.0, abs=1e-6)
    shuffled = view_metrics(z, z[torch.tensor([1, 0, 2, 3, 4, 5])])
    assert shuffled["retrieval_accuracy"] == pytest.approx(4 / 6) and shuffled["alignment"] > 0
    model = _dropout_model()
    e = embedding_metrics(model, _batches(model, 2), Contrastive(seed=0))
    assert 0 <= e["retrieval_accuracy"] <= 1 and e["alignment"] > 0 and e["uniformity"] < 0


def test_similarity_agreement_is_perfect_for_the_same_model_and_falls_with_gates_off():
    from headcount.core.masks import Mask

    model = _dropout_model()
    batches = _batches(model, 2)
    ref = embed(model, batches)
    assert ref.shape == (8, 32) and torch.allclose(ref.norm(dim=-1), torch.ones(8))
    same = similarity_agreement(embed(model, batches), ref)
    assert same["score"] == 1.0 and same["loss"] == pytest.approx(0.0, abs=1e-6)
    heads = torch.ones(3, 4)
    heads[:, :3] = 0
    off = similarity_agreement(embed(model, batches, mask=Mask(heads=heads, mlps=torch.ones(3))), ref)
    assert off["score"] < 1 and off["loss"] > 0
    z = torch.nn.functional.normalize(torch.randn(6, 32, generator=torch.Generator().manual_seed(0)), dim=-1)
    from scipy.stats import spearmanr

    i, j = torch.triu_indices(6, 6, 1)
    expected = spearmanr((z @ z.T)[i, j].numpy(), (ref[:6] @ ref[:6].T)[i, j].numpy())[0]
    assert similarity_agreement(z, ref[:6])["score"] == pytest.approx(expected)


# ---------------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedding")
    ckpt = make_checkpoint(root / "enc", head="base")
    _pooling_dir(ckpt, "cls")
    task = make_task(root / "task", n_train=64, n_dev=32)
    pairs = root / "pairs"
    pairs.mkdir()
    rows = ["a,b,score"] + [f"the movie {w},a film {w},{i % 5}" for i, w in
                            enumerate(["was good", "is long", "was slow", "is new", "was dark", "is old"] * 4)]
    for name in ("train.csv", "dev.csv"):
        (pairs / name).write_text("\n".join(rows) + "\n")
    (pairs / "task.yaml").write_text("name: tiny-sts\nkind: regression\nfiles: {train: train.csv, validation: dev.csv}\n"
                                     "text: [a, b]\nlabel: score\nmetric: pearson_spearman\n")
    return ckpt, task, pairs / "task.yaml"


def run(args, capsys):
    return run_cli(capsys, *args)


def test_cli_score_embedding(setup, tmp_path, capsys):
    ckpt, task, _ = setup
    args = ["score", "--model", str(ckpt), "--task", str(task), "--objective", "embedding", "--max-examples", "32",
            "--batch-size", "8", "--out", str(tmp_path)]
    code, out, err = run(args, capsys)
    assert code == 0, err
    s = json.loads((tmp_path / "scores.json").read_text())
    assert s["objective"] == "embedding" and s["pooling"] == "cls" and s["head"] == "pooling"
    assert s["n_examples"] == 32 and any(v > 0 for row in s["heads"] for v in row)


def test_cli_score_embedding_supervised(setup, tmp_path, capsys):
    ckpt, _, pairs = setup
    code, out, err = run(["score", "--model", str(ckpt), "--task", str(pairs), "--objective", "embedding-supervised",
                          "--batch-size", "8", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    s = json.loads((tmp_path / "scores.json").read_text())
    assert s["contrastive"] == "supervised" and s["n_examples"] == 24


def test_example_ids_follow_the_embedding_batches_rows(setup):
    from transformers import AutoTokenizer

    from headcount.data.tasks import get_task, tokenize
    from headcount.importance.pipeline import DataConfig, batches_for, example_order

    ckpt, task, pairs = setup
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    data = DataConfig(max_examples=20, batch_size=8, max_length=32, seed=3)
    for spec, objective in ((task, "embedding"), (pairs, "embedding-supervised")):
        t = get_task(str(spec))
        full = t.load(t.train_split)
        _, index = example_order(t, tok, objective, data)
        batches = batches_for(t, tok, objective, data)
        rows = [r[m.bool()].tolist() for b in batches for r, m in zip(b["input_ids"], b["attention_mask"])]
        first = [(" ".join(full.texts[i]),) if objective == "embedding" else (full.texts[i][0],) for i in index]
        enc = tokenize(first, tok, max_length=32)
        assert rows == [enc.ids[enc.offsets[k]:enc.offsets[k + 1]].tolist() for k in range(len(index))]
        if objective == "embedding-supervised":  # the second texts and labels of the same examples
            second = [r[m.bool()].tolist() for b in batches for r, m in zip(b["input_ids_b"], b["attention_mask_b"])]
            enc_b = tokenize([(full.texts[i][1],) for i in index], tok, max_length=32)
            assert second == [enc_b.ids[enc_b.offsets[k]:enc_b.offsets[k + 1]].tolist() for k in range(len(index))]
            labels = torch.cat([b["labels"] for b in batches]).numpy()
            assert labels.tolist() == pytest.approx(full.labels[index].tolist())
            positive = torch.cat([b["positive"] for b in batches])
            assert positive.tolist() == (labels >= 0.8 * full.labels[index].max()).tolist()


def test_supervised_gradient_token_and_ablation_run_on_pairs(setup):

    from headcount.data.tasks import get_task
    from headcount.importance.pipeline import DataConfig, batches_for, load_for

    ckpt, _, pairs = setup
    t = get_task(str(pairs))
    model, tok, info = load_for(str(ckpt), t, "embedding-supervised", seed=0, device="cpu")
    assert info["contrastive"].supervised and info["pooling"] == "cls"
    batches = batches_for(t, tok, "embedding-supervised", DataConfig(max_examples=16, batch_size=8))
    s = score(model, batches, method="gradient-token", keep_per_example=True, contrastive=info["contrastive"])
    torch.testing.assert_close(s.per_example.sum(0), s.heads, rtol=1e-4, atol=1e-6)
    a = score(model, batches, method="ablation", contrastive=info["contrastive"])
    assert torch.isfinite(a.heads).all() and "rank_agreement_with_gradient" in a.meta


def test_cli_prune_embedding_supervised(setup, tmp_path, capsys):
    ckpt, _, pairs = setup
    code, out, err = run(["prune", "--model", str(ckpt), "--task", str(pairs), "--objective", "embedding-supervised",
                          "--step", "0.5", "--step-of", "total", "--threshold", "0.5", "--batch-size", "8",
                          "--out", str(tmp_path)], capsys)
    assert code == 0, err
    mask = json.loads((tmp_path / "mask.json").read_text())
    rows = list(csv.DictReader((tmp_path / "trace.csv").open()))
    assert mask["metric_name"] == "cosine_pearson_spearman" and -1 <= float(rows[0]["metric"]) <= 1


def test_cli_prune_embedding(setup, tmp_path, capsys):
    ckpt, task, _ = setup
    code, out, err = run(["prune", "--model", str(ckpt), "--task", str(task), "--objective", "embedding",
                          "--step", "0.5", "--step-of", "total", "--max-examples", "16", "--max-eval-examples", "16",
                          "--batch-size", "8", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    mask = json.loads((tmp_path / "mask.json").read_text())
    rows = list(csv.DictReader((tmp_path / "trace.csv").open()))
    assert rows[0]["phase"] == "full" and float(rows[0]["metric"]) == pytest.approx(1.0)  # the unpruned model itself
    assert float(rows[0]["loss"]) == pytest.approx(0.0, abs=1e-6)
    assert any(float(r["metric"]) < 1 for r in rows[1:])  # removing heads changes the similarity structure
    assert mask["metric_name"] == "similarity_spearman" and "similarity_spearman" in out


def test_cli_supervised_on_a_single_text_task_is_refused(setup, tmp_path, capsys):
    ckpt, task, _ = setup
    base = ["score", "--model", str(ckpt), "--task", str(task), "--max-examples", "8", "--out", str(tmp_path)]
    code, out, err = run(base + ["--objective", "embedding"], capsys)
    assert code == 0, err
    earlier = (tmp_path / "scores.json").read_bytes()
    code, out, err = run(base + ["--objective", "embedding-supervised", "--force"], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "pairs" in lines[0]
    assert "Traceback" not in err and (tmp_path / "scores.json").read_bytes() == earlier


# ---------------------------------------------------------------------------------- the transfer study
def _plan(**kw):
    from headcount.experiments.runner import Plan
    from headcount.experiments.studies import transfer as T

    settings = T.TransferSettings(tasks=["offline/movies", "offline/tweets"], seeds=[1, 2], **kw)
    return {j.name: j for j in Plan(T.transfer_jobs(settings)).jobs}


def test_transfer_plan_adds_embedding_jobs_only_when_asked():
    plain, explicit, both = _plan(), _plan(objectives=["mlm"]), _plan(objectives=["mlm", "embedding"])
    assert {n: j.key for n, j in plain.items()} == {n: j.key for n, j in explicit.items()}
    assert not any("embedding" in n or "embedding" in str(j.params) for n, j in plain.items())
    # the jobs that do not read an embedding grid keep their keys (the task curves and coherence gain inputs)
    changed = {n for n in plain if plain[n].key != both[n].key}
    assert changed == {"coherence", *(f"curve/{t}/seed{s}" for t in ("movies", "tweets") for s in (1, 2))}
    emb = both["embedding-scores/movies"]
    assert emb.params["objective"] == "embedding" and emb.params["method"] == both["mlm-scores/movies"].params["method"]
    assert emb.params["data"] == both["mlm-scores/movies"].params["data"]  # the same texts: pairs by example id
    pairs = {p["name"]: p for p in both["coherence"].params["pairs"]}
    assert pairs["embedding-vs-task/movies/1"]["paired"] and pairs["mlm-vs-embedding/tweets"]["paired"]
    assert both["curve/movies/seed1"].params["orders"]["embedding"] == {"pre-trained": "embedding"}
    curve = both["curve/tweets/embedding"]
    assert curve.params["objective"] == "embedding" and set(curve.params["orders"]) == {"mlm", "embedding", "task"}
    assert "curve/tweets/embedding" not in plain


def test_transfer_objectives_must_include_mlm():
    from pydantic import ValidationError

    from headcount.experiments.studies import transfer as T

    with pytest.raises(ValidationError, match="objectives must include mlm"):
        T.TransferSettings(tasks=["offline/movies"], objectives=["embedding"])
    with pytest.raises(ValidationError):
        T.TransferSettings(tasks=["offline/movies"], objectives=["mlm", "sts"])


STUDY = """\
study: transfer
name: tiny transfer with the embedding objective
model: {model}
tasks: [{{id: good, task: good/task.yaml}}]
seeds: [1]
objectives: [mlm, embedding]
train: {{lr: 0.005, batch_size: 16, epochs: 2, max_length: 32, eval_batch_size: 64, save_steps: 1000}}
head_fit: {{lr: 0.01, epochs: 1}}
mlm: {{head_steps: 10, head_max_texts: 64, eval: {{max_examples: 32, batch_size: 32, max_length: 32}}}}
scoring: {{data: {{max_examples: 32, batch_size: 16, max_length: 32}}}}
pruning: {{levels: [0.5], random_draws: 1}}
before_after: {{enabled: false}}
stats: {{n_boot: 20, n_permutations: 19}}
"""


def test_transfer_study_reports_mlm_embedding_and_task_side_by_side(tmp_path):
    import pandas as pd

    from headcount.experiments import run_study

    model = make_checkpoint(tmp_path / "pre", seed=0, hidden_dropout_prob=0.1)
    make_task(tmp_path / "good", n_train=64, n_dev=32)
    (tmp_path / "study.yaml").write_text(STUDY.format(model=model))
    summary = run_study(tmp_path / "study.yaml", tmp_path / "run", quiet=True)
    assert not summary.failed
    coh = pd.read_csv(tmp_path / "run" / "results" / "coherence.csv")
    assert {"mlm-vs-task", "embedding-vs-task", "embedding-vs-task-before", "mlm-vs-embedding"} <= set(coh["comparison"])
    pairing = coh.groupby("comparison")["pairing"].agg(set)
    assert pairing["embedding-vs-task"] == pairing["mlm-vs-embedding"] == {"ids"}
    curves = pd.read_csv(tmp_path / "run" / "results" / "curves.csv")
    assert "embedding" in set(curves[curves["objective"] == "task"]["order"])
    emb = curves[curves["objective"] == "embedding"]
    assert set(emb["order"]) == {"mlm", "embedding", "task", "random"} and set(emb["metric"]) == {"similarity_spearman"}
    assert (emb[emb["fraction"] == 0]["score"] == 1.0).all() and (emb[emb["fraction"] > 0]["score"] < 1).all()
    html = summary.report.read_text()
    assert "embedding (pre-trained) vs task (fine-tuned)" in html and "MLM vs embedding" in html
    assert "and the embedding (SimCSE) objective" in html  # the heatmaps show its grid beside MLM's
    scores = pd.read_csv(tmp_path / "run" / "results" / "head_scores.csv")
    assert {"mlm-pre-trained", "embedding-pre-trained", "task-fine-tuned"} <= set(scores["kind"])
