"""PettingZoo faces of team environments, and team evaluation.

A team environment is a :class:`~envfactory.ToolEnvSpec` with roles; its live
episode is the same :class:`~envfactory.Episode` as for one agent
(``envfactory.make("MultiRecords-v0")``), its scripted policies the same as
well (:mod:`envfactory.agents_scripted`), and :mod:`envfactory.verify` verifies
it. This package adds the PettingZoo views::

    import envfactory.multi as multi
    aec = multi.env("MultiRecords-v0")            # PettingZoo AEC
    par = multi.parallel_env("MultiRecords-v0")   # PettingZoo Parallel

and the evaluation (:mod:`envfactory.multi.eval`: episode rows, success with Wilson intervals,
coordination metrics, cross-play; :mod:`envfactory.multi.report`: the reports), for teams
(``envfactory eval-team``) and for one agent (``envfactory eval``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["env", "parallel_env"]


def env(name: str, **kwargs: Any) -> Any:
    """The PettingZoo AEC env of ``name`` (see :class:`~envfactory.multi.pettingzoo_env.ToolAECEnv`)."""
    from .pettingzoo_env import env as _env

    return _env(name, **kwargs)


def parallel_env(name: str, **kwargs: Any) -> Any:
    """The PettingZoo Parallel env of ``name`` (see :class:`~envfactory.multi.pettingzoo_env.ToolParallelEnv`)."""
    from .pettingzoo_env import parallel_env as _parallel_env

    return _parallel_env(name, **kwargs)
