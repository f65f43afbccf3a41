"""Environments declared in spec files (environments/specs/*.yaml and specs/composed/*.yaml),
built with specs_from_file: each file's own environment, its ``variants``, and composed files
(several services in one environment).

One module per file: ``environments.spec_envs.<file>`` (``composed_<file>`` for composed
files) registers that file's environments when imported, so using one spec environment
builds one file's, not the hundred others (this module makes those names importable; it
registers nothing itself). ``import_all()`` registers every file. A broken spec file is
reported as a warning naming the file and the problem; it does not hide the other environments.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from pathlib import Path
from typing import Any

SPEC_DIR = Path(__file__).parent / "specs"
COMPOSED = "composed_"

__path__: list[str] = []  # a package of virtual modules, one per spec file (found by _SpecFinder)


def files() -> dict[str, Path]:
    """``{module suffix: spec file}`` for every spec file, composed ones included."""
    out = {p.stem: p for p in sorted(SPEC_DIR.glob("*.yaml"))}
    out.update({COMPOSED + p.stem: p for p in sorted((SPEC_DIR / "composed").glob("*.yaml"))})
    return out


def module_for(path: Path) -> str:
    return f"{__name__}.{COMPOSED if path.parent.name == 'composed' else ''}{path.stem}"


class _SpecFileLoader(importlib.abc.Loader):
    def __init__(self, path: Path) -> None:
        self.path = path

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        from envfactory import register
        from envfactory.factory.from_spec import specs_from_file

        module.__file__ = str(self.path)
        module.SPECS = []
        try:
            for s in specs_from_file(self.path):
                s.module = module.__name__  # what a container imports to register it again
                module.SPECS.append(register(s))
        except Exception as exc:  # report, keep going
            warnings.warn(f"envfactory: spec file {self.path.name} was not loaded: {exc}", RuntimeWarning,
                          stacklevel=2)


class _SpecFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith(__name__ + "."):
            return None
        found = files().get(fullname[len(__name__) + 1:])
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _SpecFileLoader(found), origin=str(found))


if not any(isinstance(f, _SpecFinder) for f in sys.meta_path):
    sys.meta_path.append(_SpecFinder())


def import_all() -> list[Any]:
    """Register every spec file's environments; return them."""
    out: list[Any] = []
    for suffix in files():
        out += importlib.import_module(f"{__name__}.{suffix}").SPECS
    return out
