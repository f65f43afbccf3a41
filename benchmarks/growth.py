"""How a step's cost grows with the state (issue 60: "cost that grows with the change, not the state").

A pydantic table state, a :class:`~envfactory.state.State` holding ``rows`` pydantic rows (as a
``dict[str, Row]`` and as a ``list[Row]``), at 10, 100, 1k, 10k and 100k rows; each in a
:class:`~envfactory.world.LocalWorld` started from a task (a tracked state, as every sole agent's is),
timed through ``LocalWorld.run`` (the tool call within the session's quotas):

* ``write``: one writing call that sets one row's field (the state keeps its size);
* ``insert``: one writing call that adds a row, the next one removes it (timed together, per call);
* ``read``: one ``read_only`` call that reads one row;
* ``fork``: ``LocalWorld.fork()`` alone, and ``fork_write``: the fork and the child's first write.

The sizes are interleaved (each round times every size in turn), each figure is the median over the
rounds of the median per call in a round (``calls`` calls a round up to 1k rows, fewer above) (the mean per call is printed too: the quota's journal
copies the state every so many calls, which the median does not show: the mean is over every
timed call). Printed per table and
figure: the microseconds per size, the ratio to the smallest size and the fitted growth exponent
(the log-log slope: 0 flat, 1 linear), with the load average before and after.

Run: ``python -m benchmarks.growth [--sizes 10,100,1000,10000,100000] [--rounds 7] [--calls 64]``
or ``envfactory bench --only growth``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from typing import Any

from pydantic import BaseModel

from benchmarks.sessions_growth import growth_exponent
from envfactory import State, Task, ToolEnvSpec, call, tool
from envfactory.task import ToolCall

__all__ = ["bench_growth"]


class Row(BaseModel):
    id: str
    name: str
    email: str
    qty: int = 0
    price: float = 0.0
    tags: list[str] = []


class DictTable(State):
    rows: dict[str, Row] = {}
    note: str = ""


class ListTable(State):
    rows: list[Row] = []
    note: str = ""


def _row(i: int) -> Row:
    return Row(id=f"r{i}", name=f"customer {i}", email=f"c{i}@example.com", qty=i % 7, price=i * 0.5,
               tags=["a", "b"])


@tool
def set_qty(state: DictTable, key: str, qty: int) -> str:
    """Set one row's quantity.

    Args:
        key: The row.
        qty: The quantity.
    """
    state.rows[key].qty = qty
    return "ok"


@tool
def add_row(state: DictTable, key: str) -> str:
    """Add a row.

    Args:
        key: The row.
    """
    state.rows[key] = _row(-1)
    return "ok"


@tool
def drop_row(state: DictTable, key: str) -> str:
    """Remove a row.

    Args:
        key: The row.
    """
    del state.rows[key]
    return "ok"


@tool(read_only=True)
def get_row(state: DictTable, key: str) -> str:
    """Read one row.

    Args:
        key: The row.
    """
    return state.rows[key].name


@tool
def set_qty_at(state: ListTable, index: int, qty: int) -> str:
    """Set one row's quantity.

    Args:
        index: The row.
        qty: The quantity.
    """
    state.rows[index].qty = qty
    return "ok"


@tool
def append_row(state: ListTable) -> str:
    """Append a row."""
    state.rows.append(_row(-1))
    return "ok"


@tool
def pop_row(state: ListTable) -> str:
    """Remove the last row."""
    state.rows.pop()
    return "ok"


@tool(read_only=True)
def get_at(state: ListTable, index: int) -> str:
    """Read one row.

    Args:
        index: The row.
    """
    return state.rows[index].name


def _spec(kind: str, n: int) -> tuple[ToolEnvSpec, Task, dict[str, list[ToolCall]]]:
    if kind == "dict":
        state: State = DictTable(rows={f"r{i}": _row(i) for i in range(n)})
        tools = [set_qty, add_row, drop_row, get_row]
        k = f"r{n // 2}"
        calls = {"write": [call("set_qty", key=k, qty=1), call("set_qty", key=k, qty=2)],
                 "insert": [call("add_row", key="new"), call("drop_row", key="new")],
                 "read": [call("get_row", key=k)]}
    else:
        state = ListTable(rows=[_row(i) for i in range(n)])
        tools = [set_qty_at, append_row, pop_row, get_at]
        calls = {"write": [call("set_qty_at", index=n // 2, qty=1),
                           call("set_qty_at", index=n // 2, qty=2)],
                 "insert": [call("append_row"), call("pop_row")],
                 "read": [call("get_at", index=n // 2)]}
    task = Task(id="t", instruction="Work on the table.", initial_state=state, solution=[], check=lambda s: True)
    spec = ToolEnvSpec(name=f"GrowthTable{kind.title()}{n}-v0", domain="bench", description="growth",
                       state_type=type(state), tools=tools, tasks=[task], max_turns=10 ** 9)
    return spec, task, calls


def _per_call(world: Any, calls: list[ToolCall], k: int) -> list[float]:
    clock = time.perf_counter
    out = []
    for i in range(k):
        c = calls[i % len(calls)]
        t0 = clock()
        world.run("agent", 0, [c])
        out.append(clock() - t0)
    return out


def bench_growth(sizes: tuple[int, ...] = (10, 100, 1000, 10_000, 100_000), rounds: int = 7,
                 calls: int = 64) -> dict[str, Any]:
    """Step and fork cost against the state's rows (see the module)."""
    from envfactory.world import LocalWorld

    out: dict[str, Any] = {"growth_sizes": list(sizes), "growth_rounds": rounds, "growth_calls": calls,
                           "growth_loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    for kind in ("dict", "list"):
        worlds = {}
        for n in sizes:
            spec, task, cs = _spec(kind, n)
            w = LocalWorld(spec)
            w.start(task)
            for _ in range(4):  # (warm: the first writing calls measure the whole state)
                w.run("agent", 0, [cs["write"][0]])
            worlds[n] = (w, cs)
        samples: dict[str, dict[int, list[float]]] = {f: {n: [] for n in sizes} for f in
                                                      ("write", "insert", "read", "fork", "fork_write")}
        means: dict[str, dict[int, list[float]]] = {f: {n: [] for n in sizes} for f in ("write", "insert")}
        for _ in range(rounds):
            for n in sizes:
                w, cs = worlds[n]
                gc.collect()
                gc.disable()
                try:
                    k = calls if n <= 1000 else max(6, calls * 1000 // n)  # (a step that walks 100k rows: fewer)
                    for f in ("write", "insert", "read"):
                        ts = _per_call(w, cs[f], k if f != "read" else calls)
                        samples[f][n].append(statistics.median(ts))
                        if f in means:
                            means[f][n].extend(ts)
                    forks, fw = [], []
                    reps = 5 if n >= 10_000 else 20
                    for _ in range(reps):
                        t0 = time.perf_counter()
                        child = w.fork()
                        t1 = time.perf_counter()
                        child.run("agent", 0, [cs["write"][0]])
                        t2 = time.perf_counter()
                        forks.append(t1 - t0)
                        fw.append(t2 - t0)
                        del child
                    samples["fork"][n].append(statistics.median(forks))
                    samples["fork_write"][n].append(statistics.median(fw))
                finally:
                    gc.enable()
        for f, per in samples.items():
            us = [statistics.median(per[n]) * 1e6 for n in sizes]
            key = f"growth_{kind}_{f}"
            out[f"{key}_us"] = {str(n): round(u, 2) for n, u in zip(sizes, us)}
            out[f"{key}_us_minmax"] = {str(n): [round(min(per[n]) * 1e6, 2), round(max(per[n]) * 1e6, 2)]
                                       for n in sizes}
            out[f"{key}_vs_{sizes[0]}_ratio"] = {str(n): round(u / us[0], 3) for n, u in zip(sizes, us)}
            out[f"{key}_growth_exponent"] = round(growth_exponent([float(n) for n in sizes], us), 3)
        for f, per in means.items():
            out[f"growth_{kind}_{f}_mean_us"] = {str(n): round(statistics.fmean(per[n]) * 1e6, 2) for n in sizes}
        del worlds
    out["growth_loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10,100,1000,10000,100000")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=64)
    a = p.parse_args()
    sizes = tuple(int(x) for x in a.sizes.split(","))
    print(json.dumps(bench_growth(sizes, a.rounds, a.calls), indent=1))


if __name__ == "__main__":
    main()
