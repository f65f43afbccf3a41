"""YAML read with an alias budget: the one loader for YAML that may be hostile (spec files,
training configs). An alias bomb (a few hundred bytes whose aliases expand to billions of
nodes) is refused before anything walks, prints or validates it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envfactory.definition import SpecError

__all__ = ["MAX_YAML_NODES", "load_yaml", "yaml_size_ok"]

MAX_YAML_NODES = 200_000  # a spec file or config expands to a few thousand nodes; an alias bomb to billions


def yaml_size_ok(path: str | Path, root: Any, what: str = "a spec file") -> None:
    """Refuse a YAML document whose aliases expand it beyond :data:`MAX_YAML_NODES` nodes (an alias
    bomb: a few hundred bytes that expand exponentially), counted on the composed node graph, where
    every alias is one shared node, so the count itself costs one visit per distinct node.

    Raises:
        SpecError: (a ``ValueError``) naming ``path`` and the budget.
    """
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        sizes[key] = 1  # a node that contains itself (a recursive alias) counts once
        value = node.value
        if isinstance(value, list):
            total = 1
            for item in value:
                for part in (item if isinstance(item, tuple) else (item,)):
                    total += size(part)
                    if total > MAX_YAML_NODES:
                        break
        else:
            total = 1
        sizes[key] = total
        return total

    if root is not None and size(root) > MAX_YAML_NODES:
        raise SpecError(f"{path}: the YAML expands to more than {MAX_YAML_NODES:,} nodes through its aliases "
                        f"(*name); {what} needs far fewer: write the repeated parts out, or use fewer aliases")


def load_yaml(text: str, path: str | Path, what: str = "a spec file") -> Any:
    """``yaml.safe_load(text)`` (the C loader when there is one) after :func:`yaml_size_ok`.

    Raises:
        SpecError: an alias bomb. yaml.YAMLError: not valid YAML.
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    yaml_size_ok(path, yaml.compose(text, Loader=loader), what)
    return yaml.load(text, Loader=loader)
