"""Running the ``headcount`` CLI from tests (in-process, or a process killed at a chosen moment), and
checking its one-line errors and mask files."""

from __future__ import annotations

import json
import os
import signal
import time
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


def sigkill_when(proc, path: Path, *, within: float, what: str, settle: float = 0.0) -> None:
    """SIGKILL ``proc`` (a ``subprocess.Popen`` with ``stderr=PIPE``) once ``path`` exists, ``settle``
    seconds after it appears; fails if the process ends first (with its stderr's tail) or ``path``
    takes longer than ``within`` seconds (``what`` says what never happened). The process is reaped
    whatever happens."""
    try:
        deadline = time.time() + within  # only stops a hung process: a busy machine may take minutes
        while not path.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.time() < deadline, what
            time.sleep(0.05)
        time.sleep(settle)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
