"""Task synthesis: walk the tool graph from sampled initial states.

For each task: sample an initial state; walk ``k`` tool calls whose arguments
are drawn from the current state (see :mod:`~envfactory.factory.tasks.arguments`), keeping only calls
that succeed and change the world; the walk is the reference solution, and the
success check is what it changed (:class:`~envfactory.factory.tasks.success.ChangeCheck`). A read-only
walk (one look-up) instead asks for a fact its output reveals. Instructions are
templated from the tools' docs (or per-tool templates); difficulty is the walk
length. Duplicates, tasks the initial state already satisfies, and tasks that a
random agent or a bare claim can solve are dropped.
"""

from __future__ import annotations

import json
import random
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from envfactory.checks.scripted import CLAIM, RandomPolicy
from envfactory.parsing import parse_action
from envfactory.state import State, copy_state, state_hash
from envfactory.task import Task, ToolCall, normalize_answer
from envfactory.tooling import Tool
from envfactory.factory.tasks.arguments import ArgSource, draw_arguments, is_free
from envfactory.factory.tasks.success import ChangeCheck, state_leaves

__all__ = ["SynthConfig", "synthesize", "synthesize_for", "render_call"]


@dataclass
class SynthConfig:
    """How to synthesize tasks for one environment.

    Attributes:
        sample_state: ``f(rng) -> State``: an initial state (seeded).
        arguments: Argument sources by ``"tool.param"`` or ``"param"``.
        templates: Instruction templates by tool name, with ``{param}`` fields.
        exclude: Tools never used in walks.
        lengths: Walk lengths (difficulty levels) of mutation tasks, cycled.
        read_share: Fraction of tasks that are read-only look-ups with a fact.
        prefix: Task id prefix.
    """

    sample_state: Callable[[random.Random], State]
    arguments: dict[str, ArgSource] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)
    exclude: set[str] = field(default_factory=set)
    lengths: tuple[int, ...] = (1, 2, 3, 4, 5)
    read_share: float = 0.2
    prefix: str = "syn"


def _value_text(v: Any) -> str:
    return f"'{v}'" if isinstance(v, str) else json.dumps(v)


def render_call(t: Tool, arguments: dict[str, Any], templates: dict[str, str]) -> str:
    """One step of an instruction, from the tool's template or its description."""
    if t.name in templates:
        values = {k: (v if v is not None else "none") for k, v in arguments.items()}
        for k in t.parameters.get("properties", {}):
            values.setdefault(k, "any")
        return templates[t.name].format(**values)
    desc = t.description.strip().rstrip(".")
    desc = desc[0].lower() + desc[1:] if desc else t.name
    if not arguments:
        return desc
    parts = ", ".join(f"{k.replace('_', ' ')} {_value_text(v)}" for k, v in arguments.items())
    return f"{desc} ({parts})"


def _join_steps(steps: list[str]) -> str:
    if len(steps) == 1:
        s = steps[0]
        return s[0].upper() + s[1:] + "."
    body = "\n".join(f"{i}. {s[0].upper() + s[1:]}." for i, s in enumerate(steps, 1))
    return "Do the following, in this order:\n" + body


BANNED_ANSWERS = "I can't do that. " + CLAIM + " task complete done"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _fact(output: str, leaves: dict, instruction: str) -> tuple[str, str] | None:
    """A (question, fact) pair the look-up's output answers, not given away by the text."""
    inst = normalize_answer(instruction)
    banned = normalize_answer(BANNED_ANSWERS)
    out_norm = normalize_answer(output)

    def usable(fact: str) -> bool:
        f = normalize_answer(fact)
        return 2 <= len(f) <= 40 and f in out_norm and f not in inst and f not in banned

    for path, value in sorted(leaves.items()):
        if len(path) < 2 or isinstance(value, (dict, list, bool)) or value is None:
            continue
        owner, fname = path[-2], path[-1]
        if fname.startswith("private") or not usable(str(value)):
            continue
        question = f"tell me the {fname.replace('_', ' ')} of {owner}"
        if (normalize_answer(owner) in out_norm and normalize_answer(owner) not in ("", fname)
                and normalize_answer(str(value)) not in normalize_answer(question)):
            return question, str(value)
    for num in reversed(_NUMBER.findall(output)):
        if usable(num) and not re.search(rf"(?<![\d.]){re.escape(num)}(?![\d.])", instruction):
            return "tell me the amount it reports", num
    return None


def _random_solves(task: Task, tools: dict[str, Tool], seeds: Sequence[int]) -> bool:
    """Whether a seeded random agent (another seed space than the verifier's) solves it."""
    schemas = [t.schema() for t in tools.values()]
    for seed in seeds:
        state = copy_state(task.initial_state)
        actions = RandomPolicy().actions(task, schemas, seed)
        for a in actions[:-1]:
            for c in parse_action(a).calls:
                t = tools.get(c.name)
                if t is not None and not t.finish:
                    t.invoke(state, c.arguments)
        if task.success(state, actions[-1]):
            return True
    return False


def _walk(
    tools: list[Tool], state: State, length: int, cfg: SynthConfig, rng: random.Random
) -> tuple[list[ToolCall], list[str], State] | None:
    calls: list[ToolCall] = []
    steps: list[str] = []
    free = False
    for _ in range(length):
        for _attempt in range(16):
            drawn = _random_call(tools, state, cfg, rng)
            if drawn is None:
                continue
            t, args, trial = drawn
            before = state_hash(trial)
            if not t.invoke(trial, args).ok or state_hash(trial) == before:
                continue
            props = t.parameters.get("properties", {})
            free = free or any(is_free(props[k]) for k in args)
            calls.append(ToolCall(t.name, args))
            steps.append(render_call(t, args, cfg.templates))
            state = trial
            break
        else:
            return None
    return (calls, steps, state) if free else None


def synthesize(
    tools: dict[str, Tool], cfg: SynthConfig, n: int, seed: int = 0, max_tries: int | None = None
) -> list[Task]:
    """``n`` tasks (fewer only if the tool graph cannot yield that many distinct ones).

    Deterministic in ``seed``: the same tools, config and seed give the same tasks.
    """
    rng = random.Random(seed)
    usable = [t for name, t in tools.items() if not t.finish and name not in cfg.exclude]
    if not usable:
        raise ValueError("task synthesis needs at least one tool that is not excluded")
    guessable = _guessable_calls(tools)
    seen: set[str] = set()
    out: list[Task] = []
    tries = 0
    max_tries = max_tries or 40 * n
    while len(out) < n and tries < max_tries:
        tries += 1
        initial = cfg.sample_state(rng)
        read = rng.random() < cfg.read_share
        length = 1 if read else cfg.lengths[len(out) % len(cfg.lengths)]
        task = _read_task(usable, initial, cfg, rng) if read else _change_task(
            usable, initial, length, cfg, rng)
        if task is None:
            continue
        instruction, solution, check, facts = task
        key = state_hash(initial) + "|" + instruction
        if key in seen:
            continue
        t = Task(id=f"{cfg.prefix}-{seed}-{len(out):03d}", instruction=instruction,
                 initial_state=initial, solution=solution, answer_facts=facts, check=check,
                 difficulty=len(solution))
        if t.success(initial, BANNED_ANSWERS) or _random_solves(t, tools, _seeds(t.id)):
            continue
        if not facts and (not _anchored(solution, tools, check) or _blindly_reachable(t, tools, guessable)):
            continue
        seen.add(key)
        out.append(t)
    return out


def _seeds(task_id: str) -> list[int]:
    return [zlib.crc32(f"synth/{task_id}/{k}".encode()) & 0x7FFFFFFF for k in range(4)]


def _guessable_calls(tools: dict[str, Tool], limit: int = 24) -> list[ToolCall]:
    """Every call whose arguments can be guessed from the schema alone (enums,
    booleans, no arguments): the moves a blind agent can make without knowing the world."""
    import itertools

    out: list[ToolCall] = []
    for t in tools.values():
        if t.finish or t.read_only:
            continue
        props = t.parameters.get("properties", {})
        required = set(t.parameters.get("required", []))
        choices: list[list[tuple[str, Any]]] = []
        for name, sch in props.items():
            if is_free(sch):
                if name in required:
                    break
                continue
            opts = sch.get("enum") or [o.get("const") for o in sch.get("anyOf", []) if "const" in o]
            for o in sch.get("anyOf", []):
                opts = opts or o.get("enum") or ([True, False] if o.get("type") == "boolean" else [])
            opts = opts or ([True, False] if sch.get("type") == "boolean" else [])
            if not opts:
                break
            choices.append([(name, v) for v in opts])
        else:
            for combo in itertools.islice(itertools.product(*choices), limit):
                out.append(ToolCall(t.name, dict(combo)))
    return out


def _blindly_reachable(task: Task, tools: dict[str, Tool], calls: list[ToolCall],
                       depth: int = 2) -> bool:
    """Whether up to ``depth`` guessable calls reach a state that passes the check."""
    frontier = [task.initial_state]
    for _ in range(depth):
        nxt = []
        for st in frontier:
            before = state_hash(st)
            for c in calls:
                s2 = copy_state(st)
                if tools[c.name].invoke(s2, c.arguments).ok and state_hash(s2) != before:
                    if task.state_ok(s2):
                        return True
                    nxt.append(s2)
        frontier = nxt[:16]
    return False


def _anchored(calls: list[ToolCall], tools: dict[str, Tool], check: ChangeCheck) -> bool:
    """Whether what the walk changed mentions a value only the walk's free arguments carry
    (so the change cannot be a side effect any call would have, such as a counter)."""
    free: set[str] = set()
    for c in calls:
        props = tools[c.name].parameters.get("properties", {})
        free |= {str(v) for k, v in c.arguments.items() if k in props and is_free(props[k])}
    for path, value in check.expected:
        if free & set(path) or (isinstance(value, (str, int, float)) and str(value) in free):
            return True
        if isinstance(value, (list, dict)) and any(f in json.dumps(value) for f in free):
            return True
    return False


def _change_task(tools, initial, length, cfg, rng):
    walk = _walk(tools, copy_state(initial), length, cfg, rng)
    if walk is None:
        return None
    calls, steps, final = walk
    check = ChangeCheck.from_states(initial, final)
    if not check:
        return None
    return _join_steps(steps), calls, check, []


def _random_call(tools: list[Tool], state: State, cfg: SynthConfig, rng: random.Random
                 ) -> tuple[Tool, dict[str, Any], State] | None:
    """A random tool, arguments drawn for it from ``state`` and a copy of ``state`` to try the call
    on; ``None`` when no arguments could be drawn (the caller draws again)."""
    t = tools[rng.randrange(len(tools))]
    args = draw_arguments(t.name, t.parameters, json.loads(state.model_dump_json()), cfg.arguments, rng)
    return None if args is None else (t, args, copy_state(state))


def _read_task(tools, initial, cfg, rng):
    for _attempt in range(16):
        drawn = _random_call(tools, initial, cfg, rng)
        if drawn is None:
            continue
        t, args, probe = drawn
        out = t.invoke(probe, args)
        if not out.ok or state_hash(probe) != state_hash(initial):
            continue
        step = render_call(t, args, cfg.templates)
        found = _fact(out.content, state_leaves(initial), step)
        if found is None:
            continue
        question, fact = found
        instruction = f"{step[0].upper() + step[1:]}, and {question}."
        # The state must stay as it is: a look-up task checks nothing else.
        return instruction, [ToolCall(t.name, args)], _unchanged(initial), [fact]
    return None


def _unchanged(initial: State) -> Callable[[State], bool]:
    leaves = state_leaves(initial)
    return ChangeCheck(tuple(sorted(leaves.items(), key=lambda kv: kv[0])))


def synthesize_for(spec: Any, n: int = 60, seed: int = 0) -> list[Task]:
    """Synthesize tasks for a registered spec from its ``metadata["synth"]`` config.

    Without one, initial states are drawn from the spec's existing tasks.
    """
    cfg = spec.metadata.get("synth") if hasattr(spec, "metadata") else None
    if cfg is None:
        states = {state_hash(t.initial_state): t.initial_state for t in spec.get_tasks()}
        pool = [states[k] for k in sorted(states)]
        cfg = SynthConfig(sample_state=lambda rng: copy_state(pool[rng.randrange(len(pool))]),
                          prefix=spec.name.split("-")[0].lower())
    return synthesize(spec.all_tools, cfg, n, seed)
