"""The built-in library: at least 30 verified environments, 12 domains, 50 tasks each."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import envfactory
from envfactory.cli import main


def _library():
    return [s for s in envfactory.specs() if not getattr(s, "multi_agent", False)
            and s.name != "Counter-v0"]


def test_library_size_and_inputs():
    specs = _library()
    sources = {s.metadata.get("source", "module").split(" ")[0] for s in specs}
    assert {"class", "spec", "module"} <= sources  # all three non-LLM inputs are used
    big = [s for s in specs if len(s.get_tasks()) >= 50]
    assert len(big) >= 30 and len({s.domain for s in big}) >= 12


_LAZY_PROBE = """
import sys, envfactory
mods = lambda: sorted(m for m in sys.modules if m.split(".")[0] == "environments" and m != "environments")
assert mods() == [], mods()                       # import envfactory imports no environment
spec = envfactory.spec("Warehouse-v0")
assert mods() == ["environments.spec_envs", "environments.spec_envs.warehouse"], mods()  # only its file
assert spec._tasks is None and callable(spec.tasks)  # its tasks are not built yet
n = len(spec.get_tasks())
assert spec._tasks is not None and n >= 50, n     # built on first use
print("ok")
"""


def test_environment_import_is_lazy():
    # a fresh interpreter: other tests here have already imported and used every environment
    r = subprocess.run([sys.executable, "-c", _LAZY_PROBE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.slow
def test_verify_all_passes(capsys):
    start = time.perf_counter()
    code = main(["verify", "--all", "--json"])
    doc = json.loads(capsys.readouterr().out)
    failed = {e["name"]: e["failures"][:3] for e in doc["environments"] if not e["verified"]}
    assert code == 0 and not failed, failed
    big = [e for e in doc["environments"] if e["tasks"] >= 50]
    assert len(big) >= 30 and len({e["domain"] for e in big}) >= 12
    t = doc["totals"]
    assert t["tasks"] >= 1500 and t["mean_solution_length"] > 1.5
    # issue 26's depth: goal-level references of 6 calls on average, a fifth of hard tasks >= 10 calls
    assert all(t["depth"]["met"].values()), t["depth"]
    assert all(k["max_len"] >= 1 for k in t["kinds"].values()) and t["kinds"]["goal_level"]["mean_len"] >= 6
    print(f"verify --all: {t['environments']} environments in {time.perf_counter() - start:.1f}s")
