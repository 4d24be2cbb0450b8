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
    for page in ("index.html", "promises.html", "lottery.html", "transfer.html",
                 "design.html", "extending.html", "reference/api.html"):
        assert (site / page).is_file(), page
    # the README's command table is included into the start page: no link there may point into docs/
    assert 'href="docs/' not in (site / "index.html").read_text(encoding="utf-8")
    api = (site / "reference/api.html").read_text(encoding="utf-8")
    assert "load_pruned" in api and "permutation" in (site / "statistics.html").read_text(encoding="utf-8")


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if "assets" not in p.relative_to(site).parts)


def _text(html: str) -> str:
    """What a reader sees of a page: its text without scripts, styles and tags."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.DOTALL)
    return re.sub(r"<[^>]+>", "", html)


# a reST role left raw (:func:`x` rendered as text) or an escaped pipe shown with its backslash
RAW = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj|py:\w+):|\\\|")


def test_no_raw_roles_or_escapes_in_any_page(site):
    bad = {p.relative_to(site).as_posix(): RAW.findall(_text(p.read_text(encoding="utf-8")))
           for p in _pages(site)}
    bad = {page: found for page, found in bad.items() if found}
    assert not bad, bad
    assert RAW.search(_text("<p>see :func:`score` and <code>a\\|b</code></p>"))  # the check can fail


def test_the_reference_covers_the_top_level_api_and_adapters(site):
    api = (site / "reference/api.html").read_text(encoding="utf-8")
    for name in ("load_model", "load_tokenizer", "get_task", "score", "iterative_prune", "shrink", "save_pruned",
                 "load_pruned", "finetune", "export_onnx", "export_hf", "explore", "run_study", "Adapter", "Block",
                 "register_adapter"):
        assert f'id="headcount.' in api and re.search(rf'id="headcount\.[\w.]*\b{name}"', api), name


def test_the_site_navigates_from_disk(site):
    """use_directory_urls is off: every link between pages names an .html file that exists, so the
    site opened from disk (file://, no server to map page/ to page/index.html) navigates."""
    checked = 0
    for page in _pages(site):
        if page.name == "404.html":  # only a web server shows it (its links are absolute by design)
            continue
        for href in re.findall(r'href="([^"#:?]+)(?:#[^"]*)?"', page.read_text(encoding="utf-8")):
            if href.endswith((".css", ".js", ".png", ".svg", ".ico", ".xml", ".json", ".gz")):
                continue
            target = (page.parent / href).resolve()
            assert target.is_file() and target.suffix == ".html", (page.relative_to(site), href)
            checked += 1
    assert checked > 100


def test_getting_started_lists_every_command(site):
    import typer

    from headcount.cli.app import app

    text = _text((site / "getting-started.html").read_text(encoding="utf-8"))
    root = typer.main.get_command(app)
    names = [name for name, cmd in root.commands.items() if not hasattr(cmd, "commands")]
    names += [f"{name} {sub}" for name, cmd in root.commands.items() for sub in getattr(cmd, "commands", {})]
    missing = [name for name in names if f"headcount {name}" not in text]
    assert len(names) >= 15 and missing == []


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
