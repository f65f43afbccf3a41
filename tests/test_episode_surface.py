"""The episode's public surface is small and fixed (issue 57): twenty names at most, each one
documented; the rest of what an episode knows is on ``status`` (read live) and the awaited calls
on ``aio``."""

from __future__ import annotations

import asyncio

import pytest

import envfactory
from envfactory import EpisodeError
from envfactory.episode import AsyncEpisode, Episode, EpisodeStatus

PUBLIC = ["act", "agents", "aio", "close", "done", "fork", "observation", "reset", "restore", "rewards",
          "snapshot", "spec", "state", "status", "step", "step_round", "success", "task", "tool_schemas",
          "transcript"]
STATUS = ["answer", "conversation", "ended_by", "judge", "log", "max_turns", "next_agent", "round", "terminated", "truncated",
          "turns_taken"]
AIO = ["act", "close", "fork", "reset", "step", "step_round"]
INC = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'


def _public(obj: object) -> set[str]:
    return {n for n in set(dir(type(obj))) | set(getattr(obj, "__dict__", {})) if not n.startswith("_")}


@pytest.mark.parametrize("name", ["Counter-v0", "MultiRooms-v0"])
def test_an_episode_has_these_public_names_and_no_others(name: str) -> None:
    ep = envfactory.make(name)
    assert _public(ep) == set(PUBLIC)  # made
    ep.reset(0)
    assert _public(ep) == set(PUBLIC)  # and playing: no instance attribute adds a name
    assert len(PUBLIC) <= 20
    assert _public(ep.status) == set(STATUS) and _public(ep.aio) == set(AIO)
    for cls, names in ((Episode, PUBLIC), (EpisodeStatus, STATUS), (AsyncEpisode, AIO)):
        for n in names:  # each member says what it promises
            member = getattr(cls, n, None)
            if member is not None:  # (spec and agents are instance attributes: the class docstring's)
                assert (member.__doc__ or "").strip(), f"{cls.__name__}.{n} has no docstring"
        assert all(f"`{n}`" in (cls.__doc__ or "") or f":meth:`{n}`" in (cls.__doc__ or "")
                   or f":attr:`{n}`" in (cls.__doc__ or "") for n in names), f"{cls.__name__}'s docstring"


def test_status_reads_the_episode_live() -> None:
    ep = envfactory.make("Counter-v0")
    status = ep.status
    assert (status.round, status.next_agent, status.ended_by, status.answer, status.log) == (0, None, None, None, [])
    ep.reset("counter-0-2")
    assert (status.round, status.next_agent, status.turns_taken()) == (1, "agent_0", 0)
    ep.step(INC)
    ep.step(INC)
    assert status.round == 3 and status.turns_taken() == 2 and [e["name"] for e in status.log] == ["increment"] * 2
    assert status.judge() == (True, {"agent_0": 1.0}) and not ep.done  # as if cut now; nothing changed
    ep.step("It shows 2.")
    assert ep.done and status.terminated and not status.truncated and status.ended_by == "answer"
    assert status.answer == "It shows 2." and status.next_agent is None and ep.success is True
    assert status.max_turns == ep.spec.max_turns


def test_status_of_a_team_names_whose_turn_it_is() -> None:
    ep = envfactory.make("MultiRooms-v0")
    ep.reset(0)
    first, second = ep.agents[0], ep.agents[1]
    assert ep.status.next_agent == first
    ep.act(first, "I pass.")
    assert ep.status.next_agent == second and ep.status.turns_taken(first) == 1
    with pytest.raises(EpisodeError, match="say which agent"):
        ep.status.turns_taken()


def test_aio_awaits_the_same_calls() -> None:
    async def play(ep: Episode) -> tuple[float, bool | None, int]:
        await ep.aio.reset("counter-0-2")
        child = await ep.aio.fork()
        for action in (INC, INC, "It shows 2."):
            result = await ep.aio.step(action)
        await child.aio.close()
        await ep.aio.close()
        return result.reward, ep.success, len(ep.transcript())

    assert asyncio.run(play(envfactory.make("Counter-v0"))) == (1.0, True, 7)  # system, user, two calls and their results, the answer
