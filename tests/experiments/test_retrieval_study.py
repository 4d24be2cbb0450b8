"""``study: retrieval`` end to end on a tiny random Llama (4 query heads on 2 KV heads, 3 layers)
and a tiny needle-in-a-haystack task (``niah_helpers``), run once for the module; its CSVs and
files checked against recomputations written here: a run's scores against the scorer called
directly, the pooled grids against the per-example rows, every stability row against sets and
statistics computed from the runs' grids (the chance level by enumeration), the budgets against
the memory arithmetic, the curve's bytes against the cache's shape and its full-cache loss against
the model's own attention; the config's refusals; the report and the explorer page.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from niah_helpers import SENTENCES, save_niah_checkpoint
from pydantic import ValidationError
from training_helpers import one_thread

from headcount.experiments import run_study
from headcount.experiments.runner import RunStore

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

STUDY = """study: retrieval
name: tiny retrieval
model: ckpt
niah: {lengths: [60], depths: [0, 0.5, 1], examples: 3, haystack: haystack.txt}
templates: [passkey, book]
seeds: [1, 2]
held_out: {seed: 9, examples: 3}
scoring: {max_new_tokens: 6, n_boot: 20, sink: 2, window: 8}
stability: {fractions: [0.25]}
ablation: {fraction: 0.25, draws: 2, max_new_tokens: 6}
budgets: {memory: [0.5], context: 96, sink: 4, window: 16, lm_texts: 1, max_new_tokens: 6}
"""
L, H, K = 3, 4, 2  # the tiny Llama: layers, query heads, KV heads


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrieval-study")
    save_niah_checkpoint(root / "ckpt")
    (root / "haystack.txt").write_text("\n".join(SENTENCES) + "\n")
    (root / "study.yaml").write_text(STUDY)
    run_study(root / "study.yaml", root / "run", quiet=True)
    return RunStore(root / "run"), root


def _job(store, name):
    return store.result(name)


def _grid(values):
    return np.asarray([[np.nan if v is None else v for v in row] for row in values], dtype=float)


def test_the_plan_has_every_part(run):
    store, _ = run
    names = {j["name"] for j in store.plan["jobs"]}
    scores = {f"scores/{m}/{t}/seed{s}" for m in ("retrieval", "long-range") for t in ("passkey", "book") for s in (1, 2)}
    budgets = {"full", "0.5/scores", "0.5/uniform", "0.5/random0"}
    assert names == scores | {"pooled/retrieval", "pooled/long-range", "stability", "ablation/heads",
                              "ablation/kv-groups"} | {f"budget/{b}" for b in budgets} | {f"curve/{b}" for b in budgets}
    assert store.missing() == []


def test_a_run_is_the_scorer_called_on_its_examples(run):
    from headcount.core.models import load_model, load_tokenizer
    from headcount.data.tasks.niah import NiahSpec, niah_batches, niah_task
    from headcount.importance.retrieval import retrieval_scores

    store, root = run
    r = _job(store, "scores/retrieval/book/seed2")
    spec = NiahSpec(template="book", lengths=(60,), depths=(0.0, 0.5, 1.0), examples=3, seed=2,
                    haystack=str(root / "haystack.txt"))
    model, tok = load_model(str(root / "ckpt"), head="lm").eval(), load_tokenizer(str(root / "ckpt"))
    want = retrieval_scores(model, niah_batches(niah_task("x", spec), tok, split="train", batch_size=1), max_new_tokens=6)
    got = r.load_json("scores.json")
    np.testing.assert_allclose(_grid(got["heads"]), want.heads.numpy(), atol=1e-6)
    assert [e["response"] for e in got["retrieval"]["examples"]] == [e["response"] for e in want.meta["retrieval"]["examples"]]
    share = got["retrieval"]["share_above_threshold"]["estimate"]
    if want.meta["retrieval"]["n_counted"]:
        assert share == pytest.approx(float((want.heads > 0.1).double().mean()))
    else:  # no example counts: no share (the interval's rule), not 0
        assert share is None or math.isnan(share)
    runs = pd.read_csv(store.root / "results" / "runs.csv")
    row = runs[(runs["method"] == "retrieval") & (runs["template"] == "book") & (runs["seed"] == 2)].iloc[0]
    assert row["needle_accuracy"] == pytest.approx(want.meta["retrieval"]["needle_accuracy"])
    assert got["layout"] == {"n_layers": L, "n_heads": H, "n_kv_heads": K, "head_dim": got["layout"]["head_dim"]}


def test_the_pooled_grids_are_every_example_at_once(run):
    from headcount.experiments.studies.jobs import load_per_example

    store, _ = run
    runs = [f"{t}/seed{s}" for t in ("passkey", "book") for s in (1, 2)]
    # retrieval: the sum of every example's copies over the examples that count, over all runs
    rows, counted = [], []
    for name in runs:
        r = _job(store, f"scores/retrieval/{name}")
        rows.append(load_per_example(r.dir / "per_example.safetensors")[0])
        counted += [e["counted"] for e in r.load_json("scores.json")["retrieval"]["examples"]]
    rows, counted = np.concatenate(rows), np.asarray(counted)
    want = rows[counted].mean(0) if counted.any() else np.zeros((L, H))
    pooled = _job(store, "pooled/retrieval").load_json("scores.json")
    np.testing.assert_allclose(_grid(pooled["heads"]), want, atol=1e-6)
    assert pooled["n_examples"] == len(counted) == 12
    np.testing.assert_allclose(_grid(pooled["kv_groups"]), want.reshape(L, K, H // K).max(-1), atol=1e-6)
    # long-range: each run's mass weighted by its query positions; per KV head the max over the group
    docs = [_job(store, f"scores/long-range/{name}").load_json("scores.json") for name in runs]
    w = np.asarray([d["n_queries"] for d in docs], dtype=float)
    want = sum(wi * _grid(d["heads"]) for wi, d in zip(w, docs)) / w.sum()
    pooled = _job(store, "pooled/long-range").load_json("scores.json")
    np.testing.assert_allclose(_grid(pooled["heads"]), want, rtol=1e-5)
    np.testing.assert_allclose(_grid(pooled["kv_groups"]), want.reshape(L, K, H // K).max(-1), rtol=1e-5)


def _chance(ka: int, kb: int, n: int) -> float:
    """E[Jaccard] of two uniform random subsets of sizes ka, kb of n, by enumerating the second set."""
    if ka + kb == 0:
        return math.nan
    a = set(range(ka))
    total = [len(a & set(b)) / len(a | set(b)) for b in itertools.combinations(range(n), kb)]
    return float(np.mean(total))


def _top(grid, fraction):
    """The top ``fraction`` of finite units (ties to the earlier position), kept only where above 0."""
    flat = grid.ravel()
    finite = np.flatnonzero(np.isfinite(flat))
    k = max(1, round(fraction * finite.size))
    order = sorted(finite, key=lambda i: (-flat[i], i))[:k]
    out = np.zeros(flat.size, dtype=bool)
    out[order] = True
    return (out & (np.nan_to_num(flat) > 0)).reshape(grid.shape)


def _order(kv, ties=None):
    """Units from the first to the last: higher score first, then higher ``ties``, then position."""
    flat = np.nan_to_num(kv.ravel(), nan=-np.inf)
    t = np.zeros(flat.size) if ties is None else np.nan_to_num(ties.ravel(), nan=-np.inf)
    return sorted(range(flat.size), key=lambda i: (-flat[i], -t[i], i))


def _ranks(kv, ties=None):
    """That order as a grid: n for the first unit, 1 for the last."""
    out = np.empty(kv.size)
    out[_order(kv, ties)] = np.arange(kv.size, 0, -1)
    return out.reshape(kv.shape)


def _full(kv, memory, context, sink, window, ties=None):
    """The budget's full KV heads: the first in that order, as many as the memory arithmetic allows."""
    n = kv.size
    stream = min(context, sink + window)
    k = max(0, min(n, math.floor((memory * n * context - n * stream) / (context - stream) + 1e-9)))
    out = np.zeros(n, dtype=bool)
    out[_order(kv, ties)[:k]] = True
    return out.reshape(kv.shape)


def test_every_stability_row_is_recomputed_from_the_runs_grids(run):
    from scipy.stats import spearmanr

    store, _ = run
    rows = pd.read_csv(store.root / "results" / "stability.csv")
    grids = {}
    for m in ("retrieval", "long-range"):
        for t in ("passkey", "book"):
            for s in (1, 2):
                d = _job(store, f"scores/{m}/{t}/seed{s}").load_json("scores.json")
                heads = _grid(d["heads"])
                kv = _grid(d["kv_groups"]) if "kv_groups" in d else heads.reshape(L, K, H // K).max(-1)
                grids[m, t, s] = {"query heads": heads, "KV heads": kv}
    # 2 scorers x (2 seed pairs... 1 per template x 2 templates + 1 template pair per seed x 2 seeds) + 4 scorer pairs,
    # each with 3 head sets (top 25% query heads, top 25% KV heads, full KV heads at 0.5)
    assert len(rows) == (2 * (2 + 2) + 4) * 3
    assert set(rows["comparison"]) == {"seeds", "templates", "scorers"}
    for _, r in rows.iterrows():
        if r["comparison"] == "scorers":
            a, b = ("retrieval", r["template_a"], r["seed_a"]), ("long-range", r["template_b"], r["seed_b"])
            if r["scorer"].split(" vs ")[0] == "long-range":
                a = ("long-range", a[1], a[2]); b = ("retrieval", b[1], b[2])
        else:
            a, b = (r["scorer"], r["template_a"], r["seed_a"]), (r["scorer"], r["template_b"], r["seed_b"])
        ga, gb = grids[a][r["unit"]], grids[b][r["unit"]]
        if r["head_set"].startswith("full KV heads"):  # a retrieval ranking's ties: the same run's long-range mass
            ties = [grids["long-range", run[1], run[2]]["KV heads"] if run[0] == "retrieval" else None for run in (a, b)]
            sa, sb = (_full(g, 0.5, 96, 4, 16, t) for g, t in zip((ga, gb), ties))
            ga, gb = (_ranks(g, t) if t is not None else g for g, t in zip((ga, gb), ties))
        else:
            sa, sb = _top(ga, 0.25), _top(gb, 0.25)
        union = (sa | sb).sum()
        jac = (sa & sb).sum() / union if union else math.nan
        assert (r["k_a"], r["k_b"], r["n"]) == (sa.sum(), sb.sum(), ga.size), r.to_dict()
        assert (math.isnan(jac) and pd.isna(r["jaccard"])) or r["jaccard"] == pytest.approx(jac), r.to_dict()
        chance = _chance(int(sa.sum()), int(sb.sum()), ga.size)
        assert (math.isnan(chance) and pd.isna(r["chance"])) or r["chance"] == pytest.approx(chance), r.to_dict()
        if np.ptp(ga) > 0 and np.ptp(gb) > 0:
            assert r["spearman"] == pytest.approx(spearmanr(ga.ravel(), gb.ravel())[0]), r.to_dict()
        else:
            assert pd.isna(r["spearman"])


def test_the_budgets_follow_the_pooled_ranking_and_the_memory_arithmetic(run):
    from headcount.kv.budget import KVBudget

    store, _ = run
    long_range = _grid(_job(store, "pooled/long-range").load_json("scores.json")["kv_groups"])
    retrieval = _grid(_job(store, "pooled/retrieval").load_json("scores.json")["kv_groups"])
    scores = KVBudget.load(_job(store, "budget/0.5/scores").path("budget.json"))  # ranking: retrieval, ties long-range
    assert np.array_equal(np.asarray(scores.full), _full(retrieval, 0.5, 96, 4, 16, ties=long_range))
    assert scores.meta["made_from"]["ranked_scores"] == retrieval.tolist()
    rand = KVBudget.load(_job(store, "budget/0.5/random0").path("budget.json"))
    assert rand.n_full == scores.n_full == 2  # floor((0.5 * 6 * 96 - 6 * 20) / (96 - 20))
    uniform = KVBudget.load(_job(store, "budget/0.5/uniform").path("budget.json"))
    assert uniform.n_full == 0 and {w for row in uniform.window for w in row} == {48 - 4}
    assert KVBudget.load(_job(store, "budget/full").path("budget.json")).n_full == L * K


def test_the_curve_measures_bytes_accuracy_and_loss(run):
    from headcount.core.models import load_model

    store, root = run
    curve = pd.read_csv(store.root / "results" / "curve.csv").set_index("budget")
    head_dim = _job(store, "pooled/long-range").load_json("scores.json")["layout"]["head_dim"]
    full = 2 * L * K * 96 * head_dim * 4  # K and V, every KV head, 96 tokens, float32
    assert curve.loc["full", "kv_bytes"] == full and curve.loc["full", "kv_ratio"] == 1.0
    slots = {"0.5/scores": 2 * 96 + 4 * 20, "0.5/random0": 2 * 96 + 4 * 20, "0.5/uniform": 6 * 48}
    for name, n in slots.items():
        assert curve.loc[name, "kv_bytes"] == curve.loc[name, "kv_bytes_predicted"] == 2 * n * head_dim * 4, name
        assert curve.loc[name, "kv_bytes"] <= full / 2
    for name in curve.index:
        d = _job(store, f"curve/{name}").result
        assert curve.loc[name, "needle_accuracy"] == pytest.approx(np.mean([a["exact"] for a in d["answers"]]))
        assert d["successes"] == [int(a["answer"] in a["response"]) for a in d["answers"]]
        assert len(d["answers"]) == 3 and d["lm_tokens"] == 96
    # the full budget's LM loss is the model's own (no budget) on the same text
    from headcount.core.models import load_tokenizer
    from headcount.data.tasks.niah import NiahSpec, niah_task
    from headcount.experiments.studies.retrieval.jobs import lm_chunks

    spec = NiahSpec(lengths=(96,), depths=(0.0, 0.5, 1.0), examples=3, seed=9, haystack=str(root / "haystack.txt"))
    tok = load_tokenizer(str(root / "ckpt"))
    chunk = torch.tensor(lm_chunks(niah_task("x", spec), tok, "validation", 1, 96, 9))
    model = load_model(str(root / "ckpt"), head="lm").eval()
    with torch.no_grad():
        loss = float(model(input_ids=chunk, labels=chunk).loss)
    assert curve.loc["full", "lm_loss"] == pytest.approx(loss, abs=1e-5)
    assert curve.loc["0.5/uniform", "lm_loss"] != pytest.approx(loss, abs=1e-6)  # a window shorter than the text


def test_the_ablation_gates_the_top_quarter_against_random_draws(run):
    store, _ = run
    ab = pd.read_csv(store.root / "results" / "ablation.csv").set_index("unit")
    heads = _job(store, "ablation/heads").load_json("ablation.json")
    pooled = _grid(_job(store, "pooled/retrieval").load_json("scores.json")["heads"])
    assert ab.loc["heads", "k"] == 3 and ab.loc["kv-groups", "k"] == 2  # round(0.25 x 12), round(0.25 x 6)
    assert heads["n_positive"] == int((pooled > 0).sum())
    # the top units: by the pooled retrieval score, its ties broken by the pooled long-range mass
    lr = _job(store, "pooled/long-range").load_json("scores.json")
    ret_kv = _grid(_job(store, "pooled/retrieval").load_json("scores.json")["kv_groups"])
    for unit, primary, ties, width in (("heads", pooled, _grid(lr["heads"]), H),
                                       ("kv-groups", ret_kv, _grid(lr["kv_groups"]), K)):
        top = _job(store, f"ablation/{unit}").load_json("ablation.json")["top"]
        want = _order(primary, ties)[:int(ab.loc[unit, "k"])]
        assert sorted(top) == sorted([i // width, i % width] for i in want), unit
    assert len(heads["per_example"]["random"]) == 2 and len(heads["per_example"]["top"]) == 3
    for unit in ("heads", "kv-groups"):
        d = _job(store, f"ablation/{unit}").load_json("ablation.json")
        assert ab.loc[unit, "accuracy_top"] == pytest.approx(np.mean(d["per_example"]["top"]))
        assert ab.loc[unit, "accuracy_random_mean"] == pytest.approx(np.mean(d["per_example"]["random"]))


def test_the_report_and_the_explorer(run):
    store, _ = run
    out = store.root
    targets = pd.read_csv(out / "results" / "targets.csv")
    assert len(targets) == 6 and targets["this run"].notna().all()  # share, 2 x stability, 2 x ablation, budget
    summary = json.loads((out / "results" / "summary.json").read_text())
    assert summary["summary"].startswith("Share of query heads with retrieval score > 0.1")
    assert {p.name for p in (out / "figures").iterdir()} == {"curve.png", "scores.png", "stability.png", "ablation.png"}
    page = (out / "explore.html").read_text(encoding="utf-8")
    assert "retrieval score, niah-passkey, seed 1" in page and "long-range attention mass" in page
    assert "KV budget: full cache or streaming (scores, memory 0.5, 2 full KV heads)" in page
    assert "KV budgets that give every KV head the same cache" in page  # the full cache and the uniform window


@pytest.mark.parametrize("change, message", [
    ("held_out: {seed: 2}", "held_out.seed 2 is one of the scored seeds"),
    ("budgets: {memory: [0.05], context: 96, sink: 4, window: 16}", "budgets.memory 0.05"),
    ("templates: [nonesuch]", "niah template 'nonesuch' is not one of"),
    ("niah: {haystack: missing.txt}", "is not a file"),
])
def test_bad_configs_are_refused_in_one_line(run, change, message):
    from headcount.experiments.runner import load_study_config
    from headcount.runtime.errors import HeadcountError

    _, root = run
    text = "\n".join(line for line in STUDY.splitlines() if not line.startswith(change.split(":")[0] + ":"))
    (root / "bad.yaml").write_text(text + "\n" + change + "\n")
    with pytest.raises((HeadcountError, ValidationError)) as e:
        load_study_config(root / "bad.yaml")
    assert message in str(e.value) and "\n" not in str(e.value).strip()


def test_the_budget_row_says_beats_only_when_the_test_rejects():
    """The generated sentence follows the paired test, not the sign of the difference (the offline
    run's 1.00 vs 0.60 at p = 0.0625 over 10 prompts is "higher, not significant")."""
    from headcount.experiments.studies.retrieval import tables

    assert tables.versus_uniform(True, 0.0625, 0.05).startswith("higher, not significant")
    assert tables.versus_uniform(True, 0.049, 0.05).startswith("beats it")
    assert tables.versus_uniform(True, None, 0.05) == "higher, not significant (no paired test)"
    assert tables.versus_uniform(False, 0.5, 0.05).startswith("does not beat it")
