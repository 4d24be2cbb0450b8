"""The documentation site: MkDocs builds it with ``--strict`` (no broken link, anchor or API
reference), and its start page opens in headless Chromium with its command table and no broken
image. README stays the short entry point (at most 300 lines) and links only to pages that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import chromium, inspect

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr[-3000:]
    return out


def test_the_site_builds_strictly_with_every_page(site):
    for page in ("index.html", "promises/index.html", "lottery/index.html", "transfer/index.html",
                 "design/index.html", "extending/index.html", "reference/api/index.html"):
        assert (site / page).is_file(), page
    # the README's command table is included into the start page: no link there may point into docs/
    assert 'href="docs/' not in (site / "index.html").read_text(encoding="utf-8")
    api = (site / "reference/api/index.html").read_text(encoding="utf-8")
    assert "load_pruned" in api and "permutation" in (site / "statistics/index.html").read_text(encoding="utf-8")


@pytest.mark.skipif(chromium() is None, reason="no Chromium installed (apt-get install chromium)")
def test_the_start_page_opens_in_a_browser(site):
    r = inspect(site / "index.html")
    assert r["broken"] == [] and r["scrollWidth"] <= r["innerWidth"] + 1, r
    html = (site / "index.html").read_text(encoding="utf-8")
    assert "headcount score --model M --task T --out DIR" in html  # the command table, included from README


def test_the_readme_is_short_and_links_to_pages_that_exist():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert text.splitlines()[2].strip().startswith("make demo") and text.splitlines()[3].strip().startswith("make test")
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / target).is_file(), target
