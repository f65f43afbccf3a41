"""Snapshots and restores of large states against ``copy.deepcopy`` of the same state (issue 29).

Three ``from_class`` states, each measured ``repeats`` times in one run (min/median/max):

* ``tree``: a 10k-node object tree (parent pointers, a cursor, an RNG: one object graph);
* ``records``: 5,000 pydantic records in a dict;
* ``dicts``: a multi-MB dict of dicts of plain JSON data.

Per repeat: ``copy.deepcopy(episode.state)`` (the baseline), ``episode.snapshot()`` (the sealed
JSON data), ``json.dumps`` of it (the bytes that leave the process), and ``restore`` into a new
episode from the data (``restore``) and from the text (``restore_json``: ``json.loads`` then
restore). Each ratio is against the deepcopy of the same repeat. The machine's load average
(``os.getloadavg``) is recorded before and after.

Run on its own: ``python -m benchmarks.snapshot_big [--repeats N]``; ``envfactory bench --only
bigstate`` includes it.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time
from typing import Any

__all__ = ["BenchInventory", "bench_snapshots", "big_state_specs"]


class BenchInventory:
    """A third-party-style store of plain JSON data: ``{sku: {field: value, "meta": {...}}}``."""

    def __init__(self, items: int = 0) -> None:
        self.items = {f"sku{i:06d}": {"name": f"item {i}", "qty": i % 50, "price": round(i * 0.37, 2),
                                      "active": i % 3 != 0, "tags": ["a", "b"] if i % 7 == 0 else [],
                                      "meta": {"bin": f"B{i % 400}", "supplier": f"s{i % 31}",
                                               "note": "restock weekly" if i % 5 == 0 else None}}
                      for i in range(items)}

    def restock(self, sku: str, qty: int) -> int:
        """Add stock.

        Args:
            sku: The item.
            qty: How many.
        """
        self.items[sku]["qty"] += qty
        return int(self.items[sku]["qty"])


def big_state_specs(nodes: int = 10_000, records: int = 5_000, items: int = 20_000,
                    cases: tuple[str, ...] = ("tree", "records", "dicts")) -> dict[str, Any]:
    """``{case: spec}`` for the large states named in ``cases`` (each task is ``"t"``); building a
    spec runs its tools on the scenario, so only the named ones are built."""
    from envfactory.factory.from_class import ClassTask, from_class
    from envfactory.task import call

    from .big_states import BenchCustomerDB, BenchTree

    make = {
        "tree": lambda: from_class(BenchTree, name="BigTree-v0", domain="bench", loader="_load_scenario",
                           tasks=[ClassTask("t", "Enter child 0.", {"nodes": nodes, "seed": 1},
                                            [call("enter", index=0)])]),
        "records": lambda: from_class(BenchCustomerDB, name="BigRecords-v0", domain="bench",
                              tasks=[ClassTask("t", "Credit customer 1 with 5.", {"records": records},
                                               [call("credit", customer_id=1, amount=5.0)])]),
        "dicts": lambda: from_class(BenchInventory, name="BigDicts-v0", domain="bench",
                            tasks=[ClassTask("t", "Restock sku000001 by 5.", {"items": items},
                                             [call("restock", sku="sku000001", qty=5)])]),
    }
    return {name: make[name]() for name in cases}


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def _spread(out: dict[str, Any], key: str, values: list[float], digits: int) -> None:
    out[f"{key}_min"] = round(min(values), digits)
    out[f"{key}_median"] = round(statistics.median(values), digits)
    out[f"{key}_max"] = round(max(values), digits)


def bench_snapshots(repeats: int = 5, cases: tuple[str, ...] = ("tree", "records", "dicts")) -> dict[str, Any]:
    """Snapshot and restore of each large state against ``copy.deepcopy`` of it, ``repeats``
    times: ``snapbig_<case>_<what>_ms_{min,median,max}`` and ``..._vs_deepcopy_ratio_...``."""
    from envfactory.episode import Episode

    out: dict[str, Any] = {"snapbig_load_before": [round(x, 2) for x in os.getloadavg()]}
    for name, spec in big_state_specs(cases=cases).items():
        ep = Episode(spec)
        ep.reset("t")
        ep.step(spec.task("t").solution[0].to_hermes())
        state = ep.state
        times: dict[str, list[float]] = {k: [] for k in ("deepcopy", "snapshot", "json", "restore", "restore_json")}
        text = ""
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            copy.deepcopy(state)
            times["deepcopy"].append(_ms(t0))
            t0 = time.perf_counter_ns()
            snap = ep.snapshot()
            times["snapshot"].append(_ms(t0))
            t0 = time.perf_counter_ns()
            text = json.dumps(snap)
            times["json"].append(_ms(t0))
            other = Episode(spec)
            t0 = time.perf_counter_ns()
            other.restore(snap)
            times["restore"].append(_ms(t0))
            if not times["restore_json"]:  # once, untimed: the restored episode snapshots the same
                again = other.snapshot()
                assert {**again, "mac": ""} == {**snap, "mac": ""}, f"{name}: the restored state differs"
            other = Episode(spec)
            t0 = time.perf_counter_ns()
            other.restore(json.loads(text))
            times["restore_json"].append(_ms(t0))
        for what, values in times.items():
            _spread(out, f"snapbig_{name}_{what}_ms", values, 2)
            if what != "deepcopy":
                _spread(out, f"snapbig_{name}_{what}_vs_deepcopy_ratio",
                        [v / d for v, d in zip(values, times["deepcopy"])], 3)
        out[f"snapbig_{name}_snapshot_bytes"] = len(text)
    out["snapbig_load_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--case", action="append", choices=("tree", "records", "dicts"))
    args = p.parse_args(argv)
    for case in args.case or ("tree", "records", "dicts"):  # a line per case, as soon as it is measured
        print(json.dumps(bench_snapshots(args.repeats, (case,))), flush=True)


if __name__ == "__main__":
    main()
