"""The in-process runtime: the reference implementation of an episode.

Every other runtime serves this same class (the Docker server runs a
``LocalEnv`` per session), which is what makes runtimes agree exactly.
"""

from __future__ import annotations

import json
import random
from typing import Any

from ..env import Environment, EpisodeError, Message, StepResult
from ..parsing import parse_action
from ..spec import EnvSpec
from ..state import State, copy_state
from ..task import Task

__all__ = ["LocalEnv", "SNAPSHOT_FORMAT"]

SNAPSHOT_FORMAT = 1


class LocalEnv(Environment):
    """An episode of ``spec`` executed in this process.

    Args:
        spec: The environment definition.
        max_turns: Overrides ``spec.max_turns`` for this instance.
    """

    def __init__(self, spec: EnvSpec, *, max_turns: int | None = None) -> None:
        self.spec = spec
        self.max_turns = spec.max_turns if max_turns is None else int(max_turns)
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self._tools = spec.all_tools
        self._task: Task | None = None
        self._state: State | None = None
        self._messages: list[Message] = []
        self._turn = 0
        self._done = False
        self._answer: str | None = None
        self._success: bool | None = None
        self._counts = {"tool_calls": 0, "tool_errors": 0, "parse_errors": 0}

    # -- protocol -------------------------------------------------------
    def reset(self, task: Any = None, *, seed: int | None = None) -> list[Message]:
        if task is None:
            tasks = self.spec.get_tasks()
            task = random.Random(seed).randrange(len(tasks))
        t = self.spec.task(task)
        self._task = t
        self._state = t.fresh_state()
        self._messages = [
            {"role": "system", "content": self.spec.render_system_prompt()},
            {"role": "user", "content": t.instruction},
        ]
        self._turn = 0
        self._done = False
        self._answer = None
        self._success = None
        self._counts = {"tool_calls": 0, "tool_errors": 0, "parse_errors": 0}
        return list(self._messages)

    def step(self, action: Any) -> StepResult:
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: call reset() before step()")
        if self._done:
            raise EpisodeError(f"{self.spec.name}: the episode has ended; call reset() to start another")
        parsed = parse_action(action)
        self._turn = turn = self._turn + 1
        counts = self._counts
        assistant: Message = {"role": "assistant", "content": parsed.content}
        self._messages.append(assistant)
        new: list[Message] = []
        for j, err in enumerate(parsed.errors):
            counts["parse_errors"] += 1
            new.append({"role": "tool", "tool_call_id": f"call_{turn}_invalid{j}",
                        "name": "invalid_tool_call", "content": "Error: " + err})
        finished = False
        answer: str | None = None
        if parsed.calls:
            state = self._state
            tools = self._tools
            # Arguments stay a dict (the HF chat-template convention); see
            # envfactory.messages.to_openai for the string form OpenAI servers want.
            openai_calls = []
            for i, call in enumerate(parsed.calls):
                cid = call.id or f"call_{turn}_{i}"
                openai_calls.append({"id": cid, "type": "function",
                                     "function": {"name": call.name, "arguments": call.arguments}})
                counts["tool_calls"] += 1
                t = tools.get(call.name)
                if finished:
                    content = "Error: ignored; the episode was already finished by an earlier call."
                    counts["tool_errors"] += 1
                elif t is None:
                    counts["tool_errors"] += 1
                    content = f"Error: unknown tool '{call.name}'. Available tools: {', '.join(tools)}."
                else:
                    out = t.invoke(state, call.arguments)
                    content = out.content
                    if not out.ok:
                        counts["tool_errors"] += 1
                    elif t.finish:
                        finished = True
                        answer = str(call.arguments.get("answer", ""))
                new.append({"role": "tool", "tool_call_id": cid, "name": call.name, "content": content})
            assistant["tool_calls"] = openai_calls
        self._messages.extend(new)
        terminated = finished or not parsed.attempted
        truncated = not terminated and turn >= self.max_turns
        info: dict[str, Any] = {"turn": turn, "task_id": self._task.id, **counts}
        reward = 0.0
        if terminated or truncated:
            if terminated and not finished:
                answer = parsed.answer
            self._done = True
            self._answer = answer
            self._success = self._task.success(self._state, answer)
            reward = 1.0 if self._success else 0.0
            info["success"] = self._success
            info["answer"] = answer
        return StepResult(new, reward, terminated, truncated, info)

    def fork(self) -> "LocalEnv":
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: nothing to fork; call reset() first")
        new = LocalEnv.__new__(LocalEnv)
        new.__dict__.update(self.__dict__)
        new._state = copy_state(self._state)
        new._messages = list(self._messages)  # messages are never mutated once appended
        new._counts = dict(self._counts)
        return new

    def snapshot(self) -> dict[str, Any]:
        if self._task is None:
            raise EpisodeError(f"{self.spec.name}: nothing to snapshot; call reset() first")
        return {
            "format": SNAPSHOT_FORMAT,
            "env": self.spec.name,
            "task_id": self._task.id,
            "max_turns": self.max_turns,
            "state": self._state.model_dump(mode="json"),
            "messages": json.loads(json.dumps(self._messages)),
            "turn": self._turn,
            "done": self._done,
            "answer": self._answer,
            "success": self._success,
            "counts": dict(self._counts),
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(
                f"not an envfactory snapshot of format {SNAPSHOT_FORMAT} "
                "(take one with Environment.snapshot())"
            )
        if snapshot.get("env") != self.spec.name:
            raise ValueError(
                f"snapshot is of {snapshot.get('env')!r}; this environment is {self.spec.name!r}"
            )
        self._task = self.spec.task(snapshot["task_id"])
        self._state = self.spec.state_type.model_validate(snapshot["state"])
        self._messages = json.loads(json.dumps(snapshot["messages"]))
        self.max_turns = int(snapshot["max_turns"])
        self._turn = int(snapshot["turn"])
        self._done = bool(snapshot["done"])
        self._answer = snapshot["answer"]
        self._success = snapshot["success"]
        self._counts = dict(snapshot["counts"])

    # -- views ----------------------------------------------------------
    @property
    def messages(self) -> list[Message]:
        return self._messages

    @property
    def state(self) -> State:
        if self._state is None:
            raise EpisodeError(f"{self.spec.name}: no state before reset()")
        return self._state

    @property
    def task(self) -> Task | None:
        return self._task

    @property
    def done(self) -> bool:
        return self._done

    @property
    def success(self) -> bool | None:
        """Task success once the episode has ended, else ``None``."""
        return self._success

    def __repr__(self) -> str:
        tid = self._task.id if self._task else None
        return f"<LocalEnv {self.spec.name} task={tid} turn={self._turn} done={self._done}>"
