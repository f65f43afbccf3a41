"""Worker pools whose workers die with the process that started them (envfactory.processes):
the quickstart's units, `envfactory list`'s cold builds and `verify`'s environments."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

_ORPHAN = """
import os, signal, sys, time
from envfactory.processes import worker_pool

if __name__ == "__main__":
    pool = worker_pool(1, sys.argv[1])
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 120)
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)  # the run dies mid-job
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_killed_process_takes_its_workers_with_it(tmp_path, method) -> None:
    """Before: killing a quickstart left its two workers finishing their units for 25 minutes,
    and a killed cold `envfactory list` left its spawned workers waiting on their queue."""
    script = tmp_path / "orphan.py"
    script.write_text(_ORPHAN)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(root)})
    worker = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
            if Path(f"/proc/{worker}/stat").read_text().split(") ")[-1].startswith("Z"):
                return  # dead, waiting for its (re)parent to reap it
        except (ProcessLookupError, FileNotFoundError):  # gone (also between the two looks)
            return
        time.sleep(0.1)
    os.kill(worker, 9)
    raise AssertionError(f"worker {worker} outlived the process that started it by 10 s")


def test_the_pools_that_run_long_jobs_use_it() -> None:
    """The pools of the quickstart, the registry's cold listing and verify are worker_pool's."""
    import inspect

    import agents.quickstart.experiment
    import envfactory.checks.verify
    import envfactory.registry

    for mod in (agents.quickstart.experiment, envfactory.registry, envfactory.checks.verify):
        src = inspect.getsource(mod)
        assert "worker_pool(" in src and "ProcessPoolExecutor(" not in src, mod.__name__


def test_a_start_method_whose_workers_are_not_our_children_is_refused() -> None:
    from envfactory.processes import worker_pool

    with pytest.raises(ValueError, match="spawn"):
        worker_pool(1, "forkserver")
