"""Simulated users: a person in the world who holds facts the agent must ask for.

A task with a user keeps the user's private facts in the state (``state.user``, e.g.
``{"name": "Kim"}``), never in the instruction; the agent reaches them only through the
``ask_user(question)`` tool. The environment stays a single-agent environment to the
trainer: the user is part of the world.

* The **scripted user** (:func:`scripted_reply`, what ``ask_user`` runs in every world,
  containers included) answers each fact whose name the question mentions ("What is your
  name?" -> "My name is Kim.") and otherwise says which facts it can tell, never their values.
  It is a function of the state and the question, so forks, snapshots and replays hold.
* An **LLM user** answers instead when an episode is given one
  (``envfactory.make(name, user=responder)``): the referee, on the host, calls
  ``responder(question, facts, history)`` for each ``ask_user`` call and returns its text
  (see ``agents.users.LLMUser`` for one over any policy backend).

``verify`` proves such a task needs the asking: each user task carries a *twin*
(``task.metadata["user_twin"]``), the same instruction and the same tables with other user
facts, whose success check requires a different value on some leaf. An agent that never
asks sees the same thing in both and ends in the same state, so it solves at most one.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Protocol

from .tooling import Tool, make_tool

__all__ = ["USER_TOOL", "UserResponder", "scripted_reply", "user_tool", "user_facts"]

USER_TOOL = "ask_user"


class UserResponder(Protocol):
    """An LLM (or any) user: the reply to ``question`` from a user holding ``facts``;
    ``history`` is the earlier ``(question, reply)`` pairs of the episode."""

    def __call__(self, question: str, facts: dict[str, str], history: list[tuple[str, str]]) -> str: ...


_WORD = re.compile(r"[a-z0-9]+")


def scripted_reply(question: str, facts: dict[str, str]) -> str:
    """The scripted user's answer: every fact whose name shares a word with the question."""
    if not facts:
        return "I have nothing to add; please go ahead."
    asked = {_stem(w) for w in _WORD.findall(question.lower())}
    told = [f"My {key} is {value}." for key, value in facts.items()
            if asked & {_stem(w) for w in _WORD.findall(key.lower()) if len(w) > 2}]
    if told:
        return " ".join(told)
    return "Sorry, I don't follow. I can tell you my " + " or my ".join(facts) + "."


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word  # "orders" asks for "order"


def user_facts(state: Any) -> dict[str, str]:
    """The user's private facts in ``state`` (empty when the world has no user)."""
    return dict(getattr(state, "user", None) or {})


def _ask_user(state: Any, question: str) -> str:
    """Ask the user a question and get their reply (they know things about their own request).

    Args:
        question: What to ask, in plain words (e.g. "What is your name?").
    """
    return scripted_reply(question, user_facts(state))


def user_tool() -> Tool:
    """The ``ask_user`` tool (read-only: asking changes nothing in the world)."""
    return make_tool(_ask_user, name=USER_TOOL, read_only=True)


def host_reply(responder: Callable[..., str], question: str, facts: dict[str, str],
               history: list[tuple[str, str]]) -> str:
    """``responder``'s answer as the tool's text; a responder that fails or returns no text is
    reported as the tool's error, not raised into the episode."""
    try:
        reply = responder(question, facts, list(history))
    except Exception as exc:  # a user backend's failure is the agent's observation
        return f"Error: the user did not answer ({type(exc).__name__}: {exc})"
    if not isinstance(reply, str) or not reply.strip():
        return "Error: the user did not answer"
    return reply.strip()
