"""A helpdesk: tickets, support agents and comments. Tools reach it as ``state.desk``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from envfactory import ToolError, tool

__all__ = ["Ticket", "SupportAgent", "Helpdesk", "TOOLS", "STATUSES", "PRIORITIES"]

Status = Literal["open", "in_progress", "waiting", "resolved", "closed"]
Priority = Literal["low", "normal", "high", "urgent"]
STATUSES = ("open", "in_progress", "waiting", "resolved", "closed")
PRIORITIES = ("low", "normal", "high", "urgent")


class Ticket(BaseModel):
    id: str
    title: str
    customer: str
    status: Status = "open"
    priority: Priority = "normal"
    assignee: str | None = None
    comments: list[str] = Field(default_factory=list)


class SupportAgent(BaseModel):
    id: str
    name: str
    team: str


class Helpdesk(BaseModel):
    tickets: dict[str, Ticket] = Field(default_factory=dict)
    agents: dict[str, SupportAgent] = Field(default_factory=dict)
    next_ticket: int = 1000


def _desk(state: Any) -> Helpdesk:
    return state.desk


def _ticket(desk: Helpdesk, ticket_id: str) -> Ticket:
    try:
        return desk.tickets[ticket_id]
    except KeyError:
        raise ToolError(f"no ticket {ticket_id!r}; ticket ids look like 'T-1001'") from None


def _line(t: Ticket) -> str:
    return (f"{t.id} | {t.title} | customer={t.customer} | status={t.status} | "
            f"priority={t.priority} | assignee={t.assignee or 'unassigned'}")


@tool(read_only=True)
def search_tickets(
    state: Any,
    status: Status | None = None,
    customer: str | None = None,
    assignee: str | None = None,
    keyword: str | None = None,
) -> str:
    """List tickets matching every given filter (omit a filter to ignore it).

    Args:
        status: Only tickets with this status.
        customer: Only tickets of this customer.
        assignee: Only tickets assigned to this agent id (use 'unassigned' for none).
        keyword: Only tickets whose title contains this word (case-insensitive).
    """
    desk = _desk(state)
    hits = []
    for t in desk.tickets.values():
        if status is not None and t.status != status:
            continue
        if customer is not None and t.customer.lower() != customer.lower():
            continue
        if assignee is not None and (t.assignee or "unassigned") != assignee:
            continue
        if keyword is not None and keyword.lower() not in t.title.lower():
            continue
        hits.append(_line(t))
    return "\n".join(hits) if hits else "No tickets match."


@tool(read_only=True)
def get_ticket(state: Any, ticket_id: str) -> str:
    """Show one ticket with its comments.

    Args:
        ticket_id: The ticket id, e.g. 'T-1001'.
    """
    t = _ticket(_desk(state), ticket_id)
    comments = "\n".join(f"  - {c}" for c in t.comments) or "  (no comments)"
    return _line(t) + "\ncomments:\n" + comments


@tool(read_only=True)
def list_agents(state: Any) -> str:
    """List support agents with their team and number of open or in-progress tickets."""
    desk = _desk(state)
    lines = []
    for a in desk.agents.values():
        load = sum(1 for t in desk.tickets.values()
                   if t.assignee == a.id and t.status in ("open", "in_progress"))
        lines.append(f"{a.id} | {a.name} | team={a.team} | active_tickets={load}")
    return "\n".join(lines)


@tool
def create_ticket(state: Any, title: str, customer: str, priority: Priority = "normal") -> str:
    """Open a new ticket; returns its id.

    Args:
        title: Short description of the problem.
        customer: Customer name.
        priority: One of low, normal, high, urgent.
    """
    desk = _desk(state)
    if not title.strip():
        raise ToolError("title must not be empty")
    desk.next_ticket += 1
    tid = f"T-{desk.next_ticket}"
    desk.tickets[tid] = Ticket(id=tid, title=title, customer=customer, priority=priority)
    return f"Created ticket {tid}."


@tool
def assign_ticket(state: Any, ticket_id: str, agent_id: str) -> str:
    """Assign a ticket to a support agent.

    Args:
        ticket_id: The ticket id.
        agent_id: The agent id, e.g. 'A-2' (see list_agents).
    """
    desk = _desk(state)
    t = _ticket(desk, ticket_id)
    if agent_id not in desk.agents:
        raise ToolError(f"no agent {agent_id!r}; call list_agents to see the ids")
    if t.status == "closed":
        raise ToolError(f"{ticket_id} is closed; reopen it first by setting its status")
    t.assignee = agent_id
    return f"Assigned {ticket_id} to {agent_id}."


@tool
def set_status(state: Any, ticket_id: str, status: Status) -> str:
    """Change a ticket's status.

    Args:
        ticket_id: The ticket id.
        status: One of open, in_progress, waiting, resolved, closed.
    """
    t = _ticket(_desk(state), ticket_id)
    t.status = status
    return f"{ticket_id} is now {status}."


@tool
def set_priority(state: Any, ticket_id: str, priority: Priority) -> str:
    """Change a ticket's priority.

    Args:
        ticket_id: The ticket id.
        priority: One of low, normal, high, urgent.
    """
    t = _ticket(_desk(state), ticket_id)
    t.priority = priority
    return f"{ticket_id} priority is now {priority}."


@tool
def add_comment(state: Any, ticket_id: str, text: str) -> str:
    """Add a comment to a ticket.

    Args:
        ticket_id: The ticket id.
        text: The comment.
    """
    if not text.strip():
        raise ToolError("comment text must not be empty")
    t = _ticket(_desk(state), ticket_id)
    t.comments.append(text)
    return f"Comment added to {ticket_id}."


TOOLS = [search_tickets, get_ticket, list_agents, create_ticket, assign_ticket, set_status,
         set_priority, add_comment]
