"""MultiMeeting-v0 (consensus under private constraints): three people agree on a meeting time.

Each agent's calendar is private: only its owner can read it. ``organizer_0``
schedules the meeting; ``guest_0`` and ``guest_1`` must each accept it, and
cannot accept a time at which they are busy. Rescheduling withdraws the old
invitation. The team succeeds when a meeting is scheduled at a time that suits
all three and both guests have accepted it.

Tasks: four hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiMeeting/<k>")``) up to 50: three calendars sharing exactly one free hour.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel

import envfactory.faces.pettingzoo_env as multi
from envfactory import ConflictError, MultiState, Role, Task, ToolEnvSpec, ToolError, by, register, tool
from tools.messaging import TOOLS as MESSAGING

DAYS = ("mon", "tue", "wed")
HOURS = (9, 10, 11, 13, 14, 15, 16)
PEOPLE = ("organizer_0", "guest_0", "guest_1")


class Meeting(BaseModel):
    id: str
    day: str
    hour: int
    accepted: list[str] = []
    status: str = "active"         # active | withdrawn


class MeetingState(MultiState):
    busy: dict[str, list[str]]     # agent -> ["mon 9", ...]
    meetings: list[Meeting] = []


def _slot(day: str, hour: int) -> str:
    return f"{day} {hour}"


@tool(read_only=True)
def my_calendar(state: MeetingState) -> str:
    """List the hours at which you are busy (Mon-Wed; meetings can be at 9-11 and 13-16)."""
    busy = state.busy.get(state.acting, [])
    return "You are busy at: " + (", ".join(busy) if busy else "no hour") + "."


@tool
def schedule_meeting(state: MeetingState, day: str, hour: int) -> str:
    """Schedule the team meeting (withdrawing any earlier invitation) and invite both guests.

    Args:
        day: mon, tue or wed.
        hour: 9, 10, 11, 13, 14, 15 or 16.
    """
    if day not in DAYS or hour not in HOURS:
        raise ToolError(f"pick a day in {DAYS} and an hour in {HOURS}")
    if _slot(day, hour) in state.busy.get(state.acting, []):
        raise ToolError(f"you are busy at {day} {hour}")
    for m in state.meetings:
        m.status = "withdrawn"
    mid = f"MTG-{len(state.meetings) + 1}"
    state.meetings.append(Meeting(id=mid, day=day, hour=hour))
    return f"Meeting {mid} scheduled for {day} {hour}:00; guest_0 and guest_1 must accept it."


@tool
def accept_meeting(state: MeetingState, meeting_id: str) -> str:
    """Accept a meeting invitation (only at a time you are free).

    Args:
        meeting_id: The meeting id, like 'MTG-1'.
    """
    m = next((m for m in state.meetings if m.id == meeting_id), None)
    if m is None:
        raise ToolError(f"no meeting {meeting_id!r}; the organizer gives its id")
    if m.status != "active":
        raise ConflictError(f"meeting {meeting_id} was withdrawn (rescheduled)")
    if _slot(m.day, m.hour) in state.busy.get(state.acting, []):
        raise ToolError(f"you are busy at {m.day} {m.hour}; tell the organizer when you are free")
    if state.acting not in m.accepted:
        m.accepted.append(state.acting)
    return f"You accepted {meeting_id} ({m.day} {m.hour}:00)."


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(free: dict[str, list[str]], meet: tuple[str, int], seed: int | None = None) -> None:
        busy = {a: [_slot(d, h) for d in DAYS for h in HOURS if _slot(d, h) not in free[a]] for a in PEOPLE}
        common = set(free["organizer_0"]) & set(free["guest_0"]) & set(free["guest_1"])
        assert common == {_slot(*meet)}, common

        def check(state: MeetingState) -> bool:
            live = [m for m in state.meetings if m.status == "active"]
            return (len(live) == 1 and _slot(live[0].day, live[0].hour) in common
                    and set(live[0].accepted) == {"guest_0", "guest_1"})

        steps = [by(g, "my_calendar") for g in ("guest_0", "guest_1")]
        steps += [by(g, "send_message", to="organizer_0", content=f"I am free at {', '.join(free[g])}.")
                  for g in ("guest_0", "guest_1")]
        steps += [by("organizer_0", "schedule_meeting", day=meet[0], hour=meet[1]),
                  by("organizer_0", "send_message", to="all", content="Please accept MTG-1."),
                  by("guest_0", "accept_meeting", meeting_id="MTG-1"),
                  by("guest_1", "accept_meeting", meeting_id="MTG-1")]
        out.append(Task(
            id=f"meeting-{len(out):03d}",
            instruction="Schedule one team meeting (Mon-Wed, 9-11 or 13-16) at a time all three of you are "
                        "free; the organizer schedules it, and both guests must accept it.",
            private={a: "Read your calendar with my_calendar; nobody else can." for a in PEOPLE},
            initial_state=MeetingState(busy=busy), check=check, solution=steps,
            metadata={} if seed is None else {"generator_seed": seed}))

    add({"organizer_0": ["mon 9", "mon 10", "tue 14", "wed 11"], "guest_0": ["mon 10", "tue 14", "wed 9"],
         "guest_1": ["tue 14", "wed 11", "mon 9"]}, ("tue", 14))
    add({"organizer_0": ["mon 13", "tue 9", "wed 16"], "guest_0": ["wed 16", "tue 9", "mon 11"],
         "guest_1": ["wed 16", "mon 13", "tue 10"]}, ("wed", 16))
    add({"organizer_0": ["mon 9", "mon 10", "mon 11"], "guest_0": ["mon 10", "mon 11", "tue 9"],
         "guest_1": ["mon 9", "mon 11", "wed 15"]}, ("mon", 11))
    add({"organizer_0": ["tue 10", "tue 11", "wed 13", "wed 14"], "guest_0": ["wed 13", "tue 11", "mon 15"],
         "guest_1": ["wed 14", "tue 10", "wed 13"]}, ("wed", 13))
    seed = 0
    while len(out) < N_TASKS:
        add(*generate(random.Random(f"MultiMeeting/{seed}")), seed=seed)
        seed += 1
    return out


N_TASKS = 50


def generate(rng: random.Random) -> tuple[dict[str, list[str]], tuple[str, int]]:
    """Free hours per person that share exactly one slot (the meeting), and that slot."""
    slots = [(d, h) for d in DAYS for h in HOURS]
    meet = rng.choice(slots)
    others = [_slot(*s) for s in slots if s != meet]
    free = {a: set(rng.sample(others, rng.randint(2, 6))) for a in PEOPLE}
    for extra in sorted(free["organizer_0"] & free["guest_0"] & free["guest_1"]):
        free[rng.choice(PEOPLE)].discard(extra)
    out = {}
    for a in PEOPLE:
        hours = sorted(free[a] | {_slot(*meet)}, key=lambda s: (DAYS.index(s.split()[0]), int(s.split()[1])))
        rng.shuffle(hours)
        out[a] = hours
    return out, meet


SPEC = register(ToolEnvSpec(
    name="MultiMeeting-v0",
    domain="calendar",
    description="Consensus under private constraints: three private calendars, one meeting everyone accepts.",
    state_type=MeetingState,
    roles=[Role("organizer_0", "the organizer: you schedule the team meeting", [my_calendar, schedule_meeting]),
           Role("guest_0", "a guest: you accept the meeting if it suits you", [my_calendar, accept_meeting]),
           Role("guest_1", "a guest: you accept the meeting if it suits you", [my_calendar, accept_meeting])],
    tools=MESSAGING,
    tasks=tasks,
    max_turns=12,
))


def env(**kwargs: Any) -> Any:
    """PettingZoo AEC env of MultiMeeting-v0."""
    return multi.env(SPEC.name, **kwargs)


def parallel_env(**kwargs: Any) -> Any:
    """PettingZoo Parallel env of MultiMeeting-v0."""
    return multi.parallel_env(SPEC.name, **kwargs)
