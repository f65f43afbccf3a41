"""Lights-v0: switch one named light on or off — a small environment a tiny model can learn.

Purpose-built for the training quickstart (``envfactory quickstart``): every task
is one tool call that names a room and an action, so a few-million-parameter
model can be warm-started on some tasks (SFT) and improved on held-out ones
(other room/action pairs) from the sparse success reward alone. The rooms and
both actions all appear in the SFT tasks; a held-out task is a new pairing.
"""

from __future__ import annotations

from envfactory import ToolEnvSpec, State, Task, ToolError, call, register, tool

ROOMS = ("kitchen", "hall", "bedroom", "bath", "garage", "office")


class LightsState(State):
    on: dict[str, bool] = {}


def _room(state: LightsState, room: str) -> str:
    if room not in state.on:
        raise ToolError(f"no light in {room!r}; rooms: {', '.join(sorted(state.on))}")
    return room


@tool
def turn_on(state: LightsState, room: str) -> str:
    """Switch a room's light on.

    Args:
        room: The room.
    """
    state.on[_room(state, room)] = True
    return "on"


@tool
def turn_off(state: LightsState, room: str) -> str:
    """Switch a room's light off.

    Args:
        room: The room.
    """
    state.on[_room(state, room)] = False
    return "off"


def tasks() -> list[Task]:
    out = []
    for i, room in enumerate(ROOMS):
        for want in (True, False):
            start = {r: (not want) if r == room else (j + i) % 2 == 0 for j, r in enumerate(ROOMS)}
            word = "on" if want else "off"
            out.append(Task(
                id=f"lights-{room}-{word}",
                instruction=f"Turn {word} the {room} light.",
                initial_state=LightsState(on=start),
                solution=[call("turn_on" if want else "turn_off", room=room)],
                check=lambda s, room=room, want=want, start=start: s.on.get(room) == want and all(
                    s.on.get(r) == v for r, v in start.items() if r != room),
            ))
    return out


SPEC = register(
    ToolEnvSpec(
        name="Lights-v0",
        domain="toy",
        description="Switch one named light on or off (the training quickstart's learnable task).",
        state_type=LightsState,
        tools=[turn_on, turn_off],
        tasks=tasks,
        max_turns=3,
    )
)
