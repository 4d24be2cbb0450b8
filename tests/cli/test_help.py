"""``headcount --help`` imports no command module: not torch, scipy nor transformers (seconds of
CPU on every start), and lists the same commands and help as the fully loaded command line."""

from __future__ import annotations

import os
import subprocess
import sys

import typer.main

from headcount.cli.commands import COMMANDS


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


HELP = ("import sys\nfrom headcount.cli.entry import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n")


def test_top_level_help_leaves_torch_and_scipy_unimported():
    p = _run(HELP + "print('heavy:', sorted(m for m in ('torch', 'scipy', 'transformers') if m in sys.modules))")
    assert p.returncode == 0, p.stderr
    assert "heavy: []" in p.stdout, p.stdout[-500:]
    assert "score" in p.stdout and "kv-budget" in p.stdout


def test_lazy_help_is_the_help_of_every_command_loaded():
    lazy = _run(HELP)
    eager = _run("import headcount.cli.app as a\na.app\n" + HELP)  # every module registered first
    assert lazy.returncode == eager.returncode == 0, lazy.stderr + eager.stderr
    assert lazy.stdout == eager.stdout


def test_the_command_table_matches_the_registered_commands():
    from headcount.cli.app import app  # every command module loaded

    group = typer.main.get_group(app)
    assert list(group.commands) == list(COMMANDS)
    for name, (_, text) in COMMANDS.items():
        real = group.commands[name]
        assert (real.help or "").strip().split("\n\n")[0].replace("\n", " ") == text, name
