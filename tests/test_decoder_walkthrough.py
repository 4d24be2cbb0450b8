"""docs/decoder-walkthrough.md ("A decoder in an hour") run as it is written, so that the page stays true.

The page's fenced blocks are read from the page itself, in order: a block titled ``title="NAME"``
is written to that file (the niah task, with :data:`YAML_TINY` substituted: shorter prompts,
fewer examples, a haystack file instead of the offline texts); a ``bash`` block's ``headcount ...``
lines (``\\`` continues a line, ``  #`` starts a comment) run in-process in a temporary folder,
with ``offline-decoder`` replaced by a tiny random Llama saved there (3 layers, 4 query heads on
2 KV heads, a word-piece vocabulary of the niah words: ``tests/niah_helpers.py``) and
:data:`TINY` appended (a later option wins: a 72-token context, a text task of that vocabulary
instead of ``offline/tweets``); a ``python`` block is executed there. The reader's own files of
step (d) are written here: ``my-decoder.gguf`` (``tests/gguf_files.py``) and ``my-decoder/``
(another seed of the tiny Llama). Each step's output files are checked, not only its exit
status; dropping or reordering a step fails :data:`STEPS`. No network: socket connections fail
the test. 10-16 s on two busy CPU cores (one thread).
"""

from __future__ import annotations

import json
import re
import shlex
import socket
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import run_cli
from page_helpers import code_blocks
from gguf_files import write_gguf
from niah_helpers import SENTENCES, save_niah_checkpoint

from headcount.core.masks import Mask
from headcount.core.surgery import RECORD
from headcount.kv.budget import KVBudget

PAGE = Path(__file__).resolve().parents[1] / "docs" / "decoder-walkthrough.md"
#: the tiny model's folder (in the test's folder), standing in for ``--model offline-decoder``
TINY_MODEL = "tiny-decoder"
#: the tiny Llama's layout
LAYERS, HEADS, KV = 3, 4, 2
#: appended to the page's commands (a later option wins), by step (see :func:`step_name`)
TINY = {
    "kv-budget runs/budget": ["--context", "72", "--sink", "4", "--window", "8"],
    "kv-eval runs/kv-eval": ["--context", "72", "--max-new-tokens", "4", "--examples", "3", "--lm-texts", "2"],
    "prune runs/prune": ["--task", "texts.yaml"],
    "score runs/lm-score": ["--task", "texts.yaml"],
}
#: the niah task YAML's settings, at the tiny model's size (each must be on the page), then the haystack file
YAML_TINY = {"lengths: [1000]": "lengths: [60]", "examples: 20": "examples: 4"}
YAML_HAYSTACK = "  haystack: haystack.txt\n"
#: every step of the page, in its order
STEPS = ["info offline-decoder", "file niah.yaml", "score runs/retrieval", "kv-budget runs/budget",
         "kv-eval runs/kv-eval", "prune runs/prune", "score runs/lm-score", "python even-mask.json",
         "shrink runs/even", "export runs/plain", "python runs/plain", "info my-decoder.gguf", "score runs/mine",
         "explore explore.html"]
#: the shape of kv-budget's line (the page shows the offline decoder's; the run must print one)
BUDGET_LINE = re.compile(r"wrote runs/budget/budget\.json: \d+ of (\d+) KV heads keep the full cache, \d+ stream "
                         r"\(sink \d+ \+ window \d+\); KV cache at [\d,]+ tokens [\d,]+ of [\d,]+ bytes "
                         r"\(\d\.\d{3}, target 0\.5\)")


def commands(body: str) -> list[str]:
    """A bash block's command lines: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line.split("  #", 1)[0].strip() for line in joined.splitlines() if line.split("  #", 1)[0].strip()]


def step_name(argv: list[str]) -> str:
    """``COMMAND --out`` (or ``COMMAND --model`` for ``info``): unique per step of the page."""
    opts = dict(zip(argv, argv[1:]))
    return f"{argv[1]} {opts.get('--out', opts.get('--model'))}"


def python_name(body: str) -> str:
    """A python block by what it writes (``even-mask.json``) or loads (``runs/plain``)."""
    wrote = re.search(r'Path\("([^"]+)"\)\.write_text', body)
    loaded = re.search(r'from_pretrained\("([^"]+)"\)', body)
    return f"python {(wrote or loaded).group(1)}" if wrote or loaded else "python"


def _reader_files(folder: Path) -> None:
    """What the page assumes is there, at the tiny size: the model, the reader's own decoder (a
    GGUF file and a checkpoint folder), a haystack and a text task in the tiny model's words."""
    save_niah_checkpoint(folder / TINY_MODEL)
    save_niah_checkpoint(folder / "my-decoder", seed=5)
    write_gguf(folder / "my-decoder.gguf")
    (folder / "haystack.txt").write_text("\n".join(SENTENCES) + "\n")
    rows = ["text,label"] + [f'"{s}",{"positive" if i % 2 else "negative"}' for i, s in enumerate(SENTENCES * 3)]
    (folder / "texts.csv").write_text("\n".join(rows) + "\n")
    (folder / "texts.yaml").write_text("name: texts\nfiles: {train: texts.csv}\ntext: [text]\nlabel: label\n"
                                       "holdout: {fraction: 0.25, seed: 0}\n")


def _tiny_yaml(body: str) -> str:
    for old, new in YAML_TINY.items():
        assert old in body, f"the page's niah.yaml no longer has {old!r}: update YAML_TINY"
        body = body.replace(old, new)
    return body + YAML_HAYSTACK


def _no_network(monkeypatch) -> None:
    def refuse(self, *a, **kw):
        raise AssertionError(f"the walkthrough test tried to reach the network: {a}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def test_the_walkthrough_runs_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gguf")
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    _reader_files(tmp_path)
    _no_network(monkeypatch)
    blocks = code_blocks(PAGE.read_text(encoding="utf-8"))
    ran, printed, errors, namespace = [], {}, {}, {}
    for lang, title, body in blocks:
        if title:
            assert title == "niah.yaml", f"a new file on the page ({title}): say here how to make it tiny"
            (tmp_path / title).write_text(_tiny_yaml(body))
            ran.append(f"file {title}")
        elif lang == "bash":
            for line in commands(body):
                argv = shlex.split(line)
                assert argv[0] == "headcount", line
                name = step_name(argv)
                args = [TINY_MODEL if a == "offline-decoder" else a for a in argv[1:]]
                code, out, err = run_cli(capsys, *args, *TINY.get(name, []))
                assert code == 0, f"{line}\n{out}\n{err}"
                ran.append(name)
                printed[name], errors[name] = out, err
        elif lang == "python":
            capsys.readouterr()
            exec(compile(body, str(PAGE), "exec"), namespace)  # noqa: S102  (the page's own code)
            ran.append(python_name(body))
            printed[ran[-1]] = capsys.readouterr().out
    assert ran == STEPS
    runs = tmp_path / "runs"

    # 0. info: the layout, key/value heads included
    assert f"layers: {LAYERS}" in printed["info offline-decoder"]
    assert f"key/value heads: {KV} per layer" in printed["info offline-decoder"]

    # (a) retrieval scores of every query head, with their interval and the examples' record
    scores = json.loads((runs / "retrieval" / "scores.json").read_text())
    assert scores["method"] == "retrieval" and scores["task"] == "my-niah" and scores["split"] == "validation"
    assert len(scores["heads"]) == LAYERS and {len(r) for r in scores["heads"]} == {HEADS}
    assert len(scores["retrieval"]["examples"]) == 4 and "low" in scores["interval"]
    assert (runs / "retrieval" / "heads.png").read_bytes()[:4] == b"\x89PNG"
    assert "examples count" in printed["score runs/retrieval"]

    # (b) the budget: made from those scores, under the target; its line has the page's shape
    budget = KVBudget.load(runs / "budget" / "budget.json")
    assert budget.n_layers * budget.n_kv_heads == LAYERS * KV and 0 < budget.n_full < LAYERS * KV
    assert budget.kv_bytes(72) <= 0.5 * budget.full_bytes(72)
    made = json.loads((runs / "budget" / "budget.json").read_text())["made_from"]
    assert made["mode"] == "scores" and made["scores"] == "runs/retrieval/scores.json"
    line = BUDGET_LINE.search(printed["kv-budget runs/budget"])
    assert line and line.group(1) == str(LAYERS * KV), printed["kv-budget runs/budget"]
    shown = [body for lang, title, body in blocks if not lang and not title]
    page_line = next((BUDGET_LINE.search(b) for b in shown if BUDGET_LINE.search(b)), None)
    assert page_line and page_line.group(1) == "90", "the page's kv-budget line is not the shape kv-budget prints"
    # kv-eval: one row per method, each measured as its budget predicts; the page shows its header
    rows = pd.read_csv(runs / "kv-eval" / "kv-eval.csv").set_index("method")
    assert list(rows.index) == ["budget", "full", "uniform", "random"]
    assert (rows["kv_bytes"] == rows["kv_bytes_predicted"]).all() and (rows["n_needles"] == 3).all()
    assert rows.loc["budget", "kv_bytes"] == budget.kv_bytes(72) < rows.loc["full", "kv_bytes"]
    assert (runs / "kv-eval" / "kv-eval.png").read_bytes()[:4] == b"\x89PNG"
    header = printed["kv-eval runs/kv-eval"].splitlines()[0]
    table = next((b.splitlines() for b in shown if b.startswith("method ")), None)
    assert table and table[0].strip() == header.strip(), (header, shown)  # the page's table has the printed header
    assert [row.split()[0] for row in table[1:]] == list(rows.index)  # and its rows the methods, in order

    # (c) the pruning's mask is in KV groups; the LM scores have one per group; the even cut
    # removes as many groups in every layer; the export is plain and equals the shrunk checkpoint
    mask = json.loads((runs / "prune" / "mask.json").read_text())
    assert mask["unit"] == "kv-groups" and mask["objective"] == "lm" and len(mask["kv_groups"]) == LAYERS
    assert (runs / "prune" / "trace.csv").is_file()
    lm = json.loads((runs / "lm-score" / "scores.json").read_text())
    assert lm["objective"] == "lm" and lm["unit"] == "kv-groups" and {len(r) for r in lm["kv_groups"]} == {KV}
    even = Mask.load(tmp_path / "even-mask.json").with_kv_heads(KV)
    kept = even.kv_groups.sum(dim=1).tolist()
    assert len(set(kept)) == 1 and 0 < kept[0] < KV, kept
    assert f"{KV - int(kept[0])} of {KV} KV groups removed in every layer" in printed["python even-mask.json"]
    assert f"{int(sum(kept))}/{LAYERS * KV} key/value heads" in printed["shrink runs/even"]
    config = json.loads((runs / "plain" / "config.json").read_text())
    assert config["num_key_value_heads"] == kept[0] and RECORD not in config  # no headcount pruning record
    plain, logits, reference = namespace["plain"], namespace["logits"], namespace["reference"]
    assert type(plain).__module__.startswith("transformers.models.")
    assert plain.config.num_key_value_heads == kept[0]
    assert logits.shape == reference.shape and (logits - reference).abs().max().item() < 1e-5

    # (d) the reader's own files: the GGUF file converted once (one note), the folder scored
    assert "layers: 2" in printed["info my-decoder.gguf"]
    assert [ln for ln in errors["info my-decoder.gguf"].splitlines() if ln.startswith("note: converting ")]
    mine = json.loads((runs / "mine" / "scores.json").read_text())
    assert mine["model"] == "my-decoder" and mine["method"] == "retrieval" and len(mine["heads"]) == LAYERS

    # (e) the explorer page: both score grids and the mask, the attention on the page's text
    page = (tmp_path / "explore.html").read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith("<!doctype html")
    # two score grids, the mask and the attention entropy
    assert f"{LAYERS} layers x {HEADS} heads, 4 quantities" in printed["explore explore.html"]
    for quantity in ("retrieval score, my-niah", "lm gradient importance, texts", "mask (pruned by gradient"):
        assert quantity in page, quantity
    assert "1 of your texts" in printed["explore explore.html"]
