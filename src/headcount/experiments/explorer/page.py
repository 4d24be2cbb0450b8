"""The explorer page: one self-contained HTML file (inline style, script and data; nothing is
fetched, so it opens from disk with the network off).

The page model ([`data`][headcount.experiments.explorer.data]) travels as JSON in ``<script type="application/json"
id="hc-data">`` (``<``, ``>`` and ``&`` escaped as ``\\u003c``...: no text of the data can end the
tag); [`page_data`][headcount.experiments.explorer.page.page_data] reads it back. The second line of the file marks it as headcount's
([`marker`][headcount.experiments.explorer.page.marker]): a later run replaces only a file that carries it.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources

MARKER = "<!-- headcount explore "
_MARKER = re.compile(r"\A<!DOCTYPE html>\n<!-- headcount explore (\{.*?\}) -->\n")
_DATA = re.compile(r'<script type="application/json" id="hc-data">(.*?)</script>', re.DOTALL)

# The page's script (the grids, the scatter, the detail panel: it reads the page model from the
# hc-data tag and builds everything else) and its style are package files, inlined at write time.
_ASSETS = resources.files("headcount.experiments.explorer")
SCRIPT = _ASSETS.joinpath("explorer.js").read_text(encoding="utf-8")
STYLE = _ASSETS.joinpath("explorer.css").read_text(encoding="utf-8")

BODY = """<header>
<h1>{title}</h1>
<p class="sub">{subtitle}</p>
{notes}
</header>
<noscript><p>This page needs JavaScript (inline, nothing is fetched) to draw the grids.</p></noscript>
<main>
<div class="row">
  <section class="panel" aria-labelledby="qa-label">
    <label class="pick" id="qa-label">Quantity (x axis of the scatter)<select id="qa"></select></label>
    <div class="grid" id="grid-a" role="group" aria-label="heads by layer, coloured by the x quantity: arrow keys move, Enter or Space selects"></div>
    <div class="legend" id="legend-a"></div>
  </section>
  <section class="panel" aria-labelledby="qb-label">
    <label class="pick" id="qb-label">Quantity (y axis of the scatter)<select id="qb"></select></label>
    <div class="grid" id="grid-b" role="group" aria-label="heads by layer, coloured by the y quantity: arrow keys move, Enter or Space selects"></div>
    <div class="legend" id="legend-b"></div>
  </section>
  <section class="panel scatter" aria-label="scatter of the two quantities">
    <svg id="scatter" width="340" height="340" role="img" aria-label="scatter: one point per head"></svg>
    <p id="scatter-info"></p><p id="marked-info" aria-live="polite"></p>
  </section>
</div>
<section id="detail" class="panel" aria-live="polite">
  <h2 id="detail-title">Select a head (click a cell, or Tab to a grid, arrow keys and Enter)</h2>
  <table id="detail-table" hidden><thead><tr><th>quantity</th><th>value</th><th>rank</th></tr></thead><tbody></tbody></table>
  <p id="attn-label"></p>
  <label>Example <select id="ex"></select></label> <span id="attn-info"></span>
  <div class="row" id="views" hidden style="margin-top:8px">
    <div class="scroll"><svg id="lines" width="360" height="10" role="img" aria-label="attention lines: queries on the left, keys on the right"></svg></div>
    <figure><canvas id="heat" width="1" height="1" aria-label="attention heat map: rows are queries, columns keys"></canvas>
      <figcaption id="heat-info"></figcaption></figure>
  </div>
</section>
</main>"""


def _json_for_script(obj) -> str:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(page: dict, identity: str | None = None) -> str:
    """The HTML of a page model (``identity``: a short digest of what produced it, in the marker line)."""
    src = page.get("source", {})
    if src.get("kind") == "run":
        subtitle = f"Run directory {src.get('run')} ({src.get('study')} study)"
    else:
        task = src.get("task")
        subtitle = f"Model {src.get('model')} on " + (f"task {task}" if task else "your texts (no task)")
    subtitle += f"; {page['layers']} layers x {page['heads']} heads, {len(page['quantities'])} quantities."
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in page.get("notes", []))
    body = BODY.format(title=html.escape(page["title"]), subtitle=html.escape(subtitle),
                       notes=f'<ul class="notes">{notes}</ul>' if notes else "")
    cell = 22 if page["heads"] <= 16 else 16
    mark = json.dumps({"identity": identity or "", "format": page.get("format")})
    return (f"<!DOCTYPE html>\n{MARKER}{mark} -->\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<meta name=\"generator\" content=\"headcount explore\">\n"
            f"<title>{html.escape(page['title'])} - headcount explorer</title>\n"
            f"<style>{STYLE}:root {{ --cell: {cell}px; }}</style>\n</head>\n<body>\n{body}\n"
            f"<script type=\"application/json\" id=\"hc-data\">{_json_for_script(page)}</script>\n"
            f"<script>{SCRIPT}</script>\n</body>\n</html>\n")


def marker(head: str | bytes) -> dict | None:
    """The marker of an explorer page (from its first bytes), None for any other file."""
    if isinstance(head, bytes):
        head = head.decode("utf-8", errors="replace")
    m = _MARKER.match(head)
    if m is None:
        return None
    try:
        data = json.loads(m.group(1))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def page_data(text: str) -> dict:
    """The page model inside an explorer page's HTML (what the tests check)."""
    m = _DATA.search(text)
    if m is None:
        raise ValueError("no page data in this HTML")
    return json.loads(m.group(1))
