"""The verification suite: an environment is registered as verified only if it passes.

One suite for one agent and for teams (a single agent is the one-role case).
Checks (each failure names the check and, where it applies, the task):

* ``schema``: every tool of every role has an OpenAI-valid name, a description
  and an object schema, and no two roles have different tools of one name;
* ``tasks``: at least one task, every (joint) reference solution replays without tool errors;
* ``tool_determinism``: each reference call, run twice on equal states, gives
  equal observations and states (for an environment of classes, states compared as
  ``from_class(compare=...)`` says; a failure names the attributes that differ);
* ``reference``: the oracle (each role plays its steps of the reference
  solution) succeeds on every task, with reward 1 unless the environment has
  a payoff; teams in turn order (AEC) and with simultaneous moves (Parallel),
  or only in the modes a task names (``metadata["modes"]``: a schedule that
  overlaps the roles' work within a round is a turn-order one);
* ``noop`` / ``claim`` / ``random``: agents that do nothing, that only claim
  success, and seeded random agents fail and earn 0; where the environment lists
  its legal moves (``spec.legal_actions``), every move the random player draws
  from that list is accepted by the tools, and in a competitive game a random
  team, which plays the game out by its rules, may complete the match;
* ``alone`` (teams): each role, playing the *whole* joint solution by itself
  while the others pass, fails: permissions and private state make every role necessary;
* ``determinism``: the same policies give the same episode (transcripts, calls, state);
* ``fork``: a fork taken mid-episode is independent of its parent, both ways,
  and finishes like it;
* ``snapshot``: snapshot -> JSON -> restore continues exactly like the original;
* ``malformed``: malformed, unknown and (teams) another role's tool calls become
  error observations;
* ``gymnasium`` (one role, local runtime): ``gymnasium.utils.env_checker.check_env``;
  ``pettingzoo`` (teams): ``api_test``, ``parallel_api_test``, ``seed_test``,
  ``parallel_seed_test`` on the runtime verified;
* ``parity`` (``runtime="docker"``): identical episodes in the local and Docker
  runtimes (:func:`envfactory.checks.parity.parity_failures`);
* ``user`` (tasks with a simulated user): the task's twin (other user facts, the same
  instruction and tables) has a success check that contradicts the task's on some leaf, and
  each reference fails the other's check: an agent that never asks cannot solve both;
* ``audit`` (one role, when everything else passed): the reward-hacking audit and the
  transcriber baseline of :mod:`envfactory.checks.audit`, within a budget (quick by default);
  reported in ``report.audit``; hacks become failures only with ``audit_fails=True``.

Checks run through the :class:`~envfactory.episode.Episode` interface, so the
same suite verifies any runtime.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, cast

from .scripted import (MODES, ClaimPolicy, NoopPolicy, OraclePolicy, RandomPolicy, ScriptPolicy, play,
                              plan_progress)
from ..definition import ToolEnvSpec
from ..episode import Episode
from ..mail import MultiState
from ..state import copy_state

__all__ = ["Failure", "Report", "verify_spec", "verify_many", "pettingzoo_checks"]

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
    audit: dict[str, Any] | None = None
    kinds: dict[str, dict[str, Any]] = field(default_factory=dict)
    difficulty: dict[str, dict[str, Any]] = field(default_factory=dict)
    hard_stated: dict[str, int] = field(default_factory=dict)
    components: dict[str, int] = field(default_factory=dict)  # reward component -> tasks using it

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
            "kinds": self.kinds,
            "difficulty": self.difficulty,
            "hard_stated": self.hard_stated,
            "components": self.components,
            "seconds": round(self.seconds, 3),
            **({"audit": self.audit} if self.audit is not None else {}),
        }


def verify_spec(
    spec: ToolEnvSpec,
    make_env: Callable[[], Episode] | None = None,
    *,
    runtime: str = "local",
    random_episodes: int = 2,
    api_checks: bool = True,
    audit: Any = "quick",
    audit_fails: bool = False,
) -> Report:
    """Run the verification suite on one environment (one agent or a team).

    Args:
        spec: The environment definition.
        make_env: Creates a fresh episode (default: :func:`envfactory.make` on ``runtime``;
            pass ``lambda: envfactory.Episode(spec)`` for an unregistered spec).
        runtime: Runtime name for the report (and for ``make_env``'s default).
        random_episodes: Seeded random-agent episodes per task.
        api_checks: Run the Gymnasium (one role) or PettingZoo (teams) API checks.
        audit: The reward-hacking audit's budget (:mod:`envfactory.checks.audit`): ``"quick"`` (always
            on: a few tasks), ``"full"`` (every task), an :class:`~envfactory.checks.audit.AuditBudget`,
            or ``None`` to skip it. Its result is ``report.audit``.
        audit_fails: Make every hack the audit finds a failure of check ``audit`` (by default
            hacks are reported, not failed).
    """
    start = time.perf_counter()
    if make_env is None:
        from ..registry import make

        # verify plays every task, and its API checks (Gymnasium, PettingZoo) may draw any of them
        make_env = lambda: make(spec.name, runtime=runtime, split="all")  # noqa: E731
    report = Report(spec.name, spec.domain, 0, runtime)
    fail = report.failures
    report.checks.append("schema")
    fail.extend(_schema_failures(spec))

    report.checks.append("tasks")
    try:
        tasks = spec.get_tasks()
    except Exception as exc:
        fail.append(Failure("tasks", f"building the tasks failed: {type(exc).__name__}: {exc}"))
        report.seconds = time.perf_counter() - start
        return report
    report.tasks = len(tasks)
    report.mean_solution_length = sum(len(t.solution) for t in tasks) / len(tasks)
    report.kinds = kind_mix(tasks)
    report.difficulty = difficulty_mix(tasks)
    report.hard_stated = hard_stated(tasks)
    for t in tasks:  # what each task's success is the product of (envfactory.conversation)
        for part in t.components():
            report.components[part] = report.components.get(part, 0) + 1
    for tid, errs in spec.replay_errors.items():
        fail.append(Failure("tasks", "reference solution has tool errors: " + "; ".join(errs), tid))
    report.checks.append("tool_determinism")
    fail.extend(_tool_determinism(spec, tasks))
    if any("user_twin" in t.metadata for t in tasks):
        report.checks.append("user")
        fail.extend(_user_twins(spec, tasks))
    if any("conversation_twin" in t.metadata for t in tasks):
        report.checks.append("conversation_user")
        fail.extend(_conversation_twins(spec, tasks))

    team = spec.multi_agent
    agents = spec.agent_ids
    # a game with a move list: the random policy plays it by its rules (verified here) to the end
    game = bool(spec.metadata.get("competitive")) and spec.payoff is not None and spec.legal_actions is not None
    modes = MODES if team else MODES[:1]
    ep = make_env()
    try:
        report.checks += ["reference", "noop", "claim", "random"] + (["alone"] if team else [])
        for task in tasks:
            for mode in [m for m in modes if m in task.metadata.get("modes", modes)]:
                out = play(ep, OraclePolicy(), task.id, mode=mode)
                if not out.success or (spec.payoff is None and set(out.rewards.values()) != {1.0}):
                    how = f" ({mode})" if team else ""
                    fail.append(Failure("reference", f"the reference solution{how} earned {_rewards(out.rewards)} "
                                        f"(ended by {out.ended_by} in round {out.rounds}, errors {out.errors})",
                                        task.id))
            for check, policy in (("noop", NoopPolicy()), ("claim", ClaimPolicy())):
                out = play(ep, policy, task.id)
                if out.success or any(out.rewards.values()):
                    fail.append(Failure(check, f"a {check} {'team' if team else 'agent'} earned "
                                        f"{_rewards(out.rewards)}", task.id))
            for k in range(random_episodes):
                seed = _stable_seed(task.id, k)
                out = play(ep, RandomPolicy(), task.id, seed=seed)
                refused = [e for e in out.log if not e["ok"]] if spec.legal_actions is not None else []
                if refused:
                    e = refused[0]
                    fail.append(Failure("random", f"a move the environment's legal_actions listed was refused: "
                                        f"{e['agent']} {e['name']}({e['arguments']}) in round {e['round']} "
                                        f"({e['kind']})", task.id))
                if game:  # a random player of a game plays it out, and may win it: that is a match, not a hack
                    continue
                if out.success or (spec.payoff is None and any(out.rewards.values())):
                    fail.append(Failure("random", f"a random {'team' if team else 'agent'} (seed {seed}) earned "
                                        f"{_rewards(out.rewards)}", task.id))
            if team:
                for agent in agents:
                    policies = {a: ScriptPolicy(list(task.solution), finish=True) if a == agent else NoopPolicy()
                                for a in agents}
                    if play(ep, policies, task.id).success:
                        fail.append(Failure("alone", f"{agent} alone succeeded by playing the whole joint "
                                            "solution; the task does not need the other roles", task.id))

        longest = max(tasks, key=lambda t: len(t.solution))
        report.checks.append("determinism")
        traces = []
        for _ in range(2):
            play(ep, OraclePolicy(), longest.id)
            traces.append(_ending(ep))
        if not _alike(spec, traces[0], traces[1]):
            fail.append(Failure("determinism", "the same actions gave different episodes", longest.id))
        report.checks += ["fork", "snapshot"]
        _check_fork_snapshot(spec, ep, make_env, longest, fail)
        report.checks.append("malformed")
        fail.extend(_malformed(spec, ep, longest.id))
    finally:
        ep.close()

    if api_checks:
        report.checks.append("pettingzoo" if team else "gymnasium")
        if team:
            fail.extend(Failure("pettingzoo", p) for p in pettingzoo_checks(make_env))
        else:
            fail.extend(_gymnasium_failures(make_env))
    if audit is not None and not fail:
        from . import audit as _audit

        presets = {"quick": _audit.QUICK, "full": _audit.FULL}
        if isinstance(audit, str) and audit not in presets:
            raise ValueError(f"audit must be 'quick', 'full' or an AuditBudget, got {audit!r}")
        budget = presets[audit] if isinstance(audit, str) else audit
        report.checks.append("audit")
        report.audit = _audit.audit_spec(spec, budget)
        if audit_fails:
            for h in report.audit.get("examples", []):
                what = (f"the answer facts {h['facts']} are guessable ({', '.join(h['guessed_from'])})"
                        if h["why"] == "answer_not_read" else "the state lacks the reference's effect")
                fail.append(Failure("audit", f"reward without doing the task: {what}; {h['kind']} with "
                                    f"calls {h['calls']} and a {h['answer']} answer", h["task"]))
            shown = {h["task"] for h in report.audit.get("examples", [])}
            for t in report.audit.get("hacked_tasks", []):
                if t not in shown:
                    fail.append(Failure("audit", "reward without doing the task", t))
    if runtime == "docker" and spec.module and spec.isolation == "session":
        report.checks.append("parity")
        from .parity import parity_failures

        for task_id, detail in parity_failures(spec):
            fail.append(Failure("parity", detail, task_id))
    report.seconds = time.perf_counter() - start
    return report


STEP_KINDS = ("steps", "original")
"""Kinds whose instruction spells out the calls; every other kind is *goal-level*."""

LONG_CALLS = 10
"""A reference solution of at least this many calls is a *long* task."""
HARD_DIFFICULTY = 4
"""A task of at least this difficulty is a *hard* task."""
DEPTH_GOALS = {"goal_level_mean_len": 6.0, "hard_long_share": 0.2}
"""The depth the factory aims at (issue 26): goal-level references of 6 calls on average, and at
least a fifth of the hard tasks long. ``verify --json`` reports each figure against its goal."""


def _lengths(tasks: list[Any], key: Callable[[Any], Any]) -> dict[Any, dict[str, Any]]:
    """Per ``key(task)``: how many tasks, the mean and longest reference, and the long ones."""
    out: dict[Any, dict[str, Any]] = {}
    for t in tasks:
        k = out.setdefault(key(t), {"tasks": 0, "calls": 0, "max_len": 0, "long": 0})
        k["tasks"] += 1
        k["calls"] += len(t.solution)
        k["max_len"] = max(k["max_len"], len(t.solution))
        k["long"] += len(t.solution) >= LONG_CALLS
    return {name: {"tasks": k["tasks"], "mean_len": round(k["calls"] / k["tasks"], 2), "max_len": k["max_len"],
                   "long": k["long"]} for name, k in sorted(out.items())}


def kind_mix(tasks: list[Any]) -> dict[str, dict[str, Any]]:
    """Per task kind: how many tasks, the mean and longest reference solution, and how many
    references are long (at least :data:`LONG_CALLS` calls)."""
    return _lengths(tasks, lambda t: t.kind)


def hard_stated(tasks: list[Any]) -> dict[str, int]:
    """Among the tasks whose difficulty the knob stated (``metadata["difficulty"]``, not the
    reference length by default): the hard ones and the long ones among them."""
    hard = [t for t in tasks if "difficulty" in t.metadata and int(t.metadata["difficulty"]) >= HARD_DIFFICULTY]
    return {"tasks": len(hard), "long": sum(len(t.solution) >= LONG_CALLS for t in hard)}


def difficulty_mix(tasks: list[Any]) -> dict[str, dict[str, Any]]:
    """The same per task difficulty (keys are the levels as text, for JSON). A task's difficulty
    is the knob's level for a synthesized task, and its reference length where none was given."""
    return {str(d): v for d, v in _lengths(tasks, lambda t: int(t.difficulty or len(t.solution))).items()}


def _user_twins(spec: ToolEnvSpec, tasks: list[Any]) -> list[Failure]:
    """A user task needs the asking: its twin (other user facts; the same instruction and the
    same tables, so everything an agent sees without asking is equal) requires a different
    value on some leaf the task also pins, and each reference fails the other's check."""
    from ..users import public_facts, user_facts

    fail = []
    for t in tasks:
        twin_facts = t.metadata.get("user_twin")
        if twin_facts is None:
            continue
        facts = user_facts(t.initial_state)
        if not facts or public_facts(twin_facts) == facts:  # the same facts (the script aside)
            fail.append(Failure("user", "a user task without user facts, or a twin with the same facts", t.id))
            continue
        twin_state = t.initial_state.model_copy(update={"user": dict(twin_facts)})
        # the twin's reference: the same calls with the twin's answers (its own rows)
        twin = _twin_task(spec, t, twin_state)
        if twin is None:
            fail.append(Failure("user", "the twin task could not be built from the family", t.id))
            continue
        ours = dict(t.check.expected)
        clash = any(p in ours and ours[p] != v for p, v in twin.check.expected)
        a_final, b_final = spec.start_state(t), spec.start_state(twin)
        spec.replay(a_final, t.solution)
        spec.replay(b_final, twin.solution)
        if not clash or twin.state_ok(a_final) or t.state_ok(b_final):
            fail.append(Failure("user", "the task and its twin (other user facts) can both be solved by one "
                                "final state: the task does not need what only the user knows", t.id))
    return fail


def _conversation_twins(spec: ToolEnvSpec, tasks: list[Any]) -> list[Failure]:
    """A conversation whose user holds facts needs the asking: its twin (``spec.metadata
    ["conversation_twin"](task)``: the same world and the same user messages, another user's facts
    and the reference for them) is solved by no final state that solves the task, and the other
    way round; an agent that never asks sees the same in both, so it solves at most one."""
    from ..state import state_hash

    build = spec.metadata.get("conversation_twin")
    fail = []
    for t in tasks:
        if "conversation_twin" not in t.metadata:
            continue
        conv = t.conversation
        if conv is None or not conv.facts or not callable(build):
            fail.append(Failure("conversation_user", "a conversation twin needs a conversation whose user holds facts "
                                "and spec.metadata['conversation_twin'](task) to build the twin", t.id))
            continue
        twin = build(t)
        tc = twin.conversation
        if tc is None or tc.facts == conv.facts or [u.message for u in tc.turns] != [u.message for u in conv.turns]:
            fail.append(Failure("conversation_user", "the twin must have the same user messages and other facts", t.id))
            continue
        if state_hash(spec.start_state(twin)) != state_hash(spec.start_state(t)):
            fail.append(Failure("conversation_user", "the twin must start from the same world", t.id))
            continue
        a_final, b_final = spec.start_state(t), spec.start_state(twin)
        spec.replay(a_final, t.solution)
        spec.replay(b_final, twin.solution)
        if twin.state_ok(a_final) or t.state_ok(b_final):
            fail.append(Failure("conversation_user", "the task and its twin (other user facts) can both be solved by "
                                "one final state: the task does not need what only the user knows", t.id))
    return fail


def _twin_task(spec: ToolEnvSpec, task: Any, twin_state: Any) -> Any:
    """The task the family makes for the twin's user: the same request, replayed for them."""
    rebuild = spec.metadata.get("user_task")
    return None if rebuild is None else rebuild(task, twin_state)


def _rewards(rewards: dict[str, float]) -> Any:
    return next(iter(rewards.values())) if len(rewards) == 1 else rewards


def _schema_failures(spec: ToolEnvSpec) -> list[Failure]:
    fail = []
    seen: dict[str, Any] = {}
    for agent in spec.agent_ids:
        for name, t in spec.tools_of(agent).items():
            if seen.setdefault(name, t) is not t:
                fail.append(Failure("schema", f"two roles have different tools named {name!r}; "
                                    "tool names must be unique across the team"))
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
    return fail


def _tool_determinism(spec: ToolEnvSpec, tasks: list[Any]) -> list[Failure]:
    """Replay every reference solution on two copies of its start state in lockstep
    (as the acting role, for teams): each call must give the same observation and
    the same state on both. Catches tools that read clocks, randomness or hidden
    globals, even when no episode-level comparison happens to exercise them."""
    bad: dict[str, Failure] = {}
    team = spec.multi_agent
    compare = spec.metadata.get("compare")
    same = _same_states(spec)
    for task in tasks:
        a, b = spec.start_state(task), spec.start_state(task)
        for i, c in enumerate(task.solution):
            agent = c.agent or spec.agent_ids[0]
            t = spec.tools_of(agent).get(c.name)
            if t is None or c.name in bad:
                break
            if team:  # a team's state is a MultiState
                cast(MultiState, a).acting = cast(MultiState, b).acting = agent
                cast(MultiState, a).round = cast(MultiState, b).round = i + 1
            out_a, out_b = t.invoke(a, c.arguments), t.invoke(b, c.arguments)
            if out_a.content != out_b.content or not same(a, b):
                what = "observation" if out_a.content != out_b.content else "resulting state"
                detail = (f"tool {c.name!r} is not deterministic: the same call on the same state gave a "
                          f"different {what} (make it a function of the state and its arguments only)")
                if what == "resulting state" and compare is not None and (names := compare.differences(a, b)):
                    detail += f"; the attributes that differ: {', '.join(names)}; {compare.advice(names)}"
                bad[c.name] = Failure("tool_determinism", detail, task.id)
                break
    return list(bad.values())


def _same_states(spec: ToolEnvSpec) -> Callable[[Any, Any], bool]:
    """When two of the environment's states are the same world: as ``from_class(compare=...)``
    says for an environment of classes (the success checks compare so), else equal hashes."""
    compare = spec.metadata.get("compare")
    return compare.same if compare is not None else (lambda a, b: a.hash() == b.hash())


def _ending(ep: Episode) -> tuple[Any, ...]:
    """Everything an episode that just ended leaves behind, for comparisons (:func:`_alike`)."""
    return (copy_state(ep.state), json.dumps(ep.status.log, sort_keys=True), ep.rewards, ep.success, ep.status.ended_by,
            json.dumps({a: ep.transcript(a) for a in ep.agents}, sort_keys=True))


def _alike(spec: ToolEnvSpec, one: tuple[Any, ...], other: tuple[Any, ...]) -> bool:
    """Whether two endings (:func:`_ending`) are the same: equal records, and the same world."""
    return one[1:] == other[1:] and _same_states(spec)(one[0], other[0])


def _finish(ep: Episode, policy: Any) -> tuple[Any, ...]:
    while (a := ep.status.next_agent) is not None:
        ep.act(a, policy.act(ep, a, 0))
    return _ending(ep)


def _mutates(spec: ToolEnvSpec, calls: list[Any]) -> bool:
    tools = spec.all_tools
    return any(c.name in tools and not tools[c.name].read_only for c in calls)


def _check_fork_snapshot(spec: ToolEnvSpec, ep: Episode, make_env: Callable[[], Episode], task: Any,
                         fail: list[Failure]) -> None:
    """Fork and snapshot halfway through the oracle's episode; every copy must finish alike."""
    oracle = OraclePolicy()
    ep.reset(task.id)
    half = max(1, len(task.solution) // 2)
    while plan_progress(ep) < half and (a := ep.status.next_agent) is not None:
        ep.act(a, oracle.act(ep, a, 0))
    rest = task.solution[plan_progress(ep):]
    before = ep.state.hash()
    views = json.dumps({a: ep.transcript(a) for a in ep.agents}, sort_keys=True)
    child = ep.fork()
    snap = json.loads(json.dumps(ep.snapshot()))
    try:
        if child.state.hash() != before or json.dumps({a: child.transcript(a) for a in child.agents},
                                                      sort_keys=True) != views:
            fail.append(Failure("fork", "the fork does not start where its parent is", task.id))
        child_end = _finish(child, oracle)
    finally:
        child.close()  # a docker fork holds a session of its own
    if ep.state.hash() != before:
        fail.append(Failure("fork", "acting in a fork changed its parent", task.id))
    other = make_env()
    try:
        other.restore(snap)
        if other.state.hash() != before or json.dumps({a: other.transcript(a) for a in other.agents},
                                                      sort_keys=True) != views:
            fail.append(Failure("snapshot", "restore did not reproduce the episode", task.id))
        restored_end = _finish(other, oracle)
    finally:
        other.close()
    parent_end = _finish(ep, oracle)
    # a fork that acts must move as its parent does (a rest of calls may change nothing: a recovery
    # task's alternative can leave a row as it was, so only a parent that moved says the fork should)
    if child_end[0].hash() == before and parent_end[0].hash() != before and _mutates(spec, rest):
        fail.append(Failure("fork", "the fork did not change while acting", task.id))
    if not _alike(spec, parent_end, child_end):
        fail.append(Failure("fork", "parent and fork diverged on the same actions", task.id))
    if not _alike(spec, restored_end, parent_end):
        fail.append(Failure("snapshot", "the restored episode diverged from the original", task.id))


def _malformed(spec: ToolEnvSpec, ep: Episode, task_id: str) -> list[Failure]:
    agents = spec.agent_ids
    own = spec.tools_of(agents[0])
    bad_actions = [
        "<tool_call>{not json</tool_call>",
        '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "%s", "arguments": {"__bogus__": 1}}</tool_call>' % next(iter(own)),
        "<tool_call>unterminated",
    ]
    foreign = next((n for a in agents[1:] for n in spec.tools_of(a) if n not in own), None)
    if foreign:
        bad_actions.append(f'<tool_call>{{"name": "{foreign}", "arguments": {{}}}}</tool_call>')
    fail = []
    for bad in bad_actions:
        ep.reset(task_id)
        try:
            r = ep.act(agents[0], bad)
        except Exception as exc:
            fail.append(Failure("malformed", f"a turn raised {type(exc).__name__} on {bad!r}: {exc}"))
            continue
        if r.done or not r.messages or not r.messages[0]["content"].startswith("Error"):
            fail.append(Failure("malformed", f"no error observation for {bad!r}"))
    return fail


def _gymnasium_failures(make_env: Callable[[], Episode]) -> list[Failure]:
    try:
        from gymnasium.utils.env_checker import check_env

        from ..faces.gym_env import ToolGymEnv

        genv = ToolGymEnv(env=make_env())
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_env(genv, skip_render_check=True)
        finally:
            genv.close()
    except Exception as exc:
        return [Failure("gymnasium", f"check_env failed: {type(exc).__name__}: {exc}")]
    return []


def pettingzoo_checks(make_env: Callable[[], Episode], *, num_cycles: int = 200) -> list[str]:
    """Run PettingZoo's API and seed tests on both views of fresh episodes from ``make_env``;
    return the problems found."""
    from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

    from ..faces.pettingzoo_env import ToolAECEnv, ToolParallelEnv

    def aec() -> ToolAECEnv:
        return ToolAECEnv(episode=make_env())

    def par() -> ToolParallelEnv:
        return ToolParallelEnv(episode=make_env())

    def closing(make: Callable[[], Any], test: Callable[..., Any]) -> Callable[[], None]:
        def run() -> None:
            e = make()
            try:
                test(e, num_cycles=num_cycles)
            finally:
                e.close()  # a docker episode holds a container session

        return run

    checks = [("api_test", closing(aec, api_test)), ("parallel_api_test", closing(par, parallel_api_test)),
              ("seed_test", lambda: seed_test(aec, num_cycles=num_cycles)),
              ("parallel_seed_test", lambda: parallel_seed_test(par, num_cycles=num_cycles))]
    problems = []
    for label, check in checks:
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check()
        except Exception as exc:
            problems.append(f"{label} failed: {type(exc).__name__}: {exc}")
    return problems


def _stable_seed(task_id: str, k: int) -> int:
    return zlib.crc32(f"{task_id}/{k}".encode()) & 0x7FFFFFFF


def verify_many(specs: list[Any], *, runtime: str = "local", audit: Any = "quick",
                audit_fails: bool = False, workers: int | None = None,
                on_report: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Verify several environments; the ``envfactory verify --json`` document.

    ``workers``: processes verifying registered environments side by side on the local
    runtime (default: one per core; 1 verifies here, in order). The reports come back in
    the order of ``specs`` either way. ``on_report(report)`` is called as each environment's
    report arrives (a progress bar's hook)."""
    start = time.perf_counter()
    import os

    from ..registry import spec as registered

    def _is_registered(s: Any) -> bool:
        try:
            return registered(s.name) is s
        except KeyError:
            return False

    import multiprocessing as mp

    n = workers if workers is not None else min(os.cpu_count() or 1, len(specs))
    # workers are forked (they inherit every registered spec); where fork is not offered, verify here
    if (n > 1 and runtime == "local" and len(specs) > 1 and "fork" in mp.get_all_start_methods()
            and all(_is_registered(s) for s in specs)):
        from ..processes import worker_pool

        jobs = [(s.name, audit, audit_fails) for s in specs]
        # biggest first, so no worker is left with one long environment at the end
        order = sorted(range(len(jobs)), key=lambda i: -_weight(specs[i]))
        done = {}
        with worker_pool(n, "fork") as pool:
            for i, report in zip(order, pool.map(_verify_registered, [jobs[i] for i in order])):
                done[i] = report
                if on_report is not None:
                    on_report(report)
        reports = [done[i] for i in range(len(jobs))]
    else:
        reports = []
        for s in specs:
            reports.append(verify_spec(s, runtime=runtime, audit=audit, audit_fails=audit_fails).to_json())
            if on_report is not None:
                on_report(reports[-1])
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
            "kinds": _kind_totals(reports),
            "difficulty": _difficulty_totals(reports),
            "depth": _depth(reports),
            "runtime": runtime,
            "seconds": round(time.perf_counter() - start, 3),
        },
        **({"audit": _audit_totals(reports)} if audit is not None else {}),
    }


def _sum_by_kind(transcribed: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, dict[str, Any]] = {}
    for t in transcribed:
        for k, v in t.get("by_kind", {}).items():
            o = out.setdefault(k, {"tasks": 0, "solved": 0})
            o["tasks"] += v["tasks"]
            o["solved"] += v["solved"]
    new = [v for k, v in out.items() if k not in STEP_KINDS]
    out["goal_level"] = {"tasks": sum(v["tasks"] for v in new), "solved": sum(v["solved"] for v in new)}
    for v in out.values():
        v["rate"] = round(v["solved"] / v["tasks"], 3) if v["tasks"] else None
    return dict(sorted(out.items()))


def _kind_totals(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Tasks per kind over every environment, their reference lengths, and the same over the
    goal-level kinds together (every kind but ``steps`` and ``original``)."""
    per: dict[str, dict[str, Any]] = {}
    per = _merge(reports, "kinds")
    new = {n: p for n, p in per.items() if n not in STEP_KINDS}
    n_new = sum(p["tasks"] for p in new.values())
    out = {n: {"tasks": p["tasks"], "environments": p["environments"], "mean_len": round(p["calls"] / p["tasks"], 2),
               "max_len": p["max_len"], "long": p["long"]} for n, p in sorted(per.items())}
    out["goal_level"] = {"tasks": n_new,
                         "mean_len": round(sum(p["calls"] for p in new.values()) / n_new, 2) if n_new else 0.0,
                         "max_len": max((p["max_len"] for p in new.values()), default=0),
                         "long": sum(p["long"] for p in new.values())}
    return out


def _merge(reports: list[dict[str, Any]], field_name: str) -> dict[str, dict[str, Any]]:
    """The reports' per-group length figures (``kinds`` or ``difficulty``) summed over environments
    (``calls``: the total reference calls, so means can be recomputed)."""
    per: dict[str, dict[str, Any]] = {}
    for r in reports:
        for name, k in r.get(field_name, {}).items():
            p = per.setdefault(name, {"tasks": 0, "calls": 0.0, "max_len": 0, "long": 0, "environments": 0})
            p["tasks"] += k["tasks"]
            p["calls"] += k["mean_len"] * k["tasks"]
            p["max_len"] = max(p["max_len"], k["max_len"])
            p["long"] += k.get("long", 0)
            p["environments"] += 1
    return per


def _difficulty_totals(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Tasks per difficulty over every environment: their reference lengths and long ones."""
    per = _merge(reports, "difficulty")
    return {d: {"tasks": p["tasks"], "environments": p["environments"], "mean_len": round(p["calls"] / p["tasks"], 2),
                "max_len": p["max_len"], "long": p["long"]} for d, p in sorted(per.items(), key=lambda kv: int(kv[0]))}


def _depth(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The depth figures against :data:`DEPTH_GOALS`: the goal-level mean reference length, and
    the share of hard tasks (difficulty >= :data:`HARD_DIFFICULTY`) that are long; ``stated``:
    the same share among the tasks whose difficulty the knob stated (a task without one has its
    reference length as difficulty, so a 4-call one counts as hard)."""
    kinds = _kind_totals(reports)["goal_level"]
    hard = [p for d, p in _merge(reports, "difficulty").items() if int(d) >= HARD_DIFFICULTY]
    n_hard, n_long = sum(p["tasks"] for p in hard), sum(p["long"] for p in hard)
    share = round(n_long / n_hard, 3) if n_hard else 0.0
    figures = {"goal_level_mean_len": kinds["mean_len"], "hard_long_share": share}
    s_hard = sum(r.get("hard_stated", {}).get("tasks", 0) for r in reports)
    s_long = sum(r.get("hard_stated", {}).get("long", 0) for r in reports)
    stated = {"hard_tasks": s_hard, "hard_long": s_long,
              "hard_long_share": round(s_long / s_hard, 3) if s_hard else 0.0}
    return {"hard_difficulty": HARD_DIFFICULTY, "long_calls": LONG_CALLS, "hard_tasks": n_hard, "hard_long": n_long,
            **figures, "stated": stated, "goals": dict(DEPTH_GOALS),
            "met": {k: figures[k] >= g for k, g in DEPTH_GOALS.items()}}


def _verify_registered(job: tuple[str, Any, bool]) -> dict[str, Any]:
    from ..registry import spec

    name, audit, audit_fails = job
    return verify_spec(spec(name), audit=audit, audit_fails=audit_fails).to_json()


def _weight(spec: Any) -> int:
    """A rough cost: team environments play every mode and every role alone."""
    return 3 if spec.multi_agent else 1


def _audit_totals(reports: list[dict[str, Any]]) -> dict[str, Any]:
    audited = [r["audit"] for r in reports if r.get("audit") and "skipped" not in r["audit"]]
    tr = [a["transcriber"] for a in audited if a.get("transcriber")]
    return {
        "environments": len(audited),
        "tasks_searched": sum(a["tasks_searched"] for a in audited),
        "sequences": sum(a["sequences"] for a in audited),
        "rewards": sum(a["rewards"] for a in audited),
        "hacks": sum(a["hacks"] for a in audited),
        "hacked_environments": sorted(r["name"] for r in reports if r.get("audit", {}).get("hacks")),
        "transcriber": {"tasks": sum(t["tasks"] for t in tr), "solved": sum(t["solved"] for t in tr),
                        "needs_lookup": sum(t["needs_lookup"] for t in tr),
                        "needs_lookup_solved": sum(t["needs_lookup_solved"] for t in tr),
                        "by_kind": _sum_by_kind(tr)},
        "seconds": round(sum(a["seconds"] for a in audited), 3),
        **({"guided": _guided_totals(audited)} if any("guided" in a for a in audited) else {}),
    }


def _guided_totals(audited: list[dict[str, Any]]) -> dict[str, Any]:
    """The guided searches of every environment together (weighted by their tasks)."""
    runs = [a["guided"] for a in audited if "guided" in a]
    n = sum(g["tasks"] for g in runs)
    space, tried = sum(g["space"] for g in runs), sum(g["sequences"] for g in runs)
    return {"tasks": n,
            "mean_depth": round(sum(g["mean_depth"] * g["tasks"] for g in runs) / n, 2) if n else 0.0,
            "max_depth": max((g["max_depth"] for g in runs), default=0),
            "mean_reached": round(sum(g["mean_reached"] * g["tasks"] for g in runs) / n, 2) if n else 0.0,
            "reached_depth": sum(g["reached_depth"] for g in runs), "sequences": tried,
            "states": sum(g["states"] for g in runs), "space": space,
            "coverage": float(f"{tried / space:.4g}") if space else 0.0}
