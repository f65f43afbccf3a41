"""Environments declared in spec files (environments/specs/*.yaml), built with from_spec.

A broken spec file is reported as a warning naming the file and the problem; it
does not hide the other environments.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from envfactory import register
from envfactory.factory.from_spec import from_spec

SPEC_DIR = Path(__file__).parent / "specs"

SPECS = []
for _path in sorted(SPEC_DIR.glob("*.yaml")):
    try:
        SPECS.append(register(from_spec(_path)))
    except Exception as _exc:  # report, keep going
        warnings.warn(f"envfactory: spec file {_path.name} was not loaded: {_exc}", RuntimeWarning,
                      stacklevel=1)
