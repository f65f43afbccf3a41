"""PettingZoo adapters: any team environment as an AEC or Parallel env.

Observations and actions are text, in the same ``Text`` spaces as the
Gymnasium adapter (:mod:`envfactory.faces.gym_env`). An agent's observation is what
is new for it since its last turn: its tool responses (``<tool_response>``
blocks) and the messages that reached it; before its first turn, the
instruction and its private notes.

``infos[agent]`` carries ``task_id``, ``round`` and the agent's tool schemas
(``tools``); the reset infos also carry each agent's opening conversation
(``messages``: system prompt, instruction, private notes); at the end,
``success``, ``ended_by`` and ``answer``. The whole conversation is not copied
into every info (that would cost time quadratic in the episode's length): read
it when needed with ``env.transcript(agent)`` (or ``env.episode.transcript(agent)``),
what an LLM playing ``agent`` is prompted with.

Tasks come from one split: ``env(name, split="eval")`` (default ``"train"``: the sft
and rl tasks; ``"sft"``, ``"rl"``, ``"eval"``, ``"all"``), so evaluation tasks are drawn
only when asked for. ``reset(seed=s)`` picks the same task as
``envfactory.make(name, split=...).reset(seed=s)`` (:func:`envfactory.episode.task_for_seed`);
``options={"task": id_or_index}`` picks it explicitly (any split). The whole team terminates (or is truncated) together;
rewards arrive at the end: the joint success for every agent, or each agent's
payoff in mixed-motive games.

Both views run on either runtime: ``env(name, runtime="docker")`` keeps the
world in a hardened container (rewards judged on the host), with the same
observations and rewards as ``runtime="local"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv

from .gym_env import _clean, _text_space
from ..episode import Episode

__all__ = ["TextObservation", "ToolAECEnv", "ToolParallelEnv", "env", "parallel_env"]


class TextObservation(str):
    """An observation: a ``str`` that also carries the numpy dtype of the ``Text`` space.

    PettingZoo's ``api_test`` compares ``observation.dtype`` with the space's
    dtype; a plain ``str`` has none. Everything else treats it as a ``str``.
    """

    __slots__ = ()
    dtype = np.dtype(str)


class _Base:
    """What both adapters share: the episode, the spaces, the task choice and the infos."""

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "is_parallelizable": True, "render_fps": 1}

    def _setup(self, env_name: str | None, episode: Episode | None, runtime: str,
               render_mode: str | None, kwargs: dict[str, Any]) -> None:
        if episode is None:
            if env_name is None:
                raise TypeError(f"{type(self).__name__} needs env_name or episode")
            from ..registry import make_multi

            episode = make_multi(env_name, runtime=runtime, **kwargs)
        if not episode.spec.multi_agent:
            raise TypeError(f"{episode.spec.name} is a single-agent environment; its Gymnasium view is "
                            f"gymnasium.make('envfactory/{episode.spec.name}')")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.episode = episode
        self.render_mode = render_mode
        self.metadata = {**type(self).metadata, "name": episode.spec.name}
        self.possible_agents = list(episode.agents)
        self.agents: list[str] = []
        self.observation_spaces = {a: _text_space("obs") for a in self.possible_agents}
        self.action_spaces = {a: _text_space("act") for a in self.possible_agents}
        self._schemas = {a: episode.tool_schemas(a) for a in self.possible_agents}
        self._rng = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    def _start(self, seed: int | None, options: dict[str, Any] | None) -> None:
        task = (options or {}).get("task")
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        draw = None
        if task is None:  # the episode draws from its split (never eval unless it asked for eval), by
            # the one seeding rule (make, Gymnasium, PettingZoo, MCP, OpenEnv)
            draw = seed if seed is not None else int(self._rng.integers(1 << 62))
        self.episode.reset(task, seed=draw)
        self.agents = list(self.possible_agents)

    def _observe(self, agent: str) -> TextObservation:
        return TextObservation(_clean(self.episode.observation(agent)))

    def _info(self, agent: str, opening: bool = False) -> dict[str, Any]:
        ep = self.episode
        task = ep.task
        assert task is not None  # infos exist only after reset()
        info = {"task_id": task.id, "round": ep.status.round, "tools": self._schemas[agent]}
        if opening:
            info["messages"] = ep.transcript(agent)
        if ep.done:
            info.update(success=ep.success, ended_by=ep.status.ended_by, answer=ep.status.answer)
        return info

    def transcript(self, agent: str) -> list[dict[str, Any]]:
        """``agent``'s whole conversation so far (its private view): what an LLM playing it is prompted with."""
        return self.episode.transcript(agent)

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        lines = []
        for e in self.episode.status.log:
            mark = "ok" if e["ok"] else e["kind"]
            lines.append(f"[round {e['round']}] {e['agent']}: {e['name']}({e['arguments']}) -> {mark}")
        return "\n".join(lines) or "(no tool calls yet)"

    def close(self) -> None:
        self.episode.close()


class ToolAECEnv(_Base, AECEnv):
    """Turn order: agents act one at a time, each seeing what happened before its turn.

    Args:
        env_name: Registered multi-agent environment name.
        episode: An existing team :class:`~envfactory.Episode` (any runtime) to wrap instead.
        runtime: Runtime for ``env_name``: ``"local"`` (in-process) or ``"docker"`` (a container).
        render_mode: ``None`` or ``"ansi"`` (the call log).
        **kwargs: Passed to :func:`envfactory.make_multi` (e.g. ``max_turns``: rounds).
    """

    def __init__(self, env_name: str | None = None, *, episode: Episode | None = None,
                 runtime: str = "local", render_mode: str | None = None, **kwargs: Any) -> None:
        AECEnv.__init__(self)
        self._setup(env_name, episode, runtime, render_mode, kwargs)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._start(seed, options)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: self._info(a, opening=True) for a in self.agents}
        self.agent_selection = self.agents[0]  # every round starts with the first agent

    def observe(self, agent: str) -> TextObservation:
        return self._observe(agent)

    def step(self, action: Any) -> None:
        """Play the selected agent's turn (``None`` passes; a dead agent's step must be ``None``)."""
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        result = self.episode.act(agent, "" if action is None else action)
        if result.done:
            for a in self.agents:
                self.rewards[a] = result.rewards[a]
                self.terminations[a], self.truncations[a] = result.terminated, result.truncated
            self.agent_selection = self.agents[0]
        else:
            self.rewards = dict.fromkeys(self.agents, 0.0)
            self.agent_selection = self.episode.status.next_agent or self.agents[0]  # not None: not done
        self.infos = {a: self._info(a) for a in self.agents}
        self._accumulate_rewards()


class ToolParallelEnv(_Base, ParallelEnv):
    """Simultaneous moves: every live agent acts each round on the same information.

    Arguments as for :class:`ToolAECEnv`. An agent missing from ``actions``
    (or given ``None``) passes its turn.
    """

    def __init__(self, env_name: str | None = None, *, episode: Episode | None = None,
                 runtime: str = "local", render_mode: str | None = None, **kwargs: Any) -> None:
        self._setup(env_name, episode, runtime, render_mode, kwargs)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, TextObservation], dict[str, dict[str, Any]]]:
        self._start(seed, options)
        return ({a: self._observe(a) for a in self.agents}, {a: self._info(a, opening=True) for a in self.agents})

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, TextObservation], dict[str, float],
                                                     dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]]:
        ep = self.episode
        ep.step_round({a: "" if act is None else act for a, act in actions.items()})
        live = self.agents
        obs = {a: self._observe(a) for a in live}
        rewards = ep.rewards if ep.done else dict.fromkeys(live, 0.0)
        terminations = dict.fromkeys(live, ep.status.terminated)
        truncations = dict.fromkeys(live, ep.status.truncated)
        infos = {a: self._info(a) for a in live}
        if ep.done:
            self.agents = []
        return obs, {a: rewards[a] for a in live}, terminations, truncations, infos

    def state(self) -> np.ndarray:
        raise NotImplementedError("the global state of a tool environment is a pydantic model, not an "
                                  "array; read it as env.episode.state")


def env(name: str, *, runtime: str = "local", render_mode: str | None = None, **kwargs: Any) -> ToolAECEnv:
    """The PettingZoo AEC (turn order) view of multi-agent environment ``name``."""
    return ToolAECEnv(name, runtime=runtime, render_mode=render_mode, **kwargs)


def parallel_env(name: str, *, runtime: str = "local", render_mode: str | None = None,
                 **kwargs: Any) -> ToolParallelEnv:
    """The PettingZoo Parallel (simultaneous moves) view of multi-agent environment ``name``."""
    return ToolParallelEnv(name, runtime=runtime, render_mode=render_mode, **kwargs)
