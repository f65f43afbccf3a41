"""FindLight: turn on the light in the room where something is — success depends on reading a tool result.

The instruction names a goal, never the room: "Turn on the light in the room where
the keys are." Only ``locate`` says which room that is, and the rooms differ from
task to task, so a policy that ignores tool results is right about as often as
chance (1 / number of rooms; ``tests/test_find_light.py`` measures it). Turning on
every light does not count: every other light must stay as it was.

Three difficulties, one family (:func:`find_light_spec` builds any other):

* ``FindLight-v0``: one hop (``locate(item)`` names the room), 4 rooms, every light off.
* ``FindLight-v1``: two hops for half the tasks (the item is in a container:
  ``locate(container)`` names the room), 6 rooms, distractor items, some lights on.
* ``FindLight-v2``: always two hops, 8 rooms, more distractors, some lights on.

Each environment has 240 tasks, enough for disjoint SFT / RL / evaluation splits
(:meth:`envfactory.ToolEnvSpec.split`).
"""

from __future__ import annotations

import random

from envfactory import State, Task, ToolEnvSpec, ToolError, call, register, tool

__all__ = ["ROOMS", "ITEMS", "CONTAINERS", "FindLightState", "find_light_spec", "LEVELS"]

ROOMS = ("kitchen", "hall", "bedroom", "bath", "garage", "office", "attic", "cellar", "study", "porch")
ITEMS = ("keys", "wallet", "phone", "umbrella", "scarf", "book", "camera", "guitar", "helmet", "kettle",
         "laptop", "mug", "radio", "ruler", "teapot", "blanket")
CONTAINERS = ("box", "bag", "basket", "crate", "suitcase", "drawer")
# difficulty -> (rooms, share of two-hop tasks, distractor items, some lights start on)
LEVELS = {0: (4, 0.0, 1, False), 1: (6, 0.5, 3, True), 2: (8, 1.0, 5, True)}
N_TASKS = 240


class FindLightState(State):
    lights: dict[str, bool] = {}
    where: dict[str, str] = {}  # item or container -> room or container


@tool(read_only=True)
def locate(state: FindLightState, thing: str) -> str:
    """Say where an item or a container is.

    Args:
        thing: The item or container, e.g. "keys" or "box".
    """
    place = state.where.get(thing.strip().lower())
    if place is None:
        raise ToolError(f"nothing called {thing!r} here")
    return f"The {thing} is in the {place}."


def _room(state: FindLightState, room: str) -> str:
    room = room.strip().lower()
    if room not in state.lights:
        raise ToolError(f"no room called {room!r}")
    return room


@tool
def turn_on(state: FindLightState, room: str) -> str:
    """Switch a room's light on.

    Args:
        room: The room.
    """
    state.lights[_room(state, room)] = True
    return "on"


@tool
def turn_off(state: FindLightState, room: str) -> str:
    """Switch a room's light off.

    Args:
        room: The room.
    """
    state.lights[_room(state, room)] = False
    return "off"


def _make_task(name: str, difficulty: int, i: int) -> Task:
    n_rooms, two_hop_share, distractors, lit = LEVELS[difficulty]
    rng = random.Random(f"{name}/{i}")
    rooms = rng.sample(ROOMS, n_rooms)
    things = rng.sample(ITEMS, 1 + distractors)
    item = things[0]
    where = {t: rng.choice(rooms) for t in things}
    solution = [call("locate", thing=item)]
    if rng.random() < two_hop_share:
        container = rng.choice(CONTAINERS)
        where[container] = where[item]
        where[item] = container
        solution.append(call("locate", thing=container))
        room = where[container]
    else:
        room = where[item]
    solution.append(call("turn_on", room=room))
    start = {r: lit and r != room and rng.random() < 0.3 for r in rooms}
    want = dict(start, **{room: True})
    return Task(
        id=f"findlight{difficulty}-{i:03d}",
        instruction=f"Turn on the light in the room where the {item} is.",
        initial_state=FindLightState(lights=start, where=where),
        solution=solution,
        check=lambda s, want=want: s.lights == want,
        metadata={"room": room, "item": item, "hops": len(solution) - 1},
    )


def find_light_spec(name: str, difficulty: int = 0, n_tasks: int = N_TASKS) -> ToolEnvSpec:
    """A FindLight environment of ``difficulty`` (0, 1 or 2; see the module docstring)."""
    if difficulty not in LEVELS:
        raise ValueError(f"difficulty must be one of {sorted(LEVELS)}, got {difficulty!r}")
    hops = "one or two hops" if difficulty == 1 else ("two hops" if difficulty == 2 else "one hop")
    return ToolEnvSpec(
        name=name,
        domain="home",
        description=f"Turn on the light where an item is: read locate's answer ({hops}, "
                    f"{LEVELS[difficulty][0]} rooms).",
        state_type=FindLightState,
        tools=[locate, turn_on, turn_off],
        tasks=lambda: [_make_task(name, difficulty, i) for i in range(n_tasks)],
        max_turns=3 + difficulty,
    )


SPECS = [register(find_light_spec(f"FindLight-v{d}", d)) for d in LEVELS]
