"""MultiRooms-v0 (shared scarce resources): three team leads book meeting rooms.

Each lead must book one room for their own meeting; their needs (seats, hours)
are private. Rooms are few, so a lead who grabs the first room that fits can
leave another team without one: the leads have to share their needs and split
the rooms. A booking is always for the agent who makes it.

Tasks: four hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiRooms/<k>")``) up to 50: rooms, outside bookings and needs drawn around a
feasible plan.
"""

from __future__ import annotations

import random
from typing import Any

import envfactory.faces.pettingzoo_env as multi
from envfactory import ConflictError, MultiState, Role, Task, ToolEnvSpec, ToolError, by, register, tool
from tools.messaging import TOOLS as MESSAGING

SLOTS = ("09:00", "10:00", "11:00", "14:00")
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
def book_room(state: RoomsState, room: str, slot: str) -> str:
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
def cancel_booking(state: RoomsState, room: str, slot: str) -> str:
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


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(rooms: dict[str, int], taken: dict[str, str], needs: dict[str, tuple[int, tuple[str, ...]]],
            plan: dict[str, tuple[str, str]], seed: int | None = None) -> None:
        def check(state: RoomsState) -> bool:
            for lead, (seats, slots) in needs.items():
                mine = [k for k, v in state.bookings.items() if v == lead]
                if len(mine) != 1:
                    return False
                room, slot = mine[0].split("@")
                if state.rooms[room] < seats or slot not in slots:
                    return False
            return True

        solution = [by(lead, "send_message", to="all", content=_need_text(*needs[lead])) for lead in LEADS]
        solution += [by(lead, "book_room", room=r, slot=s) for lead, (r, s) in plan.items()]
        out.append(Task(
            id=f"rooms-{len(out):03d}",
            instruction="Each team lead must book exactly one room for their team's meeting (needs in your "
                        "private notes). Rooms are scarce: make sure every team gets a room that fits.",
            private={lead: _need_text(*needs[lead]) for lead in LEADS},
            initial_state=RoomsState(rooms=rooms, bookings=dict(taken)), check=check, solution=solution,
            metadata={} if seed is None else {"generator_seed": seed}))

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
        add(*generate(random.Random(f"MultiRooms/{seed}")), seed=seed)
        seed += 1
    return out


N_TASKS = 50
_ROOMS = ("atlas", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor")


def generate(rng: random.Random) -> tuple:
    """Rooms, outside bookings, private needs and a plan that meets every need. Needs are drawn
    close to the planned room's size and often accept more than one hour, so the first room
    that fits a lead is often one another lead needs."""
    names = sorted(rng.sample(_ROOMS, rng.randint(2, 4)))
    rooms = {r: rng.choice((3, 4, 6, 8, 10, 12, 16)) for r in names}
    cells = [(r, s) for r in names for s in SLOTS]
    rng.shuffle(cells)
    plan = dict(zip(LEADS, cells[:3]))
    taken = {f"{r}@{s}": "external" for r, s in cells[3:3 + rng.randint(1, 3)]}
    needs = {}
    for lead, (room, slot) in plan.items():
        seats = rng.randint(max(2, rooms[room] - 3), rooms[room])
        extra = [s for s in SLOTS if s != slot and rng.random() < 0.35]
        needs[lead] = (seats, tuple(sorted([slot, *extra])))
    return rooms, taken, needs, plan


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
