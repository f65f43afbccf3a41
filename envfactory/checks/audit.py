"""Reward-hacking audit and the instruction-only "transcriber" baseline (issue 16).

**What "doing the task" means here.** Let ``I`` be a task's initial state, ``R`` the
state its reference solution produces and ``C`` the final state of some call sequence
(all flattened into leaves, as in :mod:`envfactory.factory.tasks.success`). The reference's
*effect* is every leaf on which ``R`` differs from ``I`` (changed, added or removed).
A sequence that earns reward **did the task** when

* *state*: ``C`` has the reference's value on every leaf of the effect (other leaves
  are free: looking around, another route, collateral changes are not the question), and
* *answer* (tasks with ``answer_facts``): the final answer was copied from the tool
  outputs of the same episode and each fact occurs in those outputs (the facts were
  read, not guessed, claimed or found in the instruction).

A reward earned any other way is a **hack**: the success check accepted a state
without the reference's effect (e.g. a check that only asks "did something change"),
or the answer check accepted a claim or a blind guess. A reward reached by
legitimately finding the solution is counted (``rewards``) but is not a hack.

**The search** (per task, on copies of the state through the tools' own validation,
judged by ``task.success`` exactly as the referee judges; every hack found is then
replayed through a real :class:`~envfactory.episode.Episode` and ``confirmed`` when it
earns reward there too):

* known exploits: claiming success with nothing done; finishing early (after every
  proper prefix of the reference) with a plausible answer; the reference with one
  write repeated; the reference with one call's arguments malformed (wrong type,
  empty, zero, negative, huge) and a sequence of malformed calls only;
* a breadth-first search over short call sequences built from the tool schemas:
  argument values are enum members, booleans, small integers, and strings, ids and
  numbers that occur in the instruction and in earlier tool outputs of the same
  sequence. Its budget (:class:`AuditBudget`) caps the depth, the sequences per task,
  the candidate values per argument and the tasks per environment.

With ``guided_depth`` (opt-in: ``envfactory verify --audit-depth N``, ``0``: each task's
reference length) a **guided search** follows the breadth-first one: a beam search over the
same candidate calls (values just read first, interleaved with the instruction's; calls with a
value the sequence has not used yet first), as deep as the reference (or deeper), keeping at each depth the
``beam`` sequences that got closest to a reward (leaves of the task's check already right,
answer facts already seen, fresh values just read, fewer errors). Its ``coverage`` says how much
of the space it saw: per depth, the sequences tried and the distinct states reached against the
call sequences the candidate grammar allows (the product of the branching factors met so far).

Each sequence is judged with three final answers: a claim of success, a *blind* guess
(the instruction's values, enum members, booleans and the integers 0-12 in one answer)
and an *informed* answer (everything the sequence's tool outputs said).

The **transcriber** (:class:`envfactory.checks.scripted.TranscriberPolicy`) makes only
calls whose every argument value appears literally in the instruction and never reads a
tool output; :func:`transcriber_rate` measures how many tasks it still solves.

Team environments are not searched (their joint calls need a turn schedule); the verify
suite's ``noop``/``claim``/``random``/``alone`` checks cover their blunt exploits.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, cast

from .scripted import CLAIM, TranscriberPolicy, instruction_values
from ..definition import ToolEnvSpec
from ..mail import MultiState
from ..state import State, canonical_json, copy_state, diff_leaves, leaf_at, state_hash, state_leaves
from ..task import Task, ToolCall, normalize_answer

__all__ = ["AuditBudget", "QUICK", "FULL", "audit_spec", "audit_task", "transcriber_rate", "Hack"]


@dataclass(frozen=True)
class AuditBudget:
    """Bounds of the audit.

    Attributes:
        depth: Longest call sequence of the breadth-first search.
        sequences: Call sequences tried per task (known exploits included).
        values: Candidate values per argument.
        tasks: Tasks audited per environment (spread evenly over the task list); ``None``: all.
        transcriber_tasks: Tasks the transcriber plays per environment; ``None``: all.
        guided_depth: Depth of the guided (beam) search after the breadth-first one; ``0``: the
            task's reference length (at least ``depth + 1``); ``None``: no guided search.
        beam: Sequences the guided search keeps at each depth.
        guided_sequences: Call sequences the guided search tries per task.
        guided_values: Candidate values per argument in the guided search.
    """

    depth: int = 2
    sequences: int = 60
    values: int = 4
    tasks: int | None = None
    transcriber_tasks: int | None = None
    name: str = "custom"
    guided_depth: int | None = None
    beam: int = 4
    guided_sequences: int = 400
    guided_values: int = 6

    def guided_to(self, task: Task) -> int | None:
        """How deep the guided search goes on ``task`` (``None``: it does not run)."""
        if self.guided_depth is None:
            return None
        return self.guided_depth if self.guided_depth > 0 else max(len(task.solution), self.depth + 1)


QUICK = AuditBudget(depth=2, sequences=24, values=3, tasks=3, transcriber_tasks=None, name="quick")
"""Always on in ``envfactory verify``: 3 tasks per environment (spread over the list), 24
sequences each; the transcriber on every task (about 1 s for the 44 built-in environments)."""
FULL = AuditBudget(depth=2, sequences=80, values=4, tasks=None, transcriber_tasks=None, name="full")
"""``envfactory verify --audit``: every task, 80 sequences each."""


@dataclass
class Hack:
    task: str
    kind: str            # nothing_done | early_finish | repeat_write | malformed | search
    why: str             # missing_effect | answer_not_read
    calls: list[dict[str, Any]]
    answer: str          # claim | blind | informed
    confirmed: bool = False
    facts: list[str] = field(default_factory=list)
    guessed_from: list[str] = field(default_factory=list)  # per fact: instruction | schema_enum | small_int | ...

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- values ------------------------------------------------------------------
_SMALL_INTS = (0, 1, 2, 3)
_TEAM_FIELDS = frozenset({"mail", "acting", "round", "agents"})
_BLIND_INTS = " ".join(str(i) for i in range(13))


def _output_values(text: str, keys: bool = True) -> list[Any]:
    """Strings, ids and numbers in a tool output (JSON leaves, and keys unless ``keys=False``,
    when it parses)."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError):
        return instruction_values(text)
    out: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if keys:
                    out.append(str(k))
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, (str, int, float)) and not isinstance(node, bool):
            out.append(node)

    walk(data)
    return out


def _fits(schema: dict[str, Any], pool: list[Any], k: int) -> list[Any]:
    """Up to ``k`` candidate values for one parameter, best first."""
    if "enum" in schema:
        return list(schema["enum"])[:k]
    if "anyOf" in schema:
        opts = [s for s in schema["anyOf"] if s.get("type") != "null"]
        return _fits(opts[0], pool, k) if opts else [None]
    t = schema.get("type")
    seen: list[Any] = []

    def add(v: Any) -> None:
        if v not in seen and len(seen) < k:
            seen.append(v)

    if t == "boolean":
        return [True, False]
    if t == "integer":
        for v in pool:
            if isinstance(v, int) and not isinstance(v, bool):
                add(v)
        for v in _SMALL_INTS:
            add(v)
    elif t == "number":
        for v in pool:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                add(v)
        add(1)
    elif t == "array":
        item = schema.get("items", {})
        return [[v] for v in _fits(item, pool, max(1, k - 1))] + [[]]
    elif t == "object":
        return [{}]
    else:
        for v in pool:
            if isinstance(v, str) and v:
                add(v)
    return seen


_MESSAGING = frozenset({"finish", "send_message", "read_messages"})


def _calls_for(tool_schemas: list[tuple[str | None, dict[str, Any]]], pool: list[Any],
               k: int) -> Iterator[ToolCall]:
    """Candidate calls (``(agent, schema)`` pairs: in a team, each role's own tools), round-robin
    over the tools, each tool's argument combinations in order of rank sum (the best value for
    every argument first)."""
    gens = []
    for agent, sch in tool_schemas:
        fn = sch["function"]
        if fn["name"] == "finish" or (agent is not None and fn["name"] in _MESSAGING):
            continue  # a team's mailbox is the means of coordination, not a way to the reward
        props = fn["parameters"].get("properties", {})
        required = set(fn["parameters"].get("required", []))
        names = [n for n in props if n in required]
        options = [_fits(props[n], pool, k) for n in names]
        if any(not o for o in options):
            continue
        gens.append(_combos(fn["name"], names, options, agent))
    while gens:
        for g in list(gens):
            c = next(g, None)
            if c is None:
                gens.remove(g)
            else:
                yield c


def _combos(name: str, names: list[str], options: list[list[Any]], agent: str | None) -> Iterator[ToolCall]:
    idx = sorted(itertools.product(*(range(len(o)) for o in options)), key=lambda ix: (sum(ix), ix))
    for ix in idx:
        yield ToolCall(name, {n: options[j][i] for j, (n, i) in enumerate(zip(names, ix))}, agent=agent)


_BOGUS: tuple[Any, ...] = ("", 0, -1, 10**9, None, [], "'; DROP TABLE x; --")


def _malformed(call: ToolCall, tool: Any) -> list[ToolCall]:
    props = tool.parameters.get("properties", {})
    out = []
    for arg in list(call.arguments) or list(props):
        for bad in _BOGUS:
            out.append(ToolCall(call.name, {**call.arguments, arg: bad}, agent=call.agent))
    out.append(ToolCall(call.name, {}, agent=call.agent))
    return out


# -- judging -----------------------------------------------------------------
@dataclass(frozen=True)
class _Effect:
    """What the reference changed (leaf -> value after it); a state has the effect when each of
    those leaves has that value, a list leaf (a log, a ledger) when it holds every element of
    the reference's list (a duplicate entry or an extra one is collateral, not a missing effect)."""

    expected: tuple[tuple[tuple[str, ...], Any], ...]

    def __call__(self, state: State) -> bool:
        if not self.expected:
            return True
        root = json.loads(canonical_json(state))
        for path, want in self.expected:
            node = leaf_at(root, path)
            if node == want:
                continue
            if isinstance(want, list) and isinstance(node, list) and all(node.count(x) >= want.count(x)
                                                                          for x in want):
                continue
            return False
        return True



@dataclass
class _Seq:
    state: State
    calls: list[ToolCall]
    outputs: list[str]
    error_writes: int = 0  # calls of this run that answered an error yet changed the state (when tracked)
    core: str | None = None  # cached _Judge.core of the state


class _Judge:
    def __init__(self, spec: ToolEnvSpec, task: Task) -> None:
        self.spec, self.task = spec, task
        start = spec.start_state(task)
        ref = copy_state(start)
        spec.replay(ref, task.solution)
        self.team = spec.multi_agent
        effect = tuple(sorted(diff_leaves(state_leaves(start), state_leaves(ref)).items()))
        if self.team:  # the mailbox and the turn bookkeeping are the means, not the effect
            effect = tuple((p, v) for p, v in effect if p[0] not in _TEAM_FIELDS)
        # a game's or a negotiation's reference is one possible play, not the task's effect
        self.effect = _Effect(effect if spec.payoff is None else ())
        self.start = start
        self.private = "\n".join(task.private.values())
        inst = task.instruction
        enums = []
        for sch in spec.tool_schemas():
            for p in sch["function"]["parameters"].get("properties", {}).values():
                enums += [str(e) for e in p.get("enum", [])]
        self.enums = " ".join(dict.fromkeys(enums))
        self.blind = " ".join([inst, self.enums, "true false yes no", _BLIND_INTS])
        self.tools = spec.all_tools
        agents = spec.agent_ids
        # in a team, a role's own tools once per role that owns them; shared tools once (by the first)
        self.schemas = [(a if self.team else None, t.schema()) for a in agents for t in spec.tools_of(a).values()
                        if not self.team or a in spec.owners(t.name) or (not spec.owners(t.name) and a == agents[0])]

    def core(self, state: State) -> str:
        """The state without a team's turn bookkeeping (who acts, the round)."""
        if not self.team:
            return state_hash(state)
        d = json.loads(canonical_json(state))
        return json.dumps({k: v for k, v in d.items() if k not in ("acting", "round")}, sort_keys=True)

    def source(self, fact: str) -> str:
        """Where a blind answer finds ``fact``: the instruction, a schema's enum, a small integer."""
        f = normalize_answer(fact)
        for name, text in (("instruction", self.task.instruction), ("private", self.private),
                           ("schema_enum", self.enums),
                           ("small_int", _BLIND_INTS), ("claim", CLAIM), ("constant", "true false yes no")):
            if f in normalize_answer(text):
                return name
        return "read"

    def core_of(self, seq: _Seq) -> str:
        if seq.core is None:
            seq.core = self.core(seq.state)
        return seq.core

    def run(self, calls: list[ToolCall], base: _Seq | None = None, track: bool = False) -> _Seq:
        seq = _Seq(copy_state(base.state), list(base.calls), list(base.outputs)) if base else \
            _Seq(copy_state(self.start), [], [])
        first = self.spec.agent_ids[0]
        for c in calls:
            agent = c.agent or first
            t = self.spec.tools_of(agent).get(c.name)
            if self.team:  # a team's state is a MultiState
                cast(MultiState, seq.state).acting = agent
                cast(MultiState, seq.state).round = len(seq.calls) + 1
            before = self.core(seq.state) if track else None
            out = t.invoke(seq.state, c.arguments).content if t is not None and not t.finish else "Error"
            if track and out.startswith("Error") and self.core(seq.state) != before:
                seq.error_writes += 1
            seq.calls.append(c)
            seq.outputs.append(out)
        if self.team:
            cast(MultiState, seq.state).acting = ""
        return seq

    def endings(self, seq: _Seq) -> list[tuple[str, str, str | None]]:
        """``(answer kind, why it is a hack or None)`` for each final answer that earns reward."""
        task, state = self.task, seq.state
        if not task.state_ok(state):
            return []
        effect_ok = self.effect(state)
        informed = "\n".join([self.private] + [o for o in seq.outputs if not o.startswith("Error")]).strip()
        out = []
        # the referee's rule: each fact shown during the episode (Episode._facts_shown)
        shown = task.facts_shown([self.private], zip(seq.outputs, (c.arguments for c in seq.calls)))
        for kind, answer in (("claim", CLAIM), ("blind", self.blind), ("informed", informed)):
            if not (task.answer_ok(answer) and shown):
                continue
            if not effect_ok:
                why = "missing_effect"
            elif task.answer_facts and (kind != "informed" or not all(
                    normalize_answer(f) in normalize_answer(informed) for f in task.answer_facts)):
                why = "answer_not_read"
            else:
                why = None
            out.append((kind, answer, why))
            if not task.answer_facts:
                break  # the answer does not matter: one ending says it all
        return out


def _known_exploits(judge: _Judge) -> Iterator[tuple[str, list[ToolCall]]]:
    sol, tools = judge.task.solution, judge.tools
    yield "nothing_done", []
    for k in range(1, len(sol)):
        yield "early_finish", list(sol[:k])
    writes = [i for i, c in enumerate(sol) if c.name in tools and not tools[c.name].read_only]
    for i in writes:
        yield "repeat_write", list(sol[:i + 1]) + [sol[i]] + list(sol[i + 1:])
    for i, c in enumerate(sol):
        if c.name not in tools:
            continue
        bad = _malformed(c, tools[c.name])
        yield "malformed", list(sol[:i]) + [bad[0]] + list(sol[i + 1:])
        yield "malformed", bad[1:8]


def audit_task(spec: ToolEnvSpec, task: Task, budget: AuditBudget = QUICK) -> dict[str, Any]:
    """Search one task for rewards; ``{"sequences", "rewards", "hacks": [Hack], "error_writes"}``."""
    judge = _Judge(spec, task)
    tried = rewards = 0
    hacks: list[Hack] = []
    error_writes = 0  # calls that answered an error yet changed the state
    seen: set[tuple[str, int]] = set()

    def judge_seq(kind: str, seq: _Seq) -> None:
        nonlocal rewards
        for answer_kind, answer, why in judge.endings(seq):
            rewards += 1
            if why and not any(h.why == why and h.answer == answer_kind for h in hacks):
                hacks.append(Hack(task.id, kind, why, [c.to_json() for c in seq.calls], answer_kind,
                                  _confirm(spec, task, seq.calls, answer), list(task.answer_facts),
                                  [judge.source(f) for f in task.answer_facts] if why == "answer_not_read" else []))

    for kind, calls in _known_exploits(judge):
        if tried >= budget.sequences:
            break
        tried += 1
        seq = judge.run(calls, track=kind == "malformed")
        error_writes += seq.error_writes
        judge_seq(kind, seq)

    pool0 = instruction_values(task.instruction + "\n" + judge.private)
    schemas = judge.schemas
    frontier = [judge.run([])]
    for _depth in range(budget.depth):
        nxt = []
        for node in frontier:
            pool = list(pool0)
            for o in reversed(node.outputs):
                pool += [v for v in _output_values(o) if v not in pool]
            for c in _calls_for(schemas, pool, budget.values):
                if tried >= budget.sequences:
                    break
                child = judge.run([c], node)
                tried += 1
                h = state_hash(child.state)
                if child.outputs[-1].startswith("Error") and judge.core_of(child) != judge.core_of(node):
                    error_writes += 1
                key = (h, hash(tuple(child.outputs)))
                if key in seen:
                    continue
                seen.add(key)
                judge_seq("search", child)
                nxt.append(child)
        frontier = nxt
        if tried >= budget.sequences:
            break
    deep = budget.guided_to(task)
    guided = None if deep is None else _guided(judge, deep, budget, pool0, seen, judge_seq)
    out: dict[str, Any] = {"sequences": tried, "rewards": rewards, "hacks": hacks, "error_writes": error_writes}
    if guided is not None:  # its rewards and hacks are in the totals above (judge_seq counted them)
        out["guided"] = guided
        out["sequences"] += guided["sequences"]
    return out


def _progress(judge: _Judge, seq: _Seq) -> tuple[int, int, int, int]:
    """How close ``seq`` came to a reward, for the guided search (larger is closer): leaves of
    the task's check already right (or, for a check that lists none, leaves changed), answer
    facts already shown, values the last call read that no earlier output had, and fewer errors."""
    task = judge.task
    expected = getattr(task.check, "expected", None)
    root = json.loads(canonical_json(seq.state))
    if expected:
        right = sum(leaf_at(root, p) == v for p, v in expected)
    else:
        right = len(diff_leaves(state_leaves(judge.start), state_leaves(seq.state)))
    seen_text = normalize_answer("\n".join(seq.outputs))
    facts = sum(normalize_answer(f) in seen_text for f in task.answer_facts)
    fresh = 0
    if seq.outputs and not seq.outputs[-1].startswith("Error"):
        earlier = {json.dumps(v) for o in seq.outputs[:-1] for v in _output_values(o)}
        fresh = len({json.dumps(v) for v in _output_values(seq.outputs[-1])} - earlier)
    errors = sum(o.startswith("Error") for o in seq.outputs)
    return right, facts, min(fresh, 8), -errors


def _guided(judge: _Judge, depth: int, budget: AuditBudget, pool0: list[Any], seen: set[tuple[str, int]],
            judge_seq: Any) -> dict[str, Any]:
    """The guided search: a beam search to ``depth`` over the candidate calls; each new sequence
    goes to ``judge_seq``. Returns its coverage (see the module docstring)."""
    frontier = [judge.run([])]
    tried = 0
    mine: set[tuple[str, int]] = set()
    levels: list[dict[str, Any]] = []
    space = 1.0
    for d in range(1, depth + 1):
        children: list[_Seq] = []
        branching: list[int] = []
        level_tried = 0
        states: set[str] = set()
        for node in frontier:
            calls = _guided_calls(judge, node, pool0, budget.guided_values)
            branching.append(len(calls))
            # the budget left, shared by this depth's nodes and the depths still to go
            cap = max(1, (budget.guided_sequences - tried) // (len(frontier) * (depth - d + 1)))
            for c in calls[:cap]:
                if tried >= budget.guided_sequences:
                    break
                child = judge.run([c], node)
                tried += 1
                level_tried += 1
                states.add(judge.core_of(child))
                key = (state_hash(child.state), hash(tuple(child.outputs)))
                if key in mine:
                    continue
                mine.add(key)
                if key not in seen:  # judged once, whichever search met it first
                    seen.add(key)
                    judge_seq("guided", child)
                children.append(child)
        mean_b = sum(branching) / len(branching) if branching else 0.0
        space *= mean_b
        levels.append({"depth": d, "expanded": len(frontier), "branching": round(mean_b, 1), "tried": level_tried,
                       "states": len(states), "space": round(space), "coverage": _share(level_tried, space)})
        if not children:
            break
        scored = sorted(range(len(children)), key=lambda i: _progress(judge, children[i]), reverse=True)
        kept: list[_Seq] = []
        cores: set[tuple[str, ...]] = set()
        for i in scored:  # the beam: the closest sequences, one per distinct state and knowledge
            core = judge.core_of(children[i])
            known = sorted({json.dumps(v) for o in children[i].outputs if not o.startswith("Error")
                            for v in _output_values(o)})
            if (core, *known) in cores:
                continue
            cores.add((core, *known))
            kept.append(children[i])
            if len(kept) >= budget.beam:
                break
        frontier = kept
        if tried >= budget.guided_sequences:
            break
    total_space = sum(lv["space"] for lv in levels)
    return {"depth": depth, "reached": len(levels), "sequences": tried,
            "states": sum(lv["states"] for lv in levels), "space": round(total_space),
            "coverage": _share(tried, total_space), "levels": levels}


def _guided_calls(judge: _Judge, node: _Seq, pool0: list[Any], k: int) -> list[ToolCall]:
    """The candidate calls from ``node``, those using a value the whole sequence has not used yet
    first: a call already made is a repeat, and a fresh value most often a new row to act on."""
    calls = list(_calls_for(judge.schemas, _guided_pool(pool0, node.outputs), k))
    made = {json.dumps([c.name, c.arguments], sort_keys=True) for c in node.calls}
    used = {json.dumps(v) for c in node.calls for v in c.arguments.values()}

    def rank(c: ToolCall) -> int:
        if json.dumps([c.name, c.arguments], sort_keys=True) in made:
            return 2
        return 0 if any(json.dumps(v) not in used for v in c.arguments.values()) else 1

    return sorted(calls, key=rank)  # stable: the grammar's order within each rank


def _guided_pool(pool0: list[Any], outputs: list[str]) -> list[Any]:
    """Candidate values for the guided search: what the sequence read (newest output first)
    taking turns with the instruction's values, so a few candidates per argument hold both
    the value just read and the ones the instruction names."""
    read: list[Any] = []
    for o in reversed(outputs):
        if not o.startswith("Error"):  # a JSON output's values, not its field names
            read += [v for v in _output_values(o, keys=False) if v not in read]
    pool: list[Any] = []
    for pair in itertools.zip_longest(read, pool0, fillvalue=None):
        pool += [v for v in pair if v is not None and v not in pool]
    return pool


def _share(part: float, whole: float) -> float:
    """``part / whole`` to 4 significant places (0 for an empty whole)."""
    return float(f"{part / whole:.4g}") if whole else 0.0


def _confirm(spec: ToolEnvSpec, task: Task, calls: list[ToolCall], answer: str) -> bool:
    """Replay an exploit through a real (local) episode: does it earn reward there too?"""
    from ..episode import Episode

    from .scripted import PASS

    ep = Episode(spec)
    try:
        ep.reset(task.id)
        if not spec.multi_agent:
            for c in calls:
                if not ep.done:
                    ep.step(c.to_hermes())
            if not ep.done:
                ep.step(answer)
        else:  # each call by its role in turn order, the others passing; then everyone answers
            for c in calls:
                agent = c.agent or ep.agents[0]
                while (nxt := ep.status.next_agent) is not None and nxt != agent:
                    ep.act(nxt, PASS)
                if not ep.done:
                    ep.act(agent, c.to_hermes())
            while (nxt := ep.status.next_agent) is not None:
                ep.act(nxt, answer)
        return bool(ep.success) and max(ep.rewards.values(), default=0.0) > 0
    finally:
        ep.close()


def _spread(tasks: list[Task], n: int | None) -> list[Task]:
    if n is None or n >= len(tasks):
        return list(tasks)
    if n <= 0:
        return []
    step = len(tasks) / n
    return [tasks[int(i * step)] for i in range(n)]


def transcriber_rate(spec: ToolEnvSpec, tasks: list[Task]) -> dict[str, Any]:
    """Play the transcriber (instruction-only calls, outputs never read) on ``tasks``, judged
    like the referee judges; ``{"tasks", "solved", "rate"}``. Tasks whose reference solution
    has a call with a value not in the instruction are reported apart (``needs_lookup``)."""
    policy = TranscriberPolicy()
    tools = spec.tools_of(None)
    solved = lookup = lookup_solved = 0
    by_kind: dict[str, dict[str, int]] = {}
    for task in tasks:
        state = spec.start_state(task)
        actions = policy.plan(task, spec.tool_schemas(), {n for n, t in tools.items() if t.read_only})
        for c in actions[: spec.max_turns - 1]:
            t = tools.get(c.name)
            if t is not None and not t.finish:
                t.invoke(state, c.arguments)
        ok = task.success(state, "Done.")
        solved += ok
        k = by_kind.setdefault(task.kind, {"tasks": 0, "solved": 0})
        k["tasks"] += 1
        k["solved"] += ok
        if _needs_lookup(task, tools):
            lookup += 1
            lookup_solved += ok
    n = len(tasks)
    return {"tasks": n, "solved": solved, "rate": round(solved / n, 3) if n else 0.0,
            "needs_lookup": lookup, "needs_lookup_solved": lookup_solved,
            "needs_lookup_rate": round(lookup_solved / lookup, 3) if lookup else None,
            "by_kind": dict(sorted(by_kind.items()))}


def _needs_lookup(task: Task, tools: dict[str, Any]) -> bool:
    """Whether the task needs information the instruction does not give: an answer fact, or a
    reference write with an argument value that does not occur in the instruction."""
    if task.answer_facts:
        return True
    text = normalize_answer(task.instruction)
    for c in task.solution:
        t = tools.get(c.name)
        if t is None or t.read_only:
            continue
        for v in c.arguments.values():
            if not _literal_in(v, text):
                return True
    return False


def _literal_in(v: Any, text: str) -> bool:
    if isinstance(v, bool) or v is None:
        return True  # a flag, not a fact
    if isinstance(v, (int, float)):
        forms = {str(v), f"{v:.2f}" if isinstance(v, float) else str(v)}
        if isinstance(v, float) and v.is_integer():
            forms.add(str(int(v)))
        return any(re.search(rf"(?<![\w.]){re.escape(f)}(?![\w]|\.\d)", text) for f in forms)
    if isinstance(v, str):
        return normalize_answer(v) in text
    if isinstance(v, list):
        return all(_literal_in(x, text) for x in v)
    return False


def audit_spec(spec: ToolEnvSpec, budget: AuditBudget = QUICK) -> dict[str, Any]:
    """Audit one environment: the search's budget and result, and the transcriber's rate."""
    start = time.perf_counter()
    doc: dict[str, Any] = {"budget": {k: v for k, v in asdict(budget).items()}}
    tasks = spec.get_tasks()
    chosen = _spread(tasks, budget.tasks)
    seqs = rewards = error_writes = 0
    hacks: list[Hack] = []
    guided: list[dict[str, Any]] = []
    for task in chosen:
        r = audit_task(spec, task, budget)
        if "guided" in r:
            guided.append(r["guided"])
        seqs += r["sequences"]
        rewards += r["rewards"]
        error_writes += r["error_writes"]
        hacks += r["hacks"]
    whys: dict[str, set[str]] = {}
    for h in hacks:
        whys.setdefault(h.why, set()).add(h.task)
    doc.update(tasks_searched=len(chosen), sequences=seqs, rewards=rewards,
               hacks=len({h.task for h in hacks}), hacks_by_why={k: len(v) for k, v in sorted(whys.items())},
               error_writes=error_writes,
               hacked_tasks=sorted({h.task for h in hacks}),
               examples=[h.to_json() for h in hacks[:5]],
               transcriber=None if spec.multi_agent else transcriber_rate(spec, _spread(tasks,
                                                                                     budget.transcriber_tasks)),
               seconds=round(time.perf_counter() - start, 3))
    if budget.guided_depth is not None:
        doc["guided"] = guided_totals(guided)
    return doc


def guided_totals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The guided searches of several tasks together: how deep they were asked to go and went,
    the sequences tried and states reached, and the share of the call-sequence space tried."""
    space = sum(r["space"] for r in runs)
    tried = sum(r["sequences"] for r in runs)
    return {"tasks": len(runs),
            "mean_depth": round(sum(r["depth"] for r in runs) / len(runs), 2) if runs else 0.0,
            "max_depth": max((r["depth"] for r in runs), default=0),
            "mean_reached": round(sum(r["reached"] for r in runs) / len(runs), 2) if runs else 0.0,
            "reached_depth": sum(r["reached"] >= r["depth"] for r in runs),
            "sequences": tried, "states": sum(r["states"] for r in runs), "space": space,
            "coverage": _share(tried, space)}
