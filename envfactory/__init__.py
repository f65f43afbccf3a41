"""envfactory: verified, stateful tool-use environments and a gym for training LLM agents.

The public surface::

    import envfactory
    env = envfactory.make("FileSystem-v0")            # runtime="local" | "docker"
    messages = env.reset(task=0)
    result = env.step('<tool_call>{"name": "list_dir", "arguments": {"path": "/"}}</tool_call>')
    branch = env.fork()                                # independent copy of the live episode

    import gymnasium
    gymnasium.make("envfactory/FileSystem-v0")

Defining an environment: a :class:`State` model, :func:`tool` functions over it,
:class:`Task` objects, and :func:`register` of a :class:`ToolEnvSpec` (for a
team: :class:`Role` objects, a :class:`MultiState` and joint solutions, :func:`by`).
"""

from .definition import HELDOUT_FAMILIES, HELDOUT_KINDS, HELDOUT_PHRASING, Role, SpecError, ToolEnvSpec
from .env import Environment, EpisodeError, SnapshotError, StepResult
from .episode import Episode, step_many
from .mail import ConflictError, MultiState
from .parsing import ActionTypeError, parse_action
from .registry import ENTRY_POINT_GROUP, discover, make, make_multi, register, spec, specs, task_supply
from .state import State, copy_state, state_hash
from .task import Task, ToolCall, by, call
from .tooling import Tool, ToolError, tool

__version__ = "0.1.0"

__all__ = [
    "ActionTypeError",
    "ConflictError",
    "ENTRY_POINT_GROUP",
    "HELDOUT_FAMILIES",
    "HELDOUT_KINDS",
    "HELDOUT_PHRASING",
    "ToolEnvSpec",
    "Environment",
    "Episode",
    "EpisodeError",
    "SnapshotError",
    "SpecError",
    "State",
    "StepResult",
    "Task",
    "Tool",
    "ToolCall",
    "ToolError",
    "call",
    "copy_state",
    "discover",
    "make",
    "make_multi",
    "MultiState",
    "Role",
    "by",
    "parse_action",
    "register",
    "spec",
    "specs",
    "state_hash",
    "step_many",
    "task_supply",
    "tool",
]

# Lazy registration: environments are known by name -> module (read from the
# ``envfactory.environments`` entry points on first use) and imported by make/spec.
# gymnasium.make("envfactory/<Name>-v0") works right after `import envfactory`:
# the Gymnasium ids are registered (string entry points, no environment imported)
# when gymnasium is imported, or now if it already is; envfactory never imports it.
from .registry import install_gym_hook as _install_gym_hook  # noqa: E402

_install_gym_hook()
del _install_gym_hook
