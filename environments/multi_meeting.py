"""MultiMeeting-v0 (consensus under private constraints): three people agree on a meeting time.

Each agent's calendar is private: only its owner can read it. ``organizer_0``
schedules the meeting; ``guest_0`` and ``guest_1`` must each accept it, and
cannot accept a time at which they are busy. Rescheduling withdraws the old
invitation. The team succeeds when a meeting is scheduled at a time that suits
all three and both guests have accepted it.

Tasks: four hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiMeeting/<k>")``) up to 50, cycling through the goals of :data:`GOALS`: the
one hour all three share; the earliest or the latest common hour; the afternoon or morning one; on
or not on a given day; the first from a given hour on; the latest on the earliest possible day;
moving a meeting booked at an hour a guest is busy; a guest's private preference for mornings or
afternoons. The calendars are drawn until the goal picks exactly one hour, and the check accepts
that hour only.
"""

from __future__ import annotations

import random
from typing import Any, Literal

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
def schedule_meeting(state: MeetingState, day: Literal["mon", "tue", "wed"],
                     hour: Literal[9, 10, 11, 13, 14, 15, 16]) -> str:
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


def _key(slot: str) -> tuple[int, int]:
    day, hour = slot.split()
    return DAYS.index(day), int(hour)


_DAY_NAMES = {"mon": "Monday", "tue": "Tuesday", "wed": "Wednesday"}


def _said(slot: str) -> str:
    day, hour = slot.split()
    return f"{_DAY_NAMES[day]} at {hour}:00"


# The goals of generated tasks. Each picks the one meeting time among the times all three are free
# (``common``) by a rule, or returns ``None`` when the drawn calendars leave the rule ambiguous
# (or trivial) and must be drawn again. ``param`` is drawn per task (a day, a slot).
def _only(common: list[str]) -> str | None:
    return common[0] if len(common) == 1 else None


def _earliest(common: list[str]) -> str | None:
    return min(common, key=_key) if len(common) >= 2 else None


def _latest(common: list[str]) -> str | None:
    return max(common, key=_key) if len(common) >= 2 else None


def _half(common: list[str], afternoon: bool) -> str | None:
    inside = [c for c in common if (_key(c)[1] >= 13) == afternoon]
    return inside[0] if len(inside) == 1 and len(common) >= 2 else None


def _on(common: list[str], day: str) -> str | None:
    inside = [c for c in common if c.split()[0] == day]
    return inside[0] if len(inside) == 1 and len(common) >= 2 else None


def _not_on(common: list[str], day: str) -> str | None:
    outside = [c for c in common if c.split()[0] != day]
    return outside[0] if len(outside) == 1 and len(common) >= 2 else None


def _not_before(common: list[str], slot: str) -> str | None:
    later = [c for c in common if _key(c) >= _key(slot)]
    return min(later, key=_key) if later and len(later) < len(common) else None


def _first_day_last_hour(common: list[str]) -> str | None:
    day = min(_key(c)[0] for c in common)
    that_day = [c for c in common if _key(c)[0] == day]
    return max(that_day, key=_key) if len(that_day) >= 2 else None


def _preferred(common: list[str], afternoon: bool) -> str | None:
    liked = [c for c in common if (_key(c)[1] >= 13) == afternoon]
    return min(liked, key=_key) if liked and len(liked) < len(common) else None


GOALS: dict[str, tuple[Any, Any]] = {
    # name: (rule(common, param), instruction(param))
    "any": (lambda c, p: _only(c),
            lambda p: "Find the one hour this week (Mon-Wed, 9-11 or 13-16) when all three of you are free and "
                      "hold the team meeting then: the organizer schedules it and both guests accept it."),
    "earliest": (lambda c, p: _earliest(c),
                 lambda p: "The release review cannot wait: book it at the earliest hour this week at which the "
                           "organizer and both guests are all free, and have both guests accept the invitation."),
    "latest": (lambda c, p: _latest(c),
               lambda p: "We want the retrospective as late in the week as possible, once every result is in. "
                         "Schedule it at the last hour (Mon-Wed) when all three of you are free; both guests "
                         "accept."),
    "afternoon": (lambda c, p: _half(c, True),
                  lambda p: "Mornings are for focus work, so the planning meeting must be in the afternoon "
                            "(13:00-16:00). Pick the afternoon hour that suits all three calendars; the organizer "
                            "schedules it and both guests accept."),
    "morning": (lambda c, p: _half(c, False),
                lambda p: "The client call has to happen before lunch (9:00-11:00, their time zone). Settle on the "
                          "morning hour when all three of you can attend; the guests must accept the invitation."),
    "on_day": (lambda c, p: _on(c, p),
               lambda p: f"The budget has to be signed off on {_DAY_NAMES[p]}. Meet that day, at the hour all "
                         "three of you are free; the organizer books it and both guests accept."),
    "not_on": (lambda c, p: _not_on(c, p),
               lambda p: f"The office is closed on {_DAY_NAMES[p]}, so that day is out. Agree on a time on one of "
                         "the other days when everyone is free, and get both guests to accept it."),
    "not_before": (lambda c, p: _not_before(c, p),
                   lambda p: f"The figures for the review arrive on {_said(p)}. Schedule the review at the first "
                             "hour from then on (that hour included) when all three of you are free; both guests "
                             "accept."),
    "first_day_last_hour": (
        lambda c, p: _first_day_last_hour(c),
        lambda p: "Hold the hand-over on the earliest day on which all three of you have a common free hour, and "
                  "as late as possible on that day (so the morning's work is done). The guests accept it."),
    "reschedule": (lambda c, p: _only(c),
                   lambda p: f"The team meeting was booked for {_said(p)} without asking anyone, and not everyone "
                             "can come. Move it to the hour when all three of you are free and make sure both "
                             "guests accept the new invitation."),
    "preference": (lambda c, p: _preferred(c, p == "afternoon"),
                   lambda p: "Set up the design meeting. guest_1 has a standing preference for mornings or "
                             "afternoons (it is in their notes): honour it, and among the hours that suit it and "
                             "all three calendars take the earliest. Both guests accept."),
}


def _private(goal: str, param: Any) -> dict[str, str]:
    notes = dict.fromkeys(PEOPLE, "Read your calendar with my_calendar; nobody else can.")
    if goal == "preference":
        notes["guest_1"] += (f" You prefer {param} meetings ({'13:00-16:00' if param == 'afternoon' else '9:00-11:00'})"
                             "; the others do not know that unless you tell them.")
    return notes


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(free: dict[str, list[str]], meet: tuple[str, int], seed: int | None = None, goal: str = "any",
            param: Any = None, booked: str | None = None) -> None:
        busy = {a: [_slot(d, h) for d in DAYS for h in HOURS if _slot(d, h) not in free[a]] for a in PEOPLE}
        common = set(free["organizer_0"]) & set(free["guest_0"]) & set(free["guest_1"])
        target = _slot(*meet)
        assert target in common and GOALS[goal][0](sorted(common, key=_key), param) == target, (goal, common)
        if goal == "any":
            assert common == {target}, common

        def check(state: MeetingState) -> bool:
            live = [m for m in state.meetings if m.status == "active"]
            return (len(live) == 1 and _slot(live[0].day, live[0].hour) == target
                    and set(live[0].accepted) == {"guest_0", "guest_1"})

        meetings = [] if booked is None else [Meeting(id="MTG-1", day=booked.split()[0], hour=int(booked.split()[1]))]
        mid = f"MTG-{len(meetings) + 1}"
        steps = [by(g, "my_calendar") for g in ("guest_0", "guest_1")]
        steps += [by(g, "send_message", to="organizer_0", content=f"I am free at {', '.join(free[g])}.")
                  for g in ("guest_0", "guest_1")]
        if goal == "preference":
            steps.append(by("guest_1", "send_message", to="organizer_0", content=f"I prefer {param} meetings."))
        steps += [by("organizer_0", "schedule_meeting", day=meet[0], hour=meet[1]),
                  by("organizer_0", "send_message", to="all", content=f"Please accept {mid}."),
                  by("guest_0", "accept_meeting", meeting_id=mid),
                  by("guest_1", "accept_meeting", meeting_id=mid)]
        meta: dict[str, Any] = {} if seed is None else {"generator_seed": seed, "goal": goal}
        out.append(Task(
            id=f"meeting-{len(out):03d}",
            instruction="Schedule one team meeting (Mon-Wed, 9-11 or 13-16) at a time all three of you are "
                        "free; the organizer schedules it, and both guests must accept it." if seed is None
            else GOALS[goal][1](booked if goal == "reschedule" else param),
            private=_private(goal, param),
            initial_state=MeetingState(busy=busy, meetings=meetings), check=check, solution=steps, metadata=meta))

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
        goal = list(GOALS)[seed % len(GOALS)]
        free, meet, param, booked = generate(random.Random(f"MultiMeeting/{seed}"), goal)
        add(free, meet, seed=seed, goal=goal, param=param, booked=booked)
        seed += 1
    return out


N_TASKS = 50


def _draw_param(rng: random.Random, goal: str) -> Any:
    if goal in ("on_day", "not_on"):
        return rng.choice(DAYS)
    if goal == "not_before":
        return _slot(rng.choice(DAYS[:2]), rng.choice(HOURS))
    if goal == "preference":
        return rng.choice(("morning", "afternoon"))
    return None


def generate(rng: random.Random, goal: str = "any") -> tuple[dict[str, list[str]], tuple[str, int], Any, str | None]:
    """Free hours per person, the meeting slot the goal picks among the hours all three share, the
    goal's parameter, and (``reschedule``) the slot a meeting was wrongly booked at. Calendars are
    drawn again until the goal picks exactly one slot and is not trivial (with several common hours
    where the rule chooses among them)."""
    slots = [_slot(d, h) for d in DAYS for h in HOURS]
    while True:
        param = _draw_param(rng, goal)
        n_common = 1 if goal in ("any", "reschedule") else rng.randint(2, 4)
        common = set(rng.sample(slots, n_common))
        others = [x for x in slots if x not in common]
        free = {a: set(common) | set(rng.sample(others, rng.randint(2, 6))) for a in PEOPLE}
        for extra in sorted((free["organizer_0"] & free["guest_0"] & free["guest_1"]) - common):
            free[rng.choice(PEOPLE)].discard(extra)
        target = GOALS[goal][0](sorted(common, key=_key), param)
        if target is None:
            continue
        booked = None
        if goal == "reschedule":  # booked at an hour the organizer is free but a guest is not
            choices = sorted(free["organizer_0"] - common, key=_key)
            if not choices:
                continue
            booked = rng.choice(choices)
        out = {}
        for a in PEOPLE:
            hours = sorted(free[a], key=_key)
            rng.shuffle(hours)
            out[a] = hours
        day, hour = target.split()
        return out, (day, int(hour)), param, booked


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
