"""Hostile actions on the host (issue 17): malformed tool calls given as objects, and
oversized actions, become error observations; nothing changes partially, and the
episode's snapshot still works afterwards."""

from __future__ import annotations

import json

import pytest

import envfactory
from envfactory import ToolCall, call
from envfactory import parsing
from envfactory.parsing import parse_action

INC = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'


def _cyclic() -> dict:
    d: dict = {}
    d["self"] = d
    return d


BAD_NAMES = [["increment"], {"name": "increment"}, 3, None, ""]
BAD_ARGUMENTS = {
    "set": {"by": {1, 2}},
    "object": {"by": object()},
    "cycle": {"by": _cyclic()},
    "bigint": {"by": 10 ** 5000},  # an int over the 4,300-digit conversion limit
    "tuple-key": {(1, 2): 3},      # a key JSON cannot hold
    "list": ["by", 1],             # not a dict at all
}


def _counter() -> envfactory.Episode:
    env = envfactory.make("Counter-v0")
    env.reset(0)
    return env


def _assert_consistent(env: envfactory.Episode, value: int, turns: int) -> None:
    """Turn count, transcript and state agree, and snapshot/restore round-trip."""
    assert env.status.turns_taken() == turns
    assert env.state.value == value
    snap = env.snapshot()
    json.dumps(snap)
    other = envfactory.make("Counter-v0")
    other.restore(snap)
    assert other.state.value == value and other.status.turns_taken() == turns
    assert other.transcript() == env.transcript()


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
@pytest.mark.parametrize("form", ["toolcall", "list", "dict", "assistant", "mixed"])
def test_a_call_with_a_bad_name_is_an_error_observation(name, form) -> None:
    env = _counter()
    action = {
        "toolcall": ToolCall(name, {}),
        "list": [ToolCall(name, {})],
        "dict": [{"name": name, "arguments": {}}],
        "assistant": {"role": "assistant", "content": "", "tool_calls": [ToolCall(name, {})]},
        # a parse error sends the turn down the general path, where the bad name used to raise
        "mixed": [{"arguments": {}}, ToolCall(name, {}), call("increment", by=1)],
    }[form]
    r = env.step(action)
    assert not r.done
    errors = [m for m in r.messages if m["name"] == "invalid_tool_call"]
    assert errors and all(m["content"].startswith("Error: ") for m in errors)
    assert any("name" in m["content"] for m in errors)
    _assert_consistent(env, 1 if form == "mixed" else 0, 1)
    r = env.step(INC)  # the episode goes on
    assert r.messages[0]["content"] == str(2 if form == "mixed" else 1)
    _assert_consistent(env, 2 if form == "mixed" else 1, 2)


@pytest.mark.parametrize("args", list(BAD_ARGUMENTS.values()), ids=list(BAD_ARGUMENTS))
@pytest.mark.parametrize("form", ["toolcall", "dict", "openai", "mixed"])
def test_arguments_that_are_not_json_are_an_error_observation(args, form) -> None:
    env = _counter()
    action = {
        "toolcall": ToolCall("increment", args),
        "dict": [{"name": "increment", "arguments": args}],
        "openai": {"role": "assistant", "content": None,
                   "tool_calls": [{"id": "c1", "type": "function",
                                   "function": {"name": "increment", "arguments": args}}]},
        "mixed": [call("increment", by=2), ToolCall("increment", args)],
    }[form]
    r = env.step(action)
    assert not r.done
    bad = [m for m in r.messages if m["name"] == "invalid_tool_call"]
    assert len(bad) == 1 and bad[0]["content"].startswith("Error: ") and "arguments" in bad[0]["content"]
    _assert_consistent(env, 2 if form == "mixed" else 0, 1)
    assert env.step(INC).messages[0]["content"] == str(3 if form == "mixed" else 1)


def test_parse_action_reports_bad_toolcalls_without_raising() -> None:
    p = parse_action([ToolCall(["x"], {}), ToolCall("a", {"x": {1}}), ToolCall("b", {"x": 1})])
    assert p.attempted and [c.name for c in p.calls] == ["b"] and len(p.errors) == 2
    p = parse_action({"role": "assistant", "content": {1, 2}, "tool_calls": []})  # content JSON cannot hold
    assert isinstance(p.content, str)


def test_too_many_calls_in_one_turn_is_an_error_and_runs_none(monkeypatch) -> None:
    env = _counter()
    n = parsing.MAX_CALLS_PER_TURN + 1
    r = env.step(INC * n)
    assert not r.done and len(r.messages) == 1 and r.messages[0]["name"] == "invalid_tool_call"
    assert str(parsing.MAX_CALLS_PER_TURN) in r.messages[0]["content"]
    _assert_consistent(env, 0, 1)
    r = env.step([call("increment", by=1)] * n)  # the same cap for call objects
    assert len(r.messages) == 1 and r.messages[0]["name"] == "invalid_tool_call"
    _assert_consistent(env, 0, 2)
    # The cap is configurable
    monkeypatch.setattr(parsing, "MAX_CALLS_PER_TURN", 3)
    assert len(parse_action(INC * 3).calls) == 3
    p = parse_action(INC * 4)
    assert not p.calls and p.attempted and "3" in p.errors[0]


def test_an_oversized_action_is_an_error_observation(monkeypatch) -> None:
    env = _counter()
    # 10 MiB of tiny calls: rejected whole, before any scanning or running
    huge = '<tool_call>{"name":"increment","arguments":{}}</tool_call>' * (10 * (1 << 20) // 56)
    r = env.step(huge)
    assert not r.done and len(r.messages) == 1 and r.messages[0]["name"] == "invalid_tool_call"
    assert "too long" in r.messages[0]["content"]
    _assert_consistent(env, 0, 1)
    monkeypatch.setattr(parsing, "MAX_ACTION_CHARS", 100)
    assert parse_action(INC).calls and not parse_action(INC).errors
    p = parse_action("x" * 101)  # a long answer too: an error, and the episode goes on
    assert p.attempted and not p.calls and "100" in p.errors[0]
    r = env.step("y" * 101)
    assert not r.done and r.messages[0]["name"] == "invalid_tool_call"
    _assert_consistent(env, 0, 2)


def test_a_parsed_action_from_a_caller_is_refused_before_anything_changes():
    """The episode's own short path hands its parse to the general turn; a caller's
    ParsedAction (not an accepted action form) must not ride that path unchecked."""
    env = _counter()
    before = env.snapshot()
    forged = parsing.ParsedAction("", [ToolCall(["increment"], {"by": 1})], attempted=True)
    for play in (env.step, lambda a: env.act(env.status.next_agent, a)):
        with pytest.raises(parsing.ActionTypeError):
            play(forged)
        assert env.snapshot() == before
    assert env.step(INC).messages[0]["content"] == "1"


def _deep(levels: int) -> object:
    """A value nested so that ``{"by": value}`` is ``levels`` deep."""
    value: object = 1
    for i in range(levels - 1):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize("form", ["text", "openai", "toolcall"])
def test_arguments_nested_past_the_depth_limit_are_an_error_observation(form, monkeypatch) -> None:
    """600 levels of arguments raised RecursionError out of step() (the argument copy behind the
    state quota recursed; the 10**6-output fuzz found it on both runtimes): now the call's error."""
    env = _counter()
    args = {"by": _deep(600)}
    if form == "text":
        action: object = "<tool_call>" + json.dumps({"name": "increment", "arguments": args}) + "</tool_call>"
    elif form == "openai":
        action = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "increment", "arguments": args}}]}
    else:
        action = ToolCall("increment", args)
    r = env.step(action)
    assert not r.done and len(r.messages) == 1 and r.messages[0]["name"] == "invalid_tool_call"
    assert "deeper than 100 levels" in r.messages[0]["content"]
    _assert_consistent(env, 0, 1)
    r = env.step(INC)  # the episode goes on
    _assert_consistent(env, 1, 2)
    # at the limit a call is parsed (and its tool refuses the value as it would any wrong type)
    assert parse_action(ToolCall("increment", {"by": _deep(100)})).calls  # (the object is level 1)
    assert parse_action(ToolCall("increment", {"by": _deep(101)})).errors
    monkeypatch.setattr(parsing, "MAX_ARGUMENT_DEPTH", 5)
    assert parse_action(ToolCall("increment", {"by": _deep(5)})).calls
    assert "deeper than 5" in parse_action(ToolCall("increment", {"by": _deep(6)})).errors[0]
    cyclic: dict = {}
    cyclic["self"] = cyclic  # (refused as not JSON before the depth is looked at)
    assert parse_action(ToolCall("increment", {"by": cyclic})).errors
