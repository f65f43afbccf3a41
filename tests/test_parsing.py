"""Parsing model output into tool calls; nothing a model writes can crash an episode."""

import json

import pytest

import envfactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.parsing import parse_action, parse_text


def test_several_hermes_calls_in_one_message():
    text = ('Let me look.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>')
    p = parse_action(text)
    assert [(c.name, c.arguments) for c in p.calls] == [("a", {"x": 1}), ("b", {"y": 2})]
    assert p.errors == [] and p.attempted and p.content == text


def test_openai_message_and_bare_json_calls():
    msg = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}}]}
    p = parse_action(msg)
    assert [(c.id, c.name, c.arguments) for c in p.calls] == [("c1", "a", {"x": 1})]
    p = parse_action('{"name": "a", "arguments": {"x": 3}}')
    assert [(c.name, c.arguments) for c in p.calls] == [("a", {"x": 3})]
    p = parse_action('{"answer": 42, "name": "x"}')  # JSON that is not a call is an answer
    assert not p.attempted and not p.calls


def test_malformed_calls_are_named():
    p = parse_action("<tool_call>{oops</tool_call>")
    assert p.attempted and not p.calls and "not valid JSON" in p.errors[0]
    p = parse_action('<tool_call>{"arguments": {}}</tool_call>')
    assert "missing the tool 'name'" in p.errors[0]
    p = parse_action('<tool_call>{"name": "a", "arguments": [1]}</tool_call>')
    assert "must be a JSON object" in p.errors[0]
    p = parse_action('<tool_call>{"name": "a", "arguments": {}}')
    assert "not closed" in p.errors[0]


def _env():
    env = envfactory.make("FileSystem-v0")
    env.reset(0)
    return env


def test_errors_reach_the_agent_and_the_episode_goes_on():
    env = _env()
    r = env.step('<tool_call>{bad json</tool_call><tool_call>{"name": "nope", "arguments": {}}</tool_call>'
                 '<tool_call>{"name": "read_file", "arguments": {"path": 3}}</tool_call>'
                 '<tool_call>{"name": "read_file", "arguments": {"path": "/missing"}}</tool_call>')
    assert not r.done
    contents = [m["content"] for m in r.messages]
    assert all(c.startswith("Error") for c in contents)
    assert "not valid JSON" in contents[0]
    assert "unknown tool 'nope'" in contents[1] and "read_file" in contents[1]
    assert "argument 'path'" in contents[2]
    assert "does not exist" in contents[3]
    assert (r.info["parse_errors"], r.info["tool_calls"], r.info["tool_errors"]) == (1, 3, 3)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def _blocks(text: str) -> tuple[int, int]:
    """(closed <tool_call> blocks, opening tags): counted without the parser's regex."""
    closed, i = 0, text.find(_OPEN)
    while i != -1:
        j = text.find(_CLOSE, i + len(_OPEN))
        if j == -1:
            break
        closed += 1
        i = text.find(_OPEN, j + len(_CLOSE))
    return closed, text.count(_OPEN)


def _check_step(env, action, content):
    """Step once on a fresh episode and check what every step must satisfy; returns the result."""
    before = list(env.transcript())  # a copy: transcript() may return the live list
    r = env.step(action)  # never raises on model output
    after = env.transcript()
    # the transcript grows by exactly the assistant message and this step's tool messages
    assert after[: len(before)] == before
    assert len(after) == len(before) + 1 + len(r.messages)
    assert after[len(before)]["role"] == "assistant" and after[len(before)]["content"] == content
    assert after[len(before) + 1 :] == r.messages
    assert all(m["role"] == "tool" and isinstance(m["content"], str) and m["tool_call_id"] for m in r.messages)
    # every observation is a parse error or the answer to a call, and the counts say so
    info = r.info
    assert info["parse_errors"] + info["tool_calls"] == len(r.messages)
    assert sum(m["name"] == "invalid_tool_call" for m in r.messages) == info["parse_errors"]
    assert all(m["content"].startswith("Error") for m in r.messages if m["name"] == "invalid_tool_call")
    assert 0 <= info["tool_errors"] <= info["tool_calls"]
    calls = after[len(before)].get("tool_calls", [])
    assert len(calls) == info["tool_calls"]
    assert [m["tool_call_id"] for m in r.messages if m["name"] != "invalid_tool_call"] == [c["id"] for c in calls]
    assert isinstance(r.reward, float) and 0.0 <= r.reward <= 1.0
    assert not (r.terminated and r.truncated)
    if not r.messages:  # no tool call attempted: that is the final answer
        assert r.terminated and info["ended_by"] == "answer"
    return r


def _expect_blocks(text, r):
    closed, opened = _blocks(text)
    if opened:  # each closed block yields one call or one error; an unclosed tag one more error
        assert len(r.messages) == closed + (1 if opened > closed else 0), (text, r.messages)
        assert not (r.terminated and r.info.get("ended_by") == "answer")  # an attempt never ends the episode


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_fuzz_random_text_never_raises_out_of_step(text):
    env = _env()
    _expect_blocks(text, _check_step(env, text, text))


_call_json = st.builds(lambda name, args: json.dumps({"name": name, "arguments": args}),
                       st.sampled_from(["list_dir", "read_file", "write_file", "finish", "nope", ""]), _json)
_fragment = st.one_of(
    st.text(max_size=30), st.just(_OPEN), st.just(_CLOSE), _call_json, _json.map(json.dumps),
    st.builds(lambda c: f"{_OPEN}{c}{_CLOSE}", _call_json),
    st.just('{"name": "list_dir", "arguments": {"path": "/"}}'), st.just("{oops"),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_fragment, max_size=8).map("".join))
def test_fuzz_model_text_with_tool_call_blocks(text):
    env = _env()
    _expect_blocks(text, _check_step(env, text, text))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["read_file", "write_file", "move_file", "nope", ""]) | st.text(max_size=10),
       args=_json, wrap=st.sampled_from(["hermes", "bare", "openai", "openai_str"]))
def test_fuzz_random_json_calls_never_raise_out_of_step(name, args, wrap):
    env = _env()
    call = {"name": name, "arguments": args}
    if wrap == "hermes":
        action = f"<tool_call>{json.dumps(call)}</tool_call>"
    elif wrap == "bare":
        action = json.dumps(call)
    elif wrap == "openai":
        action = {"role": "assistant", "content": "", "tool_calls": [{"id": "x", "function": call}]}
    else:
        action = {"role": "assistant", "content": "",
                  "tool_calls": [{"id": "x", "function": {"name": name, "arguments": json.dumps(args)}}]}
    content = json.dumps(call) if wrap == "bare" else (action if wrap == "hermes" else "")
    r = _check_step(env, action, content)
    assert len(r.messages) == 1  # exactly one call: it ran, or it was refused with an error observation
    assert r.info["parse_errors"] + r.info["tool_calls"] == 1


# -- hostile input: found by hand while making the parser faster; each failed before its fix ----------

DEEP = 100_000


@pytest.mark.parametrize(
    "action",
    [
        "<tool_call>" + "[" * DEEP + "</tool_call>",  # a Hermes block
        "[" * DEEP + '"name"',  # a bare JSON call
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "increment", "arguments": "[" * DEEP}}]},  # OpenAI, arguments as a string
    ],
    ids=["hermes", "bare_json", "openai_arguments"],
)
def test_deeply_nested_json_is_an_error_observation_not_a_crash(action) -> None:
    # json.loads raises RecursionError (not ValueError) past the interpreter's depth limit;
    # the parser let it escape, so a model could crash the episode with one turn.
    parsed = parse_action(action)
    assert not parsed.calls
    if isinstance(action, str) and not action.startswith("<tool_call>"):
        assert parsed.answer  # not JSON: a plain answer, like any other text
    else:
        assert parsed.errors and "not valid JSON" in parsed.errors[0]
    env = envfactory.make("Counter-v0")
    env.reset(0)
    r = env.step(action)
    assert r.messages or r.terminated  # the episode goes on, or the turn is an answer


def test_unclosed_tags_parse_in_linear_time() -> None:
    # A lazy regex rescans the tail once per unclosed tag: 32k tags took minutes. The scanner is
    # linear; the bound here is a thousand times what it needs, so only a quadratic parser fails it.
    import time

    text = "<tool_call>{" * 32_000
    t0 = time.perf_counter()
    parsed = parse_text(text)
    assert time.perf_counter() - t0 < 2.0
    assert not parsed.calls and "not closed" in parsed.errors[-1]


@pytest.mark.parametrize("body", [
    '{"name": "a", "arguments": {}}', '\n{"name": "a", "arguments": {}}\n', ' \t{"name": "a", "arguments": {"x": [1, 2.5, null, "\\u00e9"]}} ',
    '{"name": "a", "arguments": {}} trailing', '{"name": "a", "arguments": {}}{}', "", "\u00a0{}", "NaN", '{"a": 1e999}',
])
def test_fast_json_path_agrees_with_json_loads(body: str) -> None:
    # the parser calls json's scanner directly; it must accept and reject exactly what json.loads does
    from envfactory.parsing import _loads

    try:
        expected = json.loads(body)
    except ValueError as exc:
        with pytest.raises(ValueError) as got:
            _loads(body)
        assert str(got.value) == str(exc)
    else:
        assert json.dumps(_loads(body)) == json.dumps(expected)  # NaN-safe equality


_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                            lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), _json_values.map(json.dumps)), st.sampled_from(["", " ", "\n", "\t\r", "x", "\u00a0"]))
def test_fast_json_path_agrees_with_json_loads_fuzzed(body: str, pad: str) -> None:
    test_fast_json_path_agrees_with_json_loads(pad + body + pad)


_counter_call = st.builds(
    lambda name, by, pad: f"{pad}<tool_call>{json.dumps({'name': name, 'arguments': by})}</tool_call>{pad}",
    st.sampled_from(["increment", "reset_counter", "finish", "nope"]),
    st.sampled_from([{}, {"by": 1}, {"by": 3}, {"by": 11}, {"by": "2"}, {"by": 1.0}, {"x": 1}]),
    st.sampled_from(["", " ", "ok ", "\n"]))
_counter_action = st.one_of(_counter_call, _fragment, st.just(""), st.just("The counter shows 10."))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_counter_action, min_size=1, max_size=6))
def test_the_step_s_one_call_shortcut_plays_what_the_full_parse_plays(actions) -> None:
    """A sole agent's step takes short paths (a text of one well-formed call read without the
    parse's objects, ``parsing.one_call``; the one call run inline); played again through the
    general turn that a team's agents take (``Episode._turn``), the same actions give the same
    results, transcript, log and state."""
    from envfactory.episode import Episode

    def general(self, action):
        agent = self._solo_agent
        self._check_turn(agent)
        return self._slow(agent, parse_text(action))

    def play(shortcut: bool):
        saved = Episode._solo_turn
        if not shortcut:
            Episode._solo_turn = general
        try:
            env = envfactory.make("Counter-v0", max_turns=5)
            env.reset(0)
            results = []
            for a in actions:
                if env.done:
                    break
                r = env.step(a)
                results.append((r.messages, r.reward, r.terminated, r.truncated, r.info, r.rewards))
            return results, env.transcript(), env.status.log, env.state.model_dump(), env.success
        finally:
            Episode._solo_turn = saved

    assert play(True) == play(False)


@settings(max_examples=300, deadline=None)
@given(st.lists(_fragment, max_size=6).map("".join))
def test_one_call_is_parse_text_s_reading_of_one_call(text) -> None:
    from envfactory.parsing import one_call
    from envfactory.task import ToolCall

    one = one_call(text)
    if one is not None:
        parsed = parse_text(text)
        assert parsed.calls == [ToolCall(one[0], one[1])] and not parsed.errors and parsed.attempted
        assert parsed.content == text
