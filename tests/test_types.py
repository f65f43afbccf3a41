"""The library type-checks: ``mypy envfactory/`` (configured by ``[tool.mypy]`` in pyproject.toml)
finds no error. Under CI=true a missing mypy is a failure (the dev extra installs it)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import require_module

ROOT = Path(__file__).resolve().parents[1]
# mypy's incremental cache, outside the repository; a warm cache makes a rerun take seconds
CACHE = Path(tempfile.gettempdir()) / "envfactory-mypy-cache"


def _mypy(*args: str) -> subprocess.CompletedProcess:
    require_module("mypy", "pip install mypy; scripts/setup.sh installs the dev extra")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(CACHE), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_mypy_finds_no_error_in_the_library() -> None:
    r = _mypy("envfactory")
    assert r.returncode == 0, f"mypy envfactory/ found errors:\n{r.stdout[-6000:]}{r.stderr[-2000:]}"
    assert "Success: no issues found" in r.stdout


def test_the_configured_checker_reports_an_unchecked_optional(tmp_path: Path) -> None:
    # the same configuration catches the kind of error the library was cleaned of
    bad = tmp_path / "bad.py"
    bad.write_text("def first(xs: list[str] | None) -> str:\n    return xs[0]\n")
    r = _mypy(str(bad))
    assert r.returncode == 1 and "[index]" in r.stdout, r.stdout + r.stderr
