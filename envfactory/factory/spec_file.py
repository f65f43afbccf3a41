"""The declarative spec file format for table-backed environments (pydantic-validated).

A spec file (YAML or JSON) names an environment and declares:

* ``entities``: tables, each with an id prefix, typed ``fields`` (str, int,
  float, bool, enum with ``values``, ref to another ``entity``) and ``seed``
  rules for the rows of sampled initial states (fixed ``rows``, a ``count`` of
  generated rows, per-field generators: ``choice``, ``range``, ``value``,
  ``pattern``, ``unique``);
* ``operations``: ``create | read | update | delete | query`` on an entity,
  with ``params`` (fields the agent supplies), constant ``set`` values,
  ``effects`` (add a parameter to a numeric field of the row or of a referenced
  row) and ``preconditions`` (``equals``, ``not_equals``, ``in``, ``not_in``,
  ``min``, ``max``, ``min_param``, ``max_param`` on the row or a referenced row);
* ``tasks``: how many to synthesize, with which seed, and of which *kinds*
  (:data:`TASK_KINDS`; see :mod:`~envfactory.factory.tasks.kinds`): step-by-step walks (``steps``),
  look-up-then-act, conditional, policy-bound, answer and simulated-user tasks;
* ``policies`` (optional): rules written into the system prompt that policy-bound
  tasks test (derived from the operations when omitted);
* ``variants`` (optional): further versions of the same world with other task rules
  (``RetailOrders-v1``: the goal-level task kinds over ``RetailOrders-v0``'s tables).

A *composed* file names ``services`` (two or more spec files) instead of entities and
operations: one environment whose state holds every service's tables and whose tools
are every service's operations, for tasks that span services (``multi_service``).

See ``environments/specs/`` for examples.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["FieldSpec", "SeedRule", "EntitySpec", "Precondition", "Effect", "OperationSpec",
           "TaskRules", "PolicyRule", "Variant", "EnvFile", "ComposedFile", "TASK_KINDS"]

TASK_KINDS = ("steps", "lookup", "conditional", "policy", "answer", "user", "multi_service",
              "chain", "aggregate", "exception", "recovery")
"""Task kinds a spec family can synthesize (:mod:`~envfactory.factory.tasks.kinds`): ``steps`` (the instruction
lists the calls), ``lookup`` (a goal over rows named by their attributes, found before acting),
``conditional`` (the action on each row depends on a value a tool shows), ``policy`` (a request
part of which the system prompt's policy forbids), ``answer`` (a question about the state,
judged on the answer), ``user`` (a simulated user holds the facts the agent must ask for) and
``multi_service`` (look up in one service, act in another; composed files); and the
compositional kinds of :mod:`~envfactory.factory.tasks.grammar`: ``chain`` (a later step acts on what an earlier one
found), ``aggregate`` (a total, count or average decides the action), ``exception`` (every row
of a description except some) and ``recovery`` (where the tools refuse an action, another)."""

_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FieldSpec(_Strict):
    type: Literal["str", "int", "float", "bool", "enum", "ref"]
    values: list[str] | None = None
    entity: str | None = None
    nullable: bool = False
    default: Any = None
    description: str = ""
    min: float | None = None
    max: float | None = None
    # values a goal-level task may ask to write into this free-text field ("with the note 'customer
    # called back'"); never seeded, so the sampled worlds stay as they are (issue 59: without them a
    # task wrote a filler word, "with the note 'falcon'")
    examples: list[str] | None = None

    @model_validator(mode="after")
    def _kind(self) -> "FieldSpec":
        if self.type == "enum" and not self.values:
            raise ValueError("an enum field needs 'values'")
        if self.type == "ref" and not self.entity:
            raise ValueError("a ref field needs 'entity' (the table it points to)")
        if self.examples is not None and (self.type != "str" or not self.examples):
            raise ValueError("'examples' lists values of a str field (at least one)")
        return self

    @property
    def choices(self) -> list[str]:
        """An ``enum`` field's values (validated present)."""
        if self.values is None:
            raise ValueError(f"a {self.type} field has no values; only an enum field does")
        return self.values

    @property
    def target(self) -> str:
        """The entity a ``ref`` field points to (validated present)."""
        if self.entity is None:
            raise ValueError(f"a {self.type} field points to no entity; only a ref field does")
        return self.entity


class FieldGen(_Strict):
    choice: list[Any] | None = None
    range: tuple[float, float] | None = None
    value: Any = None
    pattern: str | None = None
    unique: bool = False
    null_share: float = 0.0


class SeedRule(_Strict):
    rows: list[dict[str, Any]] = Field(default_factory=list)
    count: int | tuple[int, int] = 0
    fields: dict[str, FieldGen] = Field(default_factory=dict)


class EntitySpec(_Strict):
    label: str | None = None
    id_prefix: str
    fields: dict[str, FieldSpec]
    seed: SeedRule = Field(default_factory=SeedRule)
    # whether a row is a person who can be a simulated user ("Hi, I'm a customer here");
    # None: decided by the entity's name or label (customer, patient, pet owner, ...)
    person: bool | None = None


class Precondition(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    on: str = "row"
    field: str
    equals: Any = None
    not_equals: Any = None
    in_: list[Any] | None = Field(default=None, alias="in")
    not_in: list[Any] | None = None
    min: float | None = None
    max: float | None = None
    min_param: str | None = None
    max_param: str | None = None
    message: str | None = None

    def conditions(self) -> list[tuple[str, Any]]:
        """``(op, operand)`` pairs; ``*_param`` operands name a parameter."""
        out = []
        for op in ("equals", "not_equals", "in_", "not_in", "min", "max", "min_param", "max_param"):
            v = getattr(self, op)
            if v is not None:
                out.append((op.rstrip("_"), v))
        if not out:
            raise ValueError(f"precondition on {self.field!r} states no condition")
        return out


class Effect(_Strict):
    on: str = "row"
    field: str
    add: str | float | None = None
    set: Any = None


class OperationSpec(_Strict):
    name: str
    kind: Literal["create", "read", "update", "delete", "query"]
    entity: str
    description: str
    params: list[str] = Field(default_factory=list)
    set: dict[str, Any] = Field(default_factory=dict)
    effects: list[Effect] = Field(default_factory=list)
    preconditions: list[Precondition] = Field(default_factory=list)
    instruction: str | None = None


class TaskRules(_Strict):
    n: int = 60
    seed: int = 0
    lengths: list[int] = Field(default_factory=lambda: [1, 2, 3, 4, 5])
    read_share: float = 0.2
    # "all" (every kind the spec supports) or a list of TASK_KINDS; ["steps"] is the
    # original step-by-step synthesis, kept by the first-published (v0) families
    kinds: Literal["all"] | list[str] = "all"
    # the difficulties (1-5) the registered tasks cycle through (see TaskSupply for more)
    difficulties: list[int] = Field(default_factory=lambda: [2, 3, 4, 5])

    @model_validator(mode="after")
    def _known_kinds(self) -> "TaskRules":
        if self.kinds != "all":
            unknown = [k for k in self.kinds if k not in TASK_KINDS]
            if unknown or not self.kinds:
                raise ValueError(f"unknown task kinds {unknown}; choose from {list(TASK_KINDS)}")
        if not self.difficulties or not all(1 <= d <= 5 for d in self.difficulties):
            raise ValueError("difficulties must be a non-empty list of integers from 1 to 5")
        return self

    def kind_list(self) -> list[str]:
        return list(TASK_KINDS) if self.kinds == "all" else list(self.kinds)


class PolicyRule(_Strict):
    """``operation`` must never be applied to a row whose ``field`` is above ``above``
    (or equals ``equals``); ``text`` is the sentence written into the system prompt."""

    operation: str
    field: str
    above: float | None = None
    equals: Any = None
    text: str | None = None

    @model_validator(mode="after")
    def _one(self) -> "PolicyRule":
        if (self.above is None) == (self.equals is None):
            raise ValueError("a policy rule states exactly one of 'above' or 'equals'")
        return self


class Variant(_Strict):
    """Another version of the same world: its own name, description and task rules."""

    name: str = Field(pattern=r"^[A-Z][A-Za-z0-9]*-v\d+$")
    description: str | None = None
    tasks: TaskRules = Field(default_factory=TaskRules)


class EnvFile(_Strict):
    """A whole spec file."""

    name: str = Field(pattern=r"^[A-Z][A-Za-z0-9]*-v\d+$")
    domain: str
    description: str = ""
    max_turns: int = 20
    # the most rows a query shows per call (goal-level families; a v0 steps-only family lists all)
    page_size: int = Field(default=10, ge=1)
    entities: dict[str, EntitySpec]
    operations: list[OperationSpec]
    tasks: TaskRules = Field(default_factory=TaskRules)
    policies: list[PolicyRule] | None = None
    variants: list[Variant] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> "EnvFile":
        errors: list[str] = []
        for ename, ent in self.entities.items():
            if not _IDENT.match(ename):
                errors.append(f"entity name {ename!r} must be lower_snake_case")
            for fname, f in ent.fields.items():
                if not _IDENT.match(fname):
                    errors.append(f"{ename}.{fname}: field names must be lower_snake_case")
                if f.type == "ref" and f.entity not in self.entities:
                    errors.append(f"{ename}.{fname} refers to unknown entity {f.entity!r}")
            for fname in ent.seed.fields:
                if fname not in ent.fields:
                    errors.append(f"{ename}.seed.fields names unknown field {fname!r}")
        seen: set[str] = set()
        for op in self.operations:
            where = f"operation {op.name!r}"
            if op.name in seen:
                errors.append(f"{where} is defined twice")
            seen.add(op.name)
            op_ent = self.entities.get(op.entity)
            if op_ent is None:
                errors.append(f"{where}: unknown entity {op.entity!r}")
                continue
            for p in list(op.params) + list(op.set):
                if p not in op_ent.fields:
                    errors.append(f"{where}: {p!r} is not a field of {op.entity}")
            refs = {p for p in op.params if op_ent.fields.get(p) and op_ent.fields[p].type == "ref"}
            for c in list(op.preconditions) + list(op.effects):
                target = op.entity if c.on == "row" else (
                    op_ent.fields[c.on].entity if c.on in refs else None)
                if target is None:
                    errors.append(f"{where}: 'on: {c.on}' must be 'row' or a ref parameter")
                elif target not in self.entities:
                    continue  # the unknown entity is reported with its field
                elif c.field not in self.entities[target].fields:
                    errors.append(f"{where}: {c.field!r} is not a field of {target}")
            for c in op.preconditions:
                try:
                    for o, v in c.conditions():
                        if o.endswith("_param") and v not in op.params:
                            errors.append(f"{where}: {o} names {v!r}, which is not a parameter")
                except ValueError as exc:
                    errors.append(f"{where}: {exc}")
            if op.kind == "create":
                for fname, f in op_ent.fields.items():
                    if (fname not in op.params and fname not in op.set and f.default is None
                            and not f.nullable):
                        errors.append(f"{where}: field {op.entity}.{fname} gets no value "
                                      "(add it to params or set, or give it a default)")
            if op.kind == "update" and not (op.params or op.set or op.effects):
                errors.append(f"{where}: an update must change something (params, set or effects)")
        ops = {op.name: op for op in self.operations}
        for rule in self.policies or ():
            ruled = ops.get(rule.operation)
            if ruled is None or ruled.kind not in ("update", "delete"):
                errors.append(f"policy on {rule.operation!r}: not an update or delete operation")
            elif rule.field not in self.entities[ruled.entity].fields:
                errors.append(f"policy on {rule.operation!r}: {rule.field!r} is not a field of {ruled.entity}")
        if errors:
            raise ValueError("; ".join(errors))
        return self


class ComposedFile(_Strict):
    """Several services in one environment: each ``services`` entry is a spec file (relative
    to this one) whose entities and operations join the environment's (a name two services
    share gets the later service's domain as a prefix)."""

    name: str = Field(pattern=r"^[A-Z][A-Za-z0-9]*-v\d+$")
    domain: str
    description: str = ""
    max_turns: int = 24
    page_size: int = Field(default=10, ge=1)
    services: list[str] = Field(min_length=2)
    tasks: TaskRules = Field(default_factory=TaskRules)
