"""The factory: environments from Python classes, spec files and LLM prompts, and task synthesis.

* :func:`from_class` — an unchanged third-party class (public attributes are the
  state, public methods the tools) seeded by an initial-configuration dict;
* :func:`from_spec` — a declarative YAML/JSON spec file for table-backed worlds;
* :func:`generate_from_prompt` — an OpenAI-compatible LLM writes the module, the
  sandbox verifies it, failures go back for repair, only what passes is kept;
* :func:`synthesize` — tasks from walks over the tool graph, each with its
  reference solution and a success check derived from what the walk changed.

Submodules are imported lazily so that ``import envfactory.factory`` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["from_class", "from_spec", "generate_from_prompt", "load_generated", "synthesize",
           "synthesize_for", "SynthConfig", "ChangeCheck"]

_WHERE = {
    "from_class": "from_class", "from_spec": "from_spec", "generate_from_prompt": "from_prompt",
    "load_generated": "from_prompt", "synthesize": "tasks_synth", "synthesize_for": "tasks_synth",
    "SynthConfig": "tasks_synth", "ChangeCheck": "checks",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
