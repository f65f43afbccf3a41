"""One prefix for environment variables (``ENVFACTORY_``), each documented in docs/environment.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what ships or runs: the library, its plug-ins, the scripts (the container server and image recipe
# are in envfactory/runtime/)
CODE = ("envfactory", "environments", "tools", "agents", "benchmarks", "scripts", "examples")
SOURCES = (".py", ".sh", ".toml", ".yaml", ".yml", ".cfg", ".txt", "Dockerfile")
OLD = re.compile(r"\bENVF_(?!ACTORY_)[A-Z0-9_]*")
NAME = re.compile(r"\bENVFACTORY_[A-Z0-9_]*[A-Z0-9]")


def _files(folders: tuple[str, ...]) -> list[Path]:
    out = []
    for folder in folders:
        out += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.name.endswith(SOURCES)
                and "__pycache__" not in p.parts]
    return out


def _found(pattern: re.Pattern[str], files: list[Path]) -> dict[str, set[str]]:
    """``{name: {file, ...}}`` of every match of ``pattern`` in ``files``."""
    out: dict[str, set[str]] = {}
    for p in files:
        for m in pattern.findall(p.read_text(errors="replace")):
            out.setdefault(m, set()).add(str(p.relative_to(ROOT)))
    return out


def test_no_variable_uses_the_old_prefix():
    old = _found(OLD, _files(CODE + ("tests",)) + [ROOT / "pyproject.toml"])
    assert not old, f"rename to ENVFACTORY_... (the one prefix): {old}"


def test_every_variable_the_code_reads_is_documented():
    used = _found(NAME, _files(CODE))
    doc = set(NAME.findall((ROOT / "docs" / "environment.md").read_text()))
    missing = {n: sorted(f) for n, f in used.items() if n not in doc}
    assert not missing, f"document these in docs/environment.md (what each does, its default): {missing}"
    stale = doc - set(used)
    assert not stale, f"docs/environment.md lists variables no code reads any more: {sorted(stale)}"
    assert len(used) >= 20  # the scan sees the code (a wrong ROOT or pattern would find nothing)


def test_the_checks_see_a_stray_name():
    """The patterns catch what they are for and nothing else."""
    stray = "ENVF" + "_SOCKET"  # spelled in two halves, or this file would fail the check above
    assert OLD.findall(f'os.environ.get("{stray}") ENVFACTORY_SOCKET envf_x') == [stray]
    assert NAME.findall("`ENVFACTORY_CACHE`/models, $ENVFACTORY_DOCKER_HOSTS.") == ["ENVFACTORY_CACHE",
                                                                                     "ENVFACTORY_DOCKER_HOSTS"]
