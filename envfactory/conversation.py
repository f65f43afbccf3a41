"""Tasks as conversations: several user turns, or a user holding facts the agent must ask for.

A :class:`~envfactory.Task` is one instruction by default. Given a :class:`Conversation` it is a
conversation instead, played through the same episode API in every runtime and face:

* the first turn's message is the opening user message (the task's ``instruction``);
* the agent's turn ends when it answers without a tool call; the user's next message is then its
  next observation (a ``{"role": "user"}`` message), and the episode goes on;
* the episode ends when the last turn is answered (``ended_by="answer"``), when the agent calls
  ``finish``, or at the turn limit.

Two forms, one class:

* **Scripted turns** (BFCL's multi-turn entries): each :class:`UserTurn` is a message, the
  reference calls that answer it, the tools that appear at that turn (hidden before it), and the
  checks made when the agent ends it. Any answer ends the turn: asking the user a question is
  answering (BFCL's ``miss_param`` turns, whose right answer is no call).
* **A user with a private scenario** (tau2-style): ``facts`` that the user knows and tells only
  when asked. While a turn is open, an answer that asks for facts (names them: "What is your
  order number?") gets them from the user, and the turn stays open; an open question without a
  call yet this turn gets the turn's request restated, never the facts; anything else (the agent
  says what it did) ends the turn and the user goes on with the next request (a follow-up, or a
  change of mind: "Actually, make it two nights"), or stops after the last. The scripted user is
  a function of the conversation and the agent's words, so forks, snapshots and replays hold; an
  LLM user (``envfactory.make(name, user=responder)``) words the replies instead, over any policy
  backend, while the turn structure stays the script's.

Scoring (a task's :meth:`~envfactory.Task.components`): success is the product of the components
the task uses, each judged on the host from the true world:

* ``state``: the final state is the reference's (or the task's ``check`` holds);
* ``answer``: the final answer holds the answer facts;
* ``turn_state``: after each turn with a ``"state"`` check, the state is the reference's after that
  turn (BFCL's state check): the whole state by its hash, or what ``Conversation.state_view``
  shows of it, by ``==``;
* ``turn_results``: each result of the reference's calls in a turn with a ``"results"`` check is
  among the results of the agent's calls up to the end of that turn, as often as the reference got
  it (BFCL's response check);
* ``no_call``: the agent made no tool call in a turn whose right answer is none (BFCL's
  irrelevance check);
* ``turn_call``: the agent made a tool call in each turn with a ``"call"`` check (BFCL fails a
  turn with reference calls that the model answered without one);
* ``communicate``: each of ``Conversation.communicate`` occurs in some assistant message (tau2's
  communicate check);
* ``actions``: each of the reference's writing calls was made, in order, with the same arguments
  (tau2's action check);
* ``assertions``: each of the task's ``assertions`` holds on the final state (tau2's
  environment assertions).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .calls import ToolCall, fact_in, normalize_answer

__all__ = ["UserTurn", "Conversation", "TurnCheck", "user_reply", "asks", "asked_facts", "COMPONENTS",
           "TURN_COMPONENTS"]

TurnCheck = Literal["state", "results", "no_call", "call"]
COMPONENTS = ("state", "answer", "turn_state", "turn_results", "no_call", "turn_call", "communicate", "actions",
              "assertions")
TURN_COMPONENTS: dict[str, str] = {"state": "turn_state", "results": "turn_results", "no_call": "no_call",
                                   "call": "turn_call"}
"""Each per-turn check and the reward component that judges it (see :meth:`~envfactory.Task.components`)."""

STOP = "That's all, thank you."


class UserTurn(BaseModel):
    """One user turn of a conversation.

    Attributes:
        message: What the user says (the first turn's is the task's instruction).
        solution: The reference calls that answer this turn (none: the right answer is words).
        tools: Tools that appear at this turn: hidden from the agent (not in its schemas, an
            unknown tool if called) until the turn opens; the turn's message then ends with their
            schemas (a chat template shows the tools of the opening only). BFCL's ``miss_func``
            entries add a function mid-conversation.
        checks: What is checked when the agent ends this turn: ``"state"`` (the state is the
            reference's after this turn), ``"results"`` (the reference's results of this turn are
            among the agent's results so far), ``"no_call"`` (the agent made no tool call in this
            turn), ``"call"`` (the agent made a tool call in this turn). Default: ``("state",)``, or
            ``("no_call",)`` for a turn without reference calls; ``()``: nothing is checked when the
            turn ends (its calls still count for the later turns' checks).
    """

    model_config = ConfigDict(extra="forbid")

    message: str
    solution: list[ToolCall] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    checks: tuple[TurnCheck, ...] | None = None

    def model_post_init(self, _ctx: Any) -> None:
        if self.checks is None:
            self.checks = ("state",) if self.solution else ("no_call",)

    @field_validator("message")
    @classmethod
    def _said(cls, message: str) -> str:
        if not message.strip():
            raise ValueError("a user turn needs a message")
        return message


class Conversation(BaseModel):
    """A task's conversation: the user's turns, and what the user holds back.

    Attributes:
        turns: The user's turns, in order (at least one).
        facts: What the user knows and tells only when asked (``{"order number": "W-1182"}``):
            never in a turn's message, never listed on an open question. A fact is asked for when
            the agent's words ask something (:func:`asks`) and share a word with its name.
        persona: Who the user is, for an LLM user's prompt (the scripted user does not say it).
        communicate: Facts the agent must tell the user in some assistant message (tau2's
            communicate check): a number it looked up, a status.
        hidden: Tools of the environment this conversation never shows: not in the agent's
            schemas, an unknown tool if called (BFCL shows an entry only the functions of the
            classes it involves).
        state_view: What a turn's ``"state"`` check compares: ``state_view(state)`` after the
            agent's turn is compared by ``==`` with ``state_view`` of the reference's state after
            that turn (a deep copy taken when the reference is replayed). ``None`` (default): the
            whole state, by its canonical hash. BFCL's state check compares only the public
            attributes of the classes an entry involves (not a current directory, a random
            generator's state or a file's modification time); a function of the state that
            returns those compares exactly what it compares. It must not change the state, and a
            picklable object (not a lambda) keeps the task picklable.
    """

    model_config = ConfigDict(extra="forbid")

    turns: list[UserTurn]
    facts: dict[str, str] = Field(default_factory=dict)
    persona: str = ""
    communicate: list[str] = Field(default_factory=list)
    hidden: list[str] = Field(default_factory=list)
    state_view: Callable[[Any], Any] | None = Field(default=None, exclude=True)

    @field_validator("turns")
    @classmethod
    def _some(cls, turns: list[UserTurn]) -> list[UserTurn]:
        if not turns:
            raise ValueError("a conversation needs at least one user turn")
        return turns

    @property
    def solution(self) -> list[ToolCall]:
        """Every turn's reference calls, in order: the task's reference solution."""
        return [c for t in self.turns for c in t.solution]

    def hidden_tools(self, opened: int) -> set[str]:
        """The tools not shown when turns ``0..opened`` have been opened: those of the later
        turns and those never shown (:attr:`hidden`)."""
        return {name for t in self.turns[opened + 1:] for name in t.tools} | set(self.hidden)


_WORD = re.compile(r"[a-z0-9]+")


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def asked_facts(words: str, facts: dict[str, str]) -> list[str]:
    """The facts whose name shares a word (of three letters or more) with ``words``."""
    said = {_stem(w) for w in _WORD.findall(words.lower())}
    return [k for k in facts if said & {_stem(w) for w in _WORD.findall(k.lower()) if len(w) > 2}]


_ASKING = re.compile(r"\b(tell me|let me know|provide|give me|share|send me|i need your|i'll need your|"
                     r"i will need your|confirm)\b")


def asks(words: str) -> bool:
    """Whether the agent's ``words`` ask the user something: a question mark, or a request
    ("please tell me", "I need your ..."). "Your account is unlocked." asks for nothing, though it
    names the account."""
    return "?" in words or _ASKING.search(words.lower()) is not None


def user_reply(conversation: Conversation, turn: int, words: str, called: bool) -> tuple[str | None, list[str]]:
    """The scripted user's answer to the agent's ``words`` (an answer without a tool call) while
    ``turn`` is open.

    Returns ``(reply, asked)``: ``reply`` is the user's words when the turn stays open (the facts
    asked for, or the request restated), ``None`` when the answer ends the turn; ``asked`` the
    facts told now. ``called``: the agent has made a tool call in this turn; ``told``: facts
    told before (not told again unless asked again).
    """
    facts = conversation.facts
    if not facts:
        return None, []
    asked = asked_facts(words, facts) if asks(words) else []
    if asked:
        return " ".join(f"My {k} is {facts[k]}." for k in asked), asked
    if not called and "?" in words:
        return "As I said: " + conversation.turns[turn].message, []
    return None, []


def communicated(fact: str, messages: list[str]) -> bool:
    """Whether ``fact`` occurs in one of the assistant ``messages`` (normalized, as answer facts)."""
    f = normalize_answer(fact)
    return any(fact_in(f, normalize_answer(m)) for m in messages)
