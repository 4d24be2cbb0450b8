"""The head explorer (headcount.experiments.explorer, `headcount explore`): the page model against its inputs
(a model and a task with score and mask files, a tiny lottery run, a tiny transfer run), the
attention byte encoding and the page size, the one-file output rules, bad input, and the page in
headless Chromium (network off): one cell per head, a click fills the detail panel with the
head's numbers, switching the quantity recolours the grid, no script error.
"""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli
from browser_helpers import WIDTH, _run_browser, chromium
from training_helpers import make_checkpoint, make_task, one_thread

import headcount as hc
from headcount.experiments.explorer import data as D
from headcount.experiments.explorer.page import page_data
from headcount.experiments.runner import RunStore
from headcount.runtime.errors import HeadcountError

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

SCORES = {"heads": [[0.1, 0.9, 0.3, 0.5], [0.7, 0.2, 0.8, 0.05]], "mlps": [0.4, 0.6], "method": "gradient",
          "normalize": "none"}
MASK = {"heads": [[1, 0, 1, 1], [0, 1, 1, 0]], "mlps": [1, 0]}
LOTTERY = """study: lottery
name: tiny lottery
model: pre
tasks: [task/task.yaml]
seeds: [1, 2]
random: uniform
train: {lr: 0.01, batch_size: 32, epochs: 1, max_length: 32, save_steps: 1000}
pruning: {step: 0.25}
magnitude: {enabled: false}
super_survivors: {retrain: false}
patterns: {max_examples: 16, size: 16}
"""
TRANSFER = """study: transfer
name: tiny transfer
model: pre
tasks: [{id: good, task: task/task.yaml}]
seeds: [1, 2]
train: {lr: 0.01, batch_size: 32, epochs: 1, max_length: 32, eval_batch_size: 64, save_steps: 1000}
head_fit: {lr: 0.01, epochs: 1}
mlm: {head_steps: 10, head_max_texts: 64, eval: {max_examples: 32, batch_size: 32, max_length: 32}}
scoring: {data: {max_examples: 32, batch_size: 16, max_length: 32}}
pruning: {levels: [0.25, 0.5], random_draws: 1}
before_after: {levels: [0.25, 0.5], seeds: [1], random_control: true}
stats: {n_boot: 10, n_permutations: 9}
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore")
    w = {"root": root, "pre": str(make_checkpoint(root / "pre")), "task": str(make_task(root / "task"))}
    for name, doc in (("scores", SCORES), ("mask", MASK),
                      ("mask3", {"heads": [[1, 1, 1, 1]] * 3, "mlps": [1, 1, 1]})):
        (root / f"{name}.json").write_text(json.dumps(doc))
        w[name] = str(root / f"{name}.json")
    blank = root / "blank"
    blank.mkdir()
    (blank / "dev.csv").write_text('sentence,label\n" ",negative\n"  ",positive\n')
    (blank / "task.yaml").write_text("name: blank\nkind: classification\nfiles: {train: dev.csv, validation: dev.csv}\n"
                                     "text: [sentence]\nlabel: label\nlabels: [negative, positive]\nmetric: accuracy\n")
    w["blank"] = str(blank / "task.yaml")
    return w


def _study(world, name: str, config: str) -> Path:
    from headcount.experiments import run_study

    (world["root"] / f"{name}.yaml").write_text(config)
    summary = run_study(world["root"] / f"{name}.yaml", world["root"] / name, quiet=True)
    assert not summary.failed
    return summary.run_dir


@pytest.fixture(scope="module")
def lottery(world):
    return _study(world, "lottery", LOTTERY)


@pytest.fixture(scope="module")
def transfer(world):
    return _study(world, "transfer", TRANSFER)


@pytest.fixture(scope="module")
def model_page(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("pages") / "model.html"
    return out, ["explore", "--model", world["pre"], "--task", world["task"], "--scores", world["scores"],
                 "--mask", world["mask"], "--examples", "4", "--out", str(out)]


def _grid(q):
    return np.array([[np.nan if v is None else v for v in row] for row in q["heads"]], dtype=float)


def _by_name(page):
    return {q["name"]: q for q in page["quantities"]}


def _by_key(page, kind):
    """The quantities of one kind by where they come from (job name or file)."""
    return {q["key"]: q for q in page["quantities"] if q["kind"] == kind}


# -- the page model -----------------------------------------------------------------------------------
def test_attention_round_trips_through_the_byte_encoding():
    rng = np.random.default_rng(0)
    maps = [rng.dirichlet(np.full(n, 0.3), size=(2, 3, n)).astype(np.float32) for n in (5, 9)]
    maps[1][1, 2] = np.nan  # a pruned head
    maps[0][1, 2] = np.nan
    blobs = D.encode_attention(maps, k=3)
    assert blobs[1][2] is None and all(b is not None for i, row in enumerate(blobs) for j, b in enumerate(row) if (i, j) != (1, 2))
    rows = sum(m.shape[-1] for m in maps)
    for i in range(2):
        for j in range(3):
            if blobs[i][j] is None:
                continue
            assert len(base64.b64decode(blobs[i][j])) <= rows * (1 + 2 * 3)  # the size bound choose_k relies on
            for m, dec in zip(maps, D.decode_attention(blobs[i][j], [m.shape[-1] for m in maps])):
                real = m[i, j]
                for q in range(real.shape[0]):
                    shown = np.flatnonzero(dec[q])
                    top = np.argsort(-real[q], kind="stable")
                    assert top[0] in shown and len(shown) <= 3  # the largest is always there
                    assert set(shown) <= set(top[:3])
                    assert np.all(real[q, shown] >= D.MIN_WEIGHT) or len(shown) == 1
                    assert np.allclose(dec[q, shown], np.rint(real[q, shown] * 255) / 255)


def test_a_page_of_bert_base_size_stays_under_5_mb():
    rows = 144 * 16 * 128  # 12 x 12 heads, 16 examples of 128 tokens
    k = D.choose_k(rows)
    assert 1 <= k < D.TOP_K and rows * (1 + 2 * k) * 4 / 3 < 4.5e6  # the worst case, in base64
    assert D.choose_k(8 * 8 * 20) == D.TOP_K  # a small model keeps every weight it may


def test_seed_groups_give_means_and_survival():
    page = D.new_page(1, 3, "t", {})
    D.add_quantity(page, "scores/seed1/x", [[1.0, 2.0, 3.0]], [1.0], kind="score")
    D.add_quantity(page, "scores/seed2/x", [[3.0, float("nan"), 1.0]], [3.0], kind="score")
    D.add_quantity(page, "kept: prune/seed1", [[1, 0, 1]], kind="mask", key="prune/seed1")
    D.add_quantity(page, "kept: prune/seed2", [[1, 0, 0]], kind="mask", key="prune/seed2")
    D.add_seed_summaries(page)
    q = _by_name(D.finish(page))
    assert q["mean of 2 seeds: scores/seed*/x"]["heads"] == [[2.0, 2.0, 2.0]] and q["mean of 2 seeds: scores/seed*/x"]["mlps"] == [2.0]
    assert q["kept by k of 2 seeds: prune/seed*"]["heads"] == [[2, 0, 1]]
    assert q["scores/seed2/x"]["ranks"] == [[1, None, 2]]
    assert page["details"][0][1][1] == ["n/a", None] and page["details"][0][0][0] == ["1", "3 of 3"]
    assert page["details"][0][2][5] == ["kept by 1 of 2", None]
    with pytest.raises(HeadcountError, match="is for 2 x 3, the model has 1 layers x 3 heads"):
        D.add_quantity(page, "other", [[1, 2, 3]] * 2, kind="score")


def test_pattern_classes_of_the_rules_and_of_the_cnn():
    from headcount.analysis.patterns import CLASSES
    from headcount.experiments.explorer.sources import _pattern_quantities

    page = D.new_page(1, 2, "t", {})
    ids = [[[0, 1]], [[0, 3]], [[2, 3]]]  # [examples, layers, heads]: the CNN's class of each
    _pattern_quantities(page, "patterns/x/seed1", {"labels": [["vertical", "block"]], "cnn_example_ids": ids,
                                                   "cnn_classes": list(CLASSES)})
    rules, cnn = page["quantities"]
    assert rules["name"] == "pattern (rules): patterns/x/seed1" and rules["seed"] == 1
    assert [rules["categories"][v] for v in rules["heads"][0]] == ["vertical", "block"]
    assert cnn["name"] == "pattern (CNN, commonest over 3 examples): patterns/x/seed1"
    assert [cnn["categories"][v] for v in cnn["heads"][0]] == [CLASSES[0], CLASSES[3]]
    D.finish(page)
    assert page["details"][0][1] == [["block", None], [CLASSES[3], None]]


def test_the_page_of_a_model_and_task_holds_the_files_and_the_attention(world, model_page, capsys):
    import torch

    from headcount.core.attention import attention_maps
    from headcount.core.models import load_model, load_tokenizer
    from headcount.data.tasks import get_task

    out, argv = model_page
    code, stdout, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "2 layers x 4 heads" in stdout and "4 dev examples of has-good" in stdout
    html = out.read_text(encoding="utf-8")
    assert not re.search(r"<(link|img|iframe)\b|\b(src|href)\s*=", html)  # nothing to fetch
    page = page_data(html)
    q = _by_name(page)
    assert (page["layers"], page["heads"]) == (2, 4)
    scores, mask = _by_key(page, "score")[world["scores"]], _by_key(page, "mask")[world["mask"]]
    assert scores["name"] == "gradient importance" and mask["name"] == f"kept: {world['mask']}"  # by method; a bare mask: its file
    assert np.allclose(_grid(scores), SCORES["heads"]) and scores["mlps"] == SCORES["mlps"]
    assert scores["ranks"] == [[7, 1, 5, 4], [3, 6, 2, 8]] and mask["heads"] == MASK["heads"] and mask["mlps"] == MASK["mlps"]
    names = [x["name"] for x in page["quantities"]]
    assert page["details"][0][1][names.index(mask["name"])] == ["removed", None]
    assert page["details"][1][2][names.index(scores["name"])] == ["0.8", "2 of 8"]
    assert page["mlp_details"][1][names.index(mask["name"])] == ["removed", None]
    # the tokens and attention of the first four dev examples, as the model computes them
    att = page["attention"]
    tok, task = load_tokenizer(world["pre"]), get_task(world["task"])
    texts = task.load(task.validation_split, max_examples=4, seed=0).texts
    expected = [tok.convert_ids_to_tokens(tok(*t)["input_ids"]) for t in texts]
    assert [e["tokens"] for e in att["examples"]] == expected and att["k"] == D.TOP_K
    model = load_model(world["pre"]).eval()
    lengths = [len(t) for t in expected]
    for layer, head in ((0, 0), (1, 3)):
        decoded = D.decode_attention(att["heads"][layer][head], lengths)
        for t, dec in zip(texts[:2], decoded):
            with torch.no_grad():
                real = attention_maps(model, **tok(*t, return_tensors="pt"))[layer][0, head].numpy()
            top = real.argmax(-1)
            assert np.allclose(dec[np.arange(len(top)), top], np.rint(real.max(-1) * 255) / 255, atol=1.01 / 255)
    entropy = q["attention entropy (nats, mean over queries and examples)"]
    assert all(0 < v <= math.log(max(lengths)) for row in entropy["heads"] for v in row)


def test_the_page_of_a_lottery_run_holds_its_masks_survival_and_patterns(lottery):
    store = RunStore(lottery)
    before = _snapshot(lottery)
    ex = hc.explore(lottery, examples=3)
    assert _snapshot(lottery) == before  # reading a run (and running its model) writes nothing there
    page = ex.page
    q = _by_name(page)
    assert page["title"] == "tiny lottery" and (page["layers"], page["heads"]) == (2, 4)  # the study type: in the subtitle
    masks = [store.result(f"prune/has-good/seed{s}").result["mask"] for s in (1, 2)]
    kept, stepped = _by_key(page, "mask"), _by_key(page, "step")
    for s, m in zip((1, 2), masks):
        assert kept[f"prune/has-good/seed{s}"]["heads"] == m["heads"]
        assert kept[f"prune/has-good/seed{s}"]["name"] == f"good mask (iterative pruning), has-good, seed {s}"
        # the step that removed each head, read back against the saved mask and its trace
        steps = stepped[f"prune/has-good/seed{s}"]
        assert steps["name"] == f"pruning step that removed the head, has-good, seed {s}"
        saved = np.asarray(m["removed_at_step"]["heads"])
        assert steps["kind"] == "step" and np.array_equal(np.isnan(_grid(steps)), saved == 0)
        assert np.array_equal(_grid(steps)[saved > 0], saved[saved > 0])
        assert np.array_equal(saved == 0, np.asarray(m["heads"]) == 1)
        trace = store.result(f"prune/has-good/seed{s}").result["trace"]
        accepted = [row for row in trace if row["accepted"]]
        for before, row in zip(accepted, accepted[1:]):  # each accepted step removed the heads its row lost
            assert (saved == row["step"]).sum() == before["heads_kept"] - row["heads_kept"]
    assert not any("earlier headcount" in n for n in page["notes"])
    survival = q["kept by k of 2 seeds: good mask (iterative pruning), has-good"]
    assert np.array_equal(_grid(survival), np.add(masks[0]["heads"], masks[1]["heads"])) and survival["n"] == 2
    rules = q["pattern class (rules), has-good, seed 1"]
    labels = store.result("patterns/has-good/seed1").result["labels"]
    assert [[rules["categories"][int(v)] for v in row] for row in rules["heads"]] == labels
    assert not any("subnetwork/random" in k or "subnetwork/bad" in k for k in (x["key"] for x in page["quantities"]))
    assert not any("/" in n for n in q)  # named by method, task and seed, not by job path
    assert any("random or bad controls are left out" in n for n in page["notes"])
    assert page["attention"]["label"] == "finetune/has-good/seed1 on 3 dev examples of has-good"
    assert len(page["attention"]["examples"]) == 3


def test_the_page_of_a_transfer_run_holds_its_scores_means_and_removal_levels(transfer, tmp_path, capsys):
    store = RunStore(transfer)
    out = tmp_path / "sub" / "explore.html"
    code, _, err = run_cli(capsys, "explore", transfer, "--out", out)
    assert code == 0, err
    page = page_data(out.read_text(encoding="utf-8"))
    q, by_job = _by_name(page), _by_key(page, "score")
    grids = {}
    for name in ("mlm-scores/good", "task-scores/good/seed1/fine-tuned", "task-scores/good/seed2/fine-tuned"):
        saved = json.loads((store.result(name).dir / "scores.json").read_text())
        grids[name] = np.asarray(saved["heads"])
        x = by_job[name]
        assert np.allclose(_grid(x), saved["heads"], rtol=1e-5) and np.allclose(x["mlps"], saved["mlps"], rtol=1e-5)
    assert by_job["mlm-scores/good"]["name"] == "MLM gradient importance (pre-trained), has-good"
    assert by_job["task-scores/good/seed2/fine-tuned"]["name"] == "task gradient importance (fine-tuned), has-good, seed 2"
    assert by_job["task-scores/good/seed1/pre-trained"]["name"] == \
        "task gradient importance (pre-trained encoder), has-good, seed 1"
    mean = q["mean of 2 seeds: task gradient importance (fine-tuned), has-good"]
    assert np.allclose(_grid(mean), (grids["task-scores/good/seed1/fine-tuned"] + grids["task-scores/good/seed2/fine-tuned"]) / 2, rtol=1e-5)
    levels = _grid(q["pruning level that removed the head, by MLM importance, good"])
    m25, m50 = (np.asarray(store.result(f"mask/good/mlm-{lv}").result["heads"]) for lv in ("0.25", "0.5"))
    expected = np.where(m25 == 0, 0.25, np.where(m50 == 0, 0.5, np.nan))
    assert np.array_equal(np.isnan(levels), np.isnan(expected)) and np.allclose(levels[~np.isnan(levels)], expected[~np.isnan(expected)])
    assert not any("random-" in x["key"] for x in page["quantities"])  # the random control masks are left out
    assert not any("/" in n for n in q)  # named by method, task and seed, not by job path
    assert page["attention"]["label"].startswith("finetune/good/seed1 on 8 dev examples")


# -- notebook, output file, bad input ------------------------------------------------------------------
def test_in_a_notebook_the_explorer_shows_inline_and_saves(world, tmp_path):
    import importlib

    package = importlib.import_module("headcount.experiments.explorer")
    ex = hc.explore(model=world["pre"], task=world["task"], examples=2)
    assert hc.explore is package.explore  # the function (the package is headcount.experiments.explorer)
    shown = ex._repr_html_()
    assert shown.startswith('<iframe srcdoc="&lt;!DOCTYPE html&gt;') and "&quot;" in shown and "<script" not in shown
    path = ex.save(tmp_path / "e.html")
    assert page_data(path.read_text(encoding="utf-8"))["quantities"] == ex.page["quantities"]
    assert ex.save(path) == path  # its own page is replaced
    (tmp_path / "notes.html").write_text("<html>mine</html>")
    with pytest.raises(HeadcountError, match="was not written by `headcount explore`"):
        ex.save(tmp_path / "notes.html")
    assert (tmp_path / "notes.html").read_text() == "<html>mine</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.html", "notes.html"]  # no lock or temporary file left


def test_an_earlier_page_is_replaced_only_when_it_is_the_same_explorer(world, model_page, tmp_path, capsys):
    out = tmp_path / "e.html"
    base = ["explore", "--model", world["pre"], "--task", world["task"], "--examples", "2", "--out", out]
    assert run_cli(capsys, *base)[0] == 0
    first = out.read_bytes()
    assert run_cli(capsys, *base)[0] == 0  # the same settings: replaced
    code, _, err = run_cli(capsys, *base[:-2], "--mask", world["mask"], "--out", out)
    assert code == 2 and "another run or settings" in err and out.read_bytes() == first
    code, stdout, err = run_cli(capsys, *base[:-2], "--mask", world["mask"], "--out", out, "--force")
    assert code == 0 and "--force: replacing" in stdout and out.read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.html"]


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


BAD = {
    "no-results": (lambda w, d: [_unfinished_run(w, d), "--out", d / "e.html"], "no finished score, mask or pattern"),
    "not-a-run": (lambda w, d: [d, "--out", d / "e.html"], "not a headcount run directory"),
    "missing-run": (lambda w, d: [d / "nowhere", "--out", d / "e.html"], "is not a directory"),
    "mask-does-not-fit": (lambda w, d: ["--model", w["pre"], "--task", w["task"], "--mask", w["mask3"], "--out", d / "e.html"],
                          "is for 3 x 4, the model has 2 layers x 4 heads"),
    "not-a-mask": (lambda w, d: ["--model", w["pre"], "--task", w["task"], "--mask", w["task"], "--out", d / "e.html"],
                   "unreadable"),
    "empty-text": (lambda w, d: ["--model", w["pre"], "--task", w["task"], "--text", "  ", "--out", d / "e.html"],
                   "text 1 is empty"),
    "empty-dev-texts": (lambda w, d: ["--model", w["pre"], "--task", w["blank"], "--out", d / "e.html"], "are empty texts"),
    "run-and-model": (lambda w, d: [d, "--model", w["pre"], "--out", d / "e.html"], "not both"),
    "model-without-task": (lambda w, d: ["--model", w["pre"], "--out", d / "e.html"], "needs --task"),
    "neither": (lambda w, d: ["--out", d / "e.html"], "give a run directory"),
    "too-many-examples": (lambda w, d: ["--model", w["pre"], "--task", w["task"], "--examples", "17", "--out", d / "e.html"],
                          "--examples"),
    "out-is-a-folder": (lambda w, d: ["--model", w["pre"], "--task", w["task"], "--out", d], "is a directory"),
    "out-is-the-users-file": (lambda w, d: ["--model", w["pre"], "--task", w["task"], "--out", _users_file(d)],
                              "was not written by `headcount explore`"),
}


def _unfinished_run(w, d):
    run = d / "run"
    run.mkdir()
    for name in ("manifest.json", "plan.json"):  # a run directory whose study has not run
        shutil.copy(Path(w["root"]) / "lottery" / name, run / name)
    return run


def _users_file(d):
    (d / "page.html").write_text("<html>my page</html>")
    return d / "page.html"


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_error_line_and_writes_nothing(case, world, lottery, tmp_path, capsys):
    make, needle = BAD[case]
    d = tmp_path / "case"
    d.mkdir()
    argv = ["explore", *make(world, d)]
    before, world_before = _snapshot(d), _snapshot(Path(world["root"]) / "lottery")
    code, _, err = run_cli(capsys, *argv)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert _snapshot(d) == before and _snapshot(Path(world["root"]) / "lottery") == world_before


# -- the page in a browser ----------------------------------------------------------------------------
ERRORS = """<script>window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
window.addEventListener("unhandledrejection", function (e) { window.__errors.push("rejection: " + e.reason); });
var __err = console.error; console.error = function () { window.__errors.push([].join.call(arguments, " ")); __err.apply(console, arguments); };
</script>"""
PROBE = """<script>window.addEventListener("load", function () {
  var T = %s, r = {}, $ = function (id) { return document.getElementById(id); };
  function colours() { return Array.from(document.querySelectorAll("#grid-a .cell")).map(function (c) {
    return [c.getAttribute("data-l"), c.getAttribute("data-h"), c.getAttribute("data-colour")]; }); }
  try {
    r.ready = document.body.getAttribute("data-ready");
    r.cells = document.querySelectorAll("#grid-a .cell:not(.mlp)").length;
    r.mlps = document.querySelectorAll("#grid-a .cell.mlp").length;
    r.before = colours();
    var cell = document.querySelector('#grid-a .cell[data-l="' + T.l + '"][data-h="' + T.h + '"]');
    r.label = cell.getAttribute("aria-label");
    cell.click();
    r.hash = location.hash;
    r.axes = [$("axis-x").firstChild.textContent, $("axis-y").firstChild.textContent];
    r.picks = [$("qa-label").firstChild.textContent, $("qb-label").firstChild.textContent];
    r.title = $("detail-title").textContent;
    r.rows = Array.from(document.querySelectorAll("#detail-table tbody tr")).map(function (tr) {
      return Array.from(tr.cells).map(function (td) { return td.textContent; }); });
    r.selected = document.querySelectorAll(".cell.selected").length;
    r.lines = document.querySelectorAll("#lines line").length;
    r.canvas = [$("heat").width, $("heat").height];
    var first = document.querySelector('#grid-b .cell[data-l="0"][data-h="0"]');
    first.focus(); first.dispatchEvent(new KeyboardEvent("keydown", {key: "ArrowRight", bubbles: true}));
    r.focused = [document.activeElement.getAttribute("data-l"), document.activeElement.getAttribute("data-h")];
    r.points = document.querySelectorAll("#scatter circle").length;
    var s = $("qa"); s.value = String(T.q); s.dispatchEvent(new Event("change"));
    r.after = colours();
  } catch (e) { r.exception = String(e); }
  r.resources = performance.getEntriesByType("resource").map(function (e) { return e.name; });
  r.scrollWidth = document.documentElement.scrollWidth;
  r.errors = window.__errors;
  var pre = document.createElement("pre"); pre.id = "hc-check"; pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});</script>"""


def _defaults(page) -> tuple[int, int]:
    """The quantities the page shows first (explorer.js ``defaults``): MLM vs task importance when it
    has both, else survival across seeds vs attention entropy, else the first two numeric ones."""
    qs = page["quantities"]
    numeric = [i for i, q in enumerate(qs) if q["kind"] in ("score", "mean", "survival", "level", "step")]
    a = next((i for i in numeric if "mlm" in qs[i]["name"].lower()),
             next((i for i, q in enumerate(qs) if q["kind"] == "survival"), numeric[0] if numeric else 0))
    b = next((i for i in numeric if i != a and "task" in qs[i]["name"].lower()),
             next((i for i in numeric if i != a and "entropy" in qs[i]["name"].lower()),
                  next((i for i in numeric if i != a), (a + 1) % len(qs) if len(qs) > 1 else a)))
    return a, b


def _probe(page: Path, target: dict) -> dict:
    probe = page.with_name(f".probe-{page.name}")
    text = page.read_text(encoding="utf-8")
    probe.write_text(text.replace("<head>", "<head>" + ERRORS, 1).replace("</body>", PROBE % json.dumps(target) + "</body>"),
                     encoding="utf-8")
    try:  # no network: every request would go to a proxy that is not there
        dom = _run_browser([f"--window-size={WIDTH},1000", "--virtual-time-budget=10000",
                            "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>", "--dump-dom",
                            probe.resolve().as_uri()])
    finally:
        probe.unlink()
    m = re.search(r'<pre id="hc-check">(.*?)</pre>', dom, re.DOTALL)
    assert m, f"the probe did not run; page starts: {dom[:300]!r}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


@pytest.mark.skipif(chromium() is None, reason="no Chromium installed (apt-get install chromium)")
def test_the_page_works_in_a_browser_with_the_network_off(world, model_page, lottery, tmp_path, capsys):
    out, argv = model_page
    if not out.is_file():
        assert run_cli(capsys, *argv)[0] == 0
    page = page_data(out.read_text(encoding="utf-8"))
    names = [q["name"] for q in page["quantities"]]
    mask_q = names.index(f"kept: {world['mask']}")
    r = _probe(out, {"l": 1, "h": 2, "q": mask_q})
    assert r["errors"] == [] and "exception" not in r and r["ready"] == "1", r
    assert r["resources"] == [] and r["scrollWidth"] <= WIDTH
    assert r["cells"] == 8 and r["mlps"] == 2
    assert r["title"] == "Layer 1, head 2" and r["selected"] == 2  # the head, in both grids
    assert r["hash"] == "#head=1.2"  # clicking a head writes it into the URL (a link to it)
    sa, sb = (page["quantities"][i]["name"] for i in _defaults(page))
    assert r["axes"] == [sa[:41] + "\u2026" if len(sa) > 42 else sa, sb[:41] + "\u2026" if len(sb) > 42 else sb]
    assert r["picks"] == ["Quantity (x axis of the scatter)", "Quantity (y axis of the scatter)"]
    assert r["rows"] == [[n, *[v or "" for v in page["details"][1][2][i]]] for i, n in enumerate(names)]
    assert r["label"].startswith("layer 1, head 2: ") and page["details"][1][2][0][0] in r["label"]
    lengths = [len(e["tokens"]) for e in page["attention"]["examples"]]
    shown = D.decode_attention(page["attention"]["heads"][1][2], lengths)[0]
    assert r["lines"] == int((shown > 0).sum()) and r["canvas"] == [lengths[0]] * 2
    assert r["focused"] == ["0", "1"]  # the arrow key moved along the row
    kept = {(str(i), str(j)): v for i, row in enumerate(MASK["heads"]) for j, v in enumerate(row)}
    after = {(l, h): c for l, h, c in r["after"] if h != "mlp"}
    assert after != {(l, h): c for l, h, c in r["before"] if h != "mlp"}
    assert all(c == ("#1f4e79" if kept[key] else "#dde6f0") for key, c in after.items())
    assert r["points"] == 8  # both grids numeric: one point per head (the right one shows the entropy)
    run_page = tmp_path / "lottery.html"
    assert run_cli(capsys, "explore", lottery, "--examples", "2", "--out", run_page)[0] == 0
    r = _probe(run_page, {"l": 0, "h": 0, "q": 0})
    assert r["errors"] == [] and "exception" not in r and r["cells"] == 8 and r["title"] == "Layer 0, head 0", r


@pytest.mark.skipif(chromium() is None, reason="no Chromium installed (apt-get install chromium)")
def test_a_decoder_page_groups_query_heads_by_kv_group_in_a_browser(world, tmp_path, capsys):
    """A tiny random Llama (4 query heads on 2 KV heads): the detail panel names the head's group,
    and each group's first column is marked."""
    from conftest import tiny_model
    from training_helpers import make_tokenizer

    tiny_model("llama", head="lm").save_pretrained(tmp_path / "lm")
    make_tokenizer(tmp_path / "lm").save_pretrained(tmp_path / "lm")
    out = tmp_path / "decoder.html"
    assert run_cli(capsys, "explore", "--model", tmp_path / "lm", "--task", world["task"], "--examples", "2",
                   "--out", out)[0] == 0
    r = _probe(out, {"l": 1, "h": 2, "q": 0})
    assert r["errors"] == [] and "exception" not in r and r["ready"] == "1", r
    assert r["title"] == "Layer 1, query head 2 (KV group 1)" and r["label"].startswith("layer 1, query head 2 (KV group 1): ")
    assert out.read_text(encoding="utf-8").count('"kv_heads":2') == 1


@pytest.mark.skipif(chromium() is None, reason="no Chromium installed (apt-get install chromium)")
def test_a_lottery_page_opens_on_survival_against_entropy(lottery, tmp_path):
    """Without an MLM/task pair, the page first shows survival across seeds (x) against attention
    entropy (y): the lottery study's question, not two seeds' pruning steps side by side."""
    out = hc.explore(lottery, examples=2).save(tmp_path / "lottery.html")
    page = page_data(out.read_text(encoding="utf-8"))
    a, b = _defaults(page)
    qs = page["quantities"]
    assert qs[a]["kind"] == "survival" and "entropy" in qs[b]["name"]
    r = _probe(out, {"l": 0, "h": 1, "q": a})
    assert r["errors"] == [] and "exception" not in r, r
    short = [n[:41] + "\u2026" if len(n) > 42 else n for n in (qs[a]["name"], qs[b]["name"])]
    assert r["axes"] == short
