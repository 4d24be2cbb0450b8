"""The layer contract in ``pyproject.toml`` ([tool.importlinter]) holds: each package imports only
the packages below it, and the modules of no package import each other in a cycle (import-linter
reads every import, those inside functions included; ``if TYPE_CHECKING:`` ones left out).

The contract is also shown to catch what it forbids: a copy of the package with one upward import
or one cycle fails it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
PACKAGE = ROOT / "src" / "headcount"

#: the top level a newcomer sees: nine layer packages (and the package's own files)
LAYERS = {"cli", "experiments", "train", "analysis", "kv", "importance", "data", "core", "runtime"}


def lint(src: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the package under ``src`` with the project's contracts (no cache)."""
    config = tmp_path / "contracts.toml"
    config.write_text(PYPROJECT.read_text(encoding="utf-8"), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(sys.argv[1], no_cache=True))"
    return subprocess.run([sys.executable, "-c", code, str(config)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_package_keeps_its_layer_contract(tmp_path):
    result = lint(PACKAGE.parent, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize("where, line, broken", [
    ("runtime/errors.py", "import headcount.cli.app", "packages import only the layers below them"),
    ("experiments/runner/store.py", "from headcount.experiments.report import build", "inside experiments"),
    ("core/arch/base.py", "from headcount.core import gates", "no import cycles"),
])
def test_the_contract_catches_an_upward_import_and_a_cycle(tmp_path, where, line, broken):
    copy = tmp_path / "src" / "headcount"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / where
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _late():\n    {line}\n", encoding="utf-8")
    result = lint(copy.parent, tmp_path)
    assert result.returncode != 0
    assert broken in result.stdout and "BROKEN" in result.stdout, result.stdout


def test_the_top_level_is_the_layers():
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert entries == LAYERS | {"__init__.py", "__main__.py", "py.typed"}
    for name in LAYERS:  # each says what it holds and what it may import
        doc = (PACKAGE / name / "__init__.py").read_text(encoding="utf-8")
        assert doc.startswith('"""') and "May import" in doc, name


def test_no_source_file_over_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, long


def test_the_runner_finds_study_types_by_registration_not_by_name():
    """The runner knows no study by name: study types register (the imports are the contract's)."""
    registry = (PACKAGE / "experiments" / "runner" / "registry.py").read_text(encoding="utf-8")
    assert "headcount.experiments.studies." not in registry
