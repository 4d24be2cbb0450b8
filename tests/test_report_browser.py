"""report.html in a real headless browser (Chromium): every figure loads, nothing overflows a
1280 px window, no cell reads None, the main tables fit without scrolling.

Skipped only when no Chromium is installed (CI installs the Debian package: .ci/run). The page
is opened as a copy with a small script that measures it after the load event and writes the
measurements into the DOM, which ``chromium --headless --dump-dom`` prints.

Run as a script to take a screenshot of the top of a report (docs/report-top.png):

    python tests/test_report_browser.py runs/demo/report.html docs/report-top.png
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

WIDTH = 1280

# Flags for a quiet, offline, throw-away browser (no sandbox: CI runs as root).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars", "--mute-audio"]

# Measures the page after it loaded: images, page width (raw tables folded and unfolded), cells,
# shown tables wider than their box. Written as JSON into <pre id="hc-check">.
PROBE = """<script>
window.addEventListener("load", function () {
  var doc = document.documentElement;
  var imgs = Array.from(document.images);
  var r = {images: imgs.length, innerWidth: window.innerWidth,
           broken: imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                       .map(function (i) { return i.alt; }),
           scrollWidth: doc.scrollWidth};
  r.bad_cells = Array.from(document.querySelectorAll("td, th"))
      .map(function (c) { return c.textContent.trim(); })
      .filter(function (t) { return ["None", "nan", "NaN", "<NA>", "NaT"].indexOf(t) >= 0; });
  r.scrolling_tables = Array.from(document.querySelectorAll("div.table"))
      .filter(function (d) { return d.closest("details") === null && d.scrollWidth > d.clientWidth + 1; })
      .map(function (d) { return d.id; });
  document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  r.details = document.querySelectorAll("details").length;
  r.scrollWidth_unfolded = doc.scrollWidth;
  var pre = document.createElement("pre"); pre.id = "hc-check"; pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    """The Chromium executable: $HEADCOUNT_CHROMIUM, else chromium / chromium-browser / google-chrome on PATH."""
    env = os.environ.get("HEADCOUNT_CHROMIUM")
    if env:
        return env
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _run_browser(args: list[str], timeout: float = 90) -> str:
    exe = chromium()
    with tempfile.TemporaryDirectory(prefix="hc-chromium-") as profile:
        proc = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


def inspect(page: Path, width: int = WIDTH) -> dict:
    """Open ``page`` (with :data:`PROBE` added) in a ``width`` px window; the probe's measurements."""
    page = Path(page)
    probe = page.with_name(f".probe-{page.name}")  # beside the page: relative links resolve alike
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        dom = _run_browser([f"--window-size={width},1000", "--virtual-time-budget=10000", "--dump-dom",
                            probe.resolve().as_uri()])
    finally:
        probe.unlink()
    m = re.search(r'<pre id="hc-check">(.*?)</pre>', dom, re.S)
    assert m, f"the probe did not run; page starts: {dom[:300]!r}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


def screenshot(page: Path, out: Path, width: int = WIDTH, height: int = 1000) -> Path:
    """A PNG of the top ``width`` x ``height`` px of ``page``."""
    out = Path(out).resolve()
    _run_browser([f"--window-size={width},{height}", "--virtual-time-budget=10000", f"--screenshot={out}",
                  Path(page).resolve().as_uri()])
    return out


needs_chromium = pytest.mark.skipif(chromium() is None, reason="no Chromium installed (apt-get install chromium)")


# --- report pages to open ----------------------------------------------------------------------
def _wide_report(store, config):
    """A report as wide as the studies' own: a 12-column main table of mean ± std [CI] cells with
    missing values, a long unbreakable label, a figure, a folded 20 x 20 raw table with None cells."""
    import numpy as np
    import pandas as pd

    from headcount.experiments.report import ReportContent, ReportTable, Section, new_figure
    from headcount.experiments.report.format import seed_cell

    stats = ["Spearman", "Kendall", "top-10% Jaccard (chance 0.05)", "top-25% Jaccard (chance 0.14)",
             "top-50% Jaccard (chance 0.33)", "layer-mass L1", "Spearman, layer-normalised",
             "Spearman p within-layer (max)", "Spearman p global (max)"]
    rows = []
    for i, comparison in enumerate(["MLM vs task (fine-tuned)", "MLM vs task (frozen encoder)",
                                    "Task importance before vs after fine-tuning", "Seed vs seed (same task)"]):
        row = {"comparison": comparison, "task": "offline/tweets-with-a-rather-long-unbreakable-task-name-0123456789",
               "pairs": i + 1}
        for j, s in enumerate(stats):
            row[s] = seed_cell(0.1 * j, 0.02, 0.05, 0.4, n=1 if j == 2 else 2, n_total=2) if (i + j) % 5 else None
        rows.append(row)
    raw = pd.DataFrame({f"column_with_a_long_name_{k}": [None if (r + k) % 7 == 0 else r * k * 1.2345678
                                                         for r in range(20)] for k in range(20)})
    raw["job"] = [f"transfer/mlm-scores/offline-tweets/seed-{r}/a-long-job-directory-name" for r in range(20)]
    raw["flag"] = pd.array([None, True] * 10, dtype=object)
    fig, ax = new_figure(size=(9, 4))
    ax.imshow(np.arange(72).reshape(6, 12))
    return ReportContent(summary="A page as wide as the studies' reports. " * 8, sections=[
        Section("Main results", "The main table first.", tables=[
            ReportTable("main_wide", pd.DataFrame(rows), caption="A wide main table: mean ± std [low, high]."),
            ReportTable("main_small", pd.DataFrame({"task": ["a", "b"], "score": [0.5, float("nan")]}))]),
        Section("Figures and raw tables", "A figure, then the raw table, folded.", figures={"grid": fig},
                tables=[ReportTable("raw_wide", raw, caption="Every value.", collapsed=True, max_rows=20)]),
    ])


def _wide_expand(config):
    from headcount.experiments.runner import Job

    return [Job("one", "toy", "toy_study:make", {"label": "one", "value": 1, "steps": 2, "seed": 0})]


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """report.html of the toy study (tests/toy_study.py) and of a study with a wide report."""
    import toy_study  # noqa: F401  (registers the toy study type)

    from headcount.experiments import run_study
    from headcount.experiments.runner import StudyConfig, register_study

    class WideConfig(StudyConfig):
        pass

    register_study("browser-wide", WideConfig, _wide_expand, _wide_report, replace=True)
    tmp = tmp_path_factory.mktemp("browser")
    (tmp / "toy.yaml").write_text("study: toy_study:toy\nname: toy\nvalues: [1, 2, 3]\nsteps: 4\n")
    (tmp / "wide.yaml").write_text("study: browser-wide\nname: a wide report\n")
    out = {}
    for name in ("toy", "wide"):
        summary = run_study(tmp / f"{name}.yaml", tmp / name, quiet=True)
        assert summary.report is not None
        out[name] = summary.report
    return out


# --- tests ---------------------------------------------------------------------------------------
@needs_chromium
def test_the_probe_sees_a_broken_figure_an_overflow_and_none_cells(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><img alt="broken" src="data:image/png;base64,AAAA">'
                    '<div style="width:2000px">wide</div><table><tr><td>None</td><td>0.5</td></tr></table>'
                    '</body></html>')
    r = inspect(page)
    assert r["broken"] == ["broken"] and r["scrollWidth"] > WIDTH and r["bad_cells"] == ["None"]


@needs_chromium
@pytest.mark.parametrize("name", ["toy", "wide"])
def test_every_figure_loads_and_the_page_fits_1280_px(pages, name):
    r = inspect(pages[name])
    assert r["innerWidth"] == WIDTH
    assert r["images"] >= 1 and r["broken"] == [], r
    assert r["scrollWidth"] <= WIDTH, r  # no horizontal overflow of the page
    assert r["scrollWidth_unfolded"] <= WIDTH, r  # nor with every raw table unfolded (they scroll in their box)
    assert r["bad_cells"] == [], r
    assert r["scrolling_tables"] == [], r  # the shown tables wrap to the page instead of scrolling
    if name == "wide":
        assert r["details"] >= 1


@needs_chromium
def test_a_screenshot_of_the_top_of_the_report(pages, tmp_path):
    from PIL import Image

    png = screenshot(pages["wide"], tmp_path / "top.png", height=800)
    with Image.open(png) as im:
        assert im.size == (WIDTH, 800)
        colours = im.convert("L").getextrema()
    assert colours[0] < 100 and colours[1] > 200  # text on a light page, not a blank image


def test_chromium_is_found_where_ci_installs_it():
    # CI (.ci/run) installs the Debian package; there the browser tests above must run, not skip.
    if os.environ.get("CI") and chromium() is None:
        pytest.fail("CI has no Chromium: .ci/run should install it (apt-get install chromium)")


if __name__ == "__main__":  # python tests/test_report_browser.py REPORT.html OUT.png
    if len(sys.argv) != 3 or chromium() is None:
        sys.exit("usage: python tests/test_report_browser.py REPORT.html OUT.png (needs chromium)")
    print(screenshot(Path(sys.argv[1]), Path(sys.argv[2]), height=1150))  # the summary and the first table
