"""Size of an explorer page and how soon it is interactive in headless Chromium.

Model: BERT-base sized (``BertConfig()``: 12 layers x 12 heads, hidden 768), random weights, with a
word-level vocabulary written here; task: 16 dev texts of 126 words (128 tokens with [CLS] and
[SEP]), the most the page holds (``--examples 16``). The page is built by :func:`headcount.explore`
and saved; the baseline is the same model's page without attention examples (``attention`` off:
the grids, the scatter and the detail table only).

Interactive = from the navigation's start until the page's script has drawn both grids
(``data-ready``), a click on a head has filled the detail panel and drawn its attention (lines and
heat map): ``performance.now()`` after that click, in a real (not virtual) clock. Best of
``--repeats`` loads, each in a fresh browser profile. Targets (issue: the explorer): page <= 5 MB,
interactive <= 2 s. Ratio printed: interactive time of the full page / the baseline page's.

    python bench/bench_explore.py              # BERT-base, 16 examples (~1 min on 2 cores)
    python bench/bench_explore.py --quick      # 2 layers, 4 examples: a few seconds
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' headless Chromium
from browser_helpers import _run_browser, chromium  # noqa: E402

SIZE_TARGET_MB = 5.0
TIME_TARGET_S = 2.0
WORDS = ("the a movie film plot was is very quite long short actor story scene music ending and but it this "
         "that not really some many people time camera light dark fast slow old new big small good bad").split()

#: measures, on load: the page's own readiness, then a click on head (1, 1) and its detail panel
PROBE = """<script>window.addEventListener("load", function () {
  var r = {ready: document.body.getAttribute("data-ready")};
  try {
    var cell = document.querySelector('#grid-a .cell[data-l="1"][data-h="1"]');
    cell.click();
    r.rows = document.querySelectorAll("#detail-table tbody tr").length;
    r.lines = document.querySelectorAll("#lines line").length;
  } catch (e) { r.exception = String(e); }
  r.ms = performance.now();
  var pre = document.createElement("pre"); pre.id = "hc-bench"; pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});</script>"""


def build(root: Path, layers: int, heads: int, hidden: int, examples: int) -> tuple[Path, Path]:
    """A random BERT (``layers`` x ``heads``) with a word-level tokenizer, and a task of long texts."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tok = transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(tokens)}, do_lower_case=True)
    config = transformers.BertConfig(vocab_size=len(tok), num_hidden_layers=layers, num_attention_heads=heads,
                                     hidden_size=hidden, intermediate_size=4 * hidden, num_labels=2)
    torch.manual_seed(0)
    model_dir = root / "model"
    transformers.BertForSequenceClassification(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    g = torch.Generator().manual_seed(1)
    rows = ["sentence,label"]
    for i in range(max(examples, 8)):
        words = [WORDS[int(j)] for j in torch.randint(len(WORDS), (126,), generator=g)]
        rows.append(f"{' '.join(words)},{i % 2}")
    (root / "task").mkdir()
    (root / "task" / "dev.csv").write_text("\n".join(rows) + "\n")
    (root / "task" / "train.csv").write_text("\n".join(rows) + "\n")
    task = root / "task" / "task.yaml"
    task.write_text("name: long-texts\nkind: classification\nfiles: {train: train.csv, validation: dev.csv}\n"
                    "text: [sentence]\nlabel: label\nlabels: [0, 1]\nmetric: accuracy\n")
    return model_dir, task


def interactive_seconds(page: Path, repeats: int) -> tuple[float, dict]:
    """Best of ``repeats`` headless loads: seconds from navigation start to a filled detail panel."""
    probe = page.with_name(f".bench-{page.name}")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    best, last = float("inf"), {}
    try:
        for _ in range(repeats):
            # a fresh profile each time (no cache), a real clock (no virtual time budget)
            dom = _run_browser(["--window-size=1280,1000", "--dump-dom", probe.resolve().as_uri()], timeout=120)
            m = re.search(r'<pre id="hc-bench">(.*?)</pre>', dom, re.S)
            if not m:
                raise RuntimeError(f"the probe did not run; the page starts: {dom[:300]!r}")
            last = json.loads(m.group(1).replace("&quot;", '"'))
            if last.get("exception") or last.get("ready") != "1":
                raise RuntimeError(f"the page did not work: {last}")
            best = min(best, last["ms"] / 1000)
    finally:
        probe.unlink()
    return best, last


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 layers x 4 heads, 4 examples")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu", help="where the attention maps are computed")
    args = p.parse_args(argv)
    if chromium() is None:
        print("skipped: no Chromium ($HEADCOUNT_CHROMIUM, or chromium on PATH: apt-get install chromium)")
        return 0
    import headcount as hc

    layers, heads, hidden, examples = (2, 4, 64, 4) if args.quick else (12, 12, 768, 16)
    with tempfile.TemporaryDirectory(prefix="hc-bench-explore-") as tmp:
        root = Path(tmp)
        model, task = build(root, layers, heads, hidden, examples)
        t = time.perf_counter()
        explorer = hc.explore(model=str(model), task=str(task), examples=examples, device=args.device)
        full = explorer.save(root / "full.html")
        built = time.perf_counter() - t
        # the baseline: the same page without its attention examples
        from headcount.experiments.explorer.page import render

        (root / "base.html").write_text(render({**explorer.page, "attention": None}), encoding="utf-8")
        mb = full.stat().st_size / 1e6
        t_full, probe = interactive_seconds(full, args.repeats)
        t_base, _ = interactive_seconds(root / "base.html", args.repeats)
    print(f"model {layers} x {heads} heads, {examples} examples of 128 tokens; page built in {built:.1f} s")
    print(f"page size {mb:.2f} MB (target <= {SIZE_TARGET_MB:g} MB): {'ok' if mb <= SIZE_TARGET_MB else 'OVER'}")
    print(f"interactive in {t_full:.2f} s (best of {args.repeats}; baseline page without attention "
          f"{t_base:.2f} s; target <= {TIME_TARGET_S:g} s): {'ok' if t_full <= TIME_TARGET_S else 'OVER'}; "
          f"{probe['lines']} attention lines drawn for the clicked head")
    print(f"ratio interactive full / baseline: {t_full / t_base:.2f}")
    return 0 if mb <= SIZE_TARGET_MB and t_full <= TIME_TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
