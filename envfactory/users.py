"""Simulated users: a person in the world who holds facts the agent must ask for.

A task with a user keeps the user's private facts in the state (``state.user``, e.g.
``{"name": "Kim"}``), never in the instruction; the agent reaches them only through the
``ask_user(question)`` tool. The environment stays a single-agent environment to the
trainer: the user is part of the world.

* The **scripted user** (:func:`scripted_reply`, what ``ask_user`` runs in every world,
  containers included) answers each fact whose name the question mentions ("What is your
  name?" -> "My name is Kim.") and otherwise asks what the agent needs to know: it never lists
  its facts, so the agent has to know what to ask for.
  It is a function of the state and the question, so forks, snapshots and replays hold.
* A user with a **goal** (tau2-style) also keeps a *script* in ``state.user``, under keys that
  start with ``_`` (never told as facts): a persona and the goal in its own words, which it
  volunteers on an open question ("How can I help?") without the facts that identify it; a
  *slip* (``"_slip": "name=Kym"``): the first answer to that fact is the wrong value, corrected
  on the next question; and a *confirmation* (``"_confirm": "cancel_order"``): those tools refuse
  until the user has answered a question asking to confirm ("Shall I go ahead?" -> "Yes, go
  ahead."). What it has said so far (``_slipped``, ``_confirmed``) is kept in ``state.user`` too,
  so the reply stays a function of the state and the question.
* An **LLM user** answers instead when an episode is given one
  (``envfactory.make(name, user=responder)``): the referee, on the host, calls
  ``responder(question, facts, history)`` for each ``ask_user`` call and returns its text
  (see ``agents.policies.users.LLMUser`` for one over any policy backend).

``verify`` proves such a task needs the asking: each user task carries a *twin*
(``task.metadata["user_twin"]``), the same instruction and the same tables with other user
facts, whose success check requires a different value on some leaf. An agent that never
asks sees the same thing in both and ends in the same state, so it solves at most one.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Protocol

from .tooling import Tool, make_tool

__all__ = ["USER_TOOL", "UserResponder", "scripted_reply", "user_tool", "user_facts", "user_turn",
           "public_facts", "user_profile", "unconfirmed", "PERSONA", "GOAL", "SLIP", "CONFIRM"]

USER_TOOL = "ask_user"

# the user's script (keys of state.user that are not facts): who they are, what they want, the
# fact they first get wrong ("name=Kym"), the tools they must confirm (space-separated); and what
# they have said so far (kept in the state, so forks, snapshots and replays hold)
PERSONA, GOAL, SLIP, CONFIRM = "_persona", "_goal", "_slip", "_confirm"
_SLIPPED, _CONFIRMED = "_slipped", "_confirmed"
CONFIRMED_REPLY = "Yes, go ahead."
# a question that asks the user to confirm an action (and is not a question for a fact)
_CONFIRMING = re.compile(r"\b(confirm\w*|shall i|should i|go ahead|proceed|do you want me to|"
                         r"is (?:that|this|it) (?:ok|okay|alright|fine))\b")
_FOR_A_FACT = re.compile(r"\b(what|which|who|tell me)\b")


def _confirming(question: str) -> bool:
    q = question.lower()
    return bool(_CONFIRMING.search(q)) and not _FOR_A_FACT.search(q)


class UserResponder(Protocol):
    """An LLM (or any) user: the reply to ``question`` from a user holding ``facts``;
    ``history`` is the earlier ``(question, reply)`` pairs of the episode."""

    def __call__(self, question: str, facts: dict[str, str], history: list[tuple[str, str]]) -> str: ...


_WORD = re.compile(r"[a-z0-9]+")


def scripted_reply(question: str, facts: dict[str, str]) -> str:
    """The scripted user's answer: every fact whose name shares a word with the question."""
    facts = public_facts(facts)
    if not facts:
        return "I have nothing to add; please go ahead."
    told = [f"My {key} is {value}." for key in _asked(question, facts) for value in [facts[key]]]
    if told:
        return " ".join(told)
    return "Sorry, I don't follow. What do you need to know?"


def _asked(question: str, facts: dict[str, str]) -> list[str]:
    """The facts whose name shares a word with ``question``."""
    asked = {_stem(w) for w in _WORD.findall(question.lower())}
    return [key for key in facts if asked & {_stem(w) for w in _WORD.findall(key.lower()) if len(w) > 2}]


def user_turn(user: dict[str, str], question: str) -> str:
    """The scripted user with a goal answers ``question``, updating ``user`` (the state's
    ``state.user``) with what it has now said. Without a script it is :func:`scripted_reply`.

    * a question asking to confirm -> "Yes, go ahead." (and the confirmation is recorded);
    * a question naming facts -> those facts (the slipped one wrong the first time, then
      "Sorry, I meant ...");
    * anything else (a greeting, "How can I help?") -> the persona and the goal, never a fact or
      the names of the facts it holds;
    * a wrong value already told and not yet corrected is corrected first, whatever was asked.
    """
    facts = public_facts(user)
    if not any(k.startswith("_") for k in user):
        return scripted_reply(question, facts)
    slip, _, wrong = user.get(SLIP, "").partition("=")
    pending = bool(slip) and user.get(_SLIPPED) == "told"
    parts: list[str] = []
    confirming = _confirming(question)
    asked = [] if confirming else _asked(question, facts)
    if pending and slip not in asked:
        parts.append(f"Sorry, I told you the wrong {slip} earlier: it is {facts[slip]}, not {wrong}.")
        user[_SLIPPED] = "fixed"
    if confirming:
        if user.get(CONFIRM):
            user[_CONFIRMED] = "yes"
        parts.append(CONFIRMED_REPLY)
    elif asked:
        for key in asked:
            if key == slip and _SLIPPED not in user:
                parts.append(f"My {key} is {wrong}.")
                user[_SLIPPED] = "told"
            elif key == slip and pending:
                parts.append(f"Sorry, I meant {facts[key]}. My {key} is {facts[key]}.")
                user[_SLIPPED] = "fixed"
            else:
                parts.append(f"My {key} is {facts[key]}.")
    else:
        said = [s for s in (user.get(PERSONA) and f"I'm {user[PERSONA]}.", user.get(GOAL)) if s]
        parts += said or ["Sorry, I don't follow. What do you need to know?"]
    return " ".join(parts)


def public_facts(user: dict[str, str]) -> dict[str, str]:
    """The facts the user tells when asked (``user`` without its script)."""
    return {k: v for k, v in user.items() if not k.startswith("_")}


def unconfirmed(state: Any, tool: str) -> str | None:
    """Why ``tool`` must not run yet in ``state``: the user must confirm it first; ``None`` when
    it may (no user, a tool they need not confirm, or already confirmed)."""
    user = getattr(state, "user", None) or {}
    if tool in user.get(CONFIRM, "").split() and user.get(_CONFIRMED) != "yes":
        return ("the user has not confirmed this yet; ask them first (ask_user, e.g. \"Shall I go ahead?\") "
                "and wait for their yes")
    return None


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word  # "orders" asks for "order"


def user_facts(state: Any) -> dict[str, str]:
    """The user's private facts in ``state`` (empty when the world has no user), without its script."""
    return public_facts(getattr(state, "user", None) or {})


def user_profile(state: Any) -> dict[str, str]:
    """What an LLM user is told: its persona and goal (when it has them), then its facts."""
    user = getattr(state, "user", None) or {}
    said = {k[1:]: user[k] for k in (PERSONA, GOAL) if user.get(k)}
    return {**said, **public_facts(user)}


def _ask_user(state: Any, question: str) -> str:
    """Ask the user a question and get their reply (they know things about their own request;
    ask them to confirm before an action that cannot be undone).

    Args:
        question: What to ask, in plain words (e.g. "What is your name?").
    """
    user = getattr(state, "user", None)
    if not isinstance(user, dict):
        return scripted_reply(question, {})
    return user_turn(user, question)


def user_tool() -> Tool:
    """The ``ask_user`` tool (read-only for the world's tables: asking records only what the user
    has said so far in ``state.user``)."""
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
