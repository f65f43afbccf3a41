"""The state measure of a state whose containers are shared (issue 63).

``rows = [rows, rows]`` nested n times is 2**n paths: a dump writes each, so the measure counts
each, but it walked each too: nested 20 times a measure took 1.4 s, nested 30 times a refused call
walked 16 million containers (seconds, on every writing call) before it stopped at the quota, and
without a limit nested 40 times it never ended. A container met again now adds the size it had
the first time, unwalked.
"""

from __future__ import annotations

import json
import threading

from envfactory import quotas
from envfactory.state import State


def _nest(levels: int, leaf: list) -> list:
    rows = leaf
    for _ in range(levels):
        rows = [rows, rows]
    return rows


def _measure_within(value, seconds: float, limit=None) -> int | None:
    """The measure, or None when it did not end within ``seconds`` (the walk is left running in a
    daemon thread: before the fix, the nested-40 measure never ended)."""
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(quotas.state_size(value, limit)), daemon=True)
    t.start()
    t.join(seconds)
    return out[0] if out else None


def test_a_shared_nest_is_measured_as_its_dump_without_walking_each_path() -> None:
    leaf = ["x", "héllo", 3]
    small = _nest(8, leaf)  # small enough to dump: the measure matches the dump's rule exactly
    assert quotas.state_size(small) == quotas.state_size(json.loads(json.dumps(small)))  # shared vs unshared
    deep = _nest(40, leaf)  # 2**40 paths: a dump of about 20 TB
    size = _measure_within(deep, 20.0)
    assert size is not None, "the measure of a 40-level shared nest did not end"
    per_leaf = quotas.state_size(leaf)
    expected = per_leaf
    for _ in range(40):
        expected = 2 * expected + 4  # "[" a "," b "]" around two copies, as the walk counts a list
    assert size == expected
    over = _measure_within(deep, 20.0, quotas.MAX_STATE_BYTES)
    assert over is not None and over > quotas.MAX_STATE_BYTES


class Rows(State):
    rows: list = []


def test_a_cycle_is_still_a_reference_and_a_shared_model_is_counted_twice() -> None:
    a: list = ["x"]
    a.append(a)
    assert quotas.state_size(a) == quotas.state_size(["x", None]) + 16 - 8  # the cycle: a 16-byte reference
    one = Rows(rows=["a" * 100])
    twice = quotas.state_size({"p": one, "q": one})
    assert twice == quotas.state_size({"p": one, "q": Rows(rows=["a" * 100])})


def test_a_long_string_met_again_is_counted_each_time_it_is_written() -> None:
    """A long string is measured once a walk (a file copied 255 times cost 255 encodings of it
    after the control-character count, 1.5 ms a MB each) and counted at each place it appears."""
    big = "x\x00" * 300_000
    shared = {f"c{i}": big for i in range(50)}
    distinct = {f"c{i}": (big + "!")[:-1] for i in range(50)}  # equal strings, 50 objects
    assert len({id(v) for v in distinct.values()}) == 50
    assert quotas.state_size(shared) == quotas.state_size(distinct) > 50 * len(big) * 3.5  # "\x00": 6 bytes
