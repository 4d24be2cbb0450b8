"""Reading a docs page's fenced code blocks, for the tests that run a page as it is written
(tests/test_your_data_page.py, tests/test_decoder_walkthrough.py)."""

from __future__ import annotations

import re


def code_blocks(text: str) -> list[tuple[str, str, str]]:
    """``(language, title, body)`` of each fenced block, in order (``title=""`` when untitled).

    >>> code_blocks('text\\n```yaml title="a.yaml"\\nk: 1\\n```\\n')
    [('yaml', 'a.yaml', 'k: 1\\n')]
    """
    out = []
    for m in re.finditer(r"^```(\w*)([^\n]*)\n(.*?)^```\s*$", text, flags=re.M | re.S):
        title = re.search(r'title="([^"]+)"', m.group(2))
        out.append((m.group(1), title.group(1) if title else "", m.group(3)))
    return out
