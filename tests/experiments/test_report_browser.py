"""report.html in a real headless browser (Chromium): every figure loads, nothing overflows a
1280 px window, no cell reads None, the main tables fit without scrolling.

Skipped only when no Chromium is installed (CI installs the Debian package: .ci/run). The page
is opened as a copy with a small script that measures it after the load event and writes the
measurements into the DOM, which ``chromium --headless --dump-dom`` prints.

Run as a script to take a screenshot of the top of a report (docs/report-top.png):

    python tests/experiments/test_report_browser.py runs/demo/report.html docs/report-top.png
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from browser_helpers import WIDTH, chromium, inspect, screenshot

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


def _glance_report(store, config):
    """A report that opens like the demo's: a notice, a caveat, a headline figure beside a 14-row
    glance table, a long summary, then the sections."""
    import numpy as np
    import pandas as pd

    from headcount.experiments.report import ReportContent, ReportTable, Section, new_figure

    fig, ax = new_figure(size=(4.5, 4.2))
    ax.bar(range(8), np.linspace(0.5, 0.9, 8))
    ax.set_xticks(range(8), [f"experiment {i}" for i in range(8)], rotation=60)
    rows = [{"quantity": f"transfer: a quantity with a name of some length {i}†", "task": "tweets",
             "this run": "0.31 [0.20, 0.40]", "paper": ""} for i in range(5)]
    rows += [{"quantity": f"lottery: subnetwork {i}, retrained", "task": "tweets", "this run": "0.81 ± 0.02",
              "paper": "0.87 (SST-2)"} for i in range(9)]
    caveat = "† MLM head fitted on the frozen encoder, held-out masked-token accuracy 0.09 (tweets): read with care."
    return ReportContent(
        summary="Masked LM of the pre-trained model†: a sentence of numbers with intervals. " * 30,
        notice="**These numbers illustrate the pipeline only.** Cite nothing.", caveats=[caveat, caveat],
        glance=ReportTable("glance", pd.DataFrame(rows), caption="This run's main numbers beside the paper's."),
        headline="scores",
        sections=[Section("Main results", tables={"main": pd.DataFrame({"task": ["a"], "score": [0.5]})}),
                  Section("Figures", figures={"scores": fig})])


#: Measures the top of a report: where the headline figure and the glance table end, how often
#: the caveat is said.
TOP_PROBE = """<script>
window.addEventListener("load", function () {
  function bottom(sel) { var e = document.querySelector(sel); return e ? e.getBoundingClientRect().bottom : null; }
  var r = {figure: bottom("#glance figure img"), table: bottom("#glance table"), caveats: bottom("#caveats"),
           summary_top: document.querySelector("#summary") ? document.querySelector("#summary").getBoundingClientRect().top : null,
           caveat_count: document.body.innerText.split("MLM head fitted on the frozen encoder").length - 1,
           height: window.innerHeight};
  var pre = document.createElement("pre"); pre.id = "hc-top"; pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});
</script>"""


def _wide_expand(config):
    from headcount.experiments.runner import Job

    return [Job("one", "toy", "toy_study:make", {"label": "one", "value": 1, "steps": 2, "seed": 0})]


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """report.html of the toy study (tests/toy_study.py) and of a study with a wide report."""
    from headcount.experiments import run_study
    from headcount.experiments.runner import StudyConfig, register_study

    import toy_study  # noqa: F401  (registers the toy study type)

    class WideConfig(StudyConfig):
        pass

    register_study("browser-wide", WideConfig, _wide_expand, _wide_report, replace=True)
    register_study("browser-glance", WideConfig, _wide_expand, _glance_report, replace=True)
    tmp = tmp_path_factory.mktemp("browser")
    (tmp / "toy.yaml").write_text("study: toy_study:toy\nname: toy\nvalues: [1, 2, 3]\nsteps: 4\n")
    (tmp / "wide.yaml").write_text("study: browser-wide\nname: a wide report\n")
    (tmp / "glance.yaml").write_text("study: browser-glance\nname: headcount demo (quick profile)\n")
    out = {}
    for name in ("toy", "wide", "glance"):
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
def test_the_first_screen_holds_the_headline_figure_the_glance_table_and_the_caveat_once(pages):
    """At 1280 x 800 a reader sees the notice and caveat box, the headline figure and the whole glance
    table before scrolling; the caveat is said once (the summary marks it with †); the wording comes after."""
    import json
    import re

    from browser_helpers import _run_browser

    page = pages["glance"]
    probe = page.with_name(".probe-top.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", TOP_PROBE + "</body>"), encoding="utf-8")
    try:
        dom = _run_browser([f"--window-size={WIDTH},800", "--virtual-time-budget=10000", "--dump-dom",
                            probe.resolve().as_uri()])
    finally:
        probe.unlink()
    r = json.loads(re.search(r'<pre id="hc-top">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))
    # a viewport of 1280 x 800 (the screenshot's; headless Chromium's window of 800 reports a shorter innerHeight)
    assert r["figure"] is not None and r["figure"] <= 800, r  # the headline figure, whole, on the first screen
    assert r["table"] is not None and r["table"] <= 800, r  # and the glance table
    assert r["caveats"] < r["figure"] and r["caveat_count"] == 1, r  # the caveat box first, the caveat once
    assert r["summary_top"] >= max(r["figure"], r["table"]), r  # the statistics' wording after
    assert inspect(page)["scrollWidth"] <= WIDTH


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


if __name__ == "__main__":  # python tests/experiments/test_report_browser.py REPORT.html OUT.png
    if len(sys.argv) != 3 or chromium() is None:
        sys.exit("usage: python tests/experiments/test_report_browser.py REPORT.html OUT.png (needs chromium)")
    print(screenshot(Path(sys.argv[1]), Path(sys.argv[2]), height=1150))  # the summary and the first table
