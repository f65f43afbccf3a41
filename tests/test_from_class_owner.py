"""Third-party worlds scored as their owners score them (issue 31).

A class written for its own users keeps what it is given, stamps clocks and ids on its
records and loads its scenario in a method of its own; from_class must neither let such a
class change a task's reference solution nor fail a correct replay over a value that only
differs from run to run."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from envfactory import Episode
from envfactory.checks.scripted import OraclePolicy, ScriptPolicy, play
from envfactory.checks.verify import verify_spec
from envfactory.factory.from_class import ClassTask, from_class
from envfactory.task import call


class Feed:
    """A feed that keeps the lists it is given (no copy), as plain classes do."""

    def __init__(self, posts: list | None = None):
        self.posts = list(posts or [])

    def post(self, text: str, mentions: list) -> str:
        """Post a message.

        Args:
            text: The message.
            mentions: Who it mentions.
        """
        self.posts.append({"text": text, "mentions": mentions})
        return f"posted #{len(self.posts) - 1}"

    def mention(self, index: int, who: str) -> str:
        """Mention someone in a post.

        Args:
            index: The post.
            who: The person.
        """
        self.posts[index]["mentions"].append(who)
        return "ok"


@pytest.mark.parametrize("validation", ["lax", "coerce", "strict"])
def test_a_class_that_keeps_its_arguments_cannot_change_the_reference(validation):
    """Before: with validation='lax' the stored ``mentions`` was the solution's own list, so
    building the task (the reads replay, then the expected state) appended to the reference
    solution, and the gold replay could never reach the expected state."""
    solution = [call("post", text="hi", mentions=["ann"]), call("mention", index=0, who="bob")]
    task = ClassTask("post-hi", "Post hi mentioning ann, then mention bob.", {"posts": []}, solution)
    spec = from_class(Feed, name="Feed-v0", domain="social", tasks=[task], validation=validation,
                      read_only=None, require_reads="always")
    built = spec.get_tasks()[0]
    assert solution[0].arguments == {"text": "hi", "mentions": ["ann"]}
    assert built.solution[0].arguments == {"text": "hi", "mentions": ["ann"]}
    out = play(Episode(spec), OraclePolicy(), "post-hi")
    assert out.success and set(out.rewards.values()) == {1.0}
    assert built.solution[0].arguments["mentions"] == ["ann"]


class Ledger:
    """A ledger that stamps every change with the clock, privately, as real classes do."""

    def __init__(self, entries: list | None = None):
        self.entries = list(entries or [])
        self._changed = None

    def add(self, item: str) -> str:
        """Add an entry.

        Args:
            item: The entry.
        """
        self.entries.append(item)
        self._changed = datetime.now()
        return f"added {item}"


class Entry:
    def __init__(self, item: str):
        self.item = item
        self.created = datetime.now()  # public, and different on every run


class Journal:
    """A journal whose entries carry their creation time in a public attribute."""

    def __init__(self, entries: list | None = None):
        self.entries = [Entry(e) for e in entries or []]
        self.updated = 0.0

    def add(self, item: str) -> str:
        """Add an entry.

        Args:
            item: The entry.
        """
        self.entries.append(Entry(item))
        self.updated = time.time()
        return f"added {item}"

    def items(self) -> list[str]:
        """The entries."""
        return [e.item for e in self.entries]


class OwnedJournal(Journal):
    """A journal whose owner says what makes two equal: the entries' text."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OwnedJournal) and self.items() == other.items()

    __hash__ = None  # type: ignore[assignment]


def _gold(spec, task_id="add-tea"):
    return play(Episode(spec), OraclePolicy(), task_id)


def _tasks():
    return [ClassTask("add-tea", "Add tea.", {"entries": ["milk"]}, [call("add", item="tea")])]


def test_a_private_clock_stamp_does_not_fail_the_gold_replay():
    """Before: the expected state was the whole state's hash, ``_changed`` included, so the gold
    replay (another clock reading) earned 0. The class defines no ``__eq__``: its public
    attributes are what is compared (the convention of the suites these classes come from)."""
    spec = from_class(Ledger, name="Ledger-v0", domain="books", tasks=_tasks())
    assert _gold(spec).success
    noop = play(Episode(spec), ScriptPolicy([], finish=True), "add-tea")
    assert not noop.success  # the public entries still decide
    strict = from_class(Ledger, name="LedgerAll-v0", domain="books", tasks=_tasks(), compare="all")
    time.sleep(0.002)
    assert not _gold(strict).success  # the whole state, clock included: what "all" asks for


def test_synthesized_tasks_compare_as_the_owner_does_too():
    """Before: a synthesized task's check held every leaf its walk changed, the clock stamp
    included, so no later replay of its reference passed."""
    from envfactory.factory.from_class import Synthesis

    for cls, compare in ((Ledger, "auto"), (Journal, {"Journal": ["updated"], "Entry": ["created"]}),
                         (OwnedJournal, "auto")):
        spec = from_class(cls, name=f"{cls.__name__}Synth-v0", domain="books", config={"entries": ["milk"]},
                          compare=compare, read_only=None,
                          synthesis=Synthesis(arguments={"item": ["tea", "jam", "rye"]}, n_tasks=3))
        tasks = spec.get_tasks()
        assert tasks
        time.sleep(0.002)
        for t in tasks:
            assert _gold(spec, t.id).success, (cls.__name__, t.id)
            assert not play(Episode(spec), ScriptPolicy([], finish=True), t.id).success


def test_the_owner_can_leave_out_per_run_values_or_bring_an_equality():
    journal = from_class(Journal, name="Journal-v0", domain="books", tasks=_tasks())
    time.sleep(0.002)
    assert not _gold(journal).success  # public per-run values: compared unless left out
    left_out = from_class(Journal, name="Journal-v1", domain="books", tasks=_tasks(),
                          compare={"Journal": ["updated"], "Entry": ["created"]})
    time.sleep(0.002)
    assert _gold(left_out).success
    assert not play(Episode(left_out), ScriptPolicy([call("add", item="tee").to_hermes()], finish=True),
                    "add-tea").success
    judged = from_class(Journal, name="Journal-v2", domain="books", tasks=_tasks(),
                        compare=lambda final, expected: final.items() == expected.items())
    assert _gold(judged).success
    owned = from_class(OwnedJournal, name="Journal-v3", domain="books", tasks=_tasks())
    time.sleep(0.002)
    assert _gold(owned).success  # the class's own __eq__
    assert not play(Episode(owned), ScriptPolicy([], finish=True), "add-tea").success


def test_verify_names_the_attributes_two_replays_disagree_on():
    spec = from_class(Journal, name="Journal-v4", domain="books", tasks=_tasks())
    report = verify_spec(spec, lambda: Episode(spec), api_checks=False, random_episodes=1, audit=None)
    found = [f for f in report.failures if f.check == "tool_determinism"]
    assert found, report.to_json()["failures"]
    assert "Journal.updated" in found[0].detail and "Entry.created" in found[0].detail
    assert "compare=" in found[0].detail
    fixed = from_class(Journal, name="Journal-v5", domain="books", tasks=_tasks(),
                       compare={"Journal": ["updated"], "Entry": ["created"]})
    report = verify_spec(fixed, lambda: Episode(fixed), api_checks=False, random_episodes=1, audit=None)
    assert report.verified, report.to_json()["failures"]


class Desk:
    """A help desk whose constructor sets only constants; ``_load_scenario`` loads the tickets."""

    def __init__(self):
        self.tickets: list = []
        self.next_id = 1

    def _load_scenario(self, scenario: dict) -> None:
        self.tickets = [dict(t) for t in scenario.get("tickets", [])]
        self.next_id = len(self.tickets) + 1

    def close(self, ticket: int) -> str:
        """Close a ticket.

        Args:
            ticket: Its id.
        """
        self.tickets[ticket - 1]["open"] = False
        return "closed"


def test_a_class_whose_state_is_only_its_constructor_constants_names_its_loader():
    """Before: imported (an empty desk), and every task failed at run time."""
    from envfactory import SpecError

    with pytest.raises(SpecError, match=r"Desk: .*Desk\(\).*loader='_load_scenario'"):
        from_class(Desk, name="Desk-v0", domain="support", config={})
    with pytest.raises(SpecError, match=r"Desk: .*loader='_load_scenario'"):  # the scenario as constructor arguments
        from_class(Desk, name="Desk-v0", domain="support", config={"tickets": [{"open": True}]})
    spec = from_class(Desk, name="Desk-v0", domain="support", loader="_load_scenario",
                      tasks=[ClassTask("close-1", "Close ticket 1.", {"tickets": [{"open": True}]},
                                       [call("close", ticket=1)])])
    assert _gold(spec, "close-1").success

    class Board:  # builds its whole state itself, through a helper named like a loader
        def __init__(self):
            self.cells: list = []
            self._setup(3)

        def _setup(self, size: int) -> None:
            self.cells = [0] * size

        def mark(self, cell: int) -> str:
            """Mark a cell.

            Args:
                cell: The cell.
            """
            self.cells[cell] = 1
            return "marked"

    board = from_class(Board, name="Board-v0", domain="games", read_only=None,
                       tasks=[ClassTask("mark-0", "Mark cell 0.", {}, [call("mark", cell=0)])])
    assert _gold(board, "mark-0").success


class Vault:
    """A vault whose methods answer a wrong argument with an error-shaped value, not an exception."""

    def __init__(self, items: dict | None = None):
        self.items = dict(items or {})

    def take(self, name: str) -> dict:
        """Take an item out.

        Args:
            name: The item.
        """
        if name not in self.items:
            return {"error": f"no item {name}"}
        return {"took": self.items.pop(name)}

    def shelve(self, name: str) -> str:
        """Put an item back.

        Args:
            name: The item.
        """
        if name in self.items:
            return f"Error: {name} is already here"
        self.items[name] = 1
        return "ok"


def test_an_error_shaped_answer_leaves_read_only_undecided():
    """Before: ``take`` and ``shelve`` answered every random call with an error-shaped value, left
    the state unchanged, and were observed read-only (so synthesis and the reads check took the
    writers for reads)."""
    from envfactory.factory.from_class import Service, Synthesis

    synthesis = Synthesis(arguments={"take.name": ["ghost"], "shelve.name": ["gold"]}, n_tasks=1)
    with pytest.warns(UserWarning, match=r"Vault: .*shelve, take.*read_only="):
        spec = from_class(Vault, name="Vault-v0", domain="vault", config={"items": {"gold": 1}},
                          synthesis=synthesis)
    assert not spec.all_tools["take"].read_only and not spec.all_tools["shelve"].read_only
    assert spec.metadata["read_only_undecided"] == ["shelve", "take"]
    pinned = from_class(Service(Vault, read_only=["take"]), name="Vault-v1", domain="vault",
                        config={"items": {"gold": 1}}, synthesis=synthesis)  # pinned: no warning
    assert pinned.all_tools["take"].read_only and not pinned.all_tools["shelve"].read_only
    assert pinned.metadata["read_only_undecided"] == []
