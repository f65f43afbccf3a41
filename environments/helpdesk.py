"""Helpdesk-v0: triage, assign and resolve customer support tickets."""

from __future__ import annotations

from envfactory import ToolEnvSpec, State, Task, call, register
from envfactory.factory.tasks.synthesis import SynthConfig, synthesize
from tools.ticketing import TOOLS, Helpdesk, SupportAgent, Ticket


class HelpdeskState(State):
    desk: Helpdesk


_TICKETS = [
    ("T-1001", "Cannot log in to portal", "acme", "open", "high", None),
    ("T-1002", "Invoice shows wrong VAT", "globex", "open", "normal", "A-1"),
    ("T-1003", "Export to CSV fails", "acme", "in_progress", "normal", "A-2"),
    ("T-1004", "Password reset email never arrives", "initech", "open", "urgent", None),
    ("T-1005", "Dashboard loads slowly", "globex", "waiting", "low", "A-3"),
    ("T-1006", "Request: dark mode", "acme", "open", "low", None),
    ("T-1007", "API returns 500 on /orders", "umbrella", "open", "urgent", None),
    ("T-1008", "Typo on pricing page", "initech", "resolved", "low", "A-1"),
    ("T-1009", "SSO setup help", "umbrella", "in_progress", "high", "A-2"),
    ("T-1010", "Refund for duplicate charge", "globex", "open", "high", None),
]
_AGENTS = [("A-1", "Priya", "billing"), ("A-2", "Marco", "platform"), ("A-3", "Lena", "frontend"),
           ("A-4", "Kofi", "platform")]


def world() -> HelpdeskState:
    return HelpdeskState(
        desk=Helpdesk(
            tickets={tid: Ticket(id=tid, title=ti, customer=c, status=s, priority=p, assignee=a)
                     for tid, ti, c, s, p, a in _TICKETS},
            agents={aid: SupportAgent(id=aid, name=n, team=t) for aid, n, t in _AGENTS},
            next_ticket=1010,
        )
    )


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(instruction: str, solution: list, facts: list[str] | None = None, *, computed: bool = False) -> None:
        # computed: the answer is worked out from what was read (a count), not read itself
        out.append(Task(id=f"hd-{len(out):03d}", instruction=instruction, initial_state=world(),
                        solution=solution, answer_facts=facts or [], answer_seen=not computed))

    # 1 call
    add("What is the status of ticket T-1003?", [call("get_ticket", ticket_id="T-1003")], ["in_progress"])
    add("Which customer filed ticket T-1007?", [call("get_ticket", ticket_id="T-1007")], ["umbrella"])
    add("How many tickets are open (status open) right now? Answer with the number.",
        [call("search_tickets", status="open")], ["6"], computed=True)
    add("Mark ticket T-1008 as closed.", [call("set_status", ticket_id="T-1008", status="closed")])
    add("Raise the priority of T-1006 to normal.", [call("set_priority", ticket_id="T-1006", priority="normal")])
    add("Add the comment 'Customer confirmed the fix' to T-1003.",
        [call("add_comment", ticket_id="T-1003", text="Customer confirmed the fix")])
    add("Open a ticket for customer hooli titled 'Mobile app crashes on start' with priority high.",
        [call("create_ticket", title="Mobile app crashes on start", customer="hooli", priority="high")])
    add("Which team is Kofi on?", [call("list_agents")], ["platform"])
    # 2 calls (look something up, then act on it)
    add("Assign ticket T-1001 to Marco.",
        [call("list_agents"), call("assign_ticket", ticket_id="T-1001", agent_id="A-2")])
    add("Assign the refund ticket (duplicate charge) to the billing team's agent.",
        [call("search_tickets", keyword="refund"), call("list_agents"),
         call("assign_ticket", ticket_id="T-1010", agent_id="A-1")])
    add("Who is working on the SSO setup ticket? Give the agent's name.",
        [call("search_tickets", keyword="SSO"), call("list_agents")], ["Marco"])
    add("Put the dashboard ticket back to open and add the comment 'Customer replied'.",
        [call("set_status", ticket_id="T-1005", status="open"),
         call("add_comment", ticket_id="T-1005", text="Customer replied")])
    add("Close every resolved ticket.",
        [call("search_tickets", status="resolved"), call("set_status", ticket_id="T-1008", status="closed")])
    # 3 calls
    add("Open a ticket for customer hooli titled 'Billing address change' (priority normal) and "
        "assign it to Priya.",
        [call("create_ticket", title="Billing address change", customer="hooli", priority="normal"),
         call("list_agents"), call("assign_ticket", ticket_id="T-1011", agent_id="A-1")])
    add("Escalate T-1001: set its priority to urgent, assign it to Kofi and add the comment "
        "'Escalated to platform'.",
        [call("set_priority", ticket_id="T-1001", priority="urgent"),
         call("assign_ticket", ticket_id="T-1001", agent_id="A-4"),
         call("add_comment", ticket_id="T-1001", text="Escalated to platform")])
    add("Assign every unassigned urgent ticket to Kofi.",
        [call("search_tickets", assignee="unassigned"),
         call("assign_ticket", ticket_id="T-1004", agent_id="A-4"),
         call("assign_ticket", ticket_id="T-1007", agent_id="A-4")])
    add("Resolve all of acme's open tickets with low priority, adding the comment 'Not planned' "
        "to each first.",
        [call("search_tickets", customer="acme", status="open"),
         call("add_comment", ticket_id="T-1006", text="Not planned"),
         call("set_status", ticket_id="T-1006", status="resolved")])
    # 4 and more
    add("Marco is going on leave: reassign all his tickets that are open or in progress to Kofi.",
        [call("list_agents"), call("search_tickets", assignee="A-2"),
         call("assign_ticket", ticket_id="T-1003", agent_id="A-4"),
         call("assign_ticket", ticket_id="T-1009", agent_id="A-4")])
    add("Open a ticket for umbrella titled 'Webhook retries missing' with priority urgent, assign "
        "it to Marco, set it to in_progress and comment 'Investigating'.",
        [call("create_ticket", title="Webhook retries missing", customer="umbrella", priority="urgent"),
         call("assign_ticket", ticket_id="T-1011", agent_id="A-2"),
         call("set_status", ticket_id="T-1011", status="in_progress"),
         call("add_comment", ticket_id="T-1011", text="Investigating")])
    add("Triage globex: every globex ticket that is open should be assigned to Priya (if not "
        "already) and set to in_progress; then report how many globex tickets there are in total.",
        [call("search_tickets", customer="globex"),
         call("set_status", ticket_id="T-1002", status="in_progress"),
         call("assign_ticket", ticket_id="T-1010", agent_id="A-1"),
         call("set_status", ticket_id="T-1010", status="in_progress")], ["3"])
    add("Start work on all unassigned tickets: assign each unassigned open ticket to the agent on "
        "the platform team with no active tickets, and set it to in_progress.",
        [call("list_agents"), call("search_tickets", assignee="unassigned", status="open"),
         call("assign_ticket", ticket_id="T-1001", agent_id="A-4"),
         call("set_status", ticket_id="T-1001", status="in_progress"),
         call("assign_ticket", ticket_id="T-1004", agent_id="A-4"),
         call("set_status", ticket_id="T-1004", status="in_progress"),
         call("assign_ticket", ticket_id="T-1006", agent_id="A-4"),
         call("set_status", ticket_id="T-1006", status="in_progress"),
         call("assign_ticket", ticket_id="T-1007", agent_id="A-4"),
         call("set_status", ticket_id="T-1007", status="in_progress"),
         call("assign_ticket", ticket_id="T-1010", agent_id="A-4"),
         call("set_status", ticket_id="T-1010", status="in_progress")])
    return out + synthesize(SPEC.all_tools, SYNTH, n=SYNTHESIZED, seed=0)


# Tasks beyond the hand-written ones are synthesized by walking the tools (envfactory.factory).
SYNTHESIZED = 40
SYNTH = SynthConfig(
    sample_state=lambda rng: world(),
    arguments={
        "ticket_id": "keys:desk.tickets", "agent_id": "keys:desk.agents",
        "title": ["Printer offline", "Cannot export PDF", "Billing question"],
        "customer": "values:desk.tickets.*.customer", "assignee": "keys:desk.agents",
        "keyword": ["login", "invoice", "API"], "text": ["Called the customer", "Waiting on logs"],
    },
    read_share=0.15, prefix="hdsyn",
)

SPEC = register(
    ToolEnvSpec(
        name="Helpdesk-v0",
        domain="ticketing",
        description="Triage, assign and resolve customer support tickets.",
        state_type=HelpdeskState,
        tools=TOOLS,
        tasks=tasks,
        metadata={"synth": SYNTH},
        max_turns=20,
    )
)
