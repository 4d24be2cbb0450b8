"""Running the ``headcount`` CLI in-process from tests, and checking its one-line errors and mask files."""

from __future__ import annotations

import json
from pathlib import Path

from headcount.cli.app import main


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``headcount ARGV`` in-process: (exit status, stdout, stderr); what fixtures printed before is dropped."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code or 0, out, err


def assert_one_error_line(code, err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


def write_mask(path: Path, heads, mlps) -> Path:
    path.write_text(json.dumps({"heads": heads, "mlps": mlps}))
    return path
