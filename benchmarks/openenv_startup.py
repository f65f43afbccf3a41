"""How long ``envfactory serve NAME --protocol openenv`` takes to listen, with and without
openenv-core's Gradio web UI imported, measured in the same run.

Two arms, each a fresh interpreter started the way the CLI starts, timed from ``Popen`` to the
``serving ... over OpenEnv at`` line on stderr (the server listens then), rounds interleaved so
load drift hits both:

* ``lazy`` (what ships): ``python -m envfactory.cli serve NAME --protocol openenv --port 0``;
  openenv-core's optional Gradio web UI is held back while openenv-core loads
  (:mod:`envfactory.faces.openenv_types`);
* ``eager`` (as before): the same command after ``import openenv.core, openenv.core.env_client``
  has loaded openenv-core the ordinary way, Gradio and the client side included (what the server
  module imported before).

Reports each arm's per-round wall seconds and CPU seconds, their medians, and ``eager/lazy`` (the
speed-up, > 1: lazy is faster); on a shared machine the CPU seconds are the steadier figure. Each arm's server is stopped as soon as it has announced itself.

    python -m benchmarks.openenv_startup [ROUNDS] [NAME]      # prints the JSON
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["startup_seconds", "bench_openenv_startup"]

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "lazy": ["-m", "envfactory.cli"],
    # what the server module imported before: openenv-core's package (Gradio with it) and its client
    "eager": ["-c", "import sys, openenv.core, openenv.core.env_client; from envfactory.cli import main; "
                    "sys.exit(main())"],
}


def startup_seconds(arm: str, name: str = "Counter-v0", timeout: float = 180.0) -> tuple[float, float]:
    """``(wall, cpu)``: seconds from starting the ``arm``'s process to its server's announcement, and
    the CPU seconds (user + system) the process spent in all (it idles once listening; on a shared,
    loaded machine the CPU time is the steadier figure)."""
    cmd = [sys.executable, *ARMS[arm], "serve", name, "--protocol", "openenv", "--port", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("ENABLE_WEB_INTERFACE", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = None
    try:
        seen = []
        assert proc.stderr is not None
        while time.perf_counter() - t0 < timeout:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if "over OpenEnv at" in line:
                wall = time.perf_counter() - t0
                break
        if wall is None:
            raise RuntimeError(f"the {arm} server did not announce itself: {''.join(seen)[-2000:]}")
    finally:
        proc.terminate()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            usage = None
    return wall, (usage.ru_utime + usage.ru_stime) if usage is not None else float("nan")


def bench_openenv_startup(rounds: int = 3, name: str = "Counter-v0") -> dict[str, Any]:
    wall: dict[str, list[float]] = {arm: [] for arm in ARMS}
    cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for r in range(rounds):
        for arm in (ARMS if r % 2 == 0 else reversed(list(ARMS))):  # alternate which goes first
            w, c = startup_seconds(arm, name)
            wall[arm].append(round(w, 2))
            cpu[arm].append(round(c, 2))
    out: dict[str, Any] = {"env": name, "rounds": rounds, "wall_s": wall, "cpu_s": cpu}
    for what, d in (("wall", wall), ("cpu", cpu)):
        med = {arm: statistics.median(v) for arm, v in d.items()}
        out[f"openenv_serve_start_{what}_s_lazy_median"] = round(med["lazy"], 2)
        out[f"openenv_serve_start_{what}_s_eager_median"] = round(med["eager"], 2)
        out[f"openenv_serve_start_{what}_eager_vs_lazy_ratio"] = round(med["eager"] / med["lazy"], 2)
    out.update(load_average=round(os.getloadavg()[0], 2), cpus=os.cpu_count())
    return out


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(json.dumps(bench_openenv_startup(n, *(sys.argv[2:3] or ["Counter-v0"])), indent=1))
