"""The state quota's measure proportional to what a call changed (issue 60): a large tracked state is
adopted by a ledger (envfactory.sizes' containers report their mutations) and a writing call is
measured by what it removed and added, with the quota's guarantee unchanged: a call past
MAX_STATE_BYTES is that call's error and leaves the state as it was, and whatever the ledger cannot
vouch for is measured in full. Tracked containers copy, dump, hash and compare as plain ones."""

from __future__ import annotations

import copy
import json
import pickle
import random
from typing import Any

import pytest
from pydantic import BaseModel

from envfactory import quotas
from envfactory.sizes import TDict, TList, TSet
from envfactory.state import State, canonical_json, copy_state, live_leaf, same_state, state_hash
from envfactory.tooling import tool


class Row(BaseModel):
    id: str
    name: str
    qty: int = 0
    price: float = 0.5
    tags: list[str] = []
    labels: set[str] = set()
    extra: dict[str, Any] = {}


class Table(State):
    rows: dict[str, Row] = {}
    items: list[Row] = []
    index: dict[str, list[int]] = {}
    note: str = ""
    blob: Any = None


def _table(n: int = 200) -> Table:
    return Table(rows={f"r{i}": Row(id=f"r{i}", name=f"row {i}", tags=["a"], labels={"x"}) for i in range(n)},
                 items=[Row(id=f"i{i}", name="item") for i in range(n // 4)],
                 index={"even": list(range(0, n, 2)), "odd": list(range(1, n, 2))})


def _pick(rng: random.Random, xs: Any) -> Any:
    xs = sorted(xs) if isinstance(xs, (set, dict)) else list(xs)
    return xs[rng.randrange(len(xs))] if xs else None


def _mutate(state: Table, op: str, seed: int) -> None:
    """One of many kinds of mutation, chosen by ``op``, its details by ``seed`` and the state."""
    rng = random.Random(seed)
    rows, items = state.rows, state.items
    key = _pick(rng, rows)
    row = rows[key] if key is not None else None
    fresh = Row(id=f"n{seed}", name="é" * rng.randrange(5) + "new", tags=["t"] * rng.randrange(3),
                extra={"deep": {"x": [1, 2.5, None, True, "s"]}})
    if op == "field" and row is not None:
        row.qty = rng.randrange(10 ** 20)
        row.name = "n" * rng.randrange(50)
    elif op == "put":
        rows[f"k{seed}"] = fresh
    elif op == "del" and key is not None:
        del rows[key]
    elif op == "pop" and key is not None:
        rows.pop(key)
        rows.pop("nothing", None)
    elif op == "popitem" and rows:
        rows.popitem()
    elif op == "setdefault":
        rows.setdefault(f"s{seed}", fresh)
        if key is not None:
            rows.setdefault(key, fresh)
    elif op == "update":
        rows.update({f"u{seed}": fresh}, **({key: Row(id="x", name="y")} if key else {}))
        rows |= {f"v{seed}": Row(id="v", name="w")}
    elif op == "move" and key is not None:
        rows[f"m{seed}"] = rows.pop(key)
    elif op == "tags" and row is not None:
        row.tags.append("z" * rng.randrange(9))
        row.tags.extend(["q", "r"])
        row.tags.insert(0, "first")
        row.tags += ["plus"]
        row.tags[0] = "changed"
        row.tags[1:3] = ["a", "b", "c", "d"]
        del row.tags[0:1]
        if row.tags:
            row.tags.pop()
        if "q" in row.tags:
            row.tags.remove("q")
    elif op == "tags_bulk" and row is not None:
        row.tags *= 2
        row.tags.sort()
        row.tags.reverse()
        if rng.random() < 0.5:
            row.tags.clear()
    elif op == "labels" and row is not None:
        row.labels.add("y" * rng.randrange(4))
        row.labels.discard("x")
        row.labels |= {"or"}
        row.labels -= {"nothing"}
        if row.labels:
            row.labels.pop()
    elif op == "replace_field" and row is not None:
        row.tags = ["new", "list"]
        row.extra = {"a": {"b": ["c"]}}
    elif op == "extra" and row is not None:
        row.extra["k"] = [1, {"z": "y"}]
        row.extra.setdefault("l", []).append(3)
        inner = row.extra.get("deep")
        if isinstance(inner, dict):
            inner["x"] = "replaced"
    elif op == "items":
        items.append(fresh)
        if items and rng.random() < 0.5:
            items.pop(0)
        if len(items) > 1:
            items[0], items[-1] = items[-1], items[0]  # (a swap: each row put where the other was)
        items.insert(1, Row(id="ins", name="i"))
    elif op == "items_move" and items:
        items.insert(0, items.pop())
    elif op == "index":
        state.index.setdefault("new", []).append(seed)
        state.index["even"][0:2] = [7, 8, 9]
        state.index.pop("odd", None)
    elif op == "note":
        state.note = "note " * rng.randrange(20)
        state.blob = {"any": [{"a": 1}, ("tuple", 2), frozenset({"f"})]} if rng.random() < 0.5 else None
    elif op == "clear_items":
        items.clear()
    elif op == "new_then_change":
        d: dict[str, Any] = {"l": []}
        rows[f"c{seed}"] = Row(id="c", name="c", extra=d)
        d["l"].append("added after the put")  # (a new part changed after it was put in: walked after the call)
    elif op == "removed_then_changed" and row is not None:
        del rows[key]
        row.name = "changed after it left" * 10  # (not in the state any more: counts nothing)


_OPS = ["field", "put", "del", "pop", "popitem", "setdefault", "update", "move", "tags", "tags_bulk", "labels",
        "replace_field", "extra", "items", "items_move", "index", "note", "clear_items", "new_then_change",
        "removed_then_changed"]


@tool
def mutate(state: Table, op: str, seed: int) -> str:
    """Change the table.

    Args:
        op: What to do.
        seed: The details.
    """
    _mutate(state, op, seed)
    return "ok"


@tool
def write(state: Table, key: str, text: str = "") -> str:
    """Write one row's name.

    Args:
        key: The row.
        text: The name.
    """
    state.rows[key].name = text
    return "ok"


@tool
def grow(state: Table, n: int) -> str:
    """Add a row with a long name.

    Args:
        n: The name's length.
    """
    state.rows[f"g{n}"] = Row(id="g", name="g" * n)
    return "ok"


@tool
def multiply(state: Table, times: int) -> str:
    """Repeat the items.

    Args:
        times: How many times.
    """
    state.items = state.items * times
    return "ok"


@tool
def nest(state: Table, depth: int) -> str:
    """Nest the index in itself.

    Args:
        depth: How many times.
    """
    v: Any = list(state.index["even"])
    for _ in range(depth):
        v = [v, v]
    state.blob = v
    return "ok"


@tool
def share(state: Table, key: str) -> str:
    """Put one row under a second key.

    Args:
        key: The row.
    """
    state.rows["shared"] = state.rows[key]
    return "ok"


class Opaque:
    def __init__(self) -> None:
        self.payload = "p" * 100


@tool
def opaque(state: Table) -> str:
    """Put an object of an unknown class in the state."""
    state.blob = Opaque()
    return "ok"


@tool(read_only=True)
def sneaky_read(state: Table, key: str) -> str:
    """A read that writes (it should not).

    Args:
        key: The row.
    """
    state.rows[key].name = "w" * 5000
    return "ok"


def _adopted(n: int = 200) -> Table:
    state = _table(n)
    quotas.track(state)
    for i in range(quotas.ADOPT_AFTER + 1):  # the first writing calls find it large, the next adopts it
        out, state = quotas.invoke_within_quota(write, state, {"key": "r0", "text": f"w{i}"})
        assert out.ok
    assert _ledger(state) is not None and _ledger(state).total == quotas._walk(state, None)
    return state


def _ledger(state: Any) -> Any:
    j = quotas._journal(state)
    return None if j is None else j.ledger


@pytest.mark.parametrize("seed", range(6))
def test_the_ledger_counts_what_the_full_measure_counts_after_every_kind_of_write(seed: int) -> None:
    state = _adopted()
    twin = copy_state(state)  # plain containers, never adopted: the same calls on it
    assert type(twin.rows) is dict and type(state.rows) is TDict
    rng = random.Random(seed)
    for step in range(120):
        op, s = rng.choice(_OPS), rng.randrange(10 ** 6)
        out, state = quotas.invoke_within_quota(mutate, state, {"op": op, "seed": s})
        assert out.ok, (op, out.content)
        _mutate(twin, op, s)
        lg = _ledger(state)
        assert lg is not None, f"the ledger gave up at {op}"  # (these writes are all ones it vouches for)
        assert lg.total == quotas._walk(state, None) == quotas._walk(twin, None), (step, op)
        assert canonical_json(state) == canonical_json(twin), (step, op)


def test_a_write_on_an_adopted_state_does_not_walk_the_state(monkeypatch) -> None:
    """The cost: before, every writing call measured the whole state (sizer(state)); now, once it
    is adopted, a write measures what it changed (the full measure is never called on the state)."""
    state = _adopted(2000)
    walked: list[int] = []
    real_walk, real_model = quotas._walk, quotas._model_size

    def walk(v: Any, limit: Any) -> int:
        if v is state:
            walked.append(1)
        return real_walk(v, limit)

    def model_size(v: Any, limit: Any) -> int:
        if v is state:
            walked.append(1)
        return real_model(v, limit)

    monkeypatch.setattr(quotas, "_walk", walk)
    monkeypatch.setattr(quotas, "_model_size", model_size)
    monkeypatch.setattr(quotas, "_SIZERS", {})
    for i in range(50):
        out, state = quotas.invoke_within_quota(write, state, {"key": f"r{i}", "text": "x" * i})
        assert out.ok
    assert not walked
    assert _ledger(state).total == real_walk(state, None)


def test_a_call_past_the_quota_on_the_fast_path_is_its_error_and_the_state_is_as_before(monkeypatch) -> None:
    state = _adopted()
    size = quotas._walk(state, None)
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", size + 20_000)
    before = state_hash(state)
    out, state = quotas.invoke_within_quota(grow, state, {"n": 30_000})
    assert not out.ok and out.kind == "quota", out.content
    assert state_hash(state) == before
    out, state = quotas.invoke_within_quota(grow, state, {"n": 10_000})  # within it: kept, and counted
    assert out.ok and "g10000" in state.rows
    lg = _ledger(state)
    if lg is not None:
        assert lg.total == quotas._walk(state, None)
    assert quotas.state_size(state) <= quotas.MAX_STATE_BYTES


def test_amplifying_calls_on_an_adopted_state_are_undone() -> None:
    """``items * 1000`` (each row held 1,000 times) and ``[v, v]`` nested 30 times (2**30 paths in
    30 lists): each that call's error, the state exactly as before, the episode goes on."""
    state = _adopted(4000)
    for t, args in ((multiply, {"times": 1000}), (nest, {"depth": 30})):
        before = canonical_json(state)
        out, state = quotas.invoke_within_quota(t, state, args)
        assert not out.ok and out.kind == "quota", (t.name, out.content)
        assert canonical_json(state) == before
        out, state = quotas.invoke_within_quota(write, state, {"key": "r1", "text": "after"})
        assert out.ok and state.rows["r1"].name == "after"
    out, state = quotas.invoke_within_quota(write, state, {"key": "r2", "text": "again"})
    lg = _ledger(state)
    assert lg is None or lg.total == quotas._walk(state, None)


def _over_by_next_call(monkeypatch, state: Table, change: Any, tool_: Any = write, args: Any = None) -> Any:
    """Set the quota just above the state, let ``change`` (outside the fast path) grow it past,
    then a small writing call: the full measure must see it."""
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas._walk(state, None) + 2_000)
    change(state)
    out, state = quotas.invoke_within_quota(tool_, state, args or {"key": "r3", "text": "small"})
    return out, state


def test_a_change_outside_a_writing_call_is_measured_in_full(monkeypatch) -> None:
    state = _adopted()

    def outside(s: Table) -> None:
        s.rows["r5"].name = "o" * 10_000  # (a caller's own change between steps)

    out, state = _over_by_next_call(monkeypatch, state, outside)
    assert not out.ok and out.kind == "quota"


def test_a_read_only_tool_that_writes_is_measured_at_the_next_write(monkeypatch) -> None:
    state = _adopted()

    def read(s: Table) -> None:
        out, s2 = quotas.invoke_within_quota(sneaky_read, s, {"key": "r6"})
        assert out.ok and s2 is s

    out, state = _over_by_next_call(monkeypatch, state, read)
    assert not out.ok and out.kind == "quota"


def test_a_part_held_twice_falls_back_to_the_full_measure(monkeypatch) -> None:
    state = _adopted()
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas._walk(state, None) + 50)
    state.rows["r7"].name  # noqa: B018
    out, state = quotas.invoke_within_quota(share, state, {"key": "r7"})  # the row's size again: over
    assert not out.ok and out.kind == "quota"
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", 1 << 30)
    out, state = quotas.invoke_within_quota(share, state, {"key": "r7"})
    assert out.ok and state.rows["shared"] is state.rows["r7"]  # (aliasing kept)
    assert _ledger(state) is None  # not vouched for: dropped, measured in full
    out, state = quotas.invoke_within_quota(write, state, {"key": "r7", "text": "via one key"})
    assert out.ok and state.rows["shared"].name == "via one key"
    assert quotas.state_size(state) == quotas._walk(state, None)


def test_an_unknown_value_falls_back_to_the_full_measure(monkeypatch) -> None:
    state = _adopted()
    out, state = quotas.invoke_within_quota(opaque, state, {})
    assert out.ok and _ledger(state) is None
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas._walk(state, None) + 100)
    out, state = quotas.invoke_within_quota(grow, state, {"n": 500})
    assert not out.ok and out.kind == "quota"


def test_a_c_level_write_is_caught_at_the_journal_s_checkpoint(monkeypatch) -> None:
    """``dict.__setitem__`` skips the tracked container's method: the ledger cannot see it; the
    journal's checkpoint (which copies the state anyway) measures it in full and drops the ledger."""
    monkeypatch.setattr(quotas, "_CHECKPOINT_CALLS", 4)
    state = _adopted()
    dict.__setitem__(state.rows, "bypass", Row(id="b", name="b" * 3000))
    lg = _ledger(state)
    for i in range(4):
        out, state = quotas.invoke_within_quota(write, state, {"key": "r1", "text": str(i)})
        assert out.ok
    assert lg.dead and _ledger(state) is not lg
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas._walk(state, None) + 10)
    out, state = quotas.invoke_within_quota(grow, state, {"n": 100})
    assert not out.ok and out.kind == "quota"


def test_tracked_containers_copy_dump_hash_and_compare_as_plain_ones() -> None:
    state = _adopted()
    for op, s in (("labels", 1), ("extra", 2), ("items", 3), ("note", 4), ("index", 5)):
        out, state = quotas.invoke_within_quota(mutate, state, {"op": op, "seed": s})
        assert out.ok
    assert type(state.rows) is TDict and type(state.items) is TList and type(state.rows["r1"].labels) is TSet
    assert type(state.rows["r1"].__dict__) is TDict
    plain = Table.model_validate(json.loads(json.dumps(state.model_dump(mode="json"))))
    for other in (copy_state(state), copy.deepcopy(state), pickle.loads(pickle.dumps(state)), plain):
        assert type(other.rows) is dict and type(other.items) is list and type(other.rows["r1"].__dict__) is dict
        assert type(other.rows["r1"].labels) is set and type(other.index["even"]) is list
        assert canonical_json(other) == canonical_json(state) and state_hash(other) == state_hash(state)
        assert json.dumps(other.model_dump(mode="json")) == json.dumps(state.model_dump(mode="json"))
        if other is not plain:  # (a JSON round trip makes the blob's tuple a list: equal dumps, other classes)
            assert other == state
            assert same_state(state, other) and same_state(other, state)
        for path in (("rows", "r1", "name"), ("rows", "r1", "tags"), ("index", "even"), ("rows", "nope"), ("note",)):
            assert live_leaf(state, path) == live_leaf(other, path)
    assert type(state.rows.copy()) is dict and type(state.items[:]) is list and type(state.rows["r1"].labels.copy()) is set


def test_a_fork_of_an_adopted_state_is_independent() -> None:
    from envfactory import Task, ToolEnvSpec
    from envfactory.task import call
    from envfactory.world import LocalWorld

    start = _table(300)
    task = Task(id="t", instruction="x", initial_state=start, solution=[], check=lambda s: True)
    spec = ToolEnvSpec(name="GrowthForkTable-v0", domain="test", description="x", state_type=Table,
                       tools=[write, mutate], tasks=[task], max_turns=1000)
    world = LocalWorld(spec)
    world.start(task)
    for i in range(quotas.ADOPT_AFTER + 1):
        world.run("agent", 0, [call("write", key="r1", text=f"p{i}")])
    assert _ledger(world.view()) is not None
    child = world.fork()
    before = canonical_json(world.view())
    for i in range(3):
        child.run("agent", 0, [call("mutate", op="put", seed=i)])
        child.run("agent", 0, [call("write", key="r2", text=f"c{i}")])
    assert canonical_json(world.view()) == before
    world.run("agent", 0, [call("write", key="r3", text="parent")])
    mine, theirs = child.view(), world.view()
    assert isinstance(mine, Table) and isinstance(theirs, Table)
    assert mine.rows["r3"].name == "row 3" and theirs.rows["r3"].name == "parent"
    for w in (world, child):
        lg = _ledger(w.view())
        assert lg is None or lg.total == quotas._walk(w.view(), None)


def _adoptable_specs(every: int = 1) -> list[Any]:
    import envfactory

    out = []
    for name in sorted(envfactory.specs(), key=str)[::every]:
        spec = envfactory.spec(name) if isinstance(name, str) else name
        if not spec.multi_agent and quotas._adoptable(spec.state_type):
            out.append(spec)
    return out


def test_built_in_reference_plays_dump_and_hash_alike_with_the_ledger(monkeypatch) -> None:
    """Built-in single-agent environments whose state the ledger takes (a plain pydantic one; every
    fifth by name here: building their tasks is what costs; all 106 passed the same), each its first
    task's reference played twice, the ledger on every state (adopted at the first
    writing call) and off: the same outcomes, canonical JSON, dump and hash after every call, and
    the ledger's count the full measure's."""
    from envfactory.world import LocalWorld

    played = adopted = 0
    for spec in _adoptable_specs(every=5):
        tasks = spec.tasks() if callable(spec.tasks) else spec.tasks
        task = next((t for t in tasks if t.solution), None)
        if task is None:
            continue
        worlds = []
        monkeypatch.setattr(quotas, "ADOPT_AFTER", 0)  # (adopted at the first writing call)
        for on in (True, False):
            monkeypatch.setattr(quotas, "LEDGER_BYTES", 0 if on else 1 << 60)
            w = LocalWorld(spec)
            w.start(task)
            worlds.append((on, w))
        seen = False
        for c in task.solution:
            outs = []
            for on, w in worlds:
                monkeypatch.setattr(quotas, "LEDGER_BYTES", 0 if on else 1 << 60)
                outs.append(w.run("agent", 0, [c])[0])
            assert outs[0] == outs[1], (spec.name, c)
            a, b = worlds[0][1].view(), worlds[1][1].view()
            assert canonical_json(a) == canonical_json(b), (spec.name, c)
            assert json.dumps(worlds[0][1].dump()) == json.dumps(worlds[1][1].dump()), (spec.name, c)
            lg = _ledger(a)
            if lg is not None:
                seen = True
                assert lg.total == quotas._walk(a, None), (spec.name, c)
        played += 1
        adopted += seen
    assert played >= 15 and adopted >= 8, (played, adopted)


def test_a_state_whose_checkpoint_is_slow_keeps_its_journal_longer(monkeypatch) -> None:
    """The journal's checkpoint copies the state (and checks the ledger): every 256 calls, that
    was a cost proportional to the state on every call (amortized). Now a checkpoint that took
    longer is taken again after proportionally more calls (and as much tool time)."""
    state = _adopted()
    copies: list[int] = []
    real = quotas.copy_state

    def slow_copy(s: Any) -> Any:
        if s is state:
            copies.append(1)
            import time

            time.sleep(0.06)  # (the copy of a large state)
        return real(s)

    monkeypatch.setattr(quotas, "copy_state", slow_copy)
    for i in range(700):
        out, state = quotas.invoke_within_quota(write, state, {"key": "r1", "text": str(i % 10)})
        assert out.ok
    assert len(copies) == 1, copies  # (at call 256; the next one after 0.06 s / 4 us = 15,000 calls)
    j = quotas._journal(state)
    assert j is not None
    limits = j.limits
    assert limits is not None
    calls, nbytes, seconds = limits
    assert calls >= 15_000 and seconds >= 0.06 and nbytes > quotas._CHECKPOINT_BYTES
    assert quotas._limits(0.001) is None  # (a quick checkpoint: the defaults)


def test_a_state_is_adopted_after_adopt_after_full_measures_and_a_small_one_never() -> None:
    """The adoption costs about three full measures: a large state is measured in full by its
    first ADOPT_AFTER writing calls (a short episode pays nothing more than before), adopted at the
    next; a state under LEDGER_BYTES is never adopted."""
    state = _table(50)
    quotas.track(state)
    for i in range(quotas.ADOPT_AFTER):
        out, state = quotas.invoke_within_quota(write, state, {"key": "r0", "text": str(i)})
        assert out.ok and _ledger(state) is None and type(state.rows) is dict
    out, state = quotas.invoke_within_quota(write, state, {"key": "r0", "text": "adopted"})
    assert out.ok and _ledger(state) is not None and type(state.rows) is TDict
    small = Table(note="tiny")
    assert quotas._walk(small, None) < quotas.LEDGER_BYTES
    quotas.track(small)
    for _ in range(10):
        out, small = quotas.invoke_within_quota(mutate, small, {"op": "note", "seed": 0})
    assert _ledger(small) is None


def test_tracked_containers_answer_every_operation_as_plain_ones() -> None:
    """Outside a ledger (and inside one) a tracked container is its plain class: the same results,
    the same errors."""
    ops: list[Any] = [
        lambda d: d.update({"a": 1}, b=2), lambda d: d.setdefault("c", []), lambda d: d.pop("a"),
        lambda d: d.pop("zz", 0), lambda d: d.popitem(), lambda d: d.__ior__({"x": 1}), lambda d: d.pop("nope"),
        lambda d: d.__delitem__("nope"), lambda d: d.fromkeys("ab"), lambda d: d | {"y": 2}, lambda d: d.clear(),
    ]
    lops: list[Any] = [
        lambda x: x.append(1), lambda x: x.extend((2, 3)), lambda x: x.insert(0, 9), lambda x: x.__setitem__(slice(0, 2), [7]),
        lambda x: x.__delitem__(slice(None, None, 2)), lambda x: x.remove(3), lambda x: x.remove(99), lambda x: x.pop(),
        lambda x: x.pop(50), lambda x: x.__iadd__([4, 5]), lambda x: x.__imul__(2), lambda x: x.__setitem__(slice(0, 4, 2), [1]),
        lambda x: x + [1], lambda x: x[1:], lambda x: x.clear(),
    ]
    sops: list[Any] = [
        lambda s: s.add("q"), lambda s: s.discard("q"), lambda s: s.remove("nope"), lambda s: s.update("xy"),
        lambda s: s.__ior__({"z"}), lambda s: s.__ior__(["no"]), lambda s: s.__isub__({"x"}), lambda s: s.__iand__({"y", "z"}),
        lambda s: s.__ixor__({"w"}), lambda s: s.pop(), lambda s: s | {"k"}, lambda s: s.clear(),
    ]

    def run(obj: Any, fs: list[Any]) -> list[Any]:
        got: list[Any] = []
        for f in fs:
            try:
                r = f(obj)
                got.append(("ok", r if not isinstance(r, (dict, list, set)) or r is obj else (type(r).__name__, r)))
            except Exception as exc:  # noqa: BLE001
                got.append(("raised", type(exc).__name__))
            got.append(sorted(obj) if isinstance(obj, set) else (list(obj.items()) if isinstance(obj, dict) else list(obj)))
        return got

    def norm(got: list[Any]) -> str:
        return repr(got).replace("TDict", "dict").replace("TList", "list").replace("TSet", "set")

    assert norm(run(TDict({"a": 0, "k": 1}), ops)) == norm(run({"a": 0, "k": 1}, ops))
    assert norm(run(TList([1, 2, 3]), lops)) == norm(run([1, 2, 3], lops))
    assert norm(run(TSet({"x", "y"}), sops)) == norm(run({"x", "y"}, sops))


def test_a_fork_keeps_its_parent_s_checkpoint_limits(monkeypatch) -> None:
    """A journal kept longer (a slow checkpoint) is forked with its limits: the child's first
    write does not take a checkpoint copy because the journal it inherited is past the defaults."""
    state = _adopted()
    j = quotas._journal(state)
    assert j is not None
    j.limits = (10_000, 1 << 30, 100.0)
    for i in range(300):
        out, state = quotas.invoke_within_quota(write, state, {"key": "r1", "text": str(i % 7)})
    child = copy_state(state)
    quotas.track_fork(child, state)
    copies: list[int] = []
    real = quotas.copy_state

    def counted(s: Any) -> Any:
        copies.append(1)
        return real(s)

    monkeypatch.setattr(quotas, "copy_state", counted)
    out, child = quotas.invoke_within_quota(write, child, {"key": "r2", "text": "child"})
    assert out.ok and not copies


def test_an_adoption_past_the_quota_adopts_nothing(monkeypatch) -> None:
    """A state past the quota (its strings alone) is not adopted: the full measure decides, and the
    call that took it there is that call's error."""
    lg = quotas._Ledger()
    big = Table(note="x" * 100, index={str(i): [] for i in range(10)}, blob={str(i): "y" * 1000 for i in range(100)})
    with pytest.raises(quotas._Over):
        lg.adopt(big, 50_000)
    assert type(big.blob) is dict  # (nothing converted)
    state = _table(50)
    quotas.track(state)
    monkeypatch.setattr(quotas, "ADOPT_AFTER", 0)
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", quotas._walk(state, None) + 1000)
    out, state = quotas.invoke_within_quota(mutate, state, {"op": "note", "seed": 3})  # within: adopted
    assert out.ok and _ledger(state) is not None
    before = canonical_json(state)
    out, state = quotas.invoke_within_quota(grow, state, {"n": 5000})
    assert not out.ok and out.kind == "quota" and canonical_json(state) == before


def test_the_journal_counts_the_arguments_bytes_not_the_state_s() -> None:
    """The journal's bytes are its calls' arguments (what a replay copies), whatever the state's size:
    a large state's full measure must not be counted there (it made every call a checkpoint)."""
    state = _table(2000)
    quotas.track(state)
    for i in range(quotas.ADOPT_AFTER + 3):
        out, state = quotas.invoke_within_quota(write, state, {"key": "r1", "text": "t"})
        assert out.ok
    j = quotas._journal(state)
    assert j is not None and len(j.calls) == quotas.ADOPT_AFTER + 3
    assert j.bytes < 1000, j.bytes
