"""MultiRooms-v0 (shared scarce resources): three team leads book meeting rooms.

Each lead must book one room for their own meeting; their needs (seats, hours)
are private. Rooms are few, so a lead who grabs the first room that fits can
leave another team without one: the leads have to share their needs and split
the rooms. A booking is always for the agent who makes it.

Tasks: four hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiRooms/<k>")``) up to 50: rooms, outside bookings and needs drawn around a
plan that meets one of the goals of :data:`GOALS`, in turn: one room per team; keep a room free
at an hour for the all-hands; all at the same hour; no two at the same hour; all in the one room
with the equipment; sales and engineering in one joint room; undo a mistaken booking; mornings
only; at most 4 seats to spare; at most two rooms in use; a two-hour workshop in one room
(:func:`goal_met` is the check).
"""

from __future__ import annotations

import random
from typing import Any, Literal

import envfactory.faces.pettingzoo_env as multi
from envfactory import ConflictError, MultiState, Role, Task, ToolEnvSpec, ToolError, by, register, tool
from tools.messaging import TOOLS as MESSAGING

SLOTS = ("09:00", "10:00", "11:00", "14:00")
Slot = Literal["09:00", "10:00", "11:00", "14:00"]  # SLOTS, as an enum in the tools' schemas
LEADS = ("sales_0", "eng_0", "hr_0")


class RoomsState(MultiState):
    rooms: dict[str, int]                 # room -> seats
    bookings: dict[str, str] = {}         # "room@slot" -> agent (or "external")


@tool(read_only=True)
def list_rooms(state: RoomsState) -> str:
    """List the rooms with their seats and which hours are still free."""
    lines = []
    for room, seats in state.rooms.items():
        free = [s for s in SLOTS if f"{room}@{s}" not in state.bookings]
        lines.append(f"{room}: {seats} seats; free at {', '.join(free) or 'no hour'}")
    return "\n".join(lines)


@tool
def book_room(state: RoomsState, room: str, slot: Slot) -> str:
    """Book a room for your meeting at an hour.

    Args:
        room: The room name.
        slot: The hour: 09:00, 10:00, 11:00 or 14:00.
    """
    if room not in state.rooms:
        raise ToolError(f"no room {room!r}; rooms: {', '.join(state.rooms)}")
    if slot not in SLOTS:
        raise ToolError(f"no slot {slot!r}; slots: {', '.join(SLOTS)}")
    key = f"{room}@{slot}"
    holder = state.bookings.get(key)
    if holder is not None:
        raise ConflictError(f"{room} at {slot} is already booked by {holder}")
    state.bookings[key] = state.acting
    return f"Booked {room} at {slot} for {state.acting}."


@tool
def cancel_booking(state: RoomsState, room: str, slot: Slot) -> str:
    """Cancel one of your own bookings.

    Args:
        room: The room name.
        slot: The hour of the booking.
    """
    key = f"{room}@{slot}"
    if state.bookings.get(key) != state.acting:
        raise ToolError(f"you hold no booking of {room} at {slot}")
    del state.bookings[key]
    return f"Cancelled {room} at {slot}."


def _need_text(seats: int, slots: tuple[str, ...]) -> str:
    return f"Your team's meeting needs a room with at least {seats} seats at {' or '.join(slots)}."


def _long_text(seats: int, starts: tuple[str, ...]) -> str:
    pairs = " or ".join(f"{s} and {SLOTS[SLOTS.index(s) + 1]}" for s in starts)
    return (f"Your team's workshop runs two hours: it needs the same room, with at least {seats} seats, for two "
            f"hours in a row: {pairs}. Book both hours.")


Need = tuple[int, tuple[str, ...]]

# Generated goals: the instruction, given the goal's parameter (a room, or a room and an hour).
GOALS: dict[str, Any] = {
    "any": lambda p: "Each of the three team leads books one room for their team's meeting (the team's size and the "
                     "hours it can meet are in the lead's private notes). There are few rooms: make sure every team "
                     "ends up with one that fits.",
    "keep_free": lambda p: f"Each team lead books one room that fits their team's meeting (needs in your notes), but "
                           f"keep {p[0]} free at {p[1]}: the all-hands meeting takes it then.",
    "same_hour": lambda p: "The three meetings share one video link, so they must run at the same hour, each team in "
                           "a room of its own that fits it. Each lead books one room.",
    "different_hours": lambda p: "One facilitator has to attend all three meetings, so no two of them may run at the "
                                 "same hour. Each lead books one room that fits their team.",
    "same_room": lambda p: f"Only {p} has the video equipment, so all three meetings take place there, at different "
                           f"hours. Each lead books {p} once, at an hour that works for their team.",
    "joint": lambda p: "Sales and engineering meet together this time: one room big enough for both teams, at an hour "
                       "that suits both, booked by either of the two leads (not both). HR books its own room as "
                       "usual.",
    "fix_booking": lambda p: "sales_0 booked a room earlier by mistake, and it does not suit the sales meeting. Sort "
                             "it out: in the end each lead holds exactly one booking, in a room that fits their team.",
    "mornings": lambda p: "The building closes at noon today. Each lead books one room that fits their team, and every "
                          "meeting has to be in the morning (09:00 to 11:00).",
    "waste": lambda p: "Big rooms are precious: each lead books one room that fits their team with at most 4 seats to "
                       "spare.",
    "two_rooms": lambda p: "Facilities will only open two rooms today. Each lead books one room that fits their team; "
                           "between the three of you, use no more than two different rooms.",
    "long": lambda p: "Each lead books what their team's meeting needs: one hour in a room that fits, or, where the "
                      "lead's notes say so, the same room for two hours in a row.",
}


def _fits(rooms: dict[str, int], cell: tuple[str, str], need: Need) -> bool:
    return rooms[cell[0]] >= need[0] and cell[1] in need[1]


def goal_met(goal: str, param: Any, rooms: dict[str, int], needs: dict[str, Need],
             bookings: dict[str, list[tuple[str, str]]], long_lead: str | None = None) -> bool:
    """Whether the leads' ``bookings`` (lead -> [(room, slot)]) meet ``goal``."""
    own = {lead: bookings.get(lead, []) for lead in LEADS}
    if goal == "joint":
        shared = own["sales_0"] + own["eng_0"]
        both = (needs["sales_0"][0] + needs["eng_0"][0], tuple(set(needs["sales_0"][1]) & set(needs["eng_0"][1])))
        return (len(shared) == 1 and _fits(rooms, shared[0], both) and len(own["hr_0"]) == 1
                and _fits(rooms, own["hr_0"][0], needs["hr_0"]))
    for lead in LEADS:
        if lead == long_lead:
            cells = sorted(own[lead], key=lambda c: SLOTS.index(c[1]))
            if not (len(cells) == 2 and cells[0][0] == cells[1][0] and _fits(rooms, cells[0], needs[lead])
                    and SLOTS.index(cells[1][1]) == SLOTS.index(cells[0][1]) + 1 and cells[1][1] != "14:00"):
                return False
        elif len(own[lead]) != 1 or not _fits(rooms, own[lead][0], needs[lead]):
            return False
    cells = [c for lead in LEADS for c in own[lead]]
    if goal == "keep_free":
        return tuple(param) not in cells
    if goal == "same_hour":
        return len({s for _, s in cells}) == 1
    if goal == "different_hours":
        return len({s for _, s in cells}) == 3
    if goal == "same_room":
        return all(r == param for r, _ in cells)
    if goal == "mornings":
        return all(s != "14:00" for _, s in cells)
    if goal == "waste":
        return all(rooms[own[lead][0][0]] - needs[lead][0] <= 4 for lead in LEADS)
    if goal == "two_rooms":
        return len({r for r, _ in cells}) <= 2
    return True


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(rooms: dict[str, int], taken: dict[str, str], needs: dict[str, Need],
            plan: dict[str, tuple[str, str]], seed: int | None = None, goal: str = "any", param: Any = None,
            long_lead: str | None = None) -> None:
        def check(state: RoomsState) -> bool:
            held: dict[str, list[tuple[str, str]]] = {}
            for k, v in state.bookings.items():
                room, slot = k.split("@")
                held.setdefault(v, []).append((room, slot))
            return goal_met(goal, param, state.rooms, needs, held, long_lead)

        notes = {lead: _long_text(*needs[lead]) if lead == long_lead else _need_text(*needs[lead]) for lead in LEADS}
        solution = [by(lead, "send_message", to="all", content=notes[lead]) for lead in LEADS]
        mistake = [k for k, v in taken.items() if v == "sales_0"]
        solution += [by("sales_0", "cancel_booking", room=k.split("@")[0], slot=k.split("@")[1]) for k in mistake]
        for lead, (r, sl) in plan.items():
            solution.append(by(lead, "book_room", room=r, slot=sl))
            if lead == long_lead:
                solution.append(by(lead, "book_room", room=r, slot=SLOTS[SLOTS.index(sl) + 1]))
        meta: dict[str, Any] = {} if seed is None else {"generator_seed": seed, "goal": goal}
        out.append(Task(
            id=f"rooms-{len(out):03d}",
            instruction="Each team lead must book exactly one room for their team's meeting (needs in your "
                        "private notes). Rooms are scarce: make sure every team gets a room that fits." if seed is None
            else GOALS[goal](param),
            private=notes,
            initial_state=RoomsState(rooms=rooms, bookings=dict(taken)), check=check, solution=solution,
            metadata=meta))

    add({"atlas": 12, "birch": 6, "cedar": 3}, {"atlas@09:00": "external", "birch@09:00": "external"},
        {"sales_0": (10, ("10:00", "11:00")), "eng_0": (5, ("10:00",)), "hr_0": (2, ("10:00", "11:00"))},
        {"sales_0": ("atlas", "11:00"), "eng_0": ("birch", "10:00"), "hr_0": ("cedar", "10:00")})
    add({"atlas": 12, "birch": 6}, {"birch@11:00": "external"},
        {"sales_0": (8, ("10:00",)), "eng_0": (4, ("10:00", "11:00")), "hr_0": (6, ("11:00", "14:00"))},
        {"sales_0": ("atlas", "10:00"), "eng_0": ("birch", "10:00"), "hr_0": ("atlas", "11:00")})
    add({"atlas": 12, "birch": 6, "cedar": 3}, {"atlas@14:00": "external"},
        {"sales_0": (3, ("14:00",)), "eng_0": (6, ("14:00",)), "hr_0": (10, ("09:00", "14:00"))},
        {"sales_0": ("cedar", "14:00"), "eng_0": ("birch", "14:00"), "hr_0": ("atlas", "09:00")})
    add({"atlas": 12, "birch": 6, "cedar": 3}, {"atlas@10:00": "external", "birch@09:00": "external"},
        {"sales_0": (6, ("09:00", "10:00")), "eng_0": (6, ("09:00", "10:00")), "hr_0": (3, ("09:00",))},
        {"sales_0": ("atlas", "09:00"), "eng_0": ("birch", "10:00"), "hr_0": ("cedar", "09:00")})
    seed = 0
    while len(out) < N_TASKS:
        goal = list(GOALS)[seed % len(GOALS)]
        rooms, taken, needs, plan, param, long_lead = generate(random.Random(f"MultiRooms/{seed}"), goal)
        add(rooms, taken, needs, plan, seed=seed, goal=goal, param=param, long_lead=long_lead)
        seed += 1
    return out


N_TASKS = 50
_ROOMS = ("atlas", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor")


def _plan_cells(rng: random.Random, goal: str, names: list[str], rooms: dict[str, int]) -> tuple[list, Any]:
    """Three planned (room, slot) cells for the leads, shaped by the goal, and the goal's parameter."""
    cells = [(r, s) for r in names for s in SLOTS]
    rng.shuffle(cells)
    if goal == "same_hour":
        slot = rng.choice(SLOTS)
        return [(r, slot) for r in rng.sample(names, 3)], None
    if goal == "different_hours":
        return [(rng.choice(names), s) for s in rng.sample(SLOTS, 3)], None
    if goal in ("same_room", "two_rooms"):
        room = max(names, key=lambda r: (rooms[r], r)) if goal == "same_room" else rng.choice(names)
        slots = rng.sample(SLOTS, 3)
        plan = [(room, s) for s in slots]
        if goal == "two_rooms":
            plan[2] = (rng.choice([r for r in names if r != room]), plan[2][1])
        return plan, room if goal == "same_room" else None
    if goal == "mornings":
        return [c for c in cells if c[1] != "14:00"][:3], None
    if goal == "joint":  # sales_0 books the big room for sales and eng together
        shared = (names[0], rng.choice(SLOTS))
        return [shared, shared, next(c for c in cells if c != shared)], None
    if goal == "long":
        first = next(c for c in cells if c[1] in ("09:00", "10:00"))
        second = (first[0], SLOTS[SLOTS.index(first[1]) + 1])
        return [first] + [c for c in cells if c not in (first, second)][:2], None
    return cells[:3], None


def generate(rng: random.Random, goal: str = "any") -> tuple:
    """Rooms, outside (and, for ``fix_booking``, mistaken) bookings, private needs, a plan that meets
    the goal, the goal's parameter and the lead with a two-hour workshop (``long``). Needs are drawn
    close to the planned room's size and often accept more than one hour, so the first room that fits
    a lead is often one another lead needs, or one the goal rules out."""
    names = sorted(rng.sample(_ROOMS, rng.randint(3, 4)))
    rooms = {r: rng.choice((3, 4, 6, 8, 10, 12, 16)) for r in names}
    if goal == "same_room" or goal == "joint":
        rooms[names[0]] = 16
    planned, param = _plan_cells(rng, goal, names, rooms)
    long_lead = rng.choice(LEADS) if goal == "long" else None
    if long_lead:  # the first planned cell is the workshop's first hour
        k = LEADS.index(long_lead)
        planned = planned[-k:] + planned[:-k] if k else planned
    plan = dict(zip(LEADS, planned))
    used = set(planned) | ({(plan[long_lead][0], SLOTS[SLOTS.index(plan[long_lead][1]) + 1])} if long_lead else set())
    free = [(r, s) for r in names for s in SLOTS if (r, s) not in used]
    rng.shuffle(free)
    taken = {f"{r}@{s}": "external" for r, s in free[:rng.randint(1, 3)]}
    free = free[len(taken):]
    needs: dict[str, Need] = {}
    for lead, (room, slot) in plan.items():
        seats = rng.randint(max(2, rooms[room] - 3), rooms[room])
        if lead == long_lead:
            needs[lead] = (seats, (slot,))
            continue
        pool = [x for x in SLOTS if x != slot and not (goal == "mornings" and x == "14:00" and rng.random() < 0.5)]
        extra = [x for x in pool if rng.random() < 0.35]
        needs[lead] = (seats, tuple(sorted([slot, *extra])))
    if goal == "joint":  # sales and eng share the big room: their needs add up to at most its seats
        del plan["eng_0"]
        s = rng.randint(3, 8)
        needs["sales_0"] = (s, needs["sales_0"][1])
        needs["eng_0"] = (rng.randint(2, rooms[names[0]] - s), needs["eng_0"][1])
    if goal == "keep_free":  # a free cell some lead's need would fit: the tempting one
        tempting = [c for c in free if any(_fits(rooms, c, n) for n in needs.values())]
        param = tempting[0] if tempting else free[0]
    if goal == "fix_booking":  # sales_0 holds a cell that does not fit its need
        wrong = next(c for c in free if not _fits(rooms, c, needs["sales_0"]))
        taken[f"{wrong[0]}@{wrong[1]}"] = "sales_0"
    return rooms, taken, needs, plan, param, long_lead


SPEC = register(ToolEnvSpec(
    name="MultiRooms-v0",
    domain="scheduling",
    description="Shared scarce resources: three team leads with private needs must split few meeting rooms.",
    state_type=RoomsState,
    roles=[Role(lead, f"the {lead.split('_')[0]} team lead: you must book one room that fits your team's "
                "meeting (see your private notes); you can only book and cancel for yourself")
           for lead in LEADS],
    tools=[list_rooms, book_room, cancel_booking, *MESSAGING],
    tasks=tasks,
    max_turns=10,
))


def env(**kwargs: Any) -> Any:
    """PettingZoo AEC env of MultiRooms-v0."""
    return multi.env(SPEC.name, **kwargs)


def parallel_env(**kwargs: Any) -> Any:
    """PettingZoo Parallel env of MultiRooms-v0."""
    return multi.parallel_env(SPEC.name, **kwargs)
