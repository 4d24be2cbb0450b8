"""Headless Chromium for the page tests (and bench/bench_explore.py): find it, open a page, read what
the page shows (figures loaded, overflow, cells)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

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
