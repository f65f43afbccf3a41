"""The verification suite for multi-agent environments.

Checks (each failure names the check and, where it applies, the task):

* ``schema``: every tool of every role has a valid name, a description and an object schema;
* ``tasks``: every joint reference solution replays without tool errors;
* ``reference``: the oracle team (each role plays its steps of the joint
  solution) succeeds, in turn order (AEC) and with simultaneous moves (Parallel);
* ``noop`` / ``random``: a team that only passes, and a seeded random team, fail;
* ``alone``: each role, playing the *whole* joint solution by itself while the
  others pass, fails: permissions and private state make every role necessary;
* ``determinism``, ``fork``, ``snapshot``: as for single-agent environments;
* ``malformed``: malformed and forbidden calls become error observations;
* ``pettingzoo``: ``api_test``, ``parallel_api_test``, ``seed_test`` and
  ``parallel_seed_test`` pass (on the runtime verified);
* ``parity`` (``runtime="docker"``): the oracle team and seeded random teams,
  in turn order and in simultaneous rounds, give identical episodes
  (:func:`episode_trace`) in the local and Docker runtimes.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import warnings
from typing import Any, Callable

from ..verify import Failure, Report
from .episode import MultiEpisode
from .definition import MultiAgentSpec
from .team import MODES, NoopPolicy, OraclePolicy, RandomPolicy, ScriptPolicy, play

__all__ = ["verify_multi_spec", "pettingzoo_checks", "episode_trace", "parity_failures"]

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def verify_multi_spec(spec: MultiAgentSpec, make_episode: Callable[[], MultiEpisode] | None = None, *,
                      runtime: str = "local", random_seeds: int = 2, pettingzoo: bool = True) -> Report:
    """Run the multi-agent verification suite on one environment (see the module docstring)."""
    from ..registry import make_multi

    start = time.perf_counter()
    make_episode = make_episode or (lambda: make_multi(spec.name, runtime=runtime))
    report = Report(spec.name, spec.domain, 0, runtime)
    fail = report.failures

    report.checks.append("schema")
    for agent in spec.agent_ids:
        for sch in spec.tool_schemas(agent):
            f = sch["function"]
            if not _TOOL_NAME.match(f["name"]) or not f["description"]:
                fail.append(Failure("schema", f"{agent}: tool {f['name']!r} needs a valid name and a description"))
            if f["parameters"].get("type") != "object":
                fail.append(Failure("schema", f"{agent}: tool {f['name']!r}: parameters must be an object schema"))

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
        fail.append(Failure("tasks", "joint reference solution has tool errors: " + "; ".join(errs), tid))

    ep = make_episode()
    agents = spec.agent_ids
    try:
        report.checks += ["reference", "noop", "random", "alone"]
        for task in tasks:
            for mode in MODES:
                out = play(ep, dict.fromkeys(agents, OraclePolicy()), task.id, mode=mode)
                if not out.success:
                    fail.append(Failure("reference", f"the oracle team failed ({mode}, ended by {out.ended_by} "
                                        f"in round {out.rounds}, errors {out.errors})", task.id))
            out = play(ep, dict.fromkeys(agents, NoopPolicy()), task.id)
            if out.success or any(out.rewards.values()):
                fail.append(Failure("noop", f"a no-op team earned {out.rewards}", task.id))
            for seed in range(random_seeds):
                out = play(ep, dict.fromkeys(agents, RandomPolicy()), task.id, seed=seed)
                if out.success:
                    fail.append(Failure("random", f"a random team (seed {seed}) succeeded", task.id))
            everything = [s.call for s in task.solution]
            for agent in agents:
                team = {a: (ScriptPolicy(everything) if a == agent else NoopPolicy()) for a in agents}
                out = play(ep, team, task.id)
                if out.success:
                    fail.append(Failure("alone", f"{agent} alone succeeded by playing the whole joint "
                                        "solution; the task does not need the other roles", task.id))

        longest = max(tasks, key=lambda t: len(t.solution))
        report.checks.append("determinism")
        traces = []
        for _ in range(2):
            play(ep, dict.fromkeys(agents, OraclePolicy()), longest.id)
            traces.append((json.dumps(ep.log, sort_keys=True), ep.state.hash(), ep.rewards))
        if traces[0] != traces[1]:
            fail.append(Failure("determinism", "the same team gave different episodes", longest.id))
        report.checks += ["fork", "snapshot"]
        _check_fork_snapshot(ep, make_episode, longest.id, fail)

        report.checks.append("malformed")
        foreign = next((n for a in agents[1:] for n in spec.tools_of(a) if n not in spec.tools_of(agents[0])), None)
        bad_actions = ["<tool_call>{not json</tool_call>", '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
                       "<tool_call>unterminated"]
        if foreign:
            bad_actions.append(f'<tool_call>{{"name": "{foreign}", "arguments": {{}}}}</tool_call>')
        for bad in bad_actions:
            ep.reset(longest.id)
            try:
                r = ep.act(agents[0], bad)
            except Exception as exc:
                fail.append(Failure("malformed", f"act raised {type(exc).__name__} on {bad!r}: {exc}"))
                continue
            if r.done or not r.messages or not r.messages[0]["content"].startswith("Error"):
                fail.append(Failure("malformed", f"no error observation for {bad!r}"))
    finally:
        ep.close()

    if pettingzoo:
        report.checks.append("pettingzoo")
        for problem in pettingzoo_checks(spec.name, runtime=runtime):
            fail.append(Failure("pettingzoo", problem))
    if runtime == "docker" and spec.module:
        report.checks.append("parity")
        for task_id, detail in parity_failures(spec, random_seeds=random_seeds):
            fail.append(Failure("parity", detail, task_id))
    report.seconds = time.perf_counter() - start
    return report


def _check_fork_snapshot(ep: MultiEpisode, make_episode: Callable[[], MultiEpisode], task_id: str,
                         fail: list[Failure]) -> None:
    """Fork and snapshot halfway through the oracle's episode; both copies must behave as one."""
    oracle = OraclePolicy()
    ep.reset(task_id)
    half = max(1, len(ep.task.solution) // 2)
    while len([e for e in ep.log if e["ok"]]) < half and not ep.done:
        a = ep.next_agent
        ep.act(a, oracle.act(ep, a, 0))
    before = ep.state.hash()
    child = ep.fork()
    snap = json.loads(json.dumps(ep.snapshot()))

    def finish(e: MultiEpisode) -> tuple[Any, ...]:
        while not e.done:
            a = e.next_agent
            e.act(a, oracle.act(e, a, 0))
        return e.state.hash(), json.dumps(e.log, sort_keys=True), e.rewards, e.success

    child_end = finish(child)
    child.close()  # a docker fork holds a session of its own
    if ep.state.hash() != before:
        fail.append(Failure("fork", "acting in a fork changed its parent", task_id))
    if child_end[0] == before:
        fail.append(Failure("fork", "the fork did not change while acting", task_id))
    other = make_episode()
    try:
        other.restore(snap)
        if other.state.hash() != before or other.messages(other.agents[0]) != ep.messages(ep.agents[0]):
            fail.append(Failure("snapshot", "restore did not reproduce the episode", task_id))
        restored_end = finish(other)
    finally:
        other.close()
    parent_end = finish(ep)
    if parent_end != child_end:
        fail.append(Failure("fork", "parent and fork diverged on the same actions", task_id))
    if restored_end != parent_end:
        fail.append(Failure("snapshot", "the restored episode diverged from the original", task_id))


def episode_trace(ep: Any, team: dict[str, Any], task: Any, mode: str = "aec", seed: int = 0) -> list[Any]:
    """Everything observable of one episode of ``team`` (``aec`` turns or ``parallel``
    rounds), turn by turn: results, whose turn, round, every agent's observation,
    conversation and turn count; at the end rewards, success, answer, how it
    ended, the call log and the final state. Equal traces mean equal episodes."""
    agents = ep.agents
    out: list[Any] = [ep.reset(task), {a: ep.messages(a) for a in agents}]
    while not ep.done:
        if mode == "aec":
            a = ep.next_agent
            results = {a: ep.act(a, team[a].act(ep, a, seed))}
        else:
            results = ep.step({a: team[a].act(ep, a, seed) for a in agents})
        out.append(({a: r.to_json() for a, r in results.items()}, ep.next_agent, ep.round,
                    {a: ep.observation(a) for a in agents}, {a: ep.messages(a) for a in agents},
                    {a: ep.turns_taken(a) for a in agents}))
    out.append((ep.rewards, ep.success, ep.answer, ep.ended_by, ep.terminated, ep.truncated,
                json.dumps(ep.log, sort_keys=True), ep.state.model_dump(mode="json"), ep.state.hash()))
    return out


def parity_failures(spec: MultiAgentSpec, random_seeds: int = 2) -> list[tuple[str, str]]:
    """``[(task id, what differed)]`` between the local and Docker runtimes of ``spec``:
    every task, the oracle team and ``random_seeds`` seeded random teams, in both modes."""
    from ..registry import make_multi

    local, docker = make_multi(spec.name), make_multi(spec.name, runtime="docker")
    out = []
    try:
        for task in spec.get_tasks():
            for mode in MODES:
                for policy, seed in [(OraclePolicy, 0)] + [(RandomPolicy, s) for s in range(random_seeds)]:
                    team = {a: policy() for a in spec.agent_ids}
                    a = episode_trace(local, team, task.id, mode, seed)
                    b = episode_trace(docker, team, task.id, mode, seed)
                    if a != b:
                        where = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), "length")
                        out.append((task.id, f"{policy.name} team (seed {seed}, {mode}) differs between "
                                    f"local and docker at step {where}"))
    finally:
        docker.close()
    return out


def pettingzoo_checks(name: str, *, runtime: str = "local", num_cycles: int = 200) -> list[str]:
    """Run PettingZoo's API and seed tests on both views of ``name``; return the problems found."""
    from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

    from .pettingzoo_env import env, parallel_env

    problems = []

    def closing(make: Callable[[], Any], test: Callable[..., Any]) -> Callable[[], None]:
        def run() -> None:
            e = make()
            try:
                test(e, num_cycles=num_cycles)
            finally:
                e.close()  # a docker episode holds a container session

        return run

    checks = [("api_test", closing(lambda: env(name, runtime=runtime), api_test)),
              ("parallel_api_test", closing(lambda: parallel_env(name, runtime=runtime), parallel_api_test)),
              ("seed_test", lambda: seed_test(lambda: env(name, runtime=runtime), num_cycles=num_cycles)),
              ("parallel_seed_test", lambda: parallel_seed_test(lambda: parallel_env(name, runtime=runtime),
                                                                num_cycles=num_cycles))]
    for label, check in checks:
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check()
        except Exception as exc:
            problems.append(f"{label} failed: {type(exc).__name__}: {exc}")
    return problems
