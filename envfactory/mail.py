"""The shared world of a multi-agent episode, and the mailbox agents talk through.

A multi-agent environment's state subclasses :class:`MultiState`. Besides the
environment's own fields it carries who is acting (set by the episode before
each tool call, so that tools know their caller without an argument the agent
could forge), the round, the team's agent ids and the :class:`Mailbox`. Being
part of the state, messages are forked, snapshotted and restored with the world.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from .state import State
from .tooling import ToolError

__all__ = ["BROADCAST", "Letter", "Mailbox", "MultiState", "ConflictError", "CONFLICT_PREFIX"]

BROADCAST = "all"
CONFLICT_PREFIX = "conflict: "


class Letter(BaseModel):
    """One message between agents. ``to`` is an agent id or ``"all"`` (broadcast)."""

    id: str
    sender: str
    to: str
    content: str
    round: int

    def reaches(self, agent: str) -> bool:
        """Whether ``agent`` receives this letter (addressed to it, or broadcast by someone else)."""
        return self.sender != agent and (self.to == agent or self.to == BROADCAST)

    def render(self) -> str:
        kind = "broadcast" if self.to == BROADCAST else "message"
        return f"[{kind} {self.id} from {self.sender}, round {self.round}] {self.content}"


class Mailbox(BaseModel):
    """Every letter sent in the episode, in order (ids ``M-1``, ``M-2``, ...)."""

    letters: list[Letter] = Field(default_factory=list)

    def post(self, sender: str, to: str, content: str, round: int) -> Letter:
        letter = Letter(id=f"M-{len(self.letters) + 1}", sender=sender, to=to, content=content, round=round)
        self.letters.append(letter)
        return letter

    def get(self, letter_id: str) -> Letter:
        for letter in self.letters:
            if letter.id == letter_id:
                return letter
        raise ToolError(f"no message {letter_id!r}; message ids look like 'M-1' (see your inbox)")

    def inbox(self, agent: str, start: int = 0, stop: int | None = None) -> list[Letter]:
        """Letters that reach ``agent`` among ``letters[start:stop]``."""
        return [m for m in self.letters[start:stop] if m.reaches(agent)]


class MultiState(State):
    """Base class of a multi-agent world.

    Attributes:
        agents: The team's agent ids, in turn order (filled in by the episode).
        acting: The agent whose tool call is running (set by the episode; tools
            read it to know who calls them).
        round: The current round, from 1 (0 before the first turn).
        mail: The messages sent so far.
    """

    agents: list[str] = Field(default_factory=list)
    acting: str = ""
    round: int = 0
    mail: Mailbox = Field(default_factory=Mailbox)


class ConflictError(ToolError):
    """A tool call failed because of another agent's action (a slot already
    booked, an offer already withdrawn). Its observation starts with
    ``Error: conflict:``, which is how coordination metrics count conflicts."""

    def __init__(self, message: str) -> None:
        super().__init__(CONFLICT_PREFIX + message)
