"""The episode's async twins (``areset``, ``astep``, ...) and the rollout without a barrier
(issue 27, "Async rollouts"). Overlap is shown by events (a barrier every in-flight tool must
reach, a tool that waits for another episode's progress), never by wall-clock thresholds: a
loop that serialized the steps would break the barrier or time the wait out, and fail."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

import envfactory
from envfactory import Episode, EpisodeError, State, Task, ToolEnvSpec, ToolError, call, tool
from envfactory.checks.scripted import OraclePolicy, RandomPolicy
from envfactory.world import LocalWorld, WorldLost, WorldTimeout

from conftest import require_docker

INC = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
WAIT_S = 10.0  # how long a gated tool waits before it gives up (only reached when the test fails)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


# -- astep is step ----------------------------------------------------------------------
def test_async_twins_give_what_the_blocking_calls_give() -> None:
    task = next(t for t in envfactory.spec("Bank-v0").get_tasks() if len(OraclePolicy.actions(t)) >= 4)
    actions = OraclePolicy.actions(task)
    sync, awaited = envfactory.make("Bank-v0"), envfactory.make("Bank-v0")

    async def play() -> list[Any]:
        out: list[Any] = [await awaited.aio.reset(task.id)]
        for a in actions[:2]:
            out.append((await awaited.aio.step(a)).to_json())
        child = await awaited.aio.fork()
        for a in actions[2:]:
            r = await child.aio.step(a)
            out.append(r.to_json())
            if r.done:
                break
        out.append((child.transcript(), child.state.hash(), child.status.ended_by))
        await child.aio.close()
        return out

    expected: list[Any] = [sync.reset(task.id)]
    for a in actions[:2]:
        expected.append(sync.step(a).to_json())
    child = sync.fork()
    for a in actions[2:]:
        r = child.step(a)
        expected.append(r.to_json())
        if r.done:
            break
    expected.append((child.transcript(), child.state.hash(), child.status.ended_by))
    got = _run(play())
    assert _same(got, expected)
    assert got[-2]["reward"] == 1.0  # the reference solution was played through to its reward
    assert awaited.transcript() == sync.transcript()  # the parent episode was left as fork found it


def test_team_twins_give_what_the_blocking_calls_give() -> None:
    name = "MultiDeal-v0"
    task = envfactory.spec(name).get_tasks()[0]
    sync, awaited = envfactory.make(name), envfactory.make(name)
    sync.reset(task.id)

    async def play() -> list[Any]:
        await awaited.aio.reset(task.id)
        out = []
        for _ in range(6):
            if awaited.done:
                break
            agent = awaited.status.next_agent
            out.append((await awaited.aio.act(agent, OraclePolicy().act(awaited, agent, 0))).to_json())
        return out

    expected = []
    for _ in range(6):
        if sync.done:
            break
        agent = sync.status.next_agent
        expected.append(sync.act(agent, OraclePolicy().act(sync, agent, 0)).to_json())
    assert _same(_run(play()), expected) and expected
    a, b = envfactory.make(name), envfactory.make(name)
    a.reset(task.id)
    b.reset(task.id)
    moves = {x: "I pass." for x in a.agents}
    want = {k: v.to_json() for k, v in a.step_round(moves).items()}
    assert _same({k: v.to_json() for k, v in _run(b.aio.step_round(moves)).items()}, want)


def test_protocol_errors_are_raised_as_by_the_blocking_calls() -> None:
    env = envfactory.make("Counter-v0")
    with pytest.raises(EpisodeError, match="reset"):
        _run(env.aio.step(INC))
    _run(env.aio.reset("counter-0-2"))
    _run(env.aio.step("I am done."))
    with pytest.raises(EpisodeError, match="ended"):
        _run(env.aio.step(INC))


def test_one_episode_takes_one_async_call_at_a_time() -> None:
    gate = threading.Event()
    env = _gated_episode("gated", lambda: gate.wait(WAIT_S))

    async def two_at_once() -> str:
        first = asyncio.create_task(env.aio.step(_call("gated")))
        await asyncio.sleep(0)  # the first call is running
        try:
            with pytest.raises(EpisodeError, match="still running"):
                await env.aio.step(_call("gated"))
        finally:
            gate.set()
        return (await first).messages[0]["content"]

    assert _run(two_at_once()) == "gated: ok"
    assert env.status.turns_taken() == 1  # the refused call did not play


# -- many episodes in flight ----------------------------------------------------------------
class Log(State):
    calls: int = 0


_HOOKS: dict[str, Any] = {}  # the call's name -> what the gated tool does (set per test)


@tool
def gated(state: Log, name: str = "gated") -> str:
    """Run the episode's hook.

    Args:
        name: A label.
    """
    state.calls += 1
    hook = _HOOKS.get(name)
    if hook is not None and hook() is False:
        raise ToolError(f"{name}: the hook failed")
    return f"{name}: ok"


SPEC = ToolEnvSpec(name="Gated-v0", domain="test", state_type=Log, tools=[gated], max_turns=10,
                   tasks=lambda: [Task(id=f"gate-{who}", instruction=f"Call gated as {who}.", initial_state=Log(),
                                       solution=[call("gated", name=who)], check=lambda s: s.calls > 0)
                                  for who in ("slow", "fast")])


@pytest.fixture(autouse=True)
def _no_hooks() -> Any:
    yield
    _HOOKS.clear()


def _call(name: str) -> str:
    return '<tool_call>{"name": "gated", "arguments": {"name": "%s"}}</tool_call>' % name


def _gated_episode(name: str, hook: Any, world: Any = None) -> Episode:
    env = Episode(SPEC, world)
    env.reset("gate-slow")
    _HOOKS[name] = hook
    return env


def test_steps_in_flight_overlap_on_one_event_loop() -> None:
    """Eight episodes whose tools each wait at one barrier of eight: it opens only if all eight
    tools are running at the same time (serialized steps break it: a tool error)."""
    n = 8
    barrier = threading.Barrier(n, timeout=WAIT_S)

    def meet() -> bool:
        try:
            barrier.wait()
            return True
        except threading.BrokenBarrierError:
            return False

    envs = [_gated_episode(f"e{i}", meet) for i in range(n)]

    async def all_at_once() -> list[str]:
        results = await asyncio.gather(*(e.aio.step(_call(f"e{i}")) for i, e in enumerate(envs)))
        return [r.messages[0]["content"] for r in results]

    assert _run(all_at_once()) == [f"e{i}: ok" for i in range(n)]


def test_a_slow_tool_holds_only_its_own_episode() -> None:
    """The slow episode's tool waits until the fast episode has played three turns: the fast one
    must go on stepping while the slow tool runs."""
    events: list[str] = []
    fast_turns = threading.Semaphore(0)

    def slow() -> bool:
        ok = all(fast_turns.acquire(timeout=WAIT_S) for _ in range(3))
        events.append("slow ended")
        return ok

    def fast() -> None:
        events.append("fast turn")
        fast_turns.release()

    slow_env, fast_env = _gated_episode("slow", slow), _gated_episode("fast", fast)

    async def play() -> str:
        pending = asyncio.create_task(slow_env.aio.step(_call("slow")))
        await asyncio.sleep(0)  # the slow step is under way before the fast one starts
        for _ in range(3):
            await fast_env.aio.step(_call("fast"))
        return (await pending).messages[0]["content"]

    assert _run(play()) == "slow: ok"
    assert events == ["fast turn", "fast turn", "fast turn", "slow ended"]


class _FailingWorld(LocalWorld):
    def __init__(self, spec: ToolEnvSpec, exc: Exception) -> None:
        super().__init__(spec)
        self.exc = exc

    def run(self, agent: str, round: int, calls: Any) -> Any:
        raise self.exc


def test_failures_stay_in_their_episode() -> None:
    """A world that overran, one that was lost and a failing tool, in flight beside a healthy
    episode: each failure is its own episode's observation, exactly as the blocking step gives it."""
    def make(kind: str) -> Episode:
        if kind == "timeout":
            return _gated_episode(kind, None, _FailingWorld(SPEC, WorldTimeout("the step did not finish within 1s")))
        if kind == "lost":
            return _gated_episode(kind, None, _FailingWorld(SPEC, WorldLost("its container died")))
        return _gated_episode(kind, (lambda: False) if kind == "tool" else None)

    kinds = ["timeout", "lost", "tool", "ok"]

    async def play() -> list[Any]:
        envs = [make(k) for k in kinds]
        return [r.to_json() for r in await asyncio.gather(*(e.aio.step(_call(k)) for e, k in zip(envs, kinds)))]

    got = _run(play())
    assert _same(got, [make(k).step(_call(k)).to_json() for k in kinds])
    timeout, lost, tool_error, ok = got
    assert timeout["truncated"] and timeout["info"]["timeout"] and timeout["info"]["ended_by"] == "timeout"
    assert lost["truncated"] and lost["info"]["world_lost"] and lost["info"]["ended_by"] == "world_lost"
    assert tool_error["messages"][0]["content"].startswith("Error") and not tool_error["truncated"]
    assert ok["messages"][0]["content"] == "ok: ok" and not (ok["terminated"] or ok["truncated"])


# -- the rollout without a barrier -------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer() -> Any:
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from agents.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model())


def _trajectories(rollouts: list[Any]) -> list[Any]:
    return [{a: t.to_json() for a, t in r.trajectories.items()} | {"_": (r.success, r.ended_by, r.error)}
            for r in rollouts]


def _scripted(tokenizer: Any) -> Any:
    from agents.policies.scripted_model import ScriptedModel

    # a different number of turns per task (counter-0-N: N increments of 1, then an answer)
    def script(prompt: list[int], turn: int) -> str:
        target = int(tokenizer.decode(prompt).split("exactly ")[1].split(" ")[0])
        return INC if turn < target else "The counter shows the target."

    return ScriptedModel(tokenizer, script)


def test_async_rollout_gives_the_sync_rollout_trajectories(tokenizer: Any) -> None:
    from agents.async_rollout import rollout_async
    from agents.rollout import rollout

    counter = [t.id for t in envfactory.spec("Counter-v0").get_tasks()[:6]]
    bank = [t.id for t in envfactory.spec("Bank-v0").get_tasks()[:4]]

    def pairs() -> list[Any]:
        return ([(envfactory.make("Counter-v0", max_turns=6), t) for t in counter]
                + [(envfactory.make("Bank-v0", max_turns=5), t) for t in bank])

    kw = dict(max_new_tokens=64, seed=3, tokenizer=tokenizer)
    # a model policy (batched generate) and a seeded role policy (its seed is the tick's)
    for team in (_scripted(tokenizer), RandomPolicy(turns=4)):
        want = _trajectories(rollout(team, pairs(), **kw))
        got = _trajectories(rollout_async(team, pairs(), **kw))
        assert got == want
        assert len({len(t["agent_0"]["turn_spans"]) for t in want}) > 1  # episodes of different lengths
    team_pairs = [(envfactory.make("MultiDeal-v0"), t.id) for t in envfactory.spec("MultiDeal-v0").get_tasks()[:3]]
    want = _trajectories(rollout(OraclePolicy(), team_pairs, tokenizer=tokenizer, mode="parallel"))
    team_pairs = [(envfactory.make("MultiDeal-v0"), t.id) for t in envfactory.spec("MultiDeal-v0").get_tasks()[:3]]
    assert _trajectories(rollout_async(OraclePolicy(), team_pairs, tokenizer=tokenizer, mode="parallel")) == want


def test_async_rollout_generates_for_the_ready_episodes(tokenizer: Any) -> None:
    """The slow episode's first tool waits until the fast episode has played three turns: the
    policy must be called with the fast episode alone meanwhile (a lock-step loop would wait for
    the slow tool and time it out). Its trajectories still equal a sync rollout's without the wait."""
    from agents.async_rollout import arollout
    from agents.rollout import rollout
    from agents.policies.scripted_model import ScriptedModel

    fast_turns = threading.Semaphore(0)
    batches: list[int] = []

    def script(prompt: list[int], turn: int) -> str:
        who = "slow" if "as slow" in tokenizer.decode(prompt) else "fast"
        return _call(who) if turn < 4 else "Done."

    class Counting(ScriptedModel):
        def generate(self, prompts: list[list[int]], **kw: Any) -> Any:
            batches.append(len(prompts))
            return super().generate(prompts, **kw)

    policy = Counting(tokenizer, script)

    def pairs() -> list[Any]:
        return [(Episode(SPEC), "gate-slow"), (Episode(SPEC), "gate-fast")]

    slow_calls = iter(range(10**6))
    # the slow episode's first call waits for three turns of the fast one
    _HOOKS["slow"] = lambda: next(slow_calls) > 0 or all(fast_turns.acquire(timeout=WAIT_S) for _ in range(3))
    _HOOKS["fast"] = fast_turns.release
    got = asyncio.run(arollout(policy, pairs(), max_new_tokens=64, tokenizer=tokenizer))
    assert [r.error for r in got] == [None, None]
    slow = got[0].trajectory
    assert slow.tool_errors == 0 and slow.tool_calls == 4  # the slow tool was released, not timed out
    # both first turns, then the fast episode's turns 2 and 3 alone (its third call releases the slow tool)
    assert batches[:3] == [2, 1, 1]
    _HOOKS.clear()
    assert _trajectories(got) == _trajectories(rollout(policy, pairs(), max_new_tokens=64, tokenizer=tokenizer))


# -- the Docker runtime ------------------------------------------------------------------------
@pytest.mark.docker
def test_astep_on_the_docker_runtime_is_step() -> None:
    require_docker()
    local, docker = envfactory.make("Counter-v0"), envfactory.make("Counter-v0", runtime="docker")

    async def play() -> list[Any]:
        await docker.aio.reset("counter-0-2")
        out = [(await docker.aio.step(a)).to_json() for a in (INC, INC, "It shows 2.")]
        await docker.aio.close()
        return out

    local.reset("counter-0-2")
    want = [local.step(a).to_json() for a in (INC, INC, "It shows 2.")]
    assert _same(_run(play()), want) and want[-1]["reward"] == 1.0


def test_the_benchmark_is_an_envfactory_bench_section() -> None:
    """Declared in pyproject's ``envfactory.bench`` group (what ``bench --only async_rollout`` lists once
    the package is installed), pointing at the function that runs it."""
    import importlib
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["envfactory.bench"]["async_rollout"]
    module, _, name = target.partition(":")
    assert callable(getattr(importlib.import_module(module), name))
