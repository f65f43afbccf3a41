"""Built-in envfactory environments, one module per environment family.

Discovered through the ``envfactory.environments`` entry point, which calls
:func:`register_all`.
"""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["register_all"]


def register_all() -> None:
    """Import every built-in environment module (each registers its specs)."""
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
