"""``envfactory bench``: measurements with same-run baselines.

Every timing key carries its unit (``_us``, ``_ms``, ``_s``) and every
comparison is a ``_ratio`` against a baseline measured in the same run, because
machines here are noisy. Sections are independent functions returning flat
dicts; other subsystems add theirs to :data:`SECTIONS`.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from typing import Any, Callable

import gymnasium
from gymnasium import spaces

__all__ = ["run_bench", "SECTIONS", "PlainCounterEnv", "PlainToolEnv"]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class PlainCounterEnv(gymnasium.Env):
    """The baseline: a hand-written Gymnasium env doing the same work as Counter-v0.

    It parses the same Hermes tool-call text, applies ``increment`` and returns
    the same observation text, with no framework at all.
    """

    def __init__(self) -> None:
        self.observation_space = spaces.Text(4096, min_length=0)
        self.action_space = spaces.Text(4096, min_length=0)
        self.value = 0
        self.turn = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.value = 0
        self.turn = 0
        return "Make the counter show 10.", {}

    def step(self, action: str):
        self.turn += 1
        outs = []
        for body in _CALL.findall(action):
            try:
                call = json.loads(body)
                by = call["arguments"].get("by", 1)
                if call["name"] != "increment" or not isinstance(by, int):
                    raise ValueError("bad call")
                self.value += by
                outs.append(f"<tool_response>\n{self.value}\n</tool_response>")
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                outs.append(f"<tool_response>\nError: {exc}\n</tool_response>")
        terminated = not outs
        return "\n".join(outs), 0.0, terminated, False, {"turn": self.turn}


class PlainToolEnv(PlainCounterEnv):
    """The second baseline: the same hand-written env, calling Counter-v0's own ``increment``
    tool function on Counter-v0's own (pydantic) state, as a hand-written env over the
    same tools would. Against it the ratio is the framework's cost alone, without the
    difference between the tool's body and ``PlainCounterEnv``'s one-line increment."""

    def __init__(self) -> None:
        super().__init__()
        from .registry import spec

        counter = spec("Counter-v0")
        self._fn = counter.all_tools["increment"].fn
        self._state_type = counter.state_type
        self.state = self._state_type()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.state = self._state_type()
        return super().reset(seed=seed, options=options)

    def step(self, action: str):
        self.turn += 1
        outs = []
        for body in _CALL.findall(action):
            try:
                call = json.loads(body)
                if call["name"] != "increment":
                    raise ValueError("unknown tool")
                outs.append(f"<tool_response>\n{self._fn(self.state, **call['arguments'])}\n</tool_response>")
            except Exception as exc:  # noqa: BLE001 - a tool error is an observation
                outs.append(f"<tool_response>\nError: {exc}\n</tool_response>")
        terminated = not outs
        return "\n".join(outs), 0.0, terminated, False, {"turn": self.turn}


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) / 1000.0


def _time_episodes(env: gymnasium.Env, action: str, episodes: int, episode_len: int,
                   reset: Callable[[], Any]) -> list[float]:
    """Per-step time (ns) of each episode of ``episode_len`` identical steps;
    resets stay outside the timed region, and timing whole episodes keeps the
    clock's own overhead out of the per-step figure."""
    samples = []
    clock = time.perf_counter_ns
    step = env.step
    for _ in range(episodes):
        reset()
        t0 = clock()
        for _ in range(episode_len):
            step(action)
        samples.append((clock() - t0) / episode_len)
    return samples


def bench_step(n: int = 20000) -> dict[str, Any]:
    """Median time of one trivial tool-call step: envfactory (Gymnasium adapter over
    the local runtime, and the engine's own ``Episode.step``) against
    :class:`PlainCounterEnv`, interleaved in rounds."""
    from .gym_env import ToolGymEnv

    action = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    ours = ToolGymEnv("Counter-v0", max_turns=10**9)
    episode = ours.env  # the engine alone, without the Gymnasium face
    plain = PlainCounterEnv()
    same_tool = PlainToolEnv()
    ours_s: list[float] = []
    plain_s: list[float] = []
    tool_s: list[float] = []
    episode_s: list[float] = []
    episode_len = 50
    for _ in range(n // episode_len):  # interleave so drift hits all equally
        plain_s += _time_episodes(plain, action, 1, episode_len, lambda: plain.reset(seed=0))
        tool_s += _time_episodes(same_tool, action, 1, episode_len, lambda: same_tool.reset(seed=0))
        ours_s += _time_episodes(
            ours, action, 1, episode_len, lambda: ours.reset(seed=0, options={"task": 0})
        )
        episode_s += _time_episodes(episode, action, 1, episode_len, lambda: episode.reset(0))
    o, p, e = _median_us(ours_s), _median_us(plain_s), _median_us(episode_s)
    t = _median_us(tool_s)
    return {
        "step_envfactory_us": round(o, 2),
        "step_episode_us": round(e, 2),
        "step_plain_gymnasium_us": round(p, 2),
        "step_plain_same_tool_us": round(t, 2),
        "step_envfactory_vs_plain_ratio": round(o / p, 2),
        "step_episode_vs_plain_ratio": round(e / p, 2),
        "step_envfactory_vs_same_tool_ratio": round(o / t, 2),
        "step_episode_vs_same_tool_ratio": round(e / t, 2),
        "step_samples": len(ours_s) * episode_len,
    }


def bench_fork(n: int = 2000) -> dict[str, Any]:
    """Median ``fork()`` time on each built-in environment, mid-way through its
    longest reference solution (so the state carries the episode's changes)."""
    from .registry import make, specs

    out: dict[str, Any] = {}
    worst = 0.0
    for s in specs():
        env = make(s.name)
        task = max(s.get_tasks(), key=lambda t: len(t.solution))
        env.reset(task.id)
        for c in task.solution[: max(1, len(task.solution) // 2)]:
            while env.next_agent not in (c.agent, None) and c.agent is not None:
                env.act(env.next_agent, "")  # the others pass until it is this call's agent's turn
            env.act(env.next_agent, c.to_hermes())
        clock = time.perf_counter_ns
        samples = []
        for _ in range(n):
            t0 = clock()
            env.fork()
            samples.append(clock() - t0)
        us = _median_us(samples)
        worst = max(worst, us)
        out[f"fork_{s.name}_us"] = round(us, 2)
        t0 = clock()
        for _ in range(200):
            s.state_type.model_validate(env.state.model_dump())
        baseline = (clock() - t0) / 200 / 1000
        out[f"fork_{s.name}_vs_pydantic_roundtrip_ratio"] = round(us / baseline, 3)
    out["fork_max_us"] = round(worst, 2)
    return out


def bench_docker() -> dict[str, Any]:
    """The Docker runtime against local and OpenEnv (see :mod:`envfactory.runtime.bench_docker`);
    a ``docker_error`` note instead when no Docker engine answers."""
    try:
        from .runtime.pool import docker_client

        docker_client()
    except RuntimeError as exc:
        return {"docker_error": str(exc)}
    from .runtime.bench_docker import bench_docker as run

    return run()


def bench_scale() -> dict[str, Any]:
    """Ray worlds with 1, 2 and 4 actors against in-process (see
    :func:`envfactory.runtime.ray_world.bench_scale`); a ``scale_error`` note without Ray."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return {"scale_error": "ray is not installed (pip install 'envfactory[ray]')"}
    from .runtime.ray_world import bench_scale as run

    return run()


# -- bigstate: copy-on-write forks of large third-party states (from_class) ----------------------
class BenchNode:
    def __init__(self, name: str, parent: "BenchNode | None", size: int) -> None:
        self.name = name
        self.parent = parent
        self.size = size
        self.children: list[BenchNode] = []


class BenchTree:
    """A third-party-style object tree (parent pointers, a cursor, an RNG): ~``nodes`` objects."""

    def __init__(self) -> None:
        self.root: BenchNode
        self._cursor: BenchNode

    def _load_scenario(self, config: dict) -> None:
        import random

        self._rng = random.Random(config.get("seed", 0))
        self.root = BenchNode("root", None, 0)
        frontier, made = [self.root], 1
        while made < config["nodes"]:
            nxt = []
            for parent in frontier:
                for k in range(10):
                    if made >= config["nodes"]:
                        break
                    child = BenchNode(f"{parent.name}.{k}", parent, self._rng.randint(1, 999))
                    parent.children.append(child)
                    nxt.append(child)
                    made += 1
            frontier = nxt
        self._cursor = self.root

    def enter(self, index: int) -> str:
        """Move the cursor to a child.

        Args:
            index: The child's position.
        """
        self._cursor = self._cursor.children[index]
        return self._cursor.name

    def grow(self, name: str) -> str:
        """Add a child under the cursor.

        Args:
            name: Its name.
        """
        self._cursor.children.append(BenchNode(name, self._cursor, self._rng.randint(1, 999)))
        return f"{len(self._cursor.children)} children"


def _record_model() -> type:
    from pydantic import BaseModel

    class Customer(BaseModel):
        id: int
        name: str
        email: str
        balance: float
        tags: list[str] = []

    return Customer


BenchCustomer = _record_model()
BenchCustomer.__qualname__ = BenchCustomer.__name__ = "BenchCustomer"


class BenchCustomerDB:
    """A third-party-style database of pydantic records."""

    def __init__(self, records: int = 0) -> None:
        self.records = {i: BenchCustomer(id=i, name=f"c{i}", email=f"c{i}@example.com", balance=float(i % 97),
                                     tags=["vip"] if i % 13 == 0 else []) for i in range(records)}

    def credit(self, customer_id: int, amount: float) -> float:
        """Add to a balance.

        Args:
            customer_id: The customer.
            amount: How much.
        """
        rec = self.records[customer_id]
        rec.balance += amount
        return rec.balance


def bench_bigstate(nodes: int = 10_000, records: int = 5_000, n: int = 200) -> dict[str, Any]:
    """Forks and snapshots of large states held through ``from_class``: a ``nodes``-node object
    tree (one graph: parent pointers, a cursor, an RNG) and ``records`` pydantic records.
    A fork is copy-on-write (:func:`envfactory.factory.pystate.lazy_state_copy`): it shares
    the values, and the first tool call on a side copies that side's values, so the copy is
    reported too (``first_call_after_fork``), each against ``copy.deepcopy`` of the same state."""
    import copy

    from .episode import Episode
    from .factory.from_class import ClassTask, from_class
    from .task import call

    clock = time.perf_counter_ns
    out: dict[str, Any] = {}
    cases = {
        "tree": from_class(BenchTree, name="BigTree-v0", domain="bench", loader="_load_scenario",
                           tasks=[ClassTask("t", "Enter child 0.", {"nodes": nodes, "seed": 1},
                                            [call("enter", index=0)])]),
        "records": from_class(BenchCustomerDB, name="BigRecords-v0", domain="bench",
                              tasks=[ClassTask("t", "Credit customer 1 with 5.", {"records": records},
                                               [call("credit", customer_id=1, amount=5.0)])]),
    }
    act = {"tree": call("grow", name="x").to_hermes(), "records": call("credit", customer_id=2, amount=1.0).to_hermes()}
    for name, spec in cases.items():
        ep = Episode(spec)
        ep.reset("t")
        ep.step(spec.task("t").solution[0].to_hermes())
        state = ep.state
        forks, samples = [], []
        for _ in range(n):
            t0 = clock()
            forks.append(ep.fork())
            samples.append(clock() - t0)
        fork_us = _median_us(samples)
        first = []
        for child in forks[:10]:
            t0 = clock()
            child.step(act[name])
            first.append(clock() - t0)
        del forks
        deep = []
        for _ in range(5):
            t0 = clock()
            copy.deepcopy(state)
            deep.append(clock() - t0)
        deep_us = _median_us(deep)
        snaps, restores = [], []
        for _ in range(3):
            t0 = clock()
            snap = json.dumps(ep.snapshot())
            snaps.append(clock() - t0)
            t0 = clock()
            Episode(spec).restore(json.loads(snap))
            restores.append(clock() - t0)
        snap_us, restore_us = _median_us(snaps), _median_us(restores)
        out[f"bigstate_{name}_fork_us"] = round(fork_us, 2)
        out[f"bigstate_{name}_fork_vs_deepcopy_ratio"] = round(fork_us / deep_us, 5)
        out[f"bigstate_{name}_first_call_after_fork_ms"] = round(_median_us(first) / 1000, 3)
        out[f"bigstate_{name}_first_call_vs_deepcopy_ratio"] = round(_median_us(first) / deep_us, 3)
        out[f"bigstate_{name}_deepcopy_ms"] = round(deep_us / 1000, 3)
        out[f"bigstate_{name}_snapshot_ms"] = round(snap_us / 1000, 3)
        out[f"bigstate_{name}_snapshot_vs_deepcopy_ratio"] = round(snap_us / deep_us, 3)
        out[f"bigstate_{name}_restore_ms"] = round(restore_us / 1000, 3)
        out[f"bigstate_{name}_restore_vs_deepcopy_ratio"] = round(restore_us / deep_us, 3)
        out[f"bigstate_{name}_snapshot_bytes"] = len(snap)
    return out


SECTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "step": bench_step,
    "fork": bench_fork,
    "bigstate": bench_bigstate,
    "docker": bench_docker,
    "scale": bench_scale,
}
BENCH_GROUP = "envfactory.bench"  # other packages add sections (agents: "rollout") through this group


def sections() -> dict[str, Callable[[], dict[str, Any]]]:
    """The core's sections and those installed packages announce in :data:`BENCH_GROUP`."""
    from importlib import metadata

    out = dict(SECTIONS)
    for ep in metadata.entry_points(group=BENCH_GROUP):
        out.setdefault(ep.name, lambda ep=ep: ep.load()())
    return out


def run_bench(only: list[str] | None = None) -> dict[str, Any]:
    """Run the named sections (all by default) and merge their results."""
    results: dict[str, Any] = {}
    for name, fn in sections().items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        results.update(fn())
        results[f"section_{name}_s"] = round(time.perf_counter() - t0, 3)
    return results
