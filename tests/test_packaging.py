"""Every file the package reads at run time ships in the wheel: each non-Python file under
``src/headcount`` matches a ``[tool.setuptools.package-data]`` pattern of ``pyproject.toml``
(an editable install finds a file the wheel would lack, so only this check catches it)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "headcount"


def _patterns() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-data"]["headcount"]


def test_every_data_file_is_package_data():
    patterns = _patterns()
    data = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert any(name.endswith(".js") for name in data)  # the explorer's script is among them
    missing = [name for name in data if not any(fnmatch.fnmatch(name, pat) for pat in patterns)]
    assert missing == []

