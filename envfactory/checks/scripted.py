"""Scripted agents for any number of roles: verification, demos and baselines (no model involved).

A :class:`RolePolicy` answers ``act(episode, agent, seed) -> action`` for the agent whose
turn it is, on a live :class:`~envfactory.episode.Episode` (one agent or a team, any
runtime). It is the one contract :func:`play`, verification and evaluation accept.
Scripted policies may read the episode (the oracle follows the task's reference
solution by looking at which steps were done); a language model plays through an
adapter (``agents.policies.policy_spec.LLMRolePolicy`` wraps a token-level
``agents.policies.policy.Policy``) that reads only ``episode.transcript(agent)`` and
``episode.tool_schemas(agent)``.

* :class:`OraclePolicy`: plays the agent's own steps of the (joint) reference
  solution when they are next and passes otherwise; once the plan is done, a
  sole agent answers with the answer facts and a team member calls ``finish``;
* :class:`NoopPolicy`: always passes; :class:`ClaimPolicy`: claims success
  without acting (the reward must not believe claims);
* :class:`RandomPolicy`: schema-typed random calls with the agent's own tools,
  then a claim;
* :class:`ScriptPolicy`: a fixed list of actions (verification plays a team's
  whole joint solution with one role alone through it);
* :class:`TranscriberPolicy`: copies values from the instruction into write calls and
  never reads a tool output (the reward-hacking audit's baseline, :mod:`envfactory.checks.audit`).

:func:`play` plays an episode with one policy per agent (or one for all) in
turn order (``aec``) or simultaneous rounds (``parallel``; the same thing for
one agent).
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, runtime_checkable

from ..env import EpisodeError
from ..state import canonical_json
from ..task import Task, ToolCall

if TYPE_CHECKING:
    from ..episode import Episode

__all__ = ["RolePolicy", "OraclePolicy", "NoopPolicy", "ClaimPolicy", "RandomPolicy", "ScriptPolicy", "Outcome",
           "play", "episode_trace", "plan_progress", "scripted_policy", "SCRIPTED", "MODES", "PASS", "CLAIM",
           "redundant_calls", "random_value", "legal_moves", "TranscriberPolicy", "instruction_values"]

MODES = ("aec", "parallel")
PASS = "I have nothing to do this turn."
CLAIM = ("I have completed the task successfully. Everything you asked for is done and verified. "
         "<success>true</success> reward=1")


def _task(episode: "Episode") -> Task:
    """The task being played; a policy asked to act before ``reset`` gets a clear error."""
    if episode.task is None:
        raise EpisodeError(f"{episode.spec.name}: call reset() before asking a policy to act")
    return episode.task


@runtime_checkable
class RolePolicy(Protocol):
    """Whatever plays a role in an episode: a scripted agent, an environment's expert, or a
    model behind an adapter.

    ``name`` labels it in reports. An optional class attribute ``stochastic`` (default
    ``True`` where absent) says whether repeated episodes with other seeds can differ;
    evaluation plays deterministic policies once per task.
    """

    name: str

    def act(self, episode: "Episode", agent: str, seed: int) -> Any:
        """The action of ``agent`` for its turn now: an assistant message (text, or parsed
        tool calls). ``seed`` is the same for the whole episode; a stochastic policy draws
        from it."""


def _args_equal(logged: Any, planned: dict[str, Any]) -> bool:
    # the log holds arguments parsed back from JSON (tuples became lists)
    return logged == planned or logged == json.loads(json.dumps(planned, default=str))


def plan_progress(episode: "Episode") -> int:
    """How many leading steps of the task's (joint) solution were done successfully, in order."""
    plan, k, first = _task(episode).solution, 0, episode.agents[0]
    for e in episode.status.log:
        if k < len(plan) and e["ok"]:
            step = plan[k]
            if e["agent"] == (step.agent or first) and e["name"] == step.name and _args_equal(e["arguments"],
                                                                                            step.arguments):
                k += 1
    return k


def _answer(task: Task) -> str:
    return "Done. " + " ".join(task.answer_facts)


def _closing(episode: "Episode", agent: str) -> str:
    """The oracle's last word: a sole agent answers; a team member calls ``finish``
    (a pass ends a team's episode only when every agent passes)."""
    if len(episode.agents) == 1 or "finish" not in episode.spec.tools_of(agent):
        return _answer(_task(episode))
    return ToolCall("finish", {"answer": _answer(_task(episode)).strip()}).to_hermes()


def _converse(episode: "Episode", task: Task, k: int) -> str:
    """The oracle in a conversation: in the user turn under way, ask the user for the facts its
    next reference call needs (those not told yet), make the call, and when the turn's calls are
    done answer: what the user must be told, and on the last turn the answer facts."""
    conv = task.conversation
    status = episode.status.conversation
    assert conv is not None and status is not None
    t = status["turn"]
    end = sum(len(turn.solution) for turn in conv.turns[:t + 1])
    if k < end:
        call = task.solution[k]
        wanted = json.dumps(call.arguments, ensure_ascii=False).lower()
        need = [name for name, value in conv.facts.items()
                if name not in status["told"] and value.lower() in wanted]
        if need:
            return "Could you tell me your " + " and your ".join(need) + "?"
        return call.to_hermes()
    transcript = episode.transcript()
    shown = [(m["content"] or "").lower() for m in transcript if m["role"] == "tool"]
    said = [(m["content"] or "").lower() for m in transcript if m["role"] == "assistant" and not m.get("tool_calls")]
    told = [f for f in conv.communicate  # what it has read and not yet told
            if any(f.lower() in r for r in shown) and not any(f.lower() in a for a in said)]
    last = t + 1 == len(conv.turns)
    return " ".join(part for part in (_answer(task).strip() if last else "Done.", *told) if part)


class OraclePolicy:
    """Plays the agent's steps of the (joint) reference solution as they come up."""

    name = "oracle"
    stochastic = False

    def act(self, episode: "Episode", agent: str, seed: int) -> Any:
        task = _task(episode)
        plan = task.solution
        k = plan_progress(episode)
        if task.conversation is not None:
            return _converse(episode, task, k)
        if k == len(plan):
            return _closing(episode, agent)
        return plan[k].to_hermes() if (plan[k].agent or episode.agents[0]) == agent else PASS

    @staticmethod
    def actions(task: Task) -> list[str]:
        """What this policy plays on a one-agent ``task``: the reference solution as Hermes
        tool calls, one per turn, then the answer with the facts."""
        return [c.to_hermes() for c in task.solution] + [_answer(task)]


class NoopPolicy:
    """Always passes."""

    name = "noop"
    stochastic = False

    def act(self, episode: "Episode", agent: str, seed: int) -> Any:
        return PASS


class ClaimPolicy:
    """Claims success without doing anything."""

    name = "claim"
    stochastic = False

    def act(self, episode: "Episode", agent: str, seed: int) -> Any:
        return CLAIM


class RandomPolicy:
    """A random player of the action space the environment offers. Seeded by task, agent and
    ``seed``.

    * Where the environment lists its legal moves (``spec.legal_actions``, a game's move
      list), every turn it plays one of the moves legal now, drawn uniformly, for the whole
      episode (passing when it has none): a uniformly random player of the game, which never
      breaks a rule and never claims anything.
    * Otherwise it makes ``turns`` calls of the agent's own tools with arguments drawn from
      their schemas (an enum member, an integer or number within the schema's bounds, ...),
      then claims success quoting the instruction, then passes."""

    name = "random"
    stochastic = True

    def __init__(self, turns: int = 6) -> None:
        self.turns = turns
        self._last: dict[str, tuple[Any, list[str]]] = {}  # agent -> (episode key, its actions)

    def act(self, episode: "Episode", agent: str, seed: int) -> Any:
        task = _task(episode)
        if getattr(episode.spec, "legal_actions", None) is not None:
            i = episode.status.turns_taken(agent)
            moves = legal_moves(episode, agent)
            if not moves:
                return PASS
            rng = random.Random(zlib.crc32(f"{task.id}/{agent}/{seed}/{i}".encode()) & 0x7FFFFFFF)
            move = rng.choice(moves)
            return move.to_hermes() if isinstance(move, ToolCall) else move
        key = (episode.spec.name, task.id, seed)
        cached = self._last.get(agent)
        if cached is None or cached[0] != key:
            s = zlib.crc32(f"{task.id}/{agent}/{seed}".encode()) & 0x7FFFFFFF
            cached = self._last[agent] = (key, self.actions(task, episode.tool_schemas(agent), s))
        actions, i = cached[1], episode.status.turns_taken(agent)
        return actions[i] if i < len(actions) else PASS

    def actions(self, task: Task, tool_schemas: list[dict[str, Any]], seed: int) -> list[str]:
        """The whole schema-drawn script for one agent with ``tool_schemas``, seeded by ``seed``
        alone: the random tool calls (``finish`` drawn is skipped), then a claim of success that
        quotes random words of the instruction."""
        rng = random.Random(seed)
        words = [w.strip(".,:;'\"()") for w in task.instruction.split()]
        words = [w for w in words if w]
        actions = []
        for _ in range(self.turns):
            fn = rng.choice(tool_schemas)["function"]
            if fn["name"] == "finish":
                continue
            props = fn["parameters"].get("properties", {})
            args = {k: random_value(v, rng) for k, v in props.items()}
            actions.append(f'<tool_call>{json.dumps({"name": fn["name"], "arguments": args})}</tool_call>')
        actions.append("Task complete. " + " ".join(rng.sample(words, min(3, len(words)))))
        return actions


def legal_moves(episode: "Episode", agent: str) -> list[Any]:
    """The moves ``agent`` may legally make now, by the environment's ``legal_actions`` hook
    (``None`` where the environment has none), asked on the state as ``agent``'s tools would see
    it this turn (``acting`` and ``round`` set, for a team)."""
    hook = getattr(episode.spec, "legal_actions", None)
    if hook is None:
        return None  # type: ignore[return-value]
    state = episode.state
    if hasattr(state, "acting"):
        state = state.model_copy(update={"acting": agent, "round": episode.status.round})
    return list(hook(state, agent))


def _bounded(schema: dict[str, Any], lo: float, hi: float, step: float) -> tuple[float, float]:
    """The schema's bounds (``minimum``/``maximum``, or the exclusive ones moved in by ``step``), with
    ``(lo, hi)`` standing in for a missing side: a bound on one side clips the default range."""
    low = schema.get("minimum", schema["exclusiveMinimum"] + step if "exclusiveMinimum" in schema else None)
    high = schema.get("maximum", schema["exclusiveMaximum"] - step if "exclusiveMaximum" in schema else None)
    if low is not None and high is not None:
        return low, max(low, high)
    if low is not None:
        return low, max(hi, low)
    if high is not None:
        return min(lo, high), high
    return lo, hi


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghij/-_ 0123") for _ in range(rng.randint(1, 12)))


def random_value(schema: dict[str, Any], rng: random.Random, *, ints: tuple[int, int] = (-1000, 1000),
                 numbers: tuple[float, float] = (-1000, 1000),
                 text: Callable[[random.Random], str] = _random_text) -> Any:
    """A random value of a JSON-schema type: an enum member (or the ``const``), an integer in
    ``ints``, a number in ``numbers`` (2 decimals), both narrowed to the schema's bounds
    (``minimum``, ``maximum`` and their exclusive forms), a boolean, a short array, ``{}``, or
    ``text(rng)``."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"] or schema["anyOf"]
        return random_value(rng.choice(options), rng, ints=ints, numbers=numbers, text=text)
    t = schema.get("type")
    if t == "integer":
        lo, hi = _bounded(schema, *ints, 1)
        lo, hi = math.ceil(lo), math.floor(hi)
        return rng.randint(lo, max(lo, hi))
    if t == "number":
        lo, hi = _bounded(schema, *numbers, 0.01)
        return round(rng.uniform(lo, hi), 2)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "array":
        return [random_value(schema.get("items", {}), rng, ints=ints, numbers=numbers, text=text)
                for _ in range(rng.randint(0, 2))]
    if t == "object":
        return {}
    return text(rng)


@dataclass
class ScriptPolicy:
    """Plays ``actions`` one per turn (a :class:`ToolCall` as Hermes text, anything else as
    is); then, with ``finish``, the oracle's closing move once; then passes."""

    actions: list[Any]
    finish: bool = False
    name: str = "script"
    stochastic = False

    def act(self, episode: "Episode", agent: str, seed: int) -> Any:
        i = episode.status.turns_taken(agent)
        if i < len(self.actions):
            a = self.actions[i]
            return a.to_hermes() if isinstance(a, ToolCall) else a
        if self.finish and i == len(self.actions):
            return _closing(episode, agent)
        return PASS


_QUOTED = re.compile(r"'([^'\n]{1,80})'|\"([^\"\n]{1,80})\"")
_ID = re.compile(r"(?<![\w@./-])(?:/[\w.-]+)+/?|[\w.+-]+@[\w-]+(?:\.[\w-]+)+|"
                 r"\b[A-Za-z][A-Za-z0-9]*(?:[-_.][A-Za-z0-9]+)*[-_.]?\d[A-Za-z0-9]*(?:[-_.][A-Za-z0-9]+)*\b")
_NUM = re.compile(r"(?<![\w.-])-?\d+(?:\.\d+)?(?![\w-]|\.\d)")
_WORD = re.compile(r"\b[a-zA-Z][a-zA-Z]{2,}\b")
_STOP = set("the and for with from into onto then that this these those its his her their our your you what "
            "which who whom where when how are was were has have had not but all any each every some one two "
            "make sure also now please answer number only exactly following order use using tell show "
            "give report new set get".split())


@functools.lru_cache(maxsize=4096)
def _spans(text: str) -> tuple[tuple[int, Any, str], ...]:
    """``(position, value, kind)`` of the values written in ``text``: quoted strings, ids
    (``ACC-200``, paths, e-mail addresses), numbers and plain words, in text order."""
    out: list[tuple[int, Any, str]] = []
    taken: list[tuple[int, int]] = []

    def free(a: int, b: int) -> bool:
        return all(b <= x or a >= y for x, y in taken)

    for m in _QUOTED.finditer(text):
        g = 1 if m.group(1) is not None else 2
        out.append((m.start(g), m.group(g), "quoted"))
        taken.append(m.span())
    for m in _ID.finditer(text):
        if free(*m.span()) and not _NUM.fullmatch(m.group()):
            out.append((m.start(), m.group().rstrip("."), "id"))
            taken.append(m.span())
    for m in _NUM.finditer(text):
        if free(*m.span()):
            num = m.group()
            out.append((m.start(), float(num) if "." in num else int(num), "number"))
            taken.append(m.span())
    for m in _WORD.finditer(text):
        if free(*m.span()) and m.group().lower() not in _STOP:
            out.append((m.start(), m.group(), "word"))
    return tuple(sorted(out, key=lambda x: x[0]))


def instruction_values(text: str) -> list[Any]:
    """The values written in ``text``, most specific first: quoted strings, ids, numbers, words."""
    rank = {"quoted": 0, "id": 1, "number": 2, "word": 3}
    out: list[Any] = []
    for _, v, _k in sorted(_spans(text), key=lambda x: (rank[x[2]], x[0])):
        if v not in out:
            out.append(v)
    return out


def _stem(w: str) -> str:
    w = w.lower()
    return w[:5] if len(w) > 5 else w


def _clauses(text: str) -> list[str]:
    parts = re.split(r"(?<=[.;!?])\s+|\n+|,?\s+then\s+|,\s+and\s+", text)
    return [p for p in parts if p and p.strip()]


class TranscriberPolicy:
    """Copies the instruction into write calls, never reading a tool output.

    For each clause of the instruction (sentences, lines, "then"), it calls the write tool
    whose name and description share the most words with the clause among those whose
    required arguments can all be filled with values written in that clause (an argument
    takes the value written after its name, else the next unused value of its type;
    optional arguments only when named). Every argument value appears literally in the
    instruction. Then it answers ``Done.``: it never read anything to report."""

    name = "transcriber"
    stochastic = False

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], list[str]] = {}

    def act(self, episode: "Episode", agent: str, seed: int) -> Any:
        key = (episode.spec.name, _task(episode).id)
        if key not in self._cache:
            tools = episode.spec.tools_of(agent)
            read_only = {n for n, t in tools.items() if t.read_only}
            self._cache[key] = [c.to_hermes() for c in self.plan(_task(episode), episode.tool_schemas(agent),
                                                                 read_only)]
            self._cache[key].append("Done.")
        actions, i = self._cache[key], episode.status.turns_taken(agent)
        return actions[i] if i < len(actions) else PASS

    def plan(self, task: Task, tool_schemas: list[dict[str, Any]],
             read_only: set[str] | None = None) -> list[ToolCall]:
        """The calls for ``task`` (``read_only``: the look-up tools' names; by default guessed
        from the names, as schemas do not say)."""
        calls = []
        writes = [s["function"] for s in tool_schemas if s["function"]["name"] != "finish" and not (
            s["function"]["name"] in read_only if read_only is not None else _looks_read_only(s["function"]))]
        keys = []
        for fn in writes:
            desc = fn.get("description", "").split(".")[0]
            keys.append(({_stem(w) for w in fn["name"].split("_") if len(w) > 2},
                         {_stem(w) for w in _WORD.findall(desc) if w.lower() not in _STOP}))
        for clause in _clauses(task.instruction):
            words = {_stem(w) for w in _WORD.findall(clause) if w.lower() not in _STOP}
            if not words:
                continue
            scored = [(2 * len(words & name_words) + len(words & desc_words), i)
                      for i, (name_words, desc_words) in enumerate(keys)]
            for score, i in sorted((x for x in scored if x[0] > 0), key=lambda x: (-x[0], x[1])):
                args = _fill(writes[i], clause)  # the best-matching tool whose arguments can be filled
                if args is not None:
                    calls.append(ToolCall(writes[i]["name"], args))
                    break
        return calls


def _looks_read_only(fn: dict[str, Any]) -> bool:
    """Schemas do not say which tools write; a tool named like a look-up is taken as one."""
    return fn["name"].split("_")[0] in ("get", "list", "read", "search", "find", "show", "view", "lookup",
                                        "locate", "check", "query", "count", "sum", "describe")


def _fill(fn: dict[str, Any], clause: str) -> dict[str, Any] | None:
    """Arguments for ``fn`` from the values written in ``clause``, or ``None`` when a required
    one has no value there."""
    params = fn["parameters"]
    props, required = params.get("properties", {}), set(params.get("required", []))
    spans = _spans(clause)
    low = clause.lower()
    used: set[int] = set()
    args: dict[str, Any] = {}
    for name, sch in props.items():
        s = sch
        if "anyOf" in s:
            s = next((o for o in s["anyOf"] if o.get("type") != "null"), s)
        fits = [(i, p, v) for i, (p, v, k) in enumerate(spans) if i not in used and _fits_type(s, v, k)]
        phrase = name.replace("_", " ").lower()
        at, end = low.find(phrase), -1
        if at >= 0:
            end = at + len(phrase)
        else:
            for w in name.lower().split("_"):
                found = re.search(rf"\b{re.escape(w)}", low) if len(w) > 2 else None
                if found:
                    at = found.start()
                    end = at + len(w)
                    break
        chosen = None
        if end >= 0:  # the value written right after the argument's name; words only when nothing else is
            after = [(p - end + (40 if spans[i][2] == "word" else 0), i, v) for i, p, v in fits
                     if 0 <= p - end <= 40]
            if after:
                _, i, v = min(after, key=lambda x: x[0])
                chosen = (i, v)
        if chosen is None and name in required and fits:
            strong = [f for f in fits if spans[f[0]][2] != "word"] or fits
            chosen = (strong[0][0], strong[0][2])
        if chosen is None:
            if name in required:
                return None
            continue
        used.add(chosen[0])
        v = chosen[1]
        if "enum" in s:
            v = next(e for e in s["enum"] if str(e).lower() == str(v).lower())
        elif s.get("type") == "number" and isinstance(v, int):
            v = float(v)
        elif s.get("type") == "array":
            v = [v]
        args[name] = v
    return args


def _fits_type(s: dict[str, Any], v: Any, kind: str) -> bool:
    if "enum" in s:
        return any(str(e).lower() == str(v).lower() for e in s["enum"])
    t = s.get("type")
    if t == "integer":
        return isinstance(v, int)
    if t == "number":
        return isinstance(v, (int, float))
    if t == "boolean":
        return False
    if t == "array":
        return _fits_type(s.get("items", {}), v, kind)
    if t in ("string", None):
        return isinstance(v, str)
    return False


SCRIPTED = ("oracle", "random", "noop", "claim")


def scripted_policy(name: str) -> RolePolicy:
    """A scripted policy by name: ``oracle``, ``random``, ``noop`` or ``claim``."""
    kinds = {"oracle": OraclePolicy, "random": RandomPolicy, "noop": NoopPolicy, "claim": ClaimPolicy}
    try:
        return kinds[name]()
    except KeyError:
        raise KeyError(f"no scripted policy {name!r}; choose one of {', '.join(SCRIPTED)}") from None


@dataclass
class Outcome:
    """One episode, summarised (for verification and evaluation).

    ``messages`` counts the letters a team sent (0 for one agent); ``calls`` the
    tool calls; ``errors`` failed calls by kind; ``redundant`` successful calls
    repeating an earlier one; ``turns`` the turns played by all agents.
    """

    env: str
    task_id: str
    mode: str
    success: bool
    rewards: dict[str, float]
    rounds: int
    ended_by: str
    messages: int = 0
    calls: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    redundant: int = 0
    turns: int = 0
    terminated: bool = False
    truncated: bool = False
    log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reward(self) -> float:
        """The sole agent's reward (for a team: the first role's)."""
        return next(iter(self.rewards.values()), 0.0)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "log"}


def redundant_calls(log: list[dict[str, Any]]) -> int:
    """Successful calls that repeat an earlier successful call (same tool and arguments, by anyone)."""
    seen, n = set(), 0
    for e in log:
        if not e["ok"] or e["name"] in (None, "send_message", "read_messages", "finish"):
            continue
        key = (e["name"], json.dumps(e["arguments"], sort_keys=True, default=str))
        n += key in seen
        seen.add(key)
    return n


def _team(episode: "Episode", policies: RolePolicy | Mapping[str, RolePolicy]) -> Mapping[str, RolePolicy]:
    if not isinstance(policies, Mapping):
        return dict.fromkeys(episode.agents, policies)
    missing = set(episode.agents) - set(policies)
    if missing:
        raise KeyError(f"the team has no policy for {sorted(missing)}")
    return policies


def _turn(episode: "Episode", team: Mapping[str, RolePolicy], mode: str, seed: int) -> dict[str, Any]:
    """Play one move: a turn (``aec``, or any single agent) or a simultaneous round; the results."""
    agents = episode.agents
    if len(agents) == 1:
        sole = agents[0]
        return {sole: episode.step(team[sole].act(episode, sole, seed))}
    if mode == "aec":
        a = episode.status.next_agent
        if a is None:
            raise EpisodeError(f"{episode.spec.name}: no agent is to move (the episode is not running)")
        return {a: episode.act(a, team[a].act(episode, a, seed))}
    return episode.step_round({a: team[a].act(episode, a, seed) for a in agents})


def play(episode: "Episode", policies: RolePolicy | Mapping[str, RolePolicy], task: Any, *, mode: str = "aec",
         seed: int = 0) -> Outcome:
    """Reset ``episode`` on ``task`` and play it to the end.

    Args:
        policies: One policy for every agent, or ``{agent: policy}``.
        mode: ``aec`` (turn order: each agent decides after the previous one acted) or
            ``parallel`` (every agent decides on the same information); one agent has one mode.
        seed: Passed to every policy's ``act``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    team = _team(episode, policies)
    episode.reset(task)
    while not episode.done:
        _turn(episode, team, mode, seed)
    status = episode.status
    log = status.log
    errors: dict[str, int] = {}
    for e in log:
        if not e["ok"]:
            errors[e["kind"]] = errors.get(e["kind"], 0) + 1
    mail = getattr(episode.state, "mail", None) if len(episode.agents) > 1 else None
    return Outcome(
        env=episode.spec.name, task_id=_task(episode).id, mode=mode, success=bool(episode.success),
        rewards=episode.rewards, rounds=status.round, ended_by=status.ended_by or "",
        messages=len(mail.letters) if mail is not None else 0, calls=sum(e["name"] is not None for e in log),
        errors=errors, redundant=redundant_calls(log), turns=sum(status.turns_taken(a) for a in episode.agents),
        terminated=status.terminated, truncated=status.truncated, log=log)


def episode_trace(episode: "Episode", policies: RolePolicy | Mapping[str, RolePolicy], task: Any, mode: str = "aec",
                  seed: int = 0) -> list[Any]:
    """Everything observable of one episode, move by move: results, whose turn, round, every
    agent's observation, transcript and turn count; at the end rewards, success, answer, how it
    ended, the call log and the final state. Equal traces mean equal episodes (runtime parity)."""
    team = _team(episode, policies)
    agents, status = episode.agents, episode.status  # (the status reads the episode live)
    out: list[Any] = [episode.reset(task), {a: episode.transcript(a) for a in agents}]
    while not episode.done:
        results = _turn(episode, team, mode, seed)
        out.append(({a: r.to_json() for a, r in results.items()}, status.next_agent, status.round,
                    {a: episode.observation(a) for a in agents}, {a: list(episode.transcript(a)) for a in agents},
                    {a: status.turns_taken(a) for a in agents}))
    out.append((episode.rewards, episode.success, status.answer, status.ended_by, status.terminated,
                status.truncated, json.dumps(status.log, sort_keys=True), canonical_json(episode.state)))
    return out
