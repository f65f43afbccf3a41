"""Copy on write per container (envfactory.factory.classes.cow) in from_class states of attributes: a
call gives its state its own copy of what it reaches, whatever way the class's code reaches it
(indexing, get, iteration, dict(d), pop, slices), so forks stay independent and every call gives
what the same calls give on a deep copy of the class's instance; the quota's measure counts what
the engine's walk counts, and still refuses a state over its limit."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from envfactory import quotas
from envfactory.episode import Episode
from envfactory.factory.from_class import ClassTask, from_class
from envfactory.factory.classes.pystate import encode
from envfactory.state import state_hash
from envfactory.task import call


class Shop:
    """A shop whose methods reach their records every way a dict and a list can be reached."""

    def __init__(self, db: dict[str, Any]) -> None:
        self.db = db
        self.log: list[Any] = []

    def rename(self, uid: str, name: str) -> dict[str, Any]:
        """Rename a user.

        Args:
            uid: The user.
            name: The new name.
        """
        user = self.db["users"].get(uid)
        if user is None:
            return {"error": f"no user {uid}"}
        user["name"]["first"] = name
        return user

    def tag_all(self, tag: str) -> int:
        """Tag every user.

        Args:
            tag: The tag.
        """
        for user in self.db["users"].values():
            user["tags"].append(tag)
        return len(self.db["users"])

    def clone_user(self, uid: str, new_uid: str) -> dict[str, Any]:
        """Copy a user under a new id (shallow, as the class's author wrote it).

        Args:
            uid: The user.
            new_uid: The copy's id.
        """
        if uid not in self.db["users"]:
            return {"error": f"no user {uid}"}
        copied = dict(self.db["users"][uid])
        copied["name"] = {**copied["name"], "first": "Copy"}
        copied["tags"].append("cloned")  # the shallow copy shares the tags list with the original
        self.db["users"][new_uid] = copied
        return copied

    def archive(self, uid: str) -> str:
        """Move a user to the archive.

        Args:
            uid: The user.
        """
        user = self.db["users"].pop(uid, None)
        if user is None:
            return f"no user {uid}"
        user["archived"] = True
        self.db.setdefault("archive", {})[uid] = user
        self.log.append({"archived": uid, "n": len(self.db["archive"])})
        return "OK"

    def note(self, text: str) -> str:
        """Add a note to the last log entry.

        Args:
            text: The note.
        """
        if not self.log:
            self.log.append({})
        self.log[-1].setdefault("notes", []).append(text)
        for entry in self.log[-2:]:
            entry["seen"] = entry.get("seen", 0) + 1
        return "OK"

    def get_user(self, uid: str) -> dict[str, Any]:
        """A user.

        Args:
            uid: The user.
        """
        return self.db["users"].get(uid) or {"error": f"no user {uid}"}


def _db(n: int = 6) -> dict[str, Any]:
    return {"users": {f"u{i}": {"name": {"first": f"F{i}", "last": f"L{i}"}, "tags": ["a"] if i % 2 else []}
                      for i in range(n)}, "meta": {"version": 1}}


def _spec(db: dict[str, Any]) -> Any:
    return from_class(Shop, name="CowShop-v0", domain="shop", read_only=["get_user"], copy_on_write="containers",
                      tasks=[ClassTask("t", "Rename u1 to Ann.", {"db": db}, [call("rename", uid="u1", name="Ann")])])


CALLS = [("rename", {"uid": "u1", "name": "Bob"}), ("tag_all", {"tag": "x"}),
         ("clone_user", {"uid": "u3", "new_uid": "u9"}), ("archive", {"uid": "u2"}),
         ("note", {"text": "hi"}), ("note", {"text": "again"}), ("archive", {"uid": "u9"}),
         ("rename", {"uid": "u3", "name": "Cy"}), ("tag_all", {"tag": "y"})]


def _render(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


def _truth(db: dict[str, Any], before: list[tuple[str, dict[str, Any]]],
           after: list[tuple[str, dict[str, Any]]] = ()) -> tuple[list[str], Any]:
    """What the calls return and leave when run directly on a copy of the class's instance, with a
    fork (each field copied as a tree: what these states' forks always did) between ``before`` and
    ``after``."""
    shop = Shop(copy.deepcopy(db))
    outs = [_render(getattr(shop, name)(**args)) for name, args in before]
    if after:
        shop.__dict__ = json.loads(json.dumps(vars(shop)))
        outs += [_render(getattr(shop, name)(**args)) for name, args in after]
    return outs, {k: v for k, v in encode(vars(shop)).items() if not k.startswith("$")}  # ($ref: shared)


def _step(ep: Episode, name: str, args: dict[str, Any]) -> str:
    return ep.step(call(name, **args).to_hermes()).messages[0]["content"]


def _fields(ep: Episode) -> Any:
    d = ep.state.model_dump(mode="json")
    return {k: v for k, v in d.items() if not k.startswith("$")}


@pytest.mark.parametrize("fork_at", [0, 2, 4, 6])
def test_every_side_of_every_fork_gives_what_a_deep_copy_gives(fork_at):
    db = _db()
    pristine = copy.deepcopy(db)
    spec = _spec(db)
    ep = Episode(spec)
    ep.reset("t")
    for name, args in CALLS[:fork_at]:
        _step(ep, name, args)
    child = ep.fork()
    grand = child.fork()
    for e, calls in ((ep, CALLS[fork_at:]), (child, CALLS[fork_at:][::-1]), (grand, CALLS[fork_at::2])):
        outs = [_step(e, n, a) for n, a in calls]
        want_outs, want_state = _truth(db, CALLS[:fork_at], calls)
        assert outs == want_outs[fork_at:]
        assert _fields(e) == want_state
    assert db == pristine  # the configuration the tasks share is never changed


def test_a_snapshot_restored_then_forked_state_stays_exact():
    spec = _spec(_db())
    ep = Episode(spec)
    ep.reset("t")
    for name, args in CALLS[:3]:
        _step(ep, name, args)
    snap = ep.snapshot()
    h = state_hash(ep.state)
    for name, args in CALLS[3:]:
        _step(ep, name, args)
    ep.restore(snap)
    assert state_hash(ep.state) == h
    child = ep.fork()
    for name, args in CALLS[3:]:
        _step(child, name, args)
    assert state_hash(ep.state) == h
    assert _fields(child) == _truth(_db(), CALLS[:3], CALLS[3:])[1]


@pytest.mark.parametrize("users", [40, 150])  # (150: a table measured from its source's measure)
def test_the_quota_measure_counts_what_the_engines_walk_counts(users):
    class Plain:  # the same fields, walked by the engine's generic walk
        def __init__(self, d: dict[str, Any]) -> None:
            self.__dict__ = d

    spec = _spec(_db(users))
    ep = Episode(spec)
    ep.reset("t")
    for i, (name, args) in enumerate(CALLS * 2):
        _step(ep, name, args)
        if i % 3 == 0:
            ep = ep.fork()
        plain = json.loads(json.dumps(dict(ep.state.__dict__)))
        assert quotas.state_size(ep.state) == quotas.state_size(Plain(plain)) - 16


def test_the_quota_still_refuses_a_forked_state_over_its_limit(monkeypatch):
    spec = _spec(_db(40))
    ep = Episode(spec)
    ep.reset("t")
    _step(ep, "rename", {"uid": "u1", "name": "Bob"})
    child = ep.fork()
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas.state_size(child.state) + 100)
    before = state_hash(child.state)
    out = _step(child, "rename", {"uid": "u5", "name": "Z" * 1000})
    assert out.startswith(quotas.STATE_QUOTA_PREFIX)
    assert state_hash(child.state) == before
    assert _step(child, "rename", {"uid": "u5", "name": "Zed"}).startswith("{")


@pytest.mark.parametrize("aliases", [True, False])  # (clone_user makes two records hold one list)
@pytest.mark.parametrize("users", [30, 150])  # (150: a table written from its source's JSON)
def test_the_hash_is_the_engines_through_forks_writes_and_shared_references(users, aliases):
    """The remembered canonical JSON of shared containers gives the engine's text (a state whose
    calls made two places hold one list, written with a reference, included)."""
    from envfactory.state import canonical_json

    def engine(state: Any) -> str:
        return json.dumps(state.model_dump(mode="python"), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, default=str)

    spec = _spec(_db(users))
    ep = Episode(spec)
    ep.reset("t")
    assert canonical_json(ep.state) == engine(ep.state)
    calls = CALLS if aliases else [c for c in CALLS if c[0] != "clone_user"]
    for i, (name, args) in enumerate(calls * 2):
        _step(ep, name, args)
        if i % 2 == 0:
            ep = ep.fork()
        assert canonical_json(ep.state) == engine(ep.state), (i, name)
        assert canonical_json(ep.state) == engine(ep.state)  # (remembered the second time)


class Rows:
    """Rows in a list, beside a dict holding a set."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows
        self.meta: dict[str, Any] = {"n": 0, "tags": {"a"}}

    def bump(self, i: int) -> str:
        """Bump a row, copy two, sort, and note the call on every row.

        Args:
            i: The row.
        """
        self.rows[i]["v"] += 1
        self.rows[1:3] = [dict(r) for r in self.rows[1:3]]
        self.rows.sort(key=lambda r: -r["v"])
        self.meta["n"] += 1
        self.meta["tags"].add(str(i))
        for r in reversed(self.rows):
            r.setdefault("seen", []).append(i)
        del self.rows[-1]["seen"]
        return json.dumps(self.rows[:2])


def test_list_slices_sorting_and_a_set_in_a_field_stay_exact_across_a_fork():
    rows = [{"v": i} for i in range(5)]
    spec = from_class(Rows, name="Rows-v0", domain="rows", read_only=[], copy_on_write="containers",
                      tasks=[ClassTask("t", "Bump row 0.", {"rows": rows}, [call("bump", i=0)])])

    def truth(before: list[int], after: list[int]) -> tuple[list[str], Any]:
        obj = Rows(copy.deepcopy(rows))
        outs = [obj.bump(i) for i in before]
        obj.__dict__ = copy.deepcopy(obj.__dict__)
        outs += [obj.bump(i) for i in after]
        return outs, json.dumps(obj.__dict__, default=sorted, sort_keys=True)

    ep = Episode(spec)
    ep.reset("t")
    first = [_step(ep, "bump", {"i": i}) for i in (0, 1)]
    child = ep.fork()
    for e, after in ((child, [2, 3]), (ep, [4])):
        outs = first + [_step(e, "bump", {"i": i}) for i in after]
        want_outs, want_state = truth([0, 1], after)
        assert outs == want_outs
        assert json.dumps(dict(e.state.__dict__), default=sorted, sort_keys=True) == want_state
    assert rows == [{"v": i} for i in range(5)]


class Table:
    """A table of 80 records (a table written and measured from its source's), changed every way
    that keeps, reorders or replaces its keys."""

    def __init__(self, rows: dict[str, Any]) -> None:
        self.rows = rows

    def change(self, how: str, a: str, b: str) -> str:
        """Change the table.

        Args:
            how: set (a's value), one / two (a's value the number), swap (a's and b's records), readd (a taken out and put back last),
                drop (a taken out), same (a's record put back as it is), alias (b holds a's record), del (del of a),
                popitem (the last taken out), setdefault (a, if missing), update (a and b), clear (all, once a few are out).
            a: A key.
            b: Another key.
        """
        rows = self.rows
        if how == "set":
            rows[a] = {"v": len(rows), "s": a * 2}
        elif how in ("one", "two"):  # small ints: one object, wherever they stand
            rows[a] = 1 if how == "one" else 2
        elif how == "swap" and a in rows and b in rows:
            rows[a], rows[b] = rows[b], rows[a]
        elif how == "readd" and a in rows:
            rows[a] = rows.pop(a)
        elif how == "drop":
            rows.pop(a, None)
        elif how == "same" and a in rows:
            rows[a] = rows[a]
        elif how == "alias" and a in rows:
            rows[b] = rows[a]
        elif how == "del" and a in rows:
            del rows[a]
        elif how == "popitem" and rows:
            rows.popitem()
        elif how == "setdefault":
            rows.setdefault(a, {"v": -1})
        elif how == "update":
            rows.update({a: {"u": 1}, b: 2})
        elif how == "clear" and len(rows) < 78:
            rows.clear()
        return str(len(rows))


def test_a_table_changed_every_way_hashes_and_measures_as_the_engine_does():
    """The identity fast path (same keys in the same order: replaced entries found at C speed)
    must not be taken when keys were reordered, taken out or added; the hash and the quota's
    measure equal the engine's whatever the calls (hypothesis)."""
    from hypothesis import HealthCheck, example, given, settings, strategies as st

    from envfactory.state import canonical_json

    class Plain:
        def __init__(self, d: dict[str, Any]) -> None:
            self.__dict__ = d

    def engine(state: Any) -> str:
        return json.dumps(state.model_dump(mode="python"), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False, default=str)

    rows = {f"k{i:02d}": {"v": i, "s": "x" * (i % 7)} for i in range(80)}
    spec = from_class(Table, name="CowTable-v0", domain="t", read_only=[], copy_on_write="containers",
                      tasks=[ClassTask("t", "Set k01.", {"rows": rows}, [call("change", how="set", a="k01", b="k02")])])
    keys = st.sampled_from([f"k{i:02d}" for i in (0, 1, 2, 40, 79)] + ["new1", "new2"])
    op = st.tuples(st.sampled_from(["set", "one", "two", "swap", "readd", "drop", "same", "alias", "del", "popitem",
                                      "setdefault", "update", "clear"]), keys, keys)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(op, st.booleans()), min_size=1, max_size=8))
    # k00 set to 1, a fork, k00 put back last, k01 set to 1: position 0 holds the object 1 on both
    # sides under different keys (a fast path that compared values by position without the keys'
    # order would miss k01's change)
    @example([(("one", "k00", "k00"), True), (("readd", "k00", "k00"), False), (("one", "k01", "k00"), False)])
    def check(ops: list[Any]) -> None:
        ep = Episode(spec)
        ep.reset("t")
        for (how, a, b), fork in ops:
            _step(ep, "change", {"how": how, "a": a, "b": b})
            if fork:  # the parent hashed after it: its tables are remembered, the child's are written from them
                parent, ep = ep, ep.fork()
                if '"$ref"' not in json.dumps(encode(dict(parent.state.__dict__))):
                    assert canonical_json(parent.state) == engine(parent.state)
                    plain = json.loads(json.dumps(dict(parent.state.__dict__)))
                    assert quotas.state_size(parent.state) == quotas.state_size(Plain(plain)) - 16
            aliased = '"$ref"' in json.dumps(encode(dict(ep.state.__dict__)))
            if not aliased:  # (a record held twice is written as a reference: the engine's own walk)
                assert canonical_json(ep.state) == engine(ep.state), ops
                plain = json.loads(json.dumps(dict(ep.state.__dict__)))
                assert quotas.state_size(ep.state) == quotas.state_size(Plain(plain)) - 16, ops

    check()
