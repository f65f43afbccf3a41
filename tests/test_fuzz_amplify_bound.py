"""The differential fuzzer's amplifying outputs keep each tool's own allocation bounded (issue 63).

``benchmarks/fuzz_runtimes.amplifying`` draws ``multiply`` so that the list a call builds has at
most ``_AMP_MAX_ROWS`` rows: the tool allocates it before any quota can look, so past that the
fuzz measures the machine, not the quota. Before, the bound used the rows the output started from:
the million-output run of 2026-12-08 drew ``multiply(100)`` twice on 4,001 rows (seed 40002030),
and the second call's own 40-million-row list (610 MiB) OOM-killed its 512 MiB container. Now each
call of an output is bounded by the rows it would see, the calls before it applied.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import envfactory  # noqa: E402
from benchmarks.fuzz_runtimes import _AMP_GENERIC, _AMP_MAX_ROWS, amplifying  # noqa: E402


def _schemas() -> list:
    return [f for f in envfactory.make("Amplify-v0").tool_schemas() if f["function"]["name"] in _AMP_GENERIC]


def _calls(out):
    """The amplifying calls of an output (a generated one, text or dicts, calls the plain tools only)."""
    return [c for c in (out if isinstance(out, list) else [out]) if hasattr(c, "name")]


def test_every_multiply_of_an_output_builds_at_most_the_bound(amplify) -> None:
    schemas, worst = _schemas(), 0
    for seed in range(6000):
        rng = random.Random(seed)
        rows = rng.choice((1, 2, 4001, 10_000, 400_100, 999_999))
        out = amplifying(random.Random(seed * 7 + 1), rows, schemas)
        for c in _calls(out):
            if c.name == "multiply":
                worst = max(worst, rows * c.arguments["times"])
                assert rows * c.arguments["times"] <= max(rows, _AMP_MAX_ROWS), (seed, rows, out)
                rows *= c.arguments["times"]
            elif c.name == "fill":
                rows += c.arguments["n"]
            elif c.name == "nest":
                rows = 2
    assert worst > _AMP_MAX_ROWS // 2  # the bound is reached, not avoided


def test_the_run_s_seed_no_longer_builds_forty_million_rows(amplify) -> None:
    out = amplifying(random.Random(4 * 10_000_019 + 1954), 4001, _schemas())
    times = [c.arguments["times"] for c in _calls(out) if c.name == "multiply"]
    assert times[0] == 100 and 4001 * 100 * times[1] <= _AMP_MAX_ROWS, times
