"""Differential fuzzing of the referee: Docker against in-process (issue 17, hostile input).

Hypothesis generates model outputs (Hermes ``<tool_call>`` blocks with valid and broken
JSON, unknown tools, arguments of the wrong type, huge or deeply nested, control
characters and lone surrogates, unclosed tags, many calls, OpenAI-style message dicts
and bare lists of calls); each example plays a few of them on an in-process episode and
on a Docker episode of the same environment and task. Nothing may escape ``step()``,
and the two runtimes must agree exactly: every ``StepResult.to_json()`` and the final
state (canonical JSON). ``benchmarks/fuzz_runtimes.py`` is the large version (not in CI).

Runtime: about 20-40 s on 2 cores once the image exists.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envfactory
from envfactory.state import canonical_json

from conftest import require_docker

pytestmark = pytest.mark.docker
ENV = "FileSystem-v0"
SCHEMAS = envfactory.make(ENV).tool_schemas()
NAMES = [s["function"]["name"] for s in SCHEMAS]
PROPS = {s["function"]["name"]: s["function"]["parameters"].get("properties", {}) for s in SCHEMAS}
TASKS = [t.id for t in envfactory.spec(ENV).get_tasks()]

nasty_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40) | st.sampled_from(
    ["", "/", "/home/user/notes/todo.txt", "/home/user", "\x00", "\ud800", "\ufeff", "</tool_call>", "..",
     "/home/user/../../etc/passwd", "a" * 5000, "\u202e", "\\u0000"])
scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2 ** 63)
           | st.floats(allow_nan=False) | nasty_text)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(nasty_text, inner, max_size=3), max_leaves=12)
deep = st.integers(1, 700).map(lambda d: json.loads("[" * d + "]" * d))  # (past 450: RecursionError once)
names = st.sampled_from(NAMES) | st.sampled_from(["", "nope", "LIST_DIR", "list_dir ", "finish_x"]) | nasty_text


@st.composite
def arguments(draw, name: str) -> object:
    props = PROPS.get(name, {})
    kind = draw(st.integers(0, 4))
    if kind == 0 and props:  # well typed
        return {k: draw(nasty_text) if v.get("type") == "string" else draw(json_values) for k, v in props.items()}
    if kind == 1:  # some keys, any types, maybe an extra one
        args = {k: draw(json_values | deep) for k in props if draw(st.booleans())}
        if draw(st.booleans()):
            args[draw(nasty_text)] = draw(json_values)
        return args
    if kind == 2:
        return draw(json_values | deep)  # not an object
    return {}


@st.composite
def call_json(draw) -> str:
    name = draw(names)
    body = {"name": name, "arguments": draw(arguments(name))}
    text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    mangle = draw(st.integers(0, 9))
    if mangle == 0:
        return text[: draw(st.integers(0, len(text)))]  # truncated
    if mangle == 1:
        return text.replace('"', "'")
    if mangle == 2:
        i = draw(st.integers(0, len(text)))
        return text[:i] + draw(nasty_text) + text[i:]
    return text


@st.composite
def hermes(draw) -> str:
    parts = [draw(nasty_text)]
    for c in draw(st.lists(call_json(), max_size=4)):
        wrap = draw(st.sampled_from(["<tool_call>{}</tool_call>", "<tool_call>{}", "<tool_call>\n{}\n</tool_call>",
                                     "<tool_call><tool_call>{}</tool_call>", "{}"]))
        parts.append(wrap.format(c))
    if draw(st.integers(0, 20)) == 0:
        parts = parts * draw(st.integers(10, 60))  # many calls
    return draw(st.sampled_from(["", "\n", " "])).join(parts)


@st.composite
def openai(draw) -> object:
    calls = []
    for i in range(draw(st.integers(0, 3))):
        name = draw(names | scalars)
        args = draw(arguments(name if isinstance(name, str) else ""))
        if draw(st.booleans()):
            try:
                args = json.dumps(args)
            except (ValueError, RecursionError):
                args = "{"
        fn = {"name": name, "arguments": args} if draw(st.integers(0, 9)) else draw(json_values)
        calls.append({"id": f"call_{i}", "type": "function", "function": fn} if draw(st.integers(0, 9))
                     else draw(json_values))
    if draw(st.integers(0, 5)) == 0:
        return calls
    return {"role": "assistant", "content": draw(nasty_text | st.none() | json_values), "tool_calls": calls}


outputs = hermes() | openai() | nasty_text


@pytest.fixture(scope="module")
def pair():
    require_docker()
    from envfactory.runtime.pool import Pool

    pool = Pool(envfactory.spec(ENV), sessions_per_container=8)
    local = envfactory.make(ENV, max_turns=4)
    dock = envfactory.make(ENV, runtime="docker", pool=pool, max_turns=4)
    yield local, dock
    dock.close()
    pool.shutdown()


def play_both(local, dock, task: str, actions: list) -> None:
    assert local.reset(task) == dock.reset(task)
    for a in actions:
        ra = local.step(a)  # nothing escapes step(), on either runtime
        rb = dock.step(a)
        assert ra.to_json() == rb.to_json()
        if ra.done:
            break
    assert canonical_json(local.state) == canonical_json(dock.state)
    assert local.transcript() == dock.transcript()


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(task=st.sampled_from(TASKS), actions=st.lists(outputs, min_size=1, max_size=3))
def test_docker_and_in_process_agree_on_generated_outputs(pair, task, actions) -> None:
    play_both(*pair, task, actions)


# -- regressions: what the differential fuzzing found ------------------------------------------
SURROGATE_WRITE = ('<tool_call>{"name": "write_file", "arguments": {"path": "/home/user/\\ud800x", '
                   '"content": "\\udfff"}}</tool_call>')


def test_a_dict_key_with_a_lone_surrogate_survives_the_wire(pair) -> None:
    """pydantic-core's ``model_dump(mode="json")`` turns a lone surrogate in a dict key into
    U+FFFD: the file an agent wrote came back under another name from the container (the
    state, its hash and the reward differed from the in-process run)."""
    local, dock = pair
    play_both(local, dock, TASKS[-1], [SURROGATE_WRITE])
    assert "/home/user/\ud800x" in dock.state.fs.files
    # and across a snapshot (dump, then load into a fresh session)
    snap = dock.snapshot()
    dock.reset(TASKS[0])
    dock.restore(snap)
    assert dock.state.fs.files["/home/user/\ud800x"] == "\udfff"
    assert canonical_json(dock.state) == canonical_json(local.state)


@pytest.mark.parametrize("arguments", [
    {"path": "/home/user/a", 1: "x"},                       # a key that is not a string
    {"path": "/home/user/a", "content": "x", (1, 2): "y"},  # nor JSON-encodable at all
    {"path": ("/home/user/a",), "content": "x"},            # a tuple (JSON makes it a list)
], ids=["int-key", "tuple-key", "tuple-value"])
def test_arguments_json_would_change_are_judged_as_in_process(pair, arguments) -> None:
    """An OpenAI-style action carries Python objects: JSON would turn an int key into a
    string (a different error, or none, in the container). They are validated on the host."""
    local, dock = pair
    action = {"role": "assistant", "content": "",
              "tool_calls": [{"id": "c1", "type": "function",
                              "function": {"name": "write_file", "arguments": arguments}},
                             {"id": "c2", "type": "function",
                              "function": {"name": "write_file",
                                           "arguments": {"path": "/home/user/b", "content": "y"}}}]}
    play_both(local, dock, TASKS[-1], [action])


@pytest.mark.parametrize("text", ["\ud800\udfff", "a\udbff\udc00b", "\ud83d\ude00\ud800"], ids=["pair", "max", "emoji"])
def test_two_surrogates_in_a_row_cross_the_wire_as_two(pair, text) -> None:
    """A model's text holding a high and a low surrogate as two code points: ``\\uXXXX``
    escapes on the wire merged them into one astral character in the container (the
    file got another name; the echoed error another path)."""
    local, dock = pair
    raw = ('<tool_call>{"name": "write_file", "arguments": {"path": "/home/user/' + text + '", "content": "'
           + text + '"}}</tool_call><tool_call>{"name": "read_file", "arguments": {"path": "' + text + '"}}'
           '</tool_call>')
    play_both(local, dock, TASKS[-1], [raw])
    assert "/home/user/" + text in dock.state.fs.files


def test_make_dir_on_a_path_with_two_leading_slashes_returns() -> None:
    """Found by benchmarks/fuzz_runtimes.py: an in-process step that never returns (on
    Docker the step overruns step_timeout and the container is recycled)."""
    import subprocess
    import sys

    code = ("import envfactory; e = envfactory.make('FileSystem-v0'); e.reset(0); "
            "print(e.step('<tool_call>{\"name\": \"make_dir\", \"arguments\": {\"path\": \"//x\"}}</tool_call>')"
            ".messages[0]['content'])")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("make_dir('//x') did not return within 20 s")
    assert r.returncode == 0, r.stderr[-2000:]


def test_make_dir_refuses_a_path_whose_parents_would_blow_up_the_state() -> None:
    """Found by benchmarks/fuzz_runtimes.py: make_dir on a ~200k-character path made every
    parent directory (a state quadratic in the path: ~425 MB), killing the container at its
    memory limit on every replay. Paths are capped; the state stays as it was."""
    e = envfactory.make("FileSystem-v0")
    e.reset(0)
    before = e.state.hash()
    path = "/" + "/".join(["d"] * 5000)
    r = e.step(json.dumps({"name": "make_dir", "arguments": {"path": path}}))
    assert "too long" in r.messages[0]["content"] and e.state.hash() == before


def test_find_files_keeps_no_compiled_pattern_per_distinct_pattern() -> None:
    """The 10**6-output fuzz's FileSystem-v0 container grew 12-15 MiB a minute: one part was
    ``fnmatch.fnmatch``'s cache, which keeps up to 32,768 compiled patterns (about 3 KB each for
    random ones). ``find_files`` compiles its pattern for the call and keeps nothing; matches unchanged
    (``[`` unclosed, ``?``, ``*``, ``[!...]``)."""
    import fnmatch

    e = envfactory.make("FileSystem-v0")
    e.reset(0)
    e.step(envfactory.call("make_dir", path="/q"))
    e.step([envfactory.call("write_file", path=p, content="x") for p in ("/q/a[1.txt", "/q/b2.txt", "/q/notes.md")])
    before = fnmatch._compile_pattern.cache_info().currsize
    found = {}
    patterns = ["*.txt", "?2.txt", "a[1*", "[!a]*", "*.md", *(f"zz{i}*[q" for i in range(200))]
    for i in range(0, len(patterns), 25):  # 25 calls a turn
        some = patterns[i:i + 25]
        r = e.step([envfactory.call("find_files", directory="/q", pattern=q) for q in some])
        found.update(zip(some, (m["content"] for m in r.messages)))
    assert fnmatch._compile_pattern.cache_info().currsize == before
    assert found["*.txt"] == "/q/a[1.txt\n/q/b2.txt"
    assert found["?2.txt"] == "/q/b2.txt"
    assert found["a[1*"] == "/q/a[1.txt"
    assert found["[!a]*"] == "/q/b2.txt\n/q/notes.md"
    assert found["zz0*[q"] == "No matching files."


def test_find_files_refuses_a_pattern_that_would_take_minutes() -> None:
    """Found by benchmarks/fuzz_runtimes.py (the 10^6 run with attacks, seed 20216476): a 200,000-character
    ``find_files`` pattern holding 6,185 unclosed ``[`` took 81 s in-process (``fnmatch`` scans to the
    end for each), and on Docker overran ``step_timeout`` (the only step difference of the run).
    Patterns are capped, the same on both runtimes; a long one is the call's error."""
    e = envfactory.make("FileSystem-v0")
    e.reset(0)
    pattern = ("AIMz3T,Ah6btQ\\,clgjRznO-2enTyMOGp[>1l:8s>_jqMIh6Gi" * 4000)[:200_000]
    r = e.step(json.dumps({"name": "find_files", "arguments": {"directory": "/", "pattern": pattern}}))
    assert r.messages[0]["content"].startswith("Error: pattern is too long (200000 characters")
    ok = e.step(json.dumps({"name": "find_files", "arguments": {"directory": "/", "pattern": "[" * 1024}}))
    assert not ok.messages[0]["content"].startswith("Error")  # at the cap: still a pattern
