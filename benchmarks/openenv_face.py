"""``envfactory bench`` section ``openenv``: envfactory served over the OpenEnv protocol against
openenv-core's own server serving the same counter, measured in the same run.

Two server subprocesses, both ``openenv-core``'s ``create_app`` under uvicorn:

* ``envfactory serve Counter-v0 --protocol openenv`` (:mod:`envfactory.faces.openenv_server`): the referee
  parses the Hermes text and runs Counter-v0's ``increment`` on its validated state;
* ``benchmarks/openenv_counter.py serve``: a hand-written OpenEnv ``Environment`` that regex-parses the
  same text and adds to an int (the baseline the ``docker`` section uses too).

Both are played from this process by WebSocket ``EnvClient``s (``GenericEnvClient`` for envfactory,
unchanged; the baseline's own typed client), with the same action text, steps interleaved in rounds
of 50 so drift hits both. Reports step round-trip p50/p99 of each and their ratios
(``openenv_protocol_step_p50_vs_openenv_core_ratio`` < 1: envfactory's server is faster), and the
in-process ``envfactory.make`` step for scale. envfactory's server runs a local world's step on the
event loop (microseconds; no thread hop), where openenv-core sends a sync ``step`` through a
per-session thread; a third server (``ENVFACTORY_OPENENV_INLINE=0``) takes that thread too, the A/B
(``openenv_protocol_threaded_*``).

    python -m benchmarks.openenv_face [N]      # prints the JSON
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .docker_runtime import ACTION, _pct, _timed

__all__ = ["bench_openenv"]

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "benchmarks" / "openenv_counter.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(proc: subprocess.Popen, port: int, what: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the {what} server did not start")
            time.sleep(0.1)


def bench_openenv(n: int = 2000) -> dict[str, Any]:
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError:
        return {"openenv_protocol_error": "openenv-core is not installed (pip install 'envfactory[bench]')"}
    spec = importlib.util.spec_from_file_location("_envf_openenv_counter", BASELINE)
    base_mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(base_mod)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p_env, p_base, p_thr = _free_port(), _free_port(), _free_port()
    serve = [sys.executable, "-m", "envfactory.cli", "serve", "Counter-v0", "--protocol", "openenv",
             "--max-turns", str(10**9), "--port"]
    procs = [
        subprocess.Popen(serve + [str(p_env)], env=env, stderr=subprocess.DEVNULL),
        subprocess.Popen([sys.executable, str(BASELINE), "serve", str(p_base)], env=env, stderr=subprocess.DEVNULL),
        # the A/B: envfactory's steps through openenv-core's per-session thread, as the baseline's are
        subprocess.Popen(serve + [str(p_thr)], env={**env, "ENVFACTORY_OPENENV_INLINE": "0"},
                         stderr=subprocess.DEVNULL),
    ]
    out: dict[str, Any] = {}
    try:
        _wait(procs[0], p_env, "envfactory OpenEnv")
        _wait(procs[1], p_base, "openenv-core counter")
        _wait(procs[2], p_thr, "envfactory OpenEnv (threaded)")
        ours = GenericEnvClient(base_url=f"http://127.0.0.1:{p_env}").sync()
        base = base_mod.CounterClient(base_url=f"http://127.0.0.1:{p_base}").sync()
        thr = GenericEnvClient(base_url=f"http://127.0.0.1:{p_thr}").sync()
        with ours, base, thr:
            ours.reset(task_id="counter-0-1")
            thr.reset(task_id="counter-0-1")
            base.reset()
            a_ours, a_base = {"text": ACTION}, base_mod.TextAction(text=ACTION)
            r = ours.step(a_ours)
            assert r.observation["text"].isdigit() and r.done is False, r
            for c, a in ((ours, a_ours), (base, a_base), (thr, a_ours)):
                _timed(c.step, a, 200)
            so, sb, st = [], [], []
            for _ in range(max(1, n // 50)):
                so += _timed(ours.step, a_ours, 50)
                sb += _timed(base.step, a_base, 50)
                st += _timed(thr.step, a_ours, 50)
        from envfactory.registry import make

        local = make("Counter-v0", max_turns=10**9)
        local.reset(0)
        _timed(local.step, ACTION, 500)
        sl = _timed(local.step, ACTION, n)
        local.close()
        p50, p99, b50, b99 = _pct(so, 0.5), _pct(so, 0.99), _pct(sb, 0.5), _pct(sb, 0.99)
        out.update({
            "openenv_protocol_step_p50_us": round(p50, 1), "openenv_protocol_step_p99_us": round(p99, 1),
            "openenv_core_counter_step_p50_us": round(b50, 1), "openenv_core_counter_step_p99_us": round(b99, 1),
            "openenv_protocol_step_p50_vs_openenv_core_ratio": round(p50 / b50, 3),
            "openenv_protocol_step_p99_vs_openenv_core_ratio": round(p99 / b99, 3),
            "openenv_protocol_threaded_step_p50_us": round(_pct(st, 0.5), 1),
            "openenv_protocol_threaded_step_p99_us": round(_pct(st, 0.99), 1),
            "openenv_protocol_threaded_step_p50_vs_openenv_core_ratio": round(_pct(st, 0.5) / b50, 3),
            "openenv_protocol_local_make_step_p50_us": round(_pct(sl, 0.5), 2),
            "openenv_protocol_steps": len(so),
        })
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return out


if __name__ == "__main__":
    res = bench_openenv(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
    print(json.dumps(res, indent=1))
    if "openenv_protocol_step_p50_vs_openenv_core_ratio" in res:
        print(f"envfactory over OpenEnv / openenv-core's own counter server, step p50: "
              f"{res['openenv_protocol_step_p50_vs_openenv_core_ratio']}x, p99: "
              f"{res['openenv_protocol_step_p99_vs_openenv_core_ratio']}x", file=sys.stderr)
