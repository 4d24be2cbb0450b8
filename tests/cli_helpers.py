"""Running the ``headcount`` CLI in-process from tests."""

from __future__ import annotations

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
