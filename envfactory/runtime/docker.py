"""The Docker runtime: an environment served from a hardened container.

``envfactory.make(name, runtime="docker")`` returns a :class:`DockerEnv`. It
has the interface and the observable behaviour of
:class:`~envfactory.runtime.local.LocalEnv` (the container runs exactly that
class, see :mod:`envfactory.serve`); a parity test holds them to identical
messages, rewards and final states.

What the host does not delegate: the task choice, the episode protocol
(``EpisodeError``), the turn count, which turn ends the episode and with what
answer (both derived from the agent's own action), and the reward, computed
here by validating the final state fetched from the container into the
environment's state type and running the task's success check on it. A
container that reports anything else inconsistent is treated as broken.

Faults: a container that dies mid-episode raises :class:`ContainerError`
naming the environment, the session and the container, which is removed
(the pool replaces it); a step that overruns ``step_timeout`` ends the
episode with an error observation and the container is recycled.
"""

from __future__ import annotations

import random
import socket
from typing import Any

from ..env import Environment, EpisodeError, Message, StepResult
from ..parsing import ParsedAction, parse_action
from ..definition import ToolEnvSpec
from ..state import State
from ..task import Task
from .container import Container, ContainerError, Limits
from .docker_session import SessionLink
from .pool import Pool, get_pool
from .wire import action_to_json

__all__ = ["DockerEnv", "ContainerError", "Limits"]


class DockerEnv(Environment):
    """An episode of ``spec`` in a container (see the module docstring).

    Args:
        spec: The environment definition.
        max_turns: Overrides ``spec.max_turns``.
        step_timeout: Seconds one step may take before the container is recycled.
        pool: The container pool (default: the process-wide pool of ``spec``).
        image: Image tag to use instead of the content-hashed build.
        **pool_options: ``warm``, ``sessions_per_container``, ``limits``
            (a :class:`~envfactory.runtime.container.Limits`), used when the
            process-wide pool is created.
    """

    def __init__(self, spec: ToolEnvSpec, *, max_turns: int | None = None, step_timeout: float = 30.0,
                 pool: Pool | None = None, image: str | None = None, **pool_options: Any) -> None:
        self.spec = spec
        self.max_turns = spec.max_turns if max_turns is None else int(max_turns)
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.step_timeout = step_timeout
        self.pool = pool or get_pool(spec, image, **pool_options)
        self._link = SessionLink(self.pool, spec.name, {"max_turns": self.max_turns}, step_timeout)
        self._finish = {n for n, t in spec.all_tools.items() if t.finish}
        self._clear()

    def _clear(self) -> None:
        self._task: Task | None = None
        self._messages: list[Message] = []
        self._turn = 0
        self._done = False
        self._answer: str | None = None
        self._success: bool | None = None

    # -- session plumbing ------------------------------------------------
    def _request(self, req: dict[str, Any], *, raise_timeout: bool = False) -> dict[str, Any]:
        """One framed request (see :meth:`SessionLink.request`); a container
        that died or overran (and was removed) also ends the episode."""
        try:
            return self._link.request(req, raise_timeout=raise_timeout)
        except ContainerError:
            if self._link.container is None:
                self._done = True
            raise

    # -- protocol --------------------------------------------------------
    def reset(self, task: Any = None, *, seed: int | None = None) -> list[Message]:
        if task is None:
            tasks = self.spec.get_tasks()
            task = random.Random(seed).randrange(len(tasks))
        t = self.spec.task(task)
        try:
            registered = self.spec.task(t.id)
        except KeyError:
            registered = None
        if registered is not t:
            raise ValueError(f"{self.spec.name}: the docker runtime runs registered tasks only; "
                             f"task {t.id!r} is not one of them (register it in the ToolEnvSpec)")
        reply = self._link.request_with_retry({"op": "reset", "task": t.id})
        self._clear()
        self._task = t
        self._messages = reply["messages"]
        return list(self._messages)

    def step(self, action: Any) -> StepResult:
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() before step()")
        if self._done:
            raise EpisodeError(f"{self.spec.name}: the episode has ended; call reset() to start another")
        parsed = parse_action(action)  # ActionTypeError here, like the local runtime
        turn = self._turn + 1
        try:
            reply = self._request({"op": "step", "action": action_to_json(action)}, raise_timeout=True)
        except socket.timeout:
            return self._timed_out(parsed, turn)
        self._turn = turn
        new = reply["messages"]
        self._messages.append(reply["assistant"])
        self._messages.extend(new)
        terminated, answer = self._judge_end(parsed, new)
        truncated = not terminated and turn >= self.max_turns
        if (terminated, truncated) != (reply["terminated"], reply["truncated"]) or reply["info"].get("turn") != turn:
            where = self._link.where()
            self._link.drop(remove=True)
            self._done = True
            raise ContainerError(f"{where}: the container's account of turn {turn} disagrees with the action "
                                 "(end of episode or turn count); it was removed as untrustworthy")
        info = reply["info"]
        info.pop("success", None)
        info.pop("answer", None)
        reward = 0.0
        if terminated or truncated:
            state = self.spec.state_type.model_validate(reply["state"])
            self._done, self._answer = True, answer
            self._success = self._task.success(state, answer)
            reward = 1.0 if self._success else 0.0
            info["success"], info["answer"] = self._success, answer
        return StepResult(new, reward, terminated, truncated, info)

    def _judge_end(self, parsed: ParsedAction, new: list[Message]) -> tuple[bool, str | None]:
        """Whether the turn ends the episode and the agent's answer, from the
        agent's action (the container only says which finishing call succeeded)."""
        if not parsed.attempted:
            return True, parsed.answer
        offset = len(parsed.errors)
        if len(new) != offset + len(parsed.calls):
            raise ContainerError(f"{self._link.where()}: {len(new)} tool messages for {len(parsed.calls)} calls "
                                 f"and {offset} parse errors")
        for i, c in enumerate(parsed.calls):
            if c.name in self._finish and not str(new[offset + i]["content"]).startswith("Error"):
                return True, str(c.arguments.get("answer", ""))
        return False, None

    def _timed_out(self, parsed: ParsedAction, turn: int) -> StepResult:
        """The step overran: recycle the container, end the episode with an error observation."""
        where = self._link.where()
        self._link.drop(remove=True)
        self._turn = turn
        self._done, self._success, self._answer = True, False, None
        msg = (f"Error: the step did not finish within {self.step_timeout}s; the environment's container "
               f"was stopped and the episode ended ({where}).")
        assistant: Message = {"role": "assistant", "content": parsed.content}
        new: list[Message] = []
        calls = []
        for i, c in enumerate(parsed.calls):
            cid = c.id or f"call_{turn}_{i}"
            calls.append({"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
            new.append({"role": "tool", "tool_call_id": cid, "name": c.name, "content": msg})
        if calls:
            assistant["tool_calls"] = calls
        else:
            new.append({"role": "tool", "tool_call_id": f"call_{turn}_timeout", "name": "timeout", "content": msg})
        self._messages += [assistant, *new]
        info = {"turn": turn, "task_id": self._task.id, "timeout": True, "success": False, "answer": None}
        return StepResult(new, 0.0, False, True, info)

    def fork(self) -> "DockerEnv":
        if self._task is None or self._link.container is None:
            raise EpisodeError(f"{self.spec.name}: nothing to fork; call reset() first")
        child = DockerEnv(self.spec, max_turns=self.max_turns, step_timeout=self.step_timeout, pool=self.pool)
        if self._link.fork_into(child._link):  # a new session in the same container
            child._task, child._turn, child._done = self._task, self._turn, self._done
            child._answer, child._success = self._answer, self._success
            child._messages = list(self._messages)
        else:  # a new container: carry the episode over as a snapshot
            child.restore(self.snapshot())
        return child

    def snapshot(self) -> dict[str, Any]:
        if self._task is None or self._link.container is None:
            raise EpisodeError(f"{self.spec.name}: nothing to snapshot; call reset() first")
        return self._link.call("GET", "snapshot")

    def restore(self, snapshot: dict[str, Any]) -> None:
        if not isinstance(snapshot, dict) or snapshot.get("env") != self.spec.name:
            raise ValueError(f"snapshot is of {snapshot.get('env') if isinstance(snapshot, dict) else snapshot!r}; "
                             f"this environment is {self.spec.name!r}")
        self._link.call("POST", "restore", snapshot, open_session=True)
        self._clear()
        self._task = self.spec.task(snapshot["task_id"])
        self.max_turns = int(snapshot["max_turns"])
        self._link.create = {"max_turns": self.max_turns}
        self._messages = list(snapshot["messages"])
        self._turn, self._done, self._answer = int(snapshot["turn"]), bool(snapshot["done"]), snapshot["answer"]
        if self._done:  # judged here, from the snapshot's state, not from its "success" field
            self._success = self._task.success(self.spec.state_type.model_validate(snapshot["state"]), self._answer)

    # -- views -----------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        return self._messages

    @property
    def state(self) -> State:
        if self._task is None or self._link.container is None:
            raise EpisodeError(f"{self.spec.name}: no state before reset()")
        return self.spec.state_type.model_validate(self._request({"op": "state"})["state"])

    @property
    def task(self) -> Task | None:
        return self._task

    @property
    def done(self) -> bool:
        return self._done

    @property
    def success(self) -> bool | None:
        """Task success once the episode has ended (judged on this host), else ``None``."""
        return self._success

    @property
    def container(self) -> Container | None:
        """The container serving the current session (``None`` before ``reset``)."""
        return self._link.container

    @property
    def session(self) -> str | None:
        """The server's id of the current session (``None`` before ``reset``)."""
        return self._link.session

    def close(self) -> None:
        self._link.drop()

    def __repr__(self) -> str:
        tid = self._task.id if self._task else None
        return f"<DockerEnv {self.spec.name} task={tid} turn={self._turn} done={self._done} {self._link.container!r}>"

from .docker_multi import DockerMultiEpisode  # noqa: E402,F401  (multi-agent episodes, same runtime)
