"""MultiRecords-v0 (split permissions): one agent can read the HR database, another can write it.

``reader_0`` searches and reads employee records but cannot change them.
``writer_0`` changes records but cannot read them, and (change control) every
change must cite the message in which ``reader_0`` requested it, naming the
employee id and the new value. Neither can complete a change alone.

Tasks: five hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiRecords/<k>")``) up to 50, each on a staff drawn for the task: moves,
promotions, e-mail changes, team-wide salaries, merges, best- and lowest-paid lookups.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel

import envfactory.faces.pettingzoo_env as multi
from envfactory import MultiState, Role, Task, ToolEnvSpec, ToolError, by, register, tool
from tools.messaging import TOOLS as MESSAGING

Field_ = Literal["team", "email", "title", "salary"]


class Employee(BaseModel):
    id: str
    name: str
    team: str
    title: str
    email: str
    salary: int


class RecordsState(MultiState):
    employees: dict[str, Employee]
    change_log: list[str] = []


def _line(e: Employee) -> str:
    return f"{e.id} | {e.name} | team={e.team} | title={e.title} | email={e.email} | salary={e.salary}"


@tool(read_only=True)
def search_employees(state: RecordsState, team: str = "", name: str = "") -> str:
    """Find employees by team and/or by (part of) their name.

    Args:
        team: Team name to filter by (empty for any team).
        name: Part of the employee's name (empty for any name).
    """
    hits = [e for e in state.employees.values()
            if (not team or e.team == team.lower()) and name.lower() in e.name.lower()]
    return "\n".join(_line(e) for e in hits) or "No employee matches."


@tool(read_only=True)
def get_employee(state: RecordsState, employee_id: str) -> str:
    """Read one employee record.

    Args:
        employee_id: The employee id, like 'E-101'.
    """
    try:
        return _line(state.employees[employee_id])
    except KeyError:
        raise ToolError(f"no employee {employee_id!r}; ids look like 'E-101'") from None


@tool
def update_employee(state: RecordsState, employee_id: str, field: Field_, value: str, request_id: str) -> str:
    """Change one field of an employee record, citing the reader's request message.

    Args:
        employee_id: The employee id, like 'E-101'.
        field: The field to change: team, email, title or salary.
        value: The new value (salary in whole dollars).
        request_id: Id of the message from reader_0 requesting this change (like 'M-1').
    """
    letter = state.mail.get(request_id)
    if letter.sender != "reader_0" or not letter.reaches(state.acting):
        raise ToolError(f"message {request_id} is not a request from reader_0 to you; changes need one")
    text = letter.content.lower()
    if employee_id.lower() not in text or value.lower() not in text:
        raise ToolError(f"request {request_id} does not mention both {employee_id} and {value!r}; "
                        "ask reader_0 for a request naming the employee id and the new value")
    if employee_id not in state.employees:
        raise ToolError(f"no employee {employee_id!r}")
    e = state.employees[employee_id]
    if field == "salary":
        try:
            e.salary = int(value.replace(",", "").replace("$", ""))
        except ValueError:
            raise ToolError(f"salary must be a whole number of dollars, got {value!r}") from None
    else:
        setattr(e, field, value.lower() if field == "team" else value)
    state.change_log.append(f"{employee_id}.{field}={value} ({request_id})")
    return f"Updated {employee_id}: {field} = {value}."


_STAFF = [("E-101", "Ana Costa", "sales", "rep", 72000), ("E-102", "Alice Chen", "data", "analyst", 98000),
          ("E-103", "Bob Diaz", "data", "engineer", 101000), ("E-104", "Chen Li", "design", "designer", 88000),
          ("E-105", "Dev Patel", "design", "lead", 99000), ("E-106", "Eve Moss", "sales", "manager", 93000),
          ("E-107", "Finn Ng", "platform", "engineer", 104000)]


def world(staff: list[tuple[str, str, str, str, int]] = _STAFF) -> RecordsState:
    emps = {i: Employee(id=i, name=n, team=t, title=ti, salary=s,
                        email=n.lower().replace(" ", ".") + "@corp.example") for i, n, t, ti, s in staff}
    return RecordsState(employees=emps)


def _expect(changes: dict[str, dict[str, Any]], staff: list[tuple[str, str, str, str, int]] = _STAFF):
    want = world(staff).employees
    for i, fields in changes.items():
        for k, v in fields.items():
            setattr(want[i], k, v)

    def check(state: RecordsState) -> bool:
        return state.employees == want
    return check


def _change(steps: list, n: int, emp: str, field: str, value: str, note: str) -> None:
    steps += [by("reader_0", "send_message", to="writer_0", content=f"Please set {field} of {emp} to {value}. {note}"),
              by("writer_0", "update_employee", employee_id=emp, field=field, value=value, request_id=f"M-{n}")]


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(instruction: str, reads: list, changes: list[tuple[str, str, str]], expect: dict,
            staff: list[tuple[str, str, str, str, int]] = _STAFF, seed: int | None = None) -> None:
        steps = list(reads)
        for n, (emp, field, value) in enumerate(changes, 1):
            _change(steps, n, emp, field, value, "")
        out.append(Task(id=f"records-{len(out):03d}", instruction=instruction, initial_state=world(staff),
                        solution=steps, check=_expect(expect, staff),
                        metadata={} if seed is None else {"generator_seed": seed}))

    add("Alice Chen has moved to the platform team; update her record.",
        [by("reader_0", "search_employees", name="Alice Chen")], [("E-102", "team", "platform")],
        {"E-102": {"team": "platform"}})
    add("Bob Diaz's email must become bob.diaz@data.corp.example.",
        [by("reader_0", "search_employees", name="Bob Diaz")],
        [("E-103", "email", "bob.diaz@data.corp.example")], {"E-103": {"email": "bob.diaz@data.corp.example"}})
    add("Everyone in the data team gets a salary of 105000.",
        [by("reader_0", "search_employees", team="data")],
        [("E-102", "salary", "105000"), ("E-103", "salary", "105000")],
        {"E-102": {"salary": 105000}, "E-103": {"salary": 105000}})
    add("The best-paid person in the sales team gets the title 'director'.",
        [by("reader_0", "search_employees", team="sales")], [("E-106", "title", "director")],
        {"E-106": {"title": "director"}})
    add("The design team is merged into the product team: move each of its members.",
        [by("reader_0", "search_employees", team="design")],
        [("E-104", "team", "product"), ("E-105", "team", "product")],
        {"E-104": {"team": "product"}, "E-105": {"team": "product"}})
    seed = 0
    while len(out) < N_TASKS:
        made = generate(random.Random(f"MultiRecords/{seed}"))
        if made is not None:
            add(*made, seed=seed)
        seed += 1
    return out


N_TASKS = 50
_FIRST = ("Ana", "Ben", "Carla", "Dmitri", "Elif", "Femi", "Greta", "Hugo", "Iris", "Jonas", "Kemal", "Lena",
          "Mateo", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wen", "Yusuf")
_LAST = ("Abe", "Berg", "Cruz", "Dahl", "Eze", "Fox", "Gill", "Holm", "Ito", "Jain", "Kaur", "Lund", "Mori",
         "Nolan", "Ortiz", "Park", "Quist", "Rossi", "Sato", "Tan", "Udeh", "Voss", "Wong", "Zhou")
_TEAMS = ("sales", "data", "design", "platform", "finance", "support", "legal", "research")
_TITLES = ("analyst", "engineer", "designer", "rep", "lead", "manager", "specialist", "architect")


def generate(rng: random.Random) -> tuple | None:
    """One procedurally generated task (instruction, reads, changes, expected changes, staff), or
    ``None`` when the draw has no valid task of the chosen kind (the caller draws again)."""
    teams = rng.sample(_TEAMS, rng.randint(3, 4))
    names: list[str] = []
    size = rng.randint(6, 9)
    while len(names) < size:
        name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        if name not in names:
            names.append(name)
    staff = []
    for k, name in enumerate(names):
        staff.append((f"E-{201 + k}", name, rng.choice(teams), rng.choice(_TITLES),
                      1000 * rng.randint(55, 130)))
    by_team = {t: [e for e in staff if e[2] == t] for t in teams}
    present = [t for t in teams if by_team[t]]
    kind = rng.choice(("move", "email", "team_salary", "top_title", "merge", "low_raise", "title"))
    if kind in ("move", "email", "title"):
        e = rng.choice(staff)
        read = [by("reader_0", "search_employees", name=e[1])]
        if kind == "move":
            team = rng.choice([t for t in _TEAMS if t != e[2]])
            return (f"{e[1]} has moved to the {team} team; update their record.", read, [(e[0], "team", team)],
                    {e[0]: {"team": team}}, staff)
        if kind == "title":
            title = rng.choice([t for t in _TITLES if t != e[3]])
            return (f"{e[1]} has been promoted: their title is now '{title}'.", read, [(e[0], "title", title)],
                    {e[0]: {"title": title}}, staff)
        email = f"{e[1].split()[0].lower()}.{e[1].split()[1][0].lower()}@{e[2]}.corp.example"
        return (f"{e[1]}'s email must become {email}.", read, [(e[0], "email", email)], {e[0]: {"email": email}},
                staff)
    team = rng.choice(present)
    members = by_team[team]
    read = [by("reader_0", "search_employees", team=team)]
    if kind == "team_salary":
        if len(members) > 3:
            return None
        pay = 1000 * rng.randint(60, 140)
        if any(e[4] == pay for e in members):
            return None
        return (f"Everyone in the {team} team gets a salary of {pay}.", read,
                [(e[0], "salary", str(pay)) for e in members], {e[0]: {"salary": pay} for e in members}, staff)
    if kind == "merge":
        if len(members) > 3:
            return None
        into = rng.choice([t for t in _TEAMS if t != team])
        return (f"The {team} team is merged into the {into} team: move each of its members.", read,
                [(e[0], "team", into) for e in members], {e[0]: {"team": into} for e in members}, staff)
    pays = sorted(e[4] for e in members)
    if len(members) < 2 or len(set(pays)) != len(pays):
        return None
    if kind == "top_title":
        e = max(members, key=lambda e: e[4])
        title = rng.choice(["director", "head", "principal"])
        return (f"The best-paid person in the {team} team gets the title '{title}'.", read,
                [(e[0], "title", title)], {e[0]: {"title": title}}, staff)
    e = min(members, key=lambda e: e[4])
    pay = e[4] + 1000 * rng.randint(3, 12)
    return (f"The lowest-paid person in the {team} team gets a raise to a salary of {pay}.", read,
            [(e[0], "salary", str(pay))], {e[0]: {"salary": pay}}, staff)


SPEC = register(ToolEnvSpec(
    name="MultiRecords-v0",
    domain="hr-records",
    description="Split permissions: reader_0 can read the HR database, writer_0 can write it (citing requests).",
    state_type=RecordsState,
    roles=[Role("reader_0", "the records analyst: you can search and read employee records but not change them",
                [search_employees, get_employee]),
           Role("writer_0", "the database administrator: you can change employee records but cannot read them; "
                "every change must cite the id of reader_0's message requesting it", [update_employee])],
    tools=MESSAGING,
    tasks=tasks,
    max_turns=10,
))


def env(**kwargs: Any) -> Any:
    """PettingZoo AEC env of MultiRecords-v0."""
    return multi.env(SPEC.name, **kwargs)


def parallel_env(**kwargs: Any) -> Any:
    """PettingZoo Parallel env of MultiRecords-v0."""
    return multi.parallel_env(SPEC.name, **kwargs)
