"""MultiRecords-v0 (split permissions): one agent can read the HR database, another can write it.

``reader_0`` searches and reads employee records but cannot change them.
``writer_0`` changes records but cannot read them, and (change control) every
change must cite the message in which ``reader_0`` requested it, naming the
employee id and the new value. Neither can complete a change alone.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

import envfactory.multi as multi
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


def world() -> RecordsState:
    emps = {i: Employee(id=i, name=n, team=t, title=ti, salary=s,
                        email=n.lower().replace(" ", ".") + "@corp.example") for i, n, t, ti, s in _STAFF}
    return RecordsState(employees=emps)


def _expect(changes: dict[str, dict[str, Any]]):
    want = world().employees
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

    def add(instruction: str, reads: list, changes: list[tuple[str, str, str]], expect: dict) -> None:
        steps = list(reads)
        for n, (emp, field, value) in enumerate(changes, 1):
            _change(steps, n, emp, field, value, "")
        out.append(Task(id=f"records-{len(out):03d}", instruction=instruction, initial_state=world(),
                             solution=steps, check=_expect(expect)))

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
    return out


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
