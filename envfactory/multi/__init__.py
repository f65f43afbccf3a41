"""Multi-agent tool environments: roles with their own tools, private knowledge,
a shared world, messages, turn order (AEC) and simultaneous moves (Parallel).

::

    import envfactory.multi as multi
    aec = multi.env("MultiRecords-v0")            # PettingZoo AEC
    par = multi.parallel_env("MultiRecords-v0")   # PettingZoo Parallel
    ep = envfactory.make_multi("MultiRecords-v0") # the live episode (fork/snapshot/restore)

Defining one: a :class:`MultiState` subclass, tools, :class:`Role` objects,
:class:`MultiTask` objects with joint solutions (:func:`by`), and
``envfactory.register(MultiAgentSpec(...))``.
"""

from __future__ import annotations

from typing import Any

from .episode import MultiEpisode, TurnResult
from .spec import JointCall, MultiAgentSpec, MultiTask, Role, by
from .state import BROADCAST, ConflictError, Letter, Mailbox, MultiState

__all__ = ["BROADCAST", "ConflictError", "JointCall", "Letter", "Mailbox", "MultiAgentSpec", "MultiEpisode",
           "MultiState", "MultiTask", "Role", "TurnResult", "by", "env", "parallel_env"]


def env(name: str, **kwargs: Any) -> Any:
    """The PettingZoo AEC env of ``name`` (see :class:`~envfactory.multi.pettingzoo_env.ToolAECEnv`)."""
    from .pettingzoo_env import env as _env

    return _env(name, **kwargs)


def parallel_env(name: str, **kwargs: Any) -> Any:
    """The PettingZoo Parallel env of ``name`` (see :class:`~envfactory.multi.pettingzoo_env.ToolParallelEnv`)."""
    from .pettingzoo_env import parallel_env as _parallel_env

    return _parallel_env(name, **kwargs)
