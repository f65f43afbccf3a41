"""Per-session quotas on the in-process runtime (issue 28), and judging inside the lost-world handling.

The attack: write a 1 MB file, then turns of 255 ``copy_file`` calls. Each copy shares the string
in memory (copy on write), but a dump writes it again: before the quotas, three turns made
``snapshot()`` 732 MiB (25.8 s) and ending the episode 7.7 s. Now the state is counted as its
dump would write it (:func:`envfactory.quotas.state_size`), and a call that would take it past
``MAX_STATE_BYTES`` is that call's error observation, the state as it was before the call.
A turn's tool observations together hold at most ``MAX_OBSERVATION_CHARS`` characters. One call
that grows a small state past the whole quota (``rows * 1000``, or ``rows = [rows, rows]`` thirty
times: issue 63) is undone too: a copy is taken before every writing call.
The Docker runtime gives the same observations (``test_session_quotas_docker.py``).

Runtime: about 5 s.
"""

from __future__ import annotations

import json
from typing import Any

import envfactory
from envfactory import ToolCall, call
from envfactory import quotas
from envfactory.world import LocalWorld, WorldLost

BIG = "/home/user/big.txt"


def _copies(turn: int, n: int = 255) -> list[ToolCall]:
    return [call("copy_file", source=BIG, destination=f"/home/user/c{turn}_{i}.txt") for i in range(n)]


def test_copy_file_amplification_stops_at_the_state_quota() -> None:
    env = envfactory.make("FileSystem-v0")
    env.reset(0)
    assert env.step([call("write_file", path=BIG, content="x" * 1_000_000)]).messages[0]["content"].startswith("Wrote")
    refused = 0
    for turn in range(3):
        r = env.step(_copies(turn))
        assert not r.done
        refused += sum(quotas.STATE_QUOTA_PREFIX in m["content"] for m in r.messages)
        files_after = dict(env.state.fs.files)
    assert refused > 0, "no copy was refused: nothing caps the state's serialized size"
    size = quotas.state_size(env.state)
    assert size <= quotas.MAX_STATE_BYTES
    # the refused calls changed nothing: only copies that fit are there
    copies = [p for p in files_after if p.startswith("/home/user/c")]
    assert len(copies) == 3 * 255 - refused
    snap = env.snapshot()
    dumped = len(json.dumps(snap))
    assert dumped <= quotas.MAX_STATE_BYTES + (4 << 20), dumped  # the referee's fields besides the state
    r = env.step("done")
    assert r.done and r.info["ended_by"] == "answer"  # judged on a state of bounded size (no time bound: tests
    # check behaviour; the figures, 732 MiB / 25.8 s before and 34 MiB / 1.1 s after, are docs/hostile-input.md's)


def test_a_refused_call_leaves_the_state_as_it_was(monkeypatch) -> None:
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas.state_size(_fresh_state()) + 2_500)
    env = envfactory.make("FileSystem-v0")
    env.reset(0)
    before = env.state.model_dump()
    r = env.step([call("write_file", path="/home/user/a.txt", content="a" * 1000),
                  call("write_file", path="/home/user/b.txt", content="b" * 5000),  # over: refused
                  call("write_file", path="/home/user/c.txt", content="c" * 1000)])
    contents = [m["content"] for m in r.messages]
    assert contents[0].startswith("Wrote") and contents[2].startswith("Wrote"), contents
    assert quotas.STATE_QUOTA_PREFIX in contents[1] and "ENVFACTORY_MAX_STATE_BYTES" in contents[1]
    files = env.state.fs.files
    assert "/home/user/b.txt" not in files and files["/home/user/a.txt"] == "a" * 1000
    assert {k: v for k, v in files.items() if k not in ("/home/user/a.txt", "/home/user/c.txt")} == before["fs"]["files"]
    assert r.info["tool_errors"] == 1


def test_the_first_call_after_reset_is_undone_when_over_the_quota(monkeypatch) -> None:
    """``reset`` takes the fresh state's measure from the task's initial state, measured once
    (``quotas.fresh_copy``), not by walking the copy: that measure must still see a state past
    ``1/BACKUP_FROM`` of the quota, so that the first call, taking it over, is undone (a copy was
    kept), on the one-call text path and the call-list path alike, every reset."""
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas.state_size(_fresh_state()) + 2_500)
    env = envfactory.make("FileSystem-v0")
    big = call("write_file", path="/home/user/b.txt", content="b" * 5000)
    for action in [big.to_hermes(), [big], big.to_hermes()]:
        env.reset(0)
        before = env.state.model_dump()
        said = env.step(action).messages[0]["content"]
        assert quotas.STATE_QUOTA_PREFIX in said and "it was not applied" in said, said
        assert env.state.model_dump() == before


def _fresh_state() -> Any:
    env = envfactory.make("FileSystem-v0")
    env.reset(0)
    return env.state


def test_a_turn_observation_is_cut_at_the_cap(monkeypatch) -> None:
    monkeypatch.setattr(quotas, "MAX_OBSERVATION_CHARS", 10_000)
    env = envfactory.make("FileSystem-v0")
    env.reset(0)
    env.step([call("write_file", path=BIG, content="y" * 6_000)])
    r = env.step([call("read_file", path=BIG)] * 3)  # 18,000 characters asked for
    contents = [m["content"] for m in r.messages]
    assert contents[0] == "y" * 6_000
    assert contents[1].startswith("y" * 4_000) and not contents[1].startswith("y" * 4_001)
    assert quotas.OBSERVATION_CUT in contents[1] and contents[2] == quotas.OBSERVATION_CUT
    one = env.step(call("read_file", path=BIG))  # the single-call fast path too
    assert one.messages[0]["content"] == "y" * 6_000
    env.step([call("write_file", path=BIG, content="z" * 12_000)])
    one = env.step(call("read_file", path=BIG))
    assert one.messages[0]["content"] == "z" * 10_000 + quotas.OBSERVATION_CUT


def test_default_observation_cap_cuts_a_large_read() -> None:
    """The issue's 256 MiB read: Docker cut it at its reply cap, in-process returned it all; now both
    cut at MAX_OBSERVATION_CHARS (a smaller file, past the cap, shows the same)."""
    env = envfactory.make("FileSystem-v0")
    env.reset(0)
    n = quotas.MAX_OBSERVATION_CHARS + 12_345
    env.step([call("write_file", path=BIG, content="r" * n)])
    content = env.step(call("read_file", path=BIG)).messages[0]["content"]
    assert content == "r" * quotas.MAX_OBSERVATION_CHARS + quotas.OBSERVATION_CUT


class _LostWhileJudged(LocalWorld):
    """A world whose host is lost after the last step: fetching the state to judge it fails."""

    lost = False

    def state(self):  # type: ignore[override]
        if self.lost:
            raise WorldLost("the container stopped answering mid-episode (test)")
        return super().state()


def test_a_world_lost_while_judging_ends_the_episode_instead_of_raising() -> None:
    spec = envfactory.registry.spec("FileSystem-v0")
    world = _LostWhileJudged(spec)
    env = envfactory.Episode(spec, world)
    env.reset(0)
    env.step(call("list_dir", path="/home/user"))
    world.lost = True
    r = env.step("I am done.")  # judging fetches the state
    assert r.done and r.truncated and r.info["ended_by"] == "world_lost" and r.info.get("world_lost")
    assert r.reward == 0.0 and env.success is False


def test_one_call_that_takes_a_small_state_past_the_whole_quota_is_undone(monkeypatch) -> None:
    """Issue 63: a state under an eighth of the quota kept no copy before a call, so one call that
    took it past the whole quota (more than eightfold growth) stayed applied, and every later write
    was refused. Now a copy is taken before every writing call: the call is undone, and the next
    write goes through."""
    limit = quotas.state_size(_fresh_state()) * 20
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", limit)
    env = envfactory.make("FileSystem-v0")
    env.reset(0)
    before = env.state.model_dump()
    big = "/home/user/huge.txt"
    r = env.step([call("write_file", path=big, content="h" * limit)])
    said = r.messages[0]["content"]
    assert quotas.STATE_QUOTA_PREFIX in said and "it was not applied" in said, said
    assert env.state.model_dump() == before and quotas.state_size(env.state) <= limit
    r = env.step([call("write_file", path="/home/user/more.txt", content="m" * 100)])
    assert quotas.STATE_QUOTA_PREFIX not in r.messages[0]["content"]
    assert env.state.fs.files["/home/user/more.txt"] == "m" * 100


# -- amplification by one call (issue 63): tests/adversarial/amplify_env.py's Amplify-v0 ----------------
import pytest  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _amplify_unregistered():
    """Amplify-v0 (its tasks call tools that exit or blow the quota on purpose) leaves the registry with
    this module: the later whole-registry tests (verify --all) must not meet it."""
    yield
    envfactory.registry._REGISTRY.pop("Amplify-v0", None)


def _amplify():
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    try:
        import amplify_env
    finally:
        sys.path.pop(0)
    envfactory.registry.register(amplify_env.SPEC, replace=True)
    return amplify_env


def test_one_call_that_multiplies_or_nests_the_state_is_undone_and_the_episode_goes_on() -> None:
    """``rows * 1000`` and ``rows = [rows, rows]`` thirty times, from a 100 KB state: before, both
    stayed applied (the state at 100 MB, three times the quota; every later write refused), and
    after the nesting the next write's copy (no memo) ran past 120 s. Now each is its error
    observation, the state is exactly as before it (at most the quota), the next write is
    ordinary, and snapshot and the end of the episode work."""
    _amplify()
    env = envfactory.make("Amplify-v0")
    env.reset("one-row")
    env.step(call("fill", n=1000, width=100))
    for attack in (call("multiply", times=1000), call("nest", levels=30),
                   [call("add", text="a"), call("multiply", times=1000), call("add", text="b")]):
        before = env.state.model_dump()
        r = env.step(attack)
        said = [m["content"] for m in r.messages]
        refused = [c for c in said if quotas.STATE_QUOTA_PREFIX in c]
        assert len(refused) == 1 and "it was not applied" in refused[0], said
        assert quotas.state_size(env.state) <= quotas.MAX_STATE_BYTES
        if isinstance(attack, list):  # the turn's other calls ran
            assert env.state.rows == before["rows"] + ["a", "b"]
        else:
            assert env.state.model_dump() == before
    r = env.step(call("add", text="c"))
    assert r.messages[0]["content"] == "1003 rows" and not r.done
    snap = env.snapshot()
    assert len(snap["state"]["rows"]) == 1003
    end = env.step("done")
    assert end.done and end.info["ended_by"] == "answer"


def test_a_nest_within_the_quota_copies_in_the_time_of_its_containers() -> None:
    """A state whose lists share children (2**20 paths, 21 lists, within the quota) is copied
    memoized: a fork and the copy every writing call takes hold the shared lists once (before:
    2**20 list copies for each)."""
    from envfactory.state import copy_state

    _amplify()
    env = envfactory.make("Amplify-v0")
    env.reset("one-row")
    r = env.step(call("nest", levels=20))
    assert r.messages[0]["content"] == "nested"
    copy = copy_state(env.state)
    node, orig = copy.rows, env.state.rows
    for _ in range(20):
        assert node[0] is node[1] and node is not orig
        node, orig = node[0], orig[0]
    assert node == orig == []
    child = env.fork()
    child.step(call("add", text="x"))
    assert env.state.rows[0] is env.state.rows[1]


class _Rows:
    """A table (an imported class)."""

    def __init__(self, n: int = 0) -> None:
        self.rows = [f"{i:08d}".ljust(100, "r") for i in range(n)]

    def add(self, text: str) -> int:
        """Add a row.

        Args:
            text: The row.
        """
        self.rows.append(text)
        return len(self.rows)

    def multiply(self, times: int) -> int:
        """Repeat the rows.

        Args:
            times: How many times.
        """
        self.rows = self.rows * times
        return len(self.rows)

    def nest(self, levels: int) -> str:
        """Nest the rows in pairs of themselves.

        Args:
            levels: How many times.
        """
        for _ in range(levels):
            self.rows = [self.rows, self.rows]
        return "nested"


import pytest  # noqa: E402


@pytest.mark.parametrize("copy_on_write", ["state", "containers"])
def test_an_imported_class_s_amplifying_call_is_undone_by_replay(copy_on_write) -> None:
    """A copy-on-write state (from_class) is not copied before each call (a copy would cost a whole
    copy at the call's first write, or make every call a fork boundary); an amplifying call is
    undone by replaying the episode's calls from its origin, in the episode, its fork and a
    restored snapshot alike. The nest (2**30 paths) in both modes: before, the per-container
    measure of ``"containers"`` ignored its limit and walked every path (issue 63)."""
    from envfactory.factory.from_class import ClassTask, from_class

    spec = from_class(_Rows, name=f"QuotaRows{copy_on_write}-v0", domain="t", copy_on_write=copy_on_write,
                      tasks=[ClassTask("t", "Add x.", {"n": 1000}, [call("add", text="x")])])
    ep = envfactory.Episode(spec)
    ep.reset("t")
    assert ep.step(call("add", text="a").to_hermes()).messages[0]["content"] == "1001"
    attacks = [call("multiply", times=1000), call("nest", levels=30)]
    for episode in (ep, ep.fork()):
        before = episode.state.model_dump(mode="json")
        for attack in attacks:
            said = episode.step(attack.to_hermes()).messages[0]["content"]
            assert quotas.STATE_QUOTA_PREFIX in said and "it was not applied" in said, said
            assert episode.state.model_dump(mode="json") == before
            assert quotas.state_size(episode.state) <= quotas.MAX_STATE_BYTES
        assert episode.step(call("add", text="b").to_hermes()).messages[0]["content"] == "1002"
    again = envfactory.Episode(spec)
    again.restore(ep.snapshot())
    said = again.step(call("multiply", times=1000).to_hermes()).messages[0]["content"]
    assert quotas.STATE_QUOTA_PREFIX in said
    assert again.step(call("add", text="c").to_hermes()).messages[0]["content"] == "1003"
