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

* ``FindLight-v3``: v2's world (two hops, 8 rooms, distractors, some lights on) asked
  the way people ask ("I left my scarf somewhere. Light up that room for me."), with
  rooms, items and containers drawn from larger pools, and 1,600 tasks. Its evaluation
  split has two halves: unseen tasks of the training names and phrasings
  (``metadata["names"] == "train"``), and tasks whose target room, item, container
  and phrasing never occur in any non-evaluation task (``"heldout"``): a model that
  solves those copies what it reads instead of recalling names. :func:`swap_answer`
  builds the counterfactual twin of a task (the same instruction; ``locate`` answers
  another room) for probing whether a model follows what the tool said.
"""

from __future__ import annotations

import random
from typing import Callable

from envfactory import State, Task, ToolEnvSpec, ToolError, call, register, tool

__all__ = ["ROOMS", "ITEMS", "CONTAINERS", "FindLightState", "find_light_spec", "LEVELS", "FRAMES",
           "HELDOUT_FRAMES", "HELDOUT_NAMES", "find_light_v3_spec", "swap_answer", "turned_on", "v3_supply",
           "made_up_name"]

ROOMS = ("kitchen", "hall", "bedroom", "bath", "garage", "office", "attic", "cellar", "study", "porch")
ITEMS = ("keys", "wallet", "phone", "umbrella", "scarf", "book", "camera", "guitar", "helmet", "kettle",
         "laptop", "mug", "radio", "ruler", "teapot", "blanket")
CONTAINERS = ("box", "bag", "basket", "crate", "suitcase", "drawer")
# difficulty -> (rooms, share of two-hop tasks, distractor items, some lights start on)
LEVELS = {0: (4, 0.0, 1, False), 1: (6, 0.5, 3, True), 2: (8, 1.0, 5, True)}
N_TASKS = 240

# FindLight-v3's pools: the v0-v2 names plus more; the held-out names occur only in evaluation tasks
MORE_ROOMS = ("pantry", "nursery", "laundry", "den", "studio", "balcony", "closet", "lounge", "workshop",
              "sunroom", "shed", "foyer", "basement", "playroom", "library", "gym")
MORE_ITEMS = ("passport", "charger", "glasses", "hat", "backpack", "torch", "notebook", "watch", "headphones",
              "candle", "ticket", "pillow", "remote", "ladder", "hammer", "vase", "jacket", "tablet", "spoon",
              "kite", "drum", "violin", "compass", "stapler")
MORE_CONTAINERS = ("chest", "cupboard", "trunk", "hamper", "bin", "tin", "sack", "cabinet")
HELDOUT_NAMES: dict[str, tuple[str, ...]] = {
    "rooms": ("library", "gym", "sunroom", "foyer", "den", "balcony"),
    "items": ("violin", "compass", "stapler", "kite", "vase", "passport", "torch", "drum"),
    "containers": ("trunk", "hamper", "tin"),
}
"""Names that occur in no non-evaluation task of FindLight-v3 (nor in v0-v2)."""
FRAMES = (
    "Turn on the light in the room where the {item} is.",
    "Please switch on the light wherever my {item} is.",
    "I left my {item} somewhere. Light up that room for me.",
    "Can you turn the light on in the room that has the {item}?",
    "Where is the {item}? Put the light on in that room.",
    "Switch the light on in whichever room the {item} is in, and leave the other lights alone.",
    "My {item} is around here somewhere; could you light the room it is in?",
    "I want to go get the {item}. Turn on the light where it is, please.",
)
HELDOUT_FRAMES = (
    "I need my {item}: please turn on the light in the room it's in.",
    "Could you light up whatever room my {item} ended up in?",
)
"""Phrasings of FindLight-v3 that only its held-out evaluation tasks use."""
V3_TASKS = 1600


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


def _pool(names: tuple[str, ...], kind: str, heldout: bool) -> list[str]:
    held = HELDOUT_NAMES[kind]
    return [n for n in names if (n in held) == heldout]


def _v3_task(name: str, i: int) -> Task:
    """Task ``i`` of FindLight-v3: every fourth is an evaluation task, every other one of those
    uses only held-out names and phrasings for what the solution depends on."""
    split = "eval" if i % 4 == 0 else "rl" if i % 4 == 1 else "sft"
    heldout = i % 8 == 0
    rng = random.Random(f"{name}/{i}")
    all_rooms = _pool(ROOMS + MORE_ROOMS, "rooms", False)
    all_items = _pool(ITEMS + MORE_ITEMS, "items", False)
    boxes = _pool(CONTAINERS + MORE_CONTAINERS, "containers", heldout)
    if heldout:
        room = rng.choice(_pool(ROOMS + MORE_ROOMS, "rooms", True))
        item = rng.choice(_pool(ITEMS + MORE_ITEMS, "items", True))
        frame = rng.choice(HELDOUT_FRAMES)
    else:
        room, item, frame = rng.choice(all_rooms), rng.choice(all_items), rng.choice(FRAMES)
    rooms = [room] + rng.sample([r for r in all_rooms if r != room], 7)
    rng.shuffle(rooms)
    others = rng.sample([t for t in all_items if t != item], 5)
    container = rng.choice(boxes)
    return _two_hop_task(f"findlight3-{i:04d}", rng, rooms, room, item, others, container,
                         lambda: frame.format(item=item), split, "heldout" if heldout else "train")


def _two_hop_task(task_id: str, rng: random.Random, rooms: list[str], room: str, item: str, others: list[str],
                  container: str, instruction: Callable[[], str], split: str, names: str) -> Task:
    """A FindLight-v3-world task: ``item`` in ``container`` in ``room``, the ``others`` in random rooms,
    some other lights on. ``instruction`` is called after the world is drawn from ``rng``."""
    where = {t: rng.choice(rooms) for t in others}
    where[container] = room
    where[item] = container
    start = {r: r != room and rng.random() < 0.3 for r in rooms}
    want = dict(start, **{room: True})
    return Task(
        id=task_id,
        instruction=instruction(),
        initial_state=FindLightState(lights=start, where=where),
        solution=[call("locate", thing=item), call("locate", thing=container), call("turn_on", room=room)],
        check=lambda s, want=want: s.lights == want,
        metadata={"room": room, "item": item, "container": container, "hops": 2, "split": split, "names": names},
    )


_SYLLABLES = ("ba", "ko", "ri", "mel", "tan", "su", "dor", "vi", "pel", "gra", "lu", "nim", "fo", "zet", "ca",
              "mir", "to", "wen", "bri", "sol", "ka", "dun", "pi", "rol")


def made_up_name(rng: random.Random) -> str:
    """A pronounceable made-up word of two or three syllables ("kotan", "brimelo"): a name no
    pool holds, so a model can only get it right by copying it from what it read."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 2, 3))))


def v3_supply(n: int, *, seed: int | str = 0, made_up: float = 0.5) -> list[Task]:
    """``n`` fresh training tasks of FindLight-v3's world (play them on a FindLight-v3 episode:
    ``episode.reset(task)``): the training phrasings, names from the training pools or, each
    with probability ``made_up``, made up (:func:`made_up_name`). No held-out name or phrasing
    ever occurs in them, and their ids (``findlight3-supply-<seed>-<i>``) are not the
    environment's. The task supply for learning to read without memorising names."""
    rng = random.Random(f"FindLight-v3-supply/{seed}")
    held = {x for v in HELDOUT_NAMES.values() for x in v}
    pools = {k: _pool(names, k, False) for k, names in
             (("rooms", ROOMS + MORE_ROOMS), ("items", ITEMS + MORE_ITEMS), ("containers", CONTAINERS + MORE_CONTAINERS))}

    def names(kind: str, k: int, avoid: set[str]) -> list[str]:
        out: list[str] = []
        while len(out) < k:
            x = made_up_name(rng) if rng.random() < made_up else rng.choice(pools[kind])
            if x not in held and x not in avoid and x not in out:
                out.append(x)
        return out

    tasks = []
    for i in range(n):
        rooms = names("rooms", 8, set())
        item, *others = names("items", 6, set(rooms))
        (container,) = names("containers", 1, set(rooms) | {item, *others})
        room = rng.choice(rooms)
        tasks.append(_two_hop_task(f"findlight3-supply-{seed}-{i:06d}", rng, rooms, room, item, others, container,
                                   lambda: rng.choice(FRAMES).format(item=item), "sft", "supply"))
    return tasks


def find_light_v3_spec(name: str = "FindLight-v3", n_tasks: int = V3_TASKS) -> ToolEnvSpec:
    """FindLight-v3 (see the module docstring): v2's world, natural phrasings, larger name pools,
    held-out names and phrasings in half of the evaluation split."""
    return ToolEnvSpec(
        name=name,
        domain="home",
        description="Turn on the light where an item is, asked in plain words: read locate's answers "
                    "(two hops, 8 rooms).",
        state_type=FindLightState,
        tools=[locate, turn_on, turn_off],
        tasks=lambda: [_v3_task(name, i) for i in range(n_tasks)],
        max_turns=5,
    )


def swap_answer(task: Task, room: str) -> Task:
    """The counterfactual twin of a FindLight task: the same instruction and rooms, but the last
    ``locate`` of its solution answers ``room`` (one of the task's other rooms), and success means
    that room's light. A model that reads the tool's answer follows the swap; one that recalls
    or guesses does not. ``metadata["original_room"]`` keeps the room the task had."""
    state = task.initial_state
    old = task.metadata["room"]
    if room == old or room not in state.lights:
        raise ValueError(f"swap to another of the task's rooms ({sorted(set(state.lights) - {old})}), not {room!r}")
    where = {k: (room if v == old else v) for k, v in state.where.items()}
    lights = dict(state.lights)
    lights[old], lights[room] = lights[room], lights[old]  # the target starts off, as in the original
    want = dict(lights, **{room: True})
    solution = [c if c.name != "turn_on" else call("turn_on", room=room) for c in task.solution]
    return Task(
        id=f"{task.id}-swap-{room}",
        instruction=task.instruction,
        initial_state=FindLightState(lights=lights, where=where),
        solution=solution,
        check=lambda s, want=want: s.lights == want,
        metadata={**task.metadata, "room": room, "original_room": old, "swapped": True},
    )


def turned_on(messages: list[dict]) -> list[str]:
    """The rooms an episode's assistant turns asked to switch on (``turn_on`` calls), in order."""
    from envfactory.parsing import parse_text

    rooms = []
    for m in messages:
        if m.get("role") == "assistant" and isinstance(m.get("content"), str):
            rooms += [str(c.arguments.get("room", "")).strip().lower()
                      for c in parse_text(m["content"]).calls if c.name == "turn_on"]
    return rooms


SPECS = [register(find_light_spec(f"FindLight-v{d}", d)) for d in LEVELS] + [register(find_light_v3_spec())]
