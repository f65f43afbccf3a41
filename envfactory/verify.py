"""The verification suite: an environment is registered as verified only if it passes.

Checks (each failure names the check and, where it applies, the task):

* ``schema``: every tool has an OpenAI-valid name, a description and an object schema;
* ``tasks``: at least one task, every reference solution replays without tool errors;
* ``reference``: every task's reference solution earns reward 1;
* ``noop`` / ``claim`` / ``random``: an agent that does nothing, one that only
  claims success, and a seeded random agent earn 0 on every task;
* ``determinism``: the same actions give the same messages and final state;
* ``tool_determinism``: each reference call, run twice on equal states, gives
  equal observations and states;
* ``fork``: a fork taken mid-episode is independent of its parent, both ways;
* ``snapshot``: snapshot -> JSON -> restore continues exactly like the original;
* ``malformed``: malformed and unknown tool calls become error observations;
* ``gymnasium``: ``gymnasium.utils.env_checker.check_env`` passes (local runtime).

Checks run through the :class:`~envfactory.env.Environment` interface, so the
same suite verifies any runtime.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from .agents_scripted import claim_actions, noop_actions, oracle_actions, random_actions, run_episode
from .env import Environment
from .definition import ToolEnvSpec

__all__ = ["Failure", "Report", "verify_spec", "verify_many"]

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass
class Failure:
    check: str
    detail: str
    task: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = {"check": self.check, "detail": self.detail}
        if self.task is not None:
            d["task"] = self.task
        return d


@dataclass
class Report:
    name: str
    domain: str
    tasks: int
    runtime: str
    failures: list[Failure] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    mean_solution_length: float = 0.0

    @property
    def verified(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "domain": self.domain,
            "verified": self.verified,
            "tasks": self.tasks,
            "runtime": self.runtime,
            "checks": self.checks,
            "failures": [f.to_json() for f in self.failures],
            "mean_solution_length": round(self.mean_solution_length, 2),
            "seconds": round(self.seconds, 3),
        }


def verify_spec(
    spec: ToolEnvSpec,
    make_env: Callable[[], Environment] | None = None,
    *,
    runtime: str = "local",
    random_episodes: int = 2,
) -> Report:
    """Run the verification suite on one environment.

    Args:
        spec: The environment definition.
        make_env: Creates a fresh environment (defaults to the given runtime via
            :func:`envfactory.make`).
        runtime: Runtime name for the report (and for ``make_env``'s default).
        random_episodes: Seeded random-agent episodes per task.
    """
    from .registry import make

    start = time.perf_counter()
    make_env = make_env or (lambda: make(spec.name, runtime=runtime))
    report = Report(spec.name, spec.domain, 0, runtime)
    fail = report.failures

    # schema ---------------------------------------------------------------
    report.checks.append("schema")
    for t in spec.all_tools.values():
        sch = t.schema()["function"]
        if not _TOOL_NAME.match(sch["name"]):
            fail.append(Failure("schema", f"tool name {sch['name']!r} is not a valid function name"))
        if not sch["description"]:
            fail.append(Failure("schema", f"tool {sch['name']!r} has no description"))
        params = sch["parameters"]
        if params.get("type") != "object" or not isinstance(params.get("properties"), dict):
            fail.append(Failure("schema", f"tool {sch['name']!r}: parameters must be an object schema"))
        elif not set(params.get("required", [])) <= set(params["properties"]):
            fail.append(Failure("schema", f"tool {sch['name']!r}: required names unknown properties"))
        try:
            json.dumps(sch)
        except (TypeError, ValueError) as exc:
            fail.append(Failure("schema", f"tool {sch['name']!r}: schema is not JSON ({exc})"))

    # tasks ----------------------------------------------------------------
    report.checks.append("tasks")
    try:
        tasks = spec.get_tasks()
    except Exception as exc:
        fail.append(Failure("tasks", f"building the tasks failed: {type(exc).__name__}: {exc}"))
        report.seconds = time.perf_counter() - start
        return report
    report.tasks = len(tasks)
    report.mean_solution_length = sum(len(t.solution) for t in tasks) / len(tasks)
    for tid, errs in spec.replay_errors.items():
        fail.append(Failure("tasks", "reference solution has tool errors: " + "; ".join(errs), tid))
    report.checks.append("tool_determinism")
    fail.extend(_tool_determinism(spec, tasks))

    env = make_env()
    try:
        schemas = env.tool_schemas()
        # reference / noop / claim / random ------------------------------------
        report.checks += ["reference", "noop", "claim", "random"]
        for task in tasks:
            out = run_episode(env, task.id, oracle_actions(task))
            if out.reward != 1.0:
                fail.append(Failure("reference", f"reference solution earned {out.reward}", task.id))
            for check, actions in (("noop", noop_actions(task)), ("claim", claim_actions(task))):
                out = run_episode(env, task.id, actions)
                if out.reward != 0.0:
                    fail.append(Failure(check, f"a {check} agent earned {out.reward}", task.id))
            for k in range(random_episodes):
                seed = _stable_seed(task.id, k)
                out = run_episode(env, task.id, random_actions(task, schemas, seed))
                if out.reward != 0.0:
                    fail.append(Failure("random", f"a random agent (seed {seed}) earned {out.reward}", task.id))

        # determinism / fork / snapshot on the longest task ---------------------
        longest = max(tasks, key=lambda t: len(t.solution))
        actions = oracle_actions(longest)
        half = max(1, len(longest.solution) // 2)
        report.checks.append("determinism")
        traces = []
        for _ in range(2):
            run_episode(env, longest.id, actions)
            traces.append((json.dumps(env.messages, sort_keys=True), env.state.hash()))
        if traces[0] != traces[1]:
            fail.append(Failure("determinism", "the same actions gave different episodes", longest.id))

        report.checks.append("fork")
        env.reset(longest.id)
        for a in actions[:half]:
            env.step(a)
        before = env.state.hash()
        child = env.fork()
        try:
            for a in actions[half:]:
                r = child.step(a)
                if r.done:
                    break
            if env.state.hash() != before:
                fail.append(Failure("fork", "acting in a fork changed its parent", longest.id))
            if child.state.hash() == before and len(longest.solution) > half and _mutates(spec, longest, half):
                fail.append(Failure("fork", "the fork did not change while acting", longest.id))
            for a in actions[half:]:
                r = env.step(a)
                if r.done:
                    break
            if env.state.hash() != child.state.hash() or env.messages != child.messages:
                fail.append(Failure("fork", "parent and fork diverged on the same actions", longest.id))
        finally:
            child.close()

        report.checks.append("snapshot")
        env.reset(longest.id)
        for a in actions[:half]:
            env.step(a)
        snap = json.loads(json.dumps(env.snapshot()))
        other = make_env()
        try:
            other.restore(snap)
            if other.messages != env.messages or other.state.hash() != env.state.hash():
                fail.append(Failure("snapshot", "restore did not reproduce the episode", longest.id))
            for a in actions[half:]:
                r1, r2 = env.step(a), other.step(a)
                if (r1.messages, r1.reward, r1.terminated, r1.truncated) != (
                    r2.messages, r2.reward, r2.terminated, r2.truncated
                ):
                    fail.append(Failure("snapshot", "restored episode diverged", longest.id))
                    break
                if r1.done:
                    break
        finally:
            other.close()

        # malformed input -------------------------------------------------------
        report.checks.append("malformed")
        for bad in (
            "<tool_call>{not json</tool_call>",
            '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "%s", "arguments": {"__bogus__": 1}}</tool_call>'
            % schemas[0]["function"]["name"],
            "<tool_call>unterminated",
        ):
            env.reset(longest.id)
            try:
                r = env.step(bad)
            except Exception as exc:
                fail.append(Failure("malformed", f"step raised {type(exc).__name__} on {bad!r}: {exc}"))
                continue
            if r.done or not r.messages or not r.messages[0]["content"].startswith("Error"):
                fail.append(Failure("malformed", f"no error observation for {bad!r}"))
    finally:
        env.close()

    # gymnasium ------------------------------------------------------------
    if runtime == "docker" and spec.module and getattr(spec, "isolation", "session") == "session":
        # parity: identical episodes in local and docker (engine present: make() above succeeded)
        report.checks.append("parity")
        from .runtime.parity import parity_failures

        for task_id, detail in parity_failures(spec):
            fail.append(Failure("parity", detail, task_id))

    if runtime == "local":
        report.checks.append("gymnasium")
        try:
            from gymnasium.utils.env_checker import check_env

            from .gym_env import ToolGymEnv

            genv = ToolGymEnv(env=make_env())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_env(genv, skip_render_check=True)
            genv.close()
        except Exception as exc:
            fail.append(Failure("gymnasium", f"check_env failed: {type(exc).__name__}: {exc}"))

    report.seconds = time.perf_counter() - start
    return report


def _tool_determinism(spec: ToolEnvSpec, tasks: list[Any]) -> list[Failure]:
    """Replay every reference solution on two copies of its initial state in
    lockstep: each call must give the same observation and the same state on
    both. Catches tools that read clocks, randomness or hidden globals, even
    when no episode-level comparison happens to exercise them."""
    from .state import copy_state, state_hash

    tools = spec.all_tools
    bad: dict[str, Failure] = {}
    for task in tasks:
        a, b = copy_state(task.initial_state), copy_state(task.initial_state)
        for c in task.solution:
            t = tools.get(c.name)
            if t is None or c.name in bad:
                break
            out_a, out_b = t.invoke(a, c.arguments), t.invoke(b, c.arguments)
            if out_a.content != out_b.content or state_hash(a) != state_hash(b):
                what = "observation" if out_a.content != out_b.content else "resulting state"
                bad[c.name] = Failure(
                    "tool_determinism",
                    f"tool {c.name!r} is not deterministic: the same call on the same state gave a "
                    f"different {what} (make it a function of the state and its arguments only)",
                    task.id)
                break
    return list(bad.values())


def _stable_seed(task_id: str, k: int) -> int:
    import zlib

    return zlib.crc32(f"{task_id}/{k}".encode()) & 0x7FFFFFFF


def _mutates(spec: ToolEnvSpec, task: Any, half: int) -> bool:
    tools = spec.all_tools
    return any(not tools[c.name].read_only for c in task.solution[half:] if c.name in tools)


def _verify_any(spec: Any, runtime: str) -> Report:
    """Single-agent specs get :func:`verify_spec`; multi-agent ones the multi-agent suite."""
    if getattr(spec, "multi_agent", False):
        from .multi.verify import verify_multi_spec

        return verify_multi_spec(spec, runtime=runtime)
    return verify_spec(spec, runtime=runtime)


def verify_many(specs: list[Any], *, runtime: str = "local") -> dict[str, Any]:
    """Verify several environments; the ``envfactory verify --json`` document."""
    start = time.perf_counter()
    reports = [_verify_any(s, runtime).to_json() for s in specs]
    n_tasks = sum(r["tasks"] for r in reports)
    lengths = [r["mean_solution_length"] * r["tasks"] for r in reports]
    return {
        "environments": reports,
        "totals": {
            "environments": len(reports),
            "verified": sum(r["verified"] for r in reports),
            "domains": len({r["domain"] for r in reports}),
            "tasks": n_tasks,
            "mean_solution_length": round(sum(lengths) / n_tasks, 2) if n_tasks else 0.0,
            "runtime": runtime,
            "seconds": round(time.perf_counter() - start, 3),
        },
    }
