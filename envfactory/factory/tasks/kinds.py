"""Task kinds beyond transcription, for table-backed spec families.

A step-by-step task ("Do the following: 1. cancel order O-3 ...") tests whether an agent
can copy ids into calls. The kinds here name *goals*, so the right calls depend on what
the tools show (:data:`~envfactory.factory.spec_file.TASK_KINDS`):

* ``lookup``: act on every row that matches a description by attributes ("cancel every
  order of the customer named Kim whose status is placed"): find the customer, list the
  orders, act on each; the rows that do not match must stay as they are.
* ``conditional``: the action on each matching row depends on a value only a tool shows
  ("if its quantity is at least 2, ship it; otherwise cancel it").
* ``policy``: a request part of which the written policy in the system prompt forbids
  (``PolicyRule``: never cancel an order whose quantity is above 2): the reference acts
  only on the rows the policy allows, and the check fails a violation.
* ``answer``: a question about the state (a count, a total, which row has the most of
  something, possibly across a reference), judged on the answer with the state unchanged;
  a list of candidates earns nothing (the other ids, or the other small numbers, are the
  answer's rivals).
* ``user``: the request comes from a simulated user who holds the fact that identifies
  them (their name); the agent must ``ask_user`` (:mod:`envfactory.users`). Each task
  carries a twin (other user facts, same instruction and tables) whose check contradicts it.
* ``multi_service`` (composed files): read a value in one service and write it in another.
* ``steps``: the original step-by-step walk (:mod:`~envfactory.factory.tasks.synthesis`), of length ``difficulty``.

Every task ships with its reference solution (replayed without errors), a check over the
final state (every leaf the reference changed, plus every row of the acted-on table, so
collateral writes fail), ``metadata["kind"]`` and ``metadata["difficulty"]``. The
**difficulty knob** (1-5) scales the tables (more rows, so more distractors), the number
of rows a goal covers, and the walk length; :class:`KindSynth.supply` draws an endless,
seeded stream at one difficulty for curricula.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from typing import Any, Callable, Iterator, cast

from envfactory.state import State, copy_state, diff_leaves, state_hash, state_leaves
from envfactory.task import Task, ToolCall, number_rivals
from envfactory.tooling import Tool
from envfactory.users import CONFIRM, GOAL, PERSONA, SLIP, USER_TOOL
from envfactory.factory.tasks import grammar as task_grammar
from envfactory.factory.tasks.success import ChangeCheck
from envfactory.factory.spec_file import TASK_KINDS, EnvFile, OperationSpec, PolicyRule
from envfactory.factory.tasks.draft import GOAL_MAX_TURNS, Draft as _Draft
from envfactory.factory.tasks.user_goals import irreversible, misspell, persona
from envfactory.factory.tasks.realize import Measure, Owner, Selection, a as _a, compare, frame
from envfactory.factory.tasks.words import (fill_params as _fills, finder as _finder, is_person as _person, label as _label,
                         number_text as _num, numeric_fields as _numeric, phrase, policy_text, violates as _violates,
                         Slot, sensible as _sensible, transferable as _transferable)

__all__ = ["KindSynth"]

_NUMBERED = re.compile(r"\w \d+$")  # "Film Club 5", "Invoice 42 6", "visit note 46" (not "R-2", "FL-12")



# -- building one task ---------------------------------------------------------
def _pin(final: dict, tables: list[str]) -> dict[tuple, Any]:
    return {p: v for p, v in final.items() if len(p) >= 2 and p[0] == "tables" and p[1] in tables}


KIND_GIVE_UP = 40
"""Failed tries after which a kind leaves its unmade share of a family's tasks to the others."""


class _ProbeRows(dict):
    """A table for a probe: shares its rows with the table it copies until a tool reaches one
    (``get``, indexing, iteration over values or items), then gives the probe its own copy, so
    nothing a probing tool writes lands in the real rows."""

    __slots__ = ("_own",)

    def __init__(self, rows: dict) -> None:
        dict.__init__(self, rows)
        self._own: set[Any] = set()

    def __getitem__(self, k: Any) -> Any:
        if k not in self._own and dict.__contains__(self, k):
            self._own.add(k)
            dict.__setitem__(self, k, dict(dict.__getitem__(self, k)))
        return dict.__getitem__(self, k)

    def get(self, k: Any, default: Any = None) -> Any:
        return self[k] if dict.__contains__(self, k) else default

    def __setitem__(self, k: Any, v: Any) -> None:
        self._own.add(k)
        dict.__setitem__(self, k, v)

    def pop(self, k: Any, *default: Any) -> Any:
        if dict.__contains__(self, k):
            self[k]  # (a popped row is the probe's own copy)
        return dict.pop(self, k, *default)

    def values(self) -> Any:
        return [self[k] for k in list(dict.keys(self))]

    def items(self) -> Any:
        return [(k, self[k]) for k in list(dict.keys(self))]


class KindSynth:
    """Tasks of every kind for one table-backed family (see the module docstring).

    Args:
        env: The (possibly composed) spec file.
        tools: Every tool by name (``ask_user`` included when ``user`` tasks are wanted).
        sample: ``sample(rng, difficulty) -> State``: a seeded initial state.
        kinds: The kinds to make, in order.
        policies: The rules written into the system prompt.
        services: ``{entity: service}`` for composed files (``multi_service`` tasks).
        steps: ``steps(initial, length, rng) -> (instruction, calls, check) | None``.
        accept: ``accept(task) -> bool``: the family's last filter (e.g. no random agent solves it).
    """

    def __init__(self, env: EnvFile, tools: dict[str, Tool], sample: Callable[[random.Random, int], State],
                 kinds: list[str], policies: list[PolicyRule], *, prefix: str,
                 services: dict[str, str] | None = None,
                 steps: Callable[..., Any] | None = None, accept: Callable[[Task], bool] | None = None) -> None:
        self.env, self.tools, self.sample, self.prefix = env, tools, sample, prefix
        self.policies, self.services = policies, services or {}
        self.steps_fn, self.accept = steps, accept or (lambda t: True)
        self.kinds = [k for k in kinds if k in TASK_KINDS and (k != "multi_service" or len(set(self.services.values())) > 1)
                      and (k != "user" or USER_TOOL in tools) and (k != "steps" or steps is not None)
                      and (k != "policy" or policies)]
        self._ops = {op.name: op for op in env.operations}

    # -- the public face --------------------------------------------------------
    def tasks(self, n: int, seed: int, difficulties: list[int]) -> list[Task]:
        """``n`` tasks cycling through the kinds and ``difficulties`` (fewer only when the
        spec cannot give that many distinct ones); deterministic in ``seed``."""
        rng = random.Random(f"{self.prefix}/{seed}")
        out: list[Task] = []
        seen: set[str] = set()
        said: set[str] = set()
        order = list(itertools.product(difficulties, self.kinds))
        # each kind its share: a kind that made its share waits while others are short of theirs,
        # and one that fails :data:`KIND_GIVE_UP` times gives its turns to the rest (a rare kind,
        # a recovery, is not crowded out of a family's tasks by the easy ones)
        share = -(-n // max(len(self.kinds), 1))
        made: dict[str, int] = dict.fromkeys(self.kinds, 0)
        failed: dict[str, int] = dict.fromkeys(self.kinds, 0)
        tries = 0
        while len(out) < n and tries < 30 * n:
            d, kind = order[tries % len(order)]
            tries += 1
            short = [k for k in self.kinds if made[k] < share and failed[k] < KIND_GIVE_UP]
            if short and kind not in short:
                continue
            t = self.make(kind, d, rng, f"{self.prefix}-{kind}-{seed}-{len(out):03d}")
            if t is None:
                failed[kind] += 1
                continue
            key = state_hash(t.initial_state) + "|" + t.instruction
            if t.instruction in said and tries < 20 * n:
                continue  # prefer a new request; the same words on another world only when short of them
            if key not in seen:
                seen.add(key)
                said.add(t.instruction)
                out.append(t)
                made[kind] += 1
        return out

    def supply(self, difficulty: int, seed: int = 0, kinds: list[str] | None = None) -> Iterator[Task]:
        """An endless, seeded stream of fresh tasks at one difficulty (1-5): a curriculum's source."""
        if not 1 <= difficulty <= 5:
            raise ValueError(f"difficulty must be 1 to 5, got {difficulty}")
        kinds = kinds or self.kinds
        unknown = sorted(set(kinds) - set(self.kinds))
        if unknown:
            raise ValueError(f"this family makes no {unknown} tasks; it makes {self.kinds}")
        return self._stream(difficulty, seed, kinds)

    def _stream(self, difficulty: int, seed: int, kinds: list[str]) -> Iterator[Task]:
        rng = random.Random(f"{self.prefix}/supply/{difficulty}/{seed}")
        misses = 0
        for k in itertools.count():
            kind = kinds[k % len(kinds)]
            for _ in range(50):
                t = self.make(kind, difficulty, rng, f"{self.prefix}-d{difficulty}-s{seed}-{k:05d}")
                if t is not None:
                    misses = 0
                    yield t
                    break
            else:
                misses += 1
                if misses >= 4 * len(kinds):  # never hang: say which kinds this family cannot make here
                    raise RuntimeError(f"{self.prefix}: no {'/'.join(kinds)} task at difficulty {difficulty} "
                                       f"in {50 * misses} tries; ask for other kinds or another difficulty")

    def make(self, kind: str, difficulty: int, rng: random.Random, task_id: str) -> Task | None:
        """One task of ``kind`` at ``difficulty`` on a fresh sampled state, or ``None``."""
        initial = self.sample(rng, difficulty)
        self._state_type: type[Any] = type(initial)  # a spec's state model, made at run time
        if kind == "steps":
            if self.steps_fn is None:
                raise ValueError(f"{self.env.name}: 'steps' tasks need a steps function")
            made = self.steps_fn(initial, difficulty, rng)
            if made is None:
                return None
            instruction, calls, check = made
            if not self._policy_ok(initial, calls):
                return None
            task = Task(id=task_id, instruction=instruction, initial_state=initial, solution=calls, check=check,
                        difficulty=difficulty, metadata={"kind": "steps", "difficulty": difficulty})
            return task if self.accept(task) else None
        if kind in task_grammar.KINDS:  # compositional kinds: plans of the task grammar
            return task_grammar.make(self, kind, initial, difficulty, rng, task_id)
        self._memo: dict[tuple, Any] = {}
        draft = getattr(self, f"_{kind}")(json.loads(initial.model_dump_json()), difficulty, rng)
        return None if draft is None else self._finish(draft, initial, difficulty, task_id)

    # -- shared pieces ------------------------------------------------------------
    def _run(self, initial: State, calls: list[ToolCall]) -> State | None:
        s = copy_state(initial)
        for c in calls:
            if not self.tools[c.name].invoke(s, c.arguments).ok:
                return None
        return s

    def pages(self, state: Any, call: ToolCall) -> list[ToolCall]:
        """The further pages (``page=2`` on) a listing ``call`` shows on ``state``, which a
        reference calls because it needs every matching row; none for any other call. Read
        from the listing's own footer ("page 1 of 4 ..."), so the tool alone decides paging."""
        op = self._ops.get(call.name)
        if op is None or op.kind != "query" or "page" in call.arguments:
            return []
        out = self.tools[call.name].invoke(state, call.arguments)
        m = re.search(r"^page 1 of (\d+) \(", str(out.content) if out.ok else "", re.M)
        return [ToolCall(call.name, {**call.arguments, "page": p}) for p in range(2, int(m.group(1)) + 1)] if m else []

    def _paged(self, initial: State, calls: list[ToolCall]) -> list[ToolCall]:
        """``calls`` with every listing followed by its further pages (on the state it runs on)."""
        s = copy_state(initial)
        out: list[ToolCall] = []
        for c in calls:
            out += [c, *self.pages(s, c)]
            self.tools[c.name].invoke(s, c.arguments)
        return out

    def _policy_ok(self, initial: State, calls: list[ToolCall]) -> bool:
        if not self.policies:
            return True
        s: Any = copy_state(initial)  # a spec's state: tables and counters (a model made at run time)
        for c in calls:
            op = self._ops.get(c.name)
            if op is not None and op.kind in ("update", "delete"):
                row = s.tables.get(op.entity, {}).get(c.arguments.get(f"{op.entity}_id"), {})
                if any(_violates(r, op.name, row) for r in self.policies):
                    return False
            self.tools[c.name].invoke(s, c.arguments)
        return True

    def _finish(self, d: _Draft, initial: State, difficulty: int, task_id: str, accept: bool = True) -> Task | None:
        if d.user:
            initial = initial.model_copy(update={"user": dict(d.user)})
        if not d.paged:
            d.calls = self._paged(initial, d.calls)
        if len(d.calls) > max(self.env.max_turns, GOAL_MAX_TURNS) - 2:
            return None  # the reference and the answer must fit the turn limit with a turn to spare
        final = self._run(initial, d.calls)
        if final is None or not self._policy_ok(initial, d.calls):
            return None
        before, after = state_leaves(initial), state_leaves(final)
        expected = {**_pin(after, d.guard), **diff_leaves(before, after)}
        expected = {p: v for p, v in expected.items() if p[:1] != ("user",)}
        if not expected:
            return None
        check = ChangeCheck(tuple(sorted(expected.items(), key=lambda kv: kv[0])))
        if not d.facts and check(initial):
            return None  # nothing to do: the state already passes
        meta = {"kind": d.kind, "difficulty": difficulty, **d.meta}
        task = Task(id=task_id, instruction=d.instruction, initial_state=initial, solution=d.calls, check=check,
                    answer_facts=d.facts, answer_rivals=d.rivals, answer_seen=d.seen, difficulty=difficulty,
                    metadata=meta)
        return task if not accept or self.accept(task) else None

    def _ref_text(self, tables: dict, entity: str, key: str) -> tuple[str, list[ToolCall]]:
        """How to name a row in words, and the calls that find its id: by its (unique) name
        through the entity's finder, else by id."""
        finder = _finder(self.env, entity)
        row = tables.get(entity, {}).get(key, {})
        name = row.get("name")
        if finder is not None and isinstance(name, str) and \
                sum(1 for r in tables[entity].values() if str(r.get("name")).lower() == name.lower()) == 1:
            return f"{_label(self.env, entity)} {name}", [ToolCall(finder.name, {"name": name})]
        return f"{_label(self.env, entity)} {key}", []

    def _numbered(self, tables: dict, entity: str, f: str, v: Any) -> bool:
        """Whether a task that filters ``entity`` by ``f`` = ``v`` would name a row or a value by a
        numbered name: one a deep world made when its list of unique names ran out ("Film Club 5",
        "Mochi 2"), or a field's description numbered where it has no seed rule ("visit note 46").
        Tasks leave such rows unnamed (issue 59: 4.2% of goal-level tasks named one); they stay
        in the tables as distractors."""
        fs = self.env.entities[entity].fields[f]
        if fs.type == "ref":
            target = self.env.entities[fs.target]
            row = tables.get(fs.target, {}).get(v)
            return "name" in target.fields and row is not None and self._numbered(tables, fs.target, "name",
                                                                                  row.get("name"))
        if not isinstance(v, str) or not _NUMBERED.search(v):
            return False
        gen = self.env.entities[entity].seed.fields.get(f)
        return not (gen is not None and gen.choice and v in gen.choice)

    def _measure(self, entity: str, g: str) -> Measure:
        """How the number field ``g`` of ``entity`` is spoken of."""
        return Measure.of(g, self.env.entities[entity].fields[g].description or "")

    def _selection(self, tables: dict, entity: str, want: int, rng: random.Random, *, need_ref: bool = False,
                   ok: Callable[[str, dict], bool] = lambda k, r: True) -> dict[str, Any] | None:
        """A query on ``entity`` and filter values that select about ``want`` rows (never all
        of them), each passing ``ok``: ``{"op", "filters", "keys"}``."""
        rows = tables.get(entity, {})
        if len(rows) < 2:
            return None
        ent = self.env.entities[entity]
        best = None
        # the rows by the values of each filter combination (as a query matches them), once per
        # table while a task is made
        memo = ("groups", entity, id(rows))
        if memo not in self._memo:
            self._memo[memo] = (sorted(rows), {}, rows)  # (holding rows: its id names it while memoized)
        order, groups, _ = self._memo[memo]
        for q in [op for op in self.env.operations if op.entity == entity and op.kind == "query"]:
            params = [p for p in q.params if p != "name" and ent.fields[p].type in ("ref", "enum", "str", "int", "bool")]
            for size in (2, 1):
                for combo in itertools.combinations(params, size):
                    if need_ref and not any(ent.fields[p].type == "ref" for p in combo):
                        continue
                    # the pivots: rows whose values a task may name (no numbered names; all rows of a
                    # world without them, so its draws are as they were)
                    said = ("said", entity, combo, id(rows))
                    if said not in self._memo:
                        self._memo[said] = [k for k in order if not any(
                            self._numbered(tables, entity, p, rows[k][p]) for p in combo)]
                    pivots = self._memo[said]
                    for pivot in rng.sample(pivots, min(len(pivots), 4)):
                        filt = {p: rows[pivot][p] for p in combo}
                        if any(v is None for v in filt.values()):
                            continue
                        if combo not in groups:
                            by: dict[tuple[str, ...], list[str]] = {}
                            for k in order:
                                by.setdefault(tuple(str(rows[k].get(p)).lower() for p in combo), []).append(k)
                            groups[combo] = by
                        keys = groups[combo][tuple(str(v).lower() for v in filt.values())]
                        if len(keys) == len(rows) or not all(ok(k, rows[k]) for k in keys):
                            continue
                        # a row named through another (an order of the customer named Kim) needs one
                        # more look-up than a filter on the row's own fields: preferred
                        has_ref = any(ent.fields[p].type == "ref" for p in combo)
                        score = (abs(len(keys) - want) + (0 if has_ref else 0.75), rng.random())
                        if best is None or score < best[0]:
                            best = (score, {"op": q, "filters": filt, "keys": list(keys)})
        return None if best is None else best[1]

    def _words(self, tables: dict, entity: str, filters: dict[str, Any], *, mine: str | None = None
               ) -> tuple[Selection, list[ToolCall], dict[str, Any]]:
        """The selected rows in words (:class:`~envfactory.factory.tasks.realize.Selection`, realized in several forms),
        the calls that resolve the rows they belong to, and the query's arguments."""
        ent = self.env.entities[entity]
        owners, plain, calls = [], [], []
        for p, v in filters.items():
            if ent.fields[p].type == "ref":
                if p == mine:
                    continue
                text, found = self._ref_text(tables, ent.fields[p].target, v)
                lab = _label(self.env, ent.fields[p].target)
                owners.append(Owner(lab, text[len(lab) + 1:]))
                calls += found
            else:
                plain.append((p, ent.fields[p].type, v))
        return Selection.build(_label(self.env, entity), plain, owners, mine=mine is not None), calls, dict(filters)

    def _acts(self, entity: str) -> list[OperationSpec]:
        return [op for op in self.env.operations if op.entity == entity and op.kind == "update"]

    def _applies(self, tables: dict, op: OperationSpec, key: str, args: dict[str, Any]) -> bool:
        """Whether ``op`` succeeds on row ``key`` and changes it (tried on a copy), in the direction
        its words say ("extend" never shortens: :func:`~envfactory.factory.tasks.words.sensible`)."""
        ok, changed = self._probe(tables, op.name, op.entity, key, args)
        return ok and changed and _sensible(op, tables[op.entity][key], args)

    def _probe(self, tables: dict, op: str, entity: str, key: str, args: dict[str, Any]) -> tuple[bool, bool]:
        """Whether tool ``op`` accepts row ``key`` of ``entity`` with ``args``, and whether it
        changes that row, tried on a copy of ``tables`` that copies a row only when the tool
        reaches it (:class:`_ProbeRows`: a probe costs the rows it touches, not the world)."""
        try:
            said: Any = tuple(sorted((k, type(v).__name__, v) for k, v in args.items()))  # (1 and True differ)
            hash(said)
        except TypeError:  # (an unhashable value: its JSON)
            said = json.dumps(args, sort_keys=True)
        memo = (op, entity, key, said, id(tables))
        got = self._memo.get(memo)
        if got is None:
            probe = self._state_type.model_construct(
                tables={e: _ProbeRows(rows) for e, rows in tables.items()}, counters={})
            before = tables[entity].get(key)
            ok = self.tools[op].invoke(probe, {f"{entity}_id": key, **args}).ok
            got = self._memo[memo] = (ok, probe.tables[entity].get(key) != before)  # a delete removes it
            self._memo[("alive", id(tables))] = tables  # (its id names it while memoized)
        return got

    def _entities(self, rng: random.Random) -> list[str]:
        es = [e for e in self.env.entities if self._acts(e)]
        rng.shuffle(es)
        return es

    # -- the kinds ------------------------------------------------------------------
    def _lookup(self, s: dict, d: int, rng: random.Random) -> _Draft | None:
        tables = s["tables"]
        for e in self._entities(rng):
            for op in rng.sample(self._acts(e), len(self._acts(e))):
                args = _fills(self.env, op, rng)
                if args is None:
                    continue
                sel = self._selection(tables, e, d, rng, ok=lambda k, r: self._applies(tables, op, k, args) and
                                      not any(_violates(p, op.name, r) for p in self.policies))
                if sel is None:
                    continue
                words, calls, qargs = self._words(tables, e, sel["filters"])
                calls.append(ToolCall(sel["op"].name, qargs))
                calls += [ToolCall(op.name, {f"{e}_id": k, **args}) for k in sel["keys"]]
                text, i = frame("lookup", rng, vp=phrase(self.env, op, words.np(rng)[0], args))
                return _Draft("lookup", text, calls, guard=[e], meta={"phrasing": i})
        return None

    def _measures(self, e: str) -> list[tuple[str | None, OperationSpec | None, str]]:
        """What a condition on a row of ``e`` can read: its own numbers ``(None, None, g)``, or a
        number of the row it refers to ``(ref, read op, h)`` (one more read per row)."""
        out: list[tuple[str | None, OperationSpec | None, str]] = [(None, None, g) for g in _numeric(self.env, e)]
        for ref, fs in self.env.entities[e].fields.items():
            if fs.type != "ref":
                continue
            read = next((op for op in self.env.operations if op.entity == fs.entity and op.kind == "read"), None)
            if read is not None:
                out += [(ref, read, h) for h in _numeric(self.env, fs.target)]
        return out

    def _conditional(self, s: dict, d: int, rng: random.Random) -> _Draft | None:
        tables = s["tables"]
        for e in self._entities(rng):
            acts, measures = self._acts(e), self._measures(e)
            if len(acts) < 2 or not measures:
                continue
            for a, b in rng.sample(list(itertools.permutations(acts, 2)), min(6, len(acts) * (len(acts) - 1))):
                fa, fb = _fills(self.env, a, rng), _fills(self.env, b, rng)
                if fa is None or fb is None:
                    continue
                sel = self._selection(tables, e, max(2, d), rng, ok=lambda k, r: (
                    self._applies(tables, a, k, fa) and self._applies(tables, b, k, fb)
                    and not any(_violates(p, a.name, r) or _violates(p, b.name, r) for p in self.policies)))
                if sel is None:
                    continue
                ref, read, g = rng.choice(measures)

                def value(k: str) -> Any:
                    row = tables[e][k]
                    if ref is None:
                        return row.get(g)
                    return tables[self.env.entities[e].fields[ref].entity].get(row.get(ref), {}).get(g)

                got = {k: value(k) for k in sel["keys"]}
                values = sorted({v for v in got.values() if isinstance(v, (int, float))})
                if len(values) < 2 or len(values) != len(set(got.values())):
                    continue  # both branches must occur, decided by values a tool shows
                threshold = values[rng.randrange(1, len(values))]
                words, calls, qargs = self._words(tables, e, sel["filters"])
                calls.append(ToolCall(sel["op"].name, qargs))
                looked: set[Any] = set()
                for k in sel["keys"]:
                    if read is not None and tables[e][k][ref] not in looked:  # each referenced row once
                        looked.add(tables[e][k][ref])
                        calls.append(ToolCall(read.name, {f"{read.entity}_id": tables[e][k][ref]}))
                    op, args = (a, fa) if got[k] >= threshold else (b, fb)
                    calls.append(ToolCall(op.name, {f"{e}_id": k, **args}))
                owner = e if ref is None else self.env.entities[e].fields[ref].target
                m = self._measure(owner, g)
                person = _person(self.env, e)  # people are "they", not "it"
                whose = ("they" if person else "it") if ref is None else \
                    f"{'their' if person else 'its'} {_label(self.env, owner)}"
                obj = "them" if person else "it"
                instruction, i = frame("conditional", rng, sel=words.np(rng, form=rng.choice(["every", "each"]))[0],
                                       c=compare(m, whose, "at_least", threshold, rng),
                                       nc=compare(m, whose, "below", threshold, rng),
                                       a=phrase(self.env, a, obj, fa), b=phrase(self.env, b, obj, fb))
                return _Draft("conditional", instruction, calls, guard=[e], meta={"phrasing": i})
        return None

    def _policy(self, s: dict, d: int, rng: random.Random) -> _Draft | None:
        tables = s["tables"]
        for rule in rng.sample(self.policies, len(self.policies)):
            op = self._ops[rule.operation]
            e = op.entity
            args = _fills(self.env, op, rng)
            if args is None:
                continue
            # a row the policy protects is left as it is: it need only be one the request covers
            # (the tool takes it and it would change), not one its words fit ("extend the stays to
            # 4 nights" over a 6-night stay the policy keeps)
            sel = self._selection(tables, e, max(3, d), rng, ok=lambda k, r: (
                self._applies(tables, op, k, args) if not _violates(rule, op.name, r)
                else all(self._probe(tables, op.name, e, k, args))))
            if sel is None:
                continue
            keys = sel["keys"]
            allowed = [k for k in keys if not _violates(rule, op.name, tables[e][k])]
            if not allowed or len(allowed) == len(keys):
                continue
            words, calls, qargs = self._words(tables, e, sel["filters"])
            calls.append(ToolCall(sel["op"].name, qargs))
            calls += [ToolCall(op.name, {f"{e}_id": k, **args}) for k in allowed]
            text, i = frame("lookup", rng, vp=phrase(self.env, op, words.np(rng)[0], args))
            return _Draft("policy", text, calls, guard=[e],
                          meta={"policy": policy_text(self.env, rule), "refused": len(keys) - len(allowed),
                                "phrasing": i})
        return None

    def _answer(self, s: dict, d: int, rng: random.Random) -> _Draft | None:
        tables = s["tables"]
        es = [e for e in self.env.entities if any(op.entity == e and op.kind == "query" for op in self.env.operations)]
        rng.shuffle(es)
        for e in es:
            sel = self._selection(tables, e, max(2, d), rng, need_ref=True) or self._selection(tables, e, max(2, d), rng)
            if sel is None:
                continue
            rows = tables[e]
            keys = sel["keys"]
            words, calls, qargs = self._words(tables, e, sel["filters"])
            calls.append(ToolCall(sel["op"].name, qargs))
            text = words.np(rng, plural_only=True)[0]
            nums = [g for g in _numeric(self.env, e) if all(isinstance(rows[k][g], (int, float)) for k in keys)]
            joins = self._joins(e, keys, rows)
            forms = ["count"] + (["total", "most"] if nums and len(keys) >= 2 else [])
            # a question across a reference needs a read per row: the longer look-up, when there is one
            form = "join" if joins and rng.random() < 0.6 else rng.choice(forms)
            if form != "join" and len(calls) < 2:
                continue  # one listing answers it: too close to a plain read
            if form == "count":
                fact, seen = str(len(keys)), False
                q, i = frame("count", rng, q=words.np(rng, form="all")[0][len("all "):])
                rivals = number_rivals(fact)
            elif form == "total":
                g = rng.choice(nums)
                total = sum(rows[k][g] for k in keys)
                fact, seen = _num(round(total, 2) if isinstance(total, float) else total), False
                q, i = frame("total", rng, m=self._measure(e, g).noun, sel=text)
                rivals = number_rivals(fact)
            elif form == "most":
                g = rng.choice(nums)
                top = max(rows[k][g] for k in keys)
                best = [k for k in keys if rows[k][g] == top]
                if len(best) != 1:
                    continue
                fact, seen = best[0], True
                q, i = frame("most", rng, sel=text, sup=_superlative(self._measure(e, g)))
                rivals = [k.lower() for k in rows if k != best[0]]
            else:
                ref, read, h = rng.choice(joins)
                target = {k: tables[self.env.entities[e].fields[ref].entity].get(rows[k][ref], {}).get(h)
                          for k in keys}
                if not all(isinstance(v, (int, float)) for v in target.values()):
                    continue
                top = max(target.values())
                best = [k for k, v in target.items() if v == top]
                if len(best) != 1:
                    continue
                fact, seen = best[0], True
                target_e = self.env.entities[e].fields[ref].target
                q, i = frame("join", rng, sel=text, r=_label(self.env, target_e),
                             sup=_superlative(self._measure(target_e, h)))
                calls += [ToolCall(read.name, {f"{read.entity}_id": rid})
                          for rid in dict.fromkeys(rows[k][ref] for k in keys)]
                rivals = [k.lower() for k in rows if k != best[0]]
            if re.search(rf"(?<![\w.]){re.escape(fact)}(?![\w]|\.\d)", q, flags=re.IGNORECASE):
                continue  # the answer is in the question ("... the ingredient named oats 6?": 6)
            return _Draft("answer", q, calls, guard=[e], facts=[fact], rivals=rivals, seen=seen,
                          meta={"answer_form": form, "phrasing": i})
        return None

    def _joins(self, e: str, keys: list[str], rows: dict) -> list[tuple[str, OperationSpec, str]]:
        out = []
        for ref, fs in self.env.entities[e].fields.items():
            if fs.type != "ref":
                continue
            read = next((op for op in self.env.operations if op.entity == fs.entity and op.kind == "read"), None)
            if read is None or len({rows[k][ref] for k in keys}) < 2:
                continue
            out += [(ref, read, h) for h in _numeric(self.env, fs.target)]
        return out

    def _user(self, s: dict, d: int, rng: random.Random) -> _Draft | None:
        tables = s["tables"]
        for e in self._entities(rng):
            ent = self.env.entities[e]
            for op in rng.sample(self._acts(e), len(self._acts(e))):
                args = _fills(self.env, op, rng)
                if args is None:
                    continue
                ok = lambda k, r: self._applies(tables, op, k, args) and not any(  # noqa: E731
                    _violates(p, op.name, r) for p in self.policies)
                sel = self._selection(tables, e, d, rng, need_ref=True, ok=ok)
                if sel is None:
                    continue
                filters = sel["filters"]
                ref = next(p for p in filters if ent.fields[p].type == "ref")
                anchor = ent.fields[ref].target
                if not _person(self.env, anchor):
                    continue  # only a person asks for their own rows
                who = tables[anchor].get(filters[ref], {})
                name_text, found = self._ref_text(tables, anchor, filters[ref])
                if not found:
                    continue  # the user is known by name, found through the finder
                facts = {"name": str(who["name"])}
                twin = self._twin(tables, e, anchor, ref, filters, ok, most=len(sel["keys"]))
                if twin is None:
                    continue
                # half the time the user also keeps which rows they mean (a preference): asked for too
                kept = [p for p in filters if p != ref and ent.fields[p].type in ("enum", "str")]
                hidden = kept[0] if kept and rng.random() < 0.5 else None
                asks = [ToolCall(USER_TOOL, {"question": "What is your name?"})]
                shown = dict(filters)
                if hidden is not None:
                    what = f"{_label(self.env, e)} {hidden.replace('_', ' ')}"
                    facts[what] = str(filters.pop(hidden))
                    asks.append(ToolCall(USER_TOOL, {"question": f"Which {what} do you mean?"}))
                words, others, _ = self._words(tables, e, filters, mine=ref)
                if hidden is not None:
                    words.tail = f" with the {hidden.replace('_', ' ')} I have in mind"
                alabel = _label(self.env, anchor)

                instruction, i = frame("user", rng, role=_a(alabel), vp=phrase(self.env, op, words.np(rng)[0], args))
                twin_name, twin_key, twin_rows = twin
                # the user's goal, persona, slip and confirmation (issue 26) draw from their own rng,
                # so the family's task stream is the one it was
                sub = random.Random(f"{instruction}/{facts['name']}/{twin_name}")
                goal = f"I'd like you to {phrase(self.env, op, words.np(sub)[0], args)}."
                taken = {str(r.get("name")).lower() for r in tables[anchor].values()}
                wrong = [misspell(n, taken, sub) for n in (facts["name"], twin_name)] if sub.random() < 0.4 else []
                slips = bool(wrong) and None not in wrong
                confirm = irreversible(self.env, op)

                def script(key: str, w: str | None) -> dict[str, str]:
                    return {PERSONA: persona(self.env, tables, anchor, key, e, ref), GOAL: goal,
                            **({SLIP: f"name={w}"} if slips else {}), **({CONFIRM: op.name} if confirm else {})}

                if slips:  # the reference asks again, and hears the correction
                    asks.insert(1, ToolCall(USER_TOOL, {"question": "Sorry, could you tell me your name again?"}))
                # an irreversible action: the reference asks for the user's yes before the first one
                confirming = [ToolCall(USER_TOOL, {"question": "This cannot be undone: shall I go ahead and "
                                                                f"{phrase(self.env, op, 'them', args)}?"})] if confirm else []

                def solution(name: str, key: str, rows: list[str]) -> list[ToolCall]:
                    return [*asks, ToolCall(found[0].name, {"name": name}), *others,
                            ToolCall(sel["op"].name, {**shown, ref: key}), *confirming,
                            *[ToolCall(op.name, {f"{e}_id": k, **args}) for k in rows]]

                mine = {**facts, **script(shown[ref], wrong[0] if slips else None)}
                twin_user = {**facts, "name": twin_name, **script(twin_key, wrong[1] if slips else None)}
                return _Draft("user", instruction, solution(facts["name"], shown[ref], sel["keys"]), guard=[e],
                              user=mine, meta={"phrasing": i, "user_twin": twin_user, "twin_solution": [
                                  c.to_json() for c in solution(twin_name, twin_key, twin_rows)]})
        return None

    def _twin(self, tables: dict, e: str, anchor: str, ref: str, filters: dict, ok: Callable, most: int
              ) -> tuple[str, str, list[str]] | None:
        """Another named user for whom the same request selects other rows (all of which it
        can act on, and at most ``most`` of them, so that the twin's reference, pages included,
        fits the turn limit whenever the task's own does): the twin that proves the task needs
        the asking."""
        for key, row in sorted(tables[anchor].items()):
            if key == filters[ref] or not isinstance(row.get("name"), str):
                continue
            if sum(1 for r in tables[anchor].values() if str(r.get("name")).lower() == row["name"].lower()) != 1:
                continue
            other = {**filters, ref: key}
            keys = sorted(k for k, r in tables[e].items()
                          if all(str(r.get(p)).lower() == str(v).lower() for p, v in other.items()))
            if keys and len(keys) <= most and all(ok(k, tables[e][k]) for k in keys):
                return row["name"], key, keys
        return None

    def twin_task(self, task: Task, twin_state: State) -> Task | None:
        """The twin of a user task: the same instruction and tables, the twin's user facts, and
        the reference the family wrote for that user (``metadata["twin_solution"]``)."""
        calls = [ToolCall(c["name"], c["arguments"]) for c in task.metadata.get("twin_solution", ())]
        if not isinstance(task.check, ChangeCheck):
            return None  # only a user task (judged by its changes) has a twin
        guard = sorted({p[1] for p, _ in task.check.expected if p[:1] == ("tables",)})
        user = cast(Any, twin_state).user  # a spec's state model, made at run time
        draft = _Draft("user", task.instruction, calls, guard=guard, user=dict(user))
        return self._finish(draft, twin_state, task.difficulty or 1, task.id + "-twin", accept=False)

    def _multi_service(self, s: dict, d: int, rng: random.Random) -> _Draft | None:
        """Read in one service, act in another: either the value read is written ("set it as
        the note of ..."), or it decides which of two actions the other service's rows get."""
        tables = s["tables"]
        sources = [e for e in self.env.entities if _finder(self.env, e) is not None and tables.get(e)]
        rng.shuffle(sources)
        for src in sources:
            home = self.services.get(src)
            keys = [k for k in sorted(tables[src]) if not self._numbered(tables, src, "name", tables[src][k].get("name"))]
            if not keys:
                continue
            key = rng.choice(keys)
            name_text, found = self._ref_text(tables, src, key)
            if not found:
                continue
            row = tables[src][key]
            targets = [e for e in self._entities(rng) if self.services.get(e) != home]
            for e in targets:
                made = (self._transfer(tables, src, key, row, found, name_text, e, d, rng) if rng.random() < 0.5
                        else None) or self._switch(tables, src, row, found, name_text, e, d, rng)
                if made is not None:
                    return made
        return None

    def _transfer(self, tables: dict, src: str, key: str, row: dict, found: list[ToolCall], name_text: str,
                  e: str, d: int, rng: random.Random) -> _Draft | None:
        for op in self._acts(e):
            for p in op.params:
                f = self.env.entities[e].fields[p]
                picks = [g for g, gs in self.env.entities[src].fields.items()
                         if g != "name" and gs.type == f.type and f.type in ("str", "int") and row.get(g) is not None
                         and _transferable(self.env, src, g, e, p)]
                if not picks:
                    continue
                g = rng.choice(picks)
                args = _fills(self.env, op, rng)
                if args is None:
                    continue
                args[p] = row[g]
                sel = self._selection(tables, e, d, rng, ok=lambda k, r: self._applies(tables, op, k, args) and
                                      not any(_violates(x, op.name, r) for x in self.policies))
                if sel is None:
                    continue
                words, calls, qargs = self._words(tables, e, sel["filters"])
                m = g.replace("_", " ")
                shown = {**args, p: Slot(f"the {m} you found")}
                calls = [*found, *calls, ToolCall(sel["op"].name, qargs)]
                calls += [ToolCall(op.name, {f"{e}_id": k, **args}) for k in sel["keys"]]
                instruction, i = frame("transfer", rng, src=self.services[src].replace("_", " "),
                                       dst=self.services[e].replace("_", " "), who=name_text, m=m,
                                       vp=phrase(self.env, op, words.np(rng)[0], shown))
                return _Draft("multi_service", instruction, calls, guard=[e],
                              meta={"services": [self.services[src], self.services[e]], "form": "transfer",
                                    "phrasing": i})
        return None

    def _switch(self, tables: dict, src: str, row: dict, found: list[ToolCall], name_text: str,
                e: str, d: int, rng: random.Random) -> _Draft | None:
        nums = [g for g in _numeric(self.env, src) if isinstance(row.get(g), (int, float))]
        acts = self._acts(e)
        if not nums or len(acts) < 2:
            return None
        g = rng.choice(nums)
        for a, b in rng.sample(list(itertools.permutations(acts, 2)), min(4, len(acts) * (len(acts) - 1))):
            fa, fb = _fills(self.env, a, rng), _fills(self.env, b, rng)
            if fa is None or fb is None:
                continue
            sel = self._selection(tables, e, d, rng, ok=lambda k, r: (
                self._applies(tables, a, k, fa) and self._applies(tables, b, k, fb)
                and not any(_violates(x, a.name, r) or _violates(x, b.name, r) for x in self.policies)))
            if sel is None:
                continue
            gen = self.env.entities[src].seed.fields.get(g)
            lo, hi = gen.range if gen is not None and gen.range else (row[g] - 2, row[g] + 2)
            threshold = rng.randint(int(lo) + 1, max(int(lo) + 1, int(hi)))
            op, args = (a, fa) if row[g] >= threshold else (b, fb)
            words, calls, qargs = self._words(tables, e, sel["filters"])
            calls = [*found, *calls, ToolCall(sel["op"].name, qargs)]
            calls += [ToolCall(op.name, {f"{e}_id": k, **args}) for k in sel["keys"]]
            text = words.np(rng)[0]
            instruction, i = frame("switch", rng, who=name_text, src=self.services[src].replace("_", " "),
                                   dst=self.services[e].replace("_", " "),
                                   c=compare(self._measure(src, g), name_text, "at_least", threshold, rng),
                                   a=phrase(self.env, a, text, fa), b=phrase(self.env, b, text, fb))
            return _Draft("multi_service", instruction, calls, guard=[e],
                          meta={"services": [self.services[src], self.services[e]], "form": "condition",
                                "phrasing": i})
        return None


def _superlative(m: Measure) -> str:
    return f"the most {m.noun}" if m.count else f"the highest {m.noun}"
