"""The factory: environments from Python classes, spec files and LLM prompts, and task synthesis.

* :func:`from_class` — an unchanged third-party class (public attributes are the
  state, public methods the tools) seeded by an initial-configuration dict;
* :func:`from_spec` — a declarative YAML/JSON spec file for table-backed worlds;
* :func:`from_mcp` — an existing MCP server (started per episode over stdio): its tools are the
  environment's tools, tasks are checked through its own read tools;
* :func:`from_verifiers` — a verifiers 0.4 ``vf.Toolset`` (its ``@vf.tool`` methods the tools, its
  ``vf.State`` model the state), through :func:`from_class`;
* :func:`from_openenv` — an OpenEnv ``MCPEnvironment`` class, or a running OpenEnv server (its
  MCP tools the tools, an instance or a session per episode, its own reward the success check),
  on :func:`from_mcp`'s machinery;
* :func:`generate_from_prompt` — an OpenAI-compatible LLM writes the module, the
  sandbox verifies it, failures go back for repair, only what passes is kept;
* :func:`synthesize` — tasks from walks over the tool graph, each with its
  reference solution and a success check derived from what the walk changed.

Submodules are imported lazily so that ``import envfactory.factory`` stays cheap.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["from_class", "Service", "ClassTask", "Synthesis", "from_spec", "from_mcp", "mcp_task", "from_verifiers", "from_openenv", "openenv_task", "generate_from_prompt", "load_generated", "synthesize",
           "synthesize_for", "SynthConfig", "ChangeCheck"]

_WHERE = {
    "from_class": "from_class", "Service": "from_class", "ClassTask": "from_class", "Synthesis": "from_class", "from_spec": "from_spec", "from_mcp": "from_mcp", "mcp_task": "from_mcp", "from_verifiers": "from_verifiers", "from_openenv": "from_openenv", "openenv_task": "from_openenv", "generate_from_prompt": "from_prompt",
    "load_generated": "from_prompt", "synthesize": "tasks.synthesis", "synthesize_for": "tasks.synthesis",
    "SynthConfig": "tasks.synthesis", "ChangeCheck": "tasks.success",
}


class _CallableModule(types.ModuleType):
    """A factory submodule that shares its name with its function (``from_class``,
    ``from_spec``, ``from_mcp``): importing the submodule makes it this package's
    attribute of that name, so ``envfactory.factory.from_class`` may be the module;
    calling it calls the function, whichever one a caller got."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


def _callable(module_name: str) -> None:
    """Make the submodule ``module_name`` callable as its same-named function (see :class:`_CallableModule`)."""
    sys.modules[module_name].__class__ = _CallableModule


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
