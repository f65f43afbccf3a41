"""Messaging between agents of a multi-agent environment: direct and broadcast.

The tools work on any :class:`envfactory.MultiState` (the mailbox is part
of the shared state, so messages fork and snapshot with the world). The sender
is the acting agent, set by the episode: an agent cannot speak for another.
Letters are also delivered automatically into each recipient's next
observation; ``read_messages`` re-reads the whole inbox.
"""

from __future__ import annotations

from typing import Any

from envfactory import ToolError, tool
from envfactory.mail import BROADCAST, Letter

__all__ = ["send_message", "read_messages", "TOOLS", "letters_between"]

MAX_MESSAGE_CHARS = 2000


@tool
def send_message(state: Any, to: str, content: str) -> str:
    """Send a message to a teammate, or to everyone with to="all".

    Args:
        to: The recipient's agent id (e.g. "writer_0"), or "all" to broadcast.
        content: The message text.
    """
    sender = state.acting
    if to == sender:
        raise ToolError("you cannot send a message to yourself; pick a teammate's id or \"all\"")
    if to != BROADCAST and to not in state.agents:
        others = [a for a in state.agents if a != sender]
        raise ToolError(f"no agent {to!r}; send to one of {others} or \"all\"")
    if not content.strip():
        raise ToolError("the message is empty; write what your teammate needs to know")
    if len(content) > MAX_MESSAGE_CHARS:
        raise ToolError(f"the message has {len(content)} characters; the limit is {MAX_MESSAGE_CHARS}")
    letter = state.mail.post(sender, to, content, state.round)
    return f"Message {letter.id} sent to {to}."


@tool(read_only=True)
def read_messages(state: Any) -> str:
    """List every message you have received so far, oldest first."""
    inbox = state.mail.inbox(state.acting)
    if not inbox:
        return "No messages."
    return "\n".join(m.render() for m in inbox)


def letters_between(state: Any, sender: str, recipient: str) -> list[Letter]:
    """Letters ``sender`` sent that reach ``recipient`` (direct or broadcast)."""
    return [m for m in state.mail.letters if m.sender == sender and m.reaches(recipient)]


TOOLS = [send_message, read_messages]
