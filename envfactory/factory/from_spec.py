"""A declarative spec file (YAML or JSON) as an environment.

``from_spec(path)`` validates the file against :class:`.spec_file.EnvFile`,
and builds: a :class:`~envfactory.factory.tables.TableState` subclass, seeded initial states
(the entities' ``seed`` rules, scaled by a difficulty), one tool per operation (schema
from the field types, docstring from the operation's description), and tasks of the
file's kinds (:mod:`~envfactory.factory.tasks.kinds`: step-by-step walks, look-up-then-act, conditional,
policy-bound, answer, simulated-user and multi-service tasks). ``specs_from_file(path)``
also builds the file's ``variants`` and reads composed files (several services in one
environment). Errors name the file and what to fix.
"""

from __future__ import annotations

from envfactory.factory import _callable

import inspect
import json
import random
import re
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import ValidationError, create_model

from envfactory.definition import ToolEnvSpec, SpecError
from envfactory.tooling import Tool, ToolError, make_tool
from envfactory.factory.tasks.arguments import FRESH_WORDS
from envfactory.definition import DEFAULT_SYSTEM_PROMPT
from envfactory.users import unconfirmed, user_tool
from envfactory.factory.spec_file import ComposedFile, EntitySpec, EnvFile, FieldSpec, OperationSpec, TaskRules
from envfactory.factory.yaml_budget import load_yaml
from envfactory.factory.tasks.words import default_policies, free_text, is_person, policy_text, with_finders
from envfactory.factory.tasks.draft import GOAL_MAX_TURNS
from envfactory.factory.tasks.kinds import KindSynth
from envfactory.factory.tasks.synthesis import (BANNED_ANSWERS, SynthConfig, _anchored, _blindly_reachable, _change_task,
                          _guessable_calls, _random_solves, _seeds, synthesize)

__all__ = ["from_spec", "specs_from_file", "load_spec_file", "compose"]


def load_spec_file(path: str | Path) -> EnvFile:
    """Parse and validate a spec file; raise :class:`SpecError` naming the problems."""
    out = _load(Path(path))
    if isinstance(out, ComposedFile):
        raise SpecError(f"{path}: a composed file (services: ...); build it with specs_from_file")
    return out


def _load(path: Path) -> EnvFile | ComposedFile:
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            data = _yaml_on_keys(load_yaml(text, path))
        else:
            data = json.loads(text)
    except SpecError:
        raise
    except Exception as exc:
        raise SpecError(f"{path}: not valid {path.suffix.lstrip('.').upper()}: {exc}") from exc
    try:
        if isinstance(data, dict) and "services" in data:
            return ComposedFile.model_validate(data)
        return EnvFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        raise SpecError(f"{path}: invalid spec: {problems}") from None


def _yaml_on_keys(node: Any) -> Any:
    """YAML 1.1 reads the key ``on`` as ``True``; give it back its name."""
    if isinstance(node, dict):
        return {("on" if k is True else k): _yaml_on_keys(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_yaml_on_keys(v) for v in node]
    return node


_PY = {"str": str, "int": int, "float": float, "bool": bool, "ref": str}


def _py_type(f: FieldSpec) -> Any:
    return Literal[tuple(f.choices)] if f.type == "enum" else _PY[f.type]


# -- seeding ---------------------------------------------------------------
_SURNAMES = ("Adams", "Baker", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Haddad", "Ito", "Jensen", "Khan",
             "Lopez", "Moreau", "Nakamura", "Okafor", "Patel", "Quinn", "Rossi", "Santos", "Tanaka", "Umar",
             "Varga", "Weber", "Xu", "Young", "Zhang")


def _more_names(base: list[str], person: bool) -> Any:
    """Unique names past a list's end, for a deep table: people get surnames ("Ivy Chen", "Di Roy
    Haddad"), other things a number ("Dune 2")."""
    for k in range(1, 10_000):
        for b in base:
            if person:
                first = b.split()[0]
                yield f"{first} {_SURNAMES[(k - 1) % len(_SURNAMES)]}" + (f" {k // len(_SURNAMES) + 1}" if k > len(_SURNAMES) else "")
            else:
                yield f"{b} {k + 1}"


class _Used(set):
    """A field's values so far, with where its list of further names has got to (the names
    before it are all taken: ``used`` only grows, so the walk never restarts)."""

    more: Any = None


def _gen_value(f: FieldSpec, gen: Any, n: int, rng: random.Random, state: dict, used: set,
               extend: bool = False, person: bool = False, refs: dict | None = None) -> Any:
    if gen is not None and gen.null_share and rng.random() < gen.null_share:
        return None
    if gen is not None and gen.value is not None:
        return gen.value
    if gen is not None and gen.pattern is not None:
        return gen.pattern.format(n=n)
    if f.type == "ref":
        table = state["tables"].get(f.entity, {})
        got = None if refs is None else refs.get(f.entity)
        if got is None or got[0] != len(table):  # (sorted once per table size, not per row)
            got = (len(table), sorted(table))
            if refs is not None:
                refs[f.entity] = got
        keys = got[1]
        return keys[rng.randrange(len(keys))] if keys else None
    if gen is not None and gen.choice is not None:
        pool = [c for c in gen.choice if not (gen.unique and c in used)]
        if not pool and extend and gen.unique and all(isinstance(c, str) for c in gen.choice):
            # a deep table outgrows its list of unique names: "Ivy Chen" (people), "Dune 2" (still unique)
            more = getattr(used, "more", None)
            if more is None:
                more = _more_names(list(gen.choice), person)
                if isinstance(used, _Used):
                    used.more = more
            pool = [next(v for v in more if v not in used)]
        pool = pool or gen.choice
        v = pool[rng.randrange(len(pool))]
        used.add(v)
        return v
    if f.type == "enum":
        return f.choices[rng.randrange(len(f.choices))]
    if f.type == "bool":
        return rng.random() < 0.5
    lo, hi = (gen.range if gen is not None and gen.range else (f.min or 0, f.max or 10))
    if f.type == "int":
        return rng.randint(int(lo), int(hi))
    if f.type == "float":
        return round(rng.uniform(lo, hi), 2)
    return f"{f.description or 'item'} {n}"


def seed_state(env: EnvFile, rng: random.Random, scale: float = 1.0,
               at_least: dict[str, tuple[int, int]] | None = None) -> dict[str, Any]:
    """A sampled initial state (JSON form) from the entities' seed rules; ``scale`` multiplies
    the generated row counts, and ``at_least`` raises an entity's to a number drawn from its
    ``(lo, hi)`` (``scale`` is capped where a unique choice runs out of values; ``at_least``
    goes on with more names, "Ivy Chen" for people and "Dune 2" for things; names stay unique)."""
    state: dict[str, Any] = {"tables": {}, "counters": {}}
    refs: dict[str, tuple[int, list[str]]] = {}
    for ename, ent in env.entities.items():
        rows: dict[str, dict[str, Any]] = {}
        state["tables"][ename] = rows
        count = ent.seed.count
        extra = rng.randint(count[0], count[1]) if isinstance(count, (tuple, list)) else count
        deep = (at_least or {}).get(ename)
        if (scale != 1.0 or deep) and extra:
            extra = round(extra * scale)
            if deep:
                extra = max(extra, rng.randint(*deep) - len(ent.seed.rows))
            for fname, gen in ent.seed.fields.items():
                if gen.unique and gen.choice and not (deep and all(isinstance(c, str) for c in gen.choice)):
                    extra = min(extra, max(len(gen.choice) - len(ent.seed.rows), 0))
        used: dict[str, set] = {k: _Used() for k in ent.fields}
        person = bool(deep) and is_person(env, ename)
        for i in range(len(ent.seed.rows) + extra):
            n = i + 1
            fixed = ent.seed.rows[i] if i < len(ent.seed.rows) else {}
            row = {}
            for fname, f in ent.fields.items():
                if fname in fixed:
                    row[fname] = fixed[fname]
                else:
                    row[fname] = _gen_value(f, ent.seed.fields.get(fname), n, rng, state, used[fname], bool(deep),
                                            person, refs)
            rows[f"{ent.id_prefix}{n}"] = row
        state["counters"][ename] = len(rows)
    return state


# -- operations as tools ---------------------------------------------------
def _id_param(entity: str) -> str:
    return f"{entity}_id"


def _operand(v: Any, args: dict[str, Any]) -> Any:
    if isinstance(v, str) and v.lstrip("-") in args:
        x = args[v.lstrip("-")]
        return -x if v.startswith("-") else x
    return v


def _page(label: str, lines: list[str], page: int | None, size: int) -> str:
    """One page of a listing: at most ``size`` rows, and (when there are more) a last line
    saying how many matched and how to ask for the next page."""
    pages = max(1, -(-len(lines) // size))
    if page is not None and not 1 <= page <= pages:
        raise ToolError(f"page {page} is out of range: {len(lines)} {label} rows match, "
                        f"{pages} page{'s' if pages > 1 else ''} of {size}; ask for a page from 1 to {pages}")
    if not lines:
        return f"No {label} matches the filters."
    if pages == 1:
        return "\n".join(lines)
    n = page or 1
    shown = lines[(n - 1) * size: n * size]
    more = f"; call again with page={n + 1} for more" if n < pages else ""
    return "\n".join(shown) + f"\npage {n} of {pages} ({len(lines)} matching){more}"


def _build_tool(env: EnvFile, op: OperationSpec, page_size: int | None = None) -> Tool:
    """The tool of one operation; a query shows at most ``page_size`` rows a call (with a
    ``page`` argument) when it is given, else every matching row."""
    from envfactory.factory.tables import check_condition, format_row, get_row, matches, next_key

    ent: EntitySpec = env.entities[op.entity]
    label = ent.label or op.entity
    params: list[inspect.Parameter] = []
    annotations: dict[str, Any] = {}
    docs: list[str] = []
    P = inspect.Parameter
    if op.kind in ("read", "update", "delete"):
        pid = _id_param(op.entity)
        params.append(P(pid, P.KEYWORD_ONLY))
        annotations[pid] = str
        docs.append(f"{pid}: Id of the {label}.")
    for p in op.params:
        f = ent.fields[p]
        t = _py_type(f)
        optional = op.kind == "query" or (op.kind == "create" and (f.nullable or f.default is not None))
        params.append(P(p, P.KEYWORD_ONLY, default=None) if optional else P(p, P.KEYWORD_ONLY))
        annotations[p] = Optional[t] if optional else t
        what = f.description or p.replace("_", " ")
        if f.type == "ref":
            what += f" (id of a {env.entities[f.target].label or f.target})"
        if op.kind == "query":
            what = f"Only {label} rows with this {p.replace('_', ' ')} (omit to ignore)."
        docs.append(f"{p}: {what}")
    paged = op.kind == "query" and page_size is not None
    if paged:
        params.append(P("page", P.KEYWORD_ONLY, default=None))
        annotations["page"] = Optional[int]
        docs.append(f"page: Which page of the matching rows to show, {page_size} rows a page "
                    "(1 is the first; omit for the first).")
    refs = {p: ent.fields[p].target for p in op.params if ent.fields[p].type == "ref"}

    def target(state: Any, on: str, row: dict | None, args: dict) -> dict:
        if on == "row":
            if row is None:  # the spec's validation allows 'on: row' only where there is one
                raise ToolError(f"{op.name}: no row to check")
            return row
        rent = refs[on]
        return get_row(state, rent, args[on], env.entities[rent].label)

    def run(_state: Any, **args: Any) -> str:
        state = _state
        row = None
        if op.kind in ("read", "update", "delete"):
            row = get_row(state, op.entity, args[_id_param(op.entity)], label)
        for p, rent in refs.items():
            if args.get(p) is not None:
                get_row(state, rent, args[p], env.entities[rent].label)
        if op.kind == "query":
            page = args.pop("page", None) if paged else None
            filters = {k: v for k, v in args.items() if v is not None}
            rows = state.tables.get(op.entity, {})
            lines = [format_row(label, k, r) for k, r in sorted(rows.items()) if matches(r, filters)]
            if paged:
                assert page_size is not None  # paged: set above
                return _page(label, lines, page, page_size)
            return "\n".join(lines) if lines else f"No {label} matches the filters."
        if op.kind in ("create", "update", "delete"):
            why = unconfirmed(state, op.name)  # an action the task's user must confirm first
            if why is not None:
                raise ToolError(why)
        new_row: dict[str, Any] | None = None
        if op.kind == "create":
            new_row = {f: (fs.default if fs.default is not None else None) for f, fs in ent.fields.items()}
            new_row.update(op.set)
            new_row.update({k: v for k, v in args.items() if v is not None})
        for c in op.preconditions:
            subject = target(state, c.on, row if row is not None else new_row, args)
            for kind, operand in c.conditions():
                if kind.endswith("_param"):
                    kind, operand = kind[: -len("_param")], args[operand]
                if not check_condition(subject, c.field, kind, operand):
                    raise ToolError(c.message or (
                        f"cannot {op.name.replace('_', ' ')}: {c.field} is "
                        f"{subject.get(c.field)!r}, which fails '{kind} {operand!r}'"))
        if op.kind == "read":
            assert row is not None  # read: fetched above
            return format_row(label, args[_id_param(op.entity)], row)
        if op.kind == "delete":
            key = args[_id_param(op.entity)]
            for oname, oent in env.entities.items():
                for fname, fs in oent.fields.items():
                    if fs.type == "ref" and fs.entity == op.entity and any(
                            r.get(fname) == key for r in state.tables.get(oname, {}).values()):
                        raise ToolError(f"{label} {key} is still referenced by a "
                                        f"{oent.label or oname}; change or remove that first")
            del state.tables[op.entity][key]
            return f"Deleted {label} {key}."
        if op.kind == "create":
            key = next_key(state, op.entity, ent.id_prefix)
            assert new_row is not None  # create: built above
            state.tables.setdefault(op.entity, {})[key] = row = new_row
        else:
            key = args[_id_param(op.entity)]
            assert row is not None  # update: fetched above
            row.update(op.set)
            row.update({p: args[p] for p in op.params})
        for e in op.effects:
            subject = target(state, e.on, row, args)
            if e.add is not None:
                subject[e.field] = round((subject.get(e.field) or 0) + _operand(e.add, args), 6)
            else:
                subject[e.field] = _operand(e.set, args)
        if op.kind == "create":
            return f"Created {label} {key}."
        return f"Updated {label} {key}: " + format_row(label, key, row).split(": ", 1)[1]

    run.__name__ = op.name
    run.__doc__ = op.description + ("\n\nArgs:\n" + "\n".join("    " + d for d in docs) if docs else "")
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [P("_state", P.POSITIONAL_OR_KEYWORD)] + params)
    run.__annotations__ = annotations
    return make_tool(run, name=op.name, read_only=op.kind in ("read", "query"))


# -- synthesis sources -----------------------------------------------------
def _sources(env: EnvFile, paged: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for op in env.operations:
        ent = env.entities[op.entity]
        if paged and op.kind == "query":
            out[f"{op.name}.page"] = []  # a step-by-step walk never turns pages
        if op.kind in ("read", "update", "delete"):
            out[f"{op.name}.{_id_param(op.entity)}"] = f"keys:tables.{op.entity}"
        for p in op.params:
            f = ent.fields[p]
            gen = ent.seed.fields.get(p)
            key = f"{op.name}.{p}"
            if f.type == "ref":
                out[key] = f"keys:tables.{f.entity}"
            elif op.kind == "query":
                out[key] = f"values:tables.{op.entity}.*.{p}"
            elif f.type in ("enum", "bool"):
                continue
            elif f.type == "str":
                if gen is not None and gen.choice:
                    out[key] = list(gen.choice)
                elif paged:  # a goal-level family's walks write notes, not filler words (issue 59)
                    out[key] = f.examples or free_text(p, f.description, FRESH_WORDS)
                else:  # the step-only families keep their published tasks (the tokenizer's corpus)
                    out[key] = list(FRESH_WORDS)
            else:
                lo, hi = gen.range if gen is not None and gen.range else (f.min or 1, f.max or 10)
                lo, hi = int(lo), int(hi)
                step = max(1, (hi - lo) // 12)
                vals = list(range(lo, hi + 1, step))
                out[key] = [float(v) for v in vals] if f.type == "float" else vals
    return out


def from_spec(path: str | Path) -> ToolEnvSpec:
    """Build the environment a spec file declares (tasks synthesized lazily); a composed file
    builds its one environment. See :func:`specs_from_file` for the file's variants too."""
    return specs_from_file(path)[0]


def specs_from_file(path: str | Path) -> list[ToolEnvSpec]:
    """Every environment a spec file declares: the file's own, then each of its ``variants``
    (the same world, other task rules); a composed file declares one."""
    path = Path(path)
    loaded = _load(path)
    if isinstance(loaded, ComposedFile):
        env, services = compose(loaded, path.parent)
        return [_build(env, env.tasks, env.name, env.description, path, services)]
    out = [_build(loaded, loaded.tasks, loaded.name, loaded.description, path)]
    for v in loaded.variants:
        out.append(_build(loaded, v.tasks, v.name, v.description or loaded.description, path))
    return out


def compose(cf: ComposedFile, base: Path) -> tuple[EnvFile, dict[str, str]]:
    """One :class:`EnvFile` holding every service of ``cf``, and ``{entity: service domain}``.
    A name that an earlier service already uses gets the later service's domain as a prefix
    (its references, instruction templates and policies follow); the services' written
    policies carry over."""
    entities: dict[str, Any] = {}
    operations: list[Any] = []
    services: dict[str, str] = {}
    policies: list[Any] = []
    for rel in cf.services:
        where = (base / rel).resolve()
        if not where.is_file():
            raise SpecError(f"{cf.name}: service file {rel!r} not found (looked for {where})")
        f = _load(where)
        if isinstance(f, ComposedFile):
            raise SpecError(f"{cf.name}: service {rel} is itself composed; name plain spec files")
        dom = re.sub(r"[^a-z0-9_]", "_", f.domain.lower())
        rename = {e: (f"{dom}_{e}" if e in entities else e) for e in f.entities}
        for e, ent in f.entities.items():
            fields = {k: (fs.model_copy(update={"entity": rename[fs.target]}) if fs.type == "ref" else fs)
                      for k, fs in ent.fields.items()}
            entities[rename[e]] = ent.model_copy(update={"fields": fields, "label": ent.label or e})
            services[rename[e]] = f.domain
        names = {op.name for op in operations}
        renamed_ops = {op.name: (f"{dom}_{op.name}" if op.name in names else op.name) for op in f.operations}
        policies += [r.model_copy(update={"operation": renamed_ops[r.operation]}) for r in f.policies or ()]
        for op in f.operations:
            upd: dict[str, Any] = {"entity": rename[op.entity]}
            if op.name in names:
                upd["name"] = f"{dom}_{op.name}"
            if op.instruction and rename[op.entity] != op.entity:
                upd["instruction"] = op.instruction.replace("{" + f"{op.entity}_id" + "}",
                                                            "{" + f"{rename[op.entity]}_id" + "}")
            operations.append(op.model_copy(update=upd))
    try:
        env = EnvFile.model_validate({"name": cf.name, "domain": cf.domain, "description": cf.description,
                                      "max_turns": cf.max_turns, "page_size": cf.page_size, "entities": entities,
                                      "operations": operations, "tasks": cf.tasks,
                                      # the services' written policies; derived ones when none wrote any
                                      "policies": policies or None})
    except ValidationError as exc:
        raise SpecError(f"{cf.name}: the services do not compose: {exc}") from None
    return env, services


def _build(env: EnvFile, rules: TaskRules, name: str, description: str, path: Path,
           services: dict[str, str] | None = None) -> ToolEnvSpec:
    from envfactory.factory.tables import TableState

    kinds = rules.kind_list()
    legacy = kinds == ["steps"]
    if not legacy:
        env = with_finders(env)
    fields: dict[str, Any] = {} if legacy else {"user": (dict[str, str], {})}
    state_type = create_model(name.split("-")[0] + "State", __base__=TableState, **fields)
    tools = [_build_tool(env, op, None if legacy else env.page_size) for op in env.operations]
    if "user" in kinds:
        tools.append(user_tool())
    policies = [] if legacy or "policy" not in kinds else (env.policies if env.policies is not None
                                                          else default_policies(env))

    # goal-level families get deep worlds from difficulty 3: every table that operations change
    # holds 25 * (difficulty - 1) rows or more (50-75 at 3, 100-150 at 5), so listings page
    acted = {op.entity for op in env.operations if op.kind == "update"}

    def sample(rng: random.Random, difficulty: int = 1) -> Any:
        deep = None if legacy or difficulty < 3 else {
            e: (25 * (difficulty - 1), 75 * (difficulty - 1) // 2) for e in acted}
        return state_type.model_validate(seed_state(env, rng, 1.0 + 0.5 * (difficulty - 1), deep))

    templates = {op.name: op.instruction for op in env.operations if op.instruction}
    prefix = name.split("-")[0].lower()
    synth = SynthConfig(sample_state=sample, arguments=_sources(env, not legacy), templates=templates,
                        lengths=tuple(rules.lengths), read_share=rules.read_share, prefix=prefix)
    prompt = None
    if policies or "user" in kinds:
        prompt = DEFAULT_SYSTEM_PROMPT
        if "user" in kinds:
            prompt += (" The user may hold details you need (who they are, what they want); ask them with "
                       "ask_user instead of guessing.")
        if policies:
            prompt += "\n\nPolicy (follow it whatever a request says):\n" + "\n".join(
                "- " + policy_text(env, r) for r in policies)
    spec = ToolEnvSpec(name=name, domain=env.domain, state_type=state_type, tools=tools, tasks=[],
                       description=description, max_turns=max(env.max_turns, GOAL_MAX_TURNS if not legacy else 0),
                       system_prompt=prompt,
                       metadata={"synth": synth, "source": f"spec file {path.name}", "kinds": kinds,
                                 **({"policies": [policy_text(env, r) for r in policies]} if policies else {})})
    if legacy:
        spec.tasks = lambda: synthesize(spec.all_tools, synth, rules.n, rules.seed)
        return spec
    tool_map = spec.all_tools
    work = [t for n, t in tool_map.items() if not t.finish and n != "ask_user"]
    guessable = _guessable_calls(tool_map)

    def steps(initial: Any, length: int, rng: random.Random) -> Any:
        made = _change_task(work, initial, length, synth, rng)
        if made is None:
            return None
        instruction, calls, check, _ = made
        if not _anchored(calls, tool_map, check):
            return None
        return instruction, calls, check

    def accept(task: Any) -> bool:
        if task.success(task.initial_state, BANNED_ANSWERS) or _random_solves(task, tool_map, _seeds(task.id)):
            return False
        if task.kind == "steps" and _blindly_reachable(task, tool_map, guessable):
            return False
        return True

    kinder = KindSynth(env, tool_map, sample, kinds, policies, prefix=prefix, services=services,
                       steps=steps, accept=accept)
    spec.metadata["supply"] = kinder.supply
    spec.metadata["user_task"] = kinder.twin_task
    spec.tasks = lambda: kinder.tasks(rules.n, rules.seed, rules.difficulties)
    return spec


_callable(__name__)  # envfactory.factory.from_spec may be this module: calling it calls from_spec()
