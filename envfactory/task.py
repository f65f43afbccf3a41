"""Tasks: an instruction, an initial state, a success check and a proof of solvability."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from .calls import ToolCall, _word_pattern, fact_in, normalize_answer, number_rivals  # noqa: F401 - re-exported
from .conversation import COMPONENTS, TURN_COMPONENTS, Conversation
from .state import State, copy_state, same_state, state_hash

__all__ = ["ToolCall", "Task", "by", "call", "normalize_answer", "number_rivals"]



class Task(BaseModel):
    """A task of an environment.

    Attributes:
        id: Unique within the environment, stable across processes.
        instruction: What the user asks, shown to the agent (to every agent of a team); for a
            conversation, its first turn's message (filled in when left empty).
        initial_state: The world at ``reset``; each episode gets its own copy.
        solution: A reference solution (tool calls) that earns reward 1; in a
            team, each call names the agent that makes it (see :func:`by`).
        private: Private knowledge per agent id, shown only to that agent.
        answer_facts: Strings the final answer must contain (case-insensitive),
            for tasks that ask for information.
        answer_rivals: Values that contradict the facts (the other members of an enum a
            fact belongs to: a ticket is ``open`` or ``closed``; for a small whole number, the
            other numbers 0-12): an answer that names half of them or more, as words (a number
            on its own, not a digit of an id like ``O-2``), is a list of candidates, not an
            answer (it earns nothing); naming fewer is allowed ("Done. It is in doing", with
            ``done`` a column name). ``None``
            (the default): filled in when the environment loads its tasks, from the enums
            of its tool schemas and the small numbers (:meth:`~envfactory.ToolEnvSpec.get_tasks`);
            ``[]``: none.
        answer_seen: Each answer fact must also have been shown to the agents during the
            episode (a tool result that does not merely echo the call's own arguments, a
            letter, private notes), so an answer guessed from the instruction or the tool
            schemas earns nothing (:meth:`~envfactory.episode.EpisodeStatus.judge`). ``False`` for an
            answer the agent computes (a total) rather than reads.
        check: ``check(final_state) -> bool``. When omitted, success means the
            final state equals the state the reference solution produces (a
            canonical-hash comparison, as in tau-bench).
        difficulty: Defaults to the length of the reference solution.
        expected_state_hash: The hash of the reference solution's final state, for a task
            without ``check``; filled in when the environment loads its tasks, or, for states
            whose hash is costly (``State.__hash_on_demand__``: databases imported with
            ``from_class``), by the first judgment that needs it (:meth:`expected_hash`).
        metadata: Environment-specific data (e.g. private valuations for a payoff).
        conversation: Several user turns, or a user holding facts the agent must ask for
            (:class:`~envfactory.conversation.Conversation`); the reference solution is its turns'
            reference calls. ``None``: the task is one instruction.
        assertions: Functions of the final state that must all hold (tau2's environment
            assertions), besides the state check.
        reward_basis: The components success is the product of (:meth:`components`); ``None``:
            those the task has (the final state, the answer facts, the conversation's checks,
            the assertions). ``"actions"`` is judged only when named here.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    id: str
    instruction: str = ""
    initial_state: State
    solution: list[ToolCall] = Field(default_factory=list)
    private: dict[str, str] = Field(default_factory=dict)
    answer_facts: list[str] = Field(default_factory=list)
    answer_rivals: list[str] | None = None
    answer_seen: bool = True
    check: Callable[[Any], bool] | None = Field(default=None, exclude=True)
    difficulty: int | None = None
    expected_state_hash: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    conversation: Conversation | None = None
    assertions: list[Callable[[Any], bool]] = Field(default_factory=list, exclude=True)
    reward_basis: tuple[str, ...] | None = None
    # per turn of a conversation, the reference's (state hash after it, its calls' results): filled
    # in when the environment loads its tasks (see ToolEnvSpec.get_tasks)
    _turn_refs: list[tuple[str, list[str]]] | None = PrivateAttr(default=None)
    # (expected_state_hash, the reference's final state): see keep_expected_final
    _expected_final: tuple[str | None, State] | None = PrivateAttr(default=None)

    @field_validator("solution", mode="after")
    @classmethod
    def _check_calls(cls, calls: list[ToolCall]) -> list[ToolCall]:
        for c in calls:
            if not isinstance(c.name, str) or not c.name or not isinstance(c.arguments, dict):
                raise ValueError(f"invalid tool call in solution: {c!r}")
        return calls

    def model_post_init(self, _ctx: Any) -> None:
        conv = self.conversation
        if conv is not None:
            if not self.instruction:
                self.instruction = conv.turns[0].message
            elif self.instruction != conv.turns[0].message:
                raise ValueError(f"task {self.id!r}: the instruction is the conversation's first message; "
                                 "leave it empty or make them the same")
            if not self.solution:
                self.solution = conv.solution
            elif [c.to_json() for c in self.solution] != [c.to_json() for c in conv.solution]:
                raise ValueError(f"task {self.id!r}: the solution of a conversation is its turns' reference "
                                 "calls (UserTurn.solution); leave Task.solution empty")
        elif not self.instruction:
            raise ValueError(f"task {self.id!r} needs an instruction (or a conversation)")
        if self.reward_basis is not None:
            unknown = set(self.reward_basis) - set(COMPONENTS)
            if unknown:
                raise ValueError(f"task {self.id!r}: unknown reward components {sorted(unknown)}; "
                                 f"known: {', '.join(COMPONENTS)}")
        if self.difficulty is None:
            self.difficulty = len(self.solution)

    def components(self) -> tuple[str, ...]:
        """The components success is the product of (see :mod:`envfactory.conversation`): the
        task's ``reward_basis``, or those it has."""
        if self.reward_basis is not None:
            return self.reward_basis
        out = ["state"]
        if self.answer_facts:
            out.append("answer")
        conv = self.conversation
        if conv is not None:
            checks = {c for t in conv.turns for c in (t.checks or ())}
            out += [name for c, name in TURN_COMPONENTS.items() if c in checks]
            if conv.communicate:
                out.append("communicate")
        if self.assertions:
            out.append("assertions")
        return tuple(out)

    @property
    def kind(self) -> str:
        """The task's kind (``metadata["kind"]``, see ``envfactory.factory.spec_file.TASK_KINDS``);
        ``original`` for tasks written before kinds."""
        return self.metadata.get("kind", "original")

    def fresh_state(self) -> State:
        """An independent copy of the initial state."""
        return copy_state(self.initial_state)

    def state_ok(self, final_state: State) -> bool:
        """Whether the final state satisfies the task (ignoring the answer)."""
        if self.check is not None:
            return bool(self.check(final_state))
        private = self.__pydantic_private__  # (the attribute itself goes through pydantic's __getattr__)
        kept = private.get("_expected_final") if private else None
        if self.expected_state_hash is None and kept is None:
            raise RuntimeError(
                f"task {self.id!r} has neither a check nor an expected state; "
                "register it through an ToolEnvSpec, which replays the reference solution"
            )
        if kept is not None and kept[0] == self.expected_state_hash and same_state(final_state, kept[1]):
            return True  # the same canonical JSON as the reference's final state, without serializing
        return state_hash(final_state) == self.expected_hash()

    def keep_expected_final(self, state: State, *, on_demand: bool = False) -> None:
        """Keep the reference's final ``state`` (its hash is :attr:`expected_state_hash`), so that a
        final state identical to it is judged without serializing either (:func:`same_state`);
        anything else is judged by the hash, as before. ``on_demand`` (with no hash set yet): leave
        :attr:`expected_state_hash` ``None`` until a judgment needs it (:meth:`expected_hash`)."""
        if on_demand and self.expected_state_hash is None:
            self._expected_final = (None, state)
        else:
            self._expected_final = (self.expected_state_hash or state_hash(state), state)

    def expected_hash(self) -> str | None:
        """:attr:`expected_state_hash`, computed now from the kept reference final state if it was
        left for later (:meth:`keep_expected_final` with ``on_demand``); ``None`` for a task judged
        by its check."""
        if self.expected_state_hash is None:
            private = self.__pydantic_private__
            kept = private.get("_expected_final") if private else None
            if kept is not None and kept[0] is None:
                self.expected_state_hash = state_hash(kept[1])
                self._expected_final = (self.expected_state_hash, kept[1])
        return self.expected_state_hash

    def answer_ok(self, answer: str | None) -> bool:
        """Whether the final answer contains every required fact."""
        if not self.answer_facts:
            return True
        if not answer:
            return False
        norm = normalize_answer(answer)
        if not all(fact_in(normalize_answer(f), norm) for f in self.answer_facts):
            return False
        rivals = self.answer_rivals or ()
        named = sum(1 for r in rivals if _word_pattern(r).search(norm))
        return named == 0 or 2 * named < len(rivals)  # a list of candidates names half or more

    def facts_shown(self, notes: Iterable[str], results: Iterable[tuple[str, Any]]) -> bool:
        """Whether each answer fact was shown to the agents (always true without facts or
        with ``answer_seen=False``): it occurs in one of ``notes`` (letters, private notes)
        or in a tool result whose call's arguments do not contain it (a result that only
        echoes the agent's own argument back, ``Error: no account '430.75'``, shows nothing).

        Args:
            notes: Texts shown to the agents.
            results: ``(tool result text, that call's arguments)`` pairs.
        """
        if not self.answer_facts or not self.answer_seen:
            return True
        notes = [normalize_answer(n) for n in notes]
        pairs = [(normalize_answer(r), normalize_answer(a if isinstance(a, str) else json.dumps(a, ensure_ascii=False)))
                 for r, a in results]
        for fact in self.answer_facts:
            f = normalize_answer(fact)
            if not (any(fact_in(f, n) for n in notes) or any(fact_in(f, r) and not fact_in(f, a) for r, a in pairs)):
                return False
        return True

    def success(self, final_state: State, answer: str | None) -> bool:
        """Sparse task success on what the final state and answer show: the state check, the answer
        facts and the assertions, as far as :meth:`components` names them (an episode judges the
        conversation's components too)."""
        parts = self.components()
        if "state" in parts and not self.state_ok(final_state):
            return False
        if "answer" in parts and not self.answer_ok(answer):
            return False
        return not ("assertions" in parts and not all(bool(a(final_state)) for a in self.assertions))

    def describe(self) -> dict[str, Any]:
        """JSON-friendly description (no callables, no state)."""
        return {
            "id": self.id,
            "instruction": self.instruction,
            "difficulty": self.difficulty,
            "solution": [c.to_json() for c in self.solution],
            "answer_facts": list(self.answer_facts),
            "components": list(self.components()),
            **({"private": dict(self.private)} if self.private else {}),
            **({"conversation": self.conversation.model_dump(mode="json")} if self.conversation else {}),
        }


def call(name: str, /, **arguments: Any) -> ToolCall:
    """Shorthand for writing reference solutions: ``call("read_file", path="/a")``."""
    return ToolCall(name=name, arguments=arguments)


def by(agent: str, name: str, /, **arguments: Any) -> ToolCall:
    """Shorthand for a team's joint solution: ``by("writer_0", "update_record", id="E-1")``."""
    return ToolCall(name=name, arguments=arguments, agent=agent)
