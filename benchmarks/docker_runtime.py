"""``envfactory bench`` section ``docker``: the Docker runtime against same-run baselines.

Every episode is ``envfactory.make("Counter-v0", runtime=...)``: the same referee
over a local or a container world. Reports step round trip p50/p99 and their
ratio to the local runtime (steps interleaved in rounds so drift hits both), the step against its
transport floor (:func:`bench_step_floor`: a bare echo server in a container of the same image, the
same request and reply bytes, the same client code; also ``python -m benchmarks.docker_runtime floor
[n=] [repeats=] [gap_us=]``), warm acquire+reset (shared and
per-session containers), cold start, throughput of 32 concurrent sessions
(against 32 local sessions), 1,000 sessions held at once in shared containers
with 16 threads stepping them (step latency p50/p99, throughput; see
:func:`bench_shared_sessions`, also ``python -m benchmarks.docker_runtime sessions``),
and the same counter served by OpenEnv (``openenv-core``, WebSocket ``EnvClient``) with the ratio.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["bench_docker", "bench_shared_sessions", "bench_sessions_drivers", "bench_step_floor", "FLOOR_SERVER"]

ACTION = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))] / 1000.0


def _timed(step: Any, action: Any, n: int, gap: float = 0.0) -> list[int]:
    """The times (ns) of ``n`` calls ``step(action)`` (``gap``: seconds slept before each)."""
    clock, out, sleep = time.perf_counter_ns, [], time.sleep
    for _ in range(n):
        if gap:
            sleep(gap)
        t0 = clock()
        step(action)
        out.append(clock() - t0)
    return out


def _throughput(make: Any, sessions: int, seconds: float) -> float:
    envs = [make() for _ in range(sessions)]
    for e in envs:
        e.reset(0)
    counts = [0] * sessions
    stop = threading.Event()

    def run(i: int) -> None:
        e = envs[i]
        while not stop.is_set():
            e.step(ACTION)
            counts[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    for e in envs:
        e.close()
    return sum(counts) / seconds


def _host_cpu(before: Any, after: Any, steps: int) -> dict[str, float]:
    """The driving process's CPU a step (user + system, every thread; and system alone) between
    two ``getrusage`` readings: where a step's host time goes."""
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {"shared_sessions_host_cpu_us_per_step": round((user + system) / max(1, steps) * 1e6, 1),
            "shared_sessions_host_sys_us_per_step": round(system / max(1, steps) * 1e6, 1)}


def _rounds_of_step_many(envs: list[Any], seconds: float, pool: Any = None) -> dict[str, Any]:
    """Rounds of ``step_many`` over every episode, from this thread, for ``seconds`` (and the batch
    frames ``pool``'s containers were sent: one a container a round when the batch channel is used)."""
    from envfactory import step_many

    rounds: list[int] = []
    steps = errors = 0
    clock = time.perf_counter_ns
    t0 = time.perf_counter()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    while time.perf_counter() - t0 < seconds:
        r0 = clock()
        results = step_many([(e, ACTION) for e in envs])
        rounds.append(clock() - r0)
        steps += len(results)
        errors += sum(r.messages[0]["content"].startswith("Error") for r in results)
    elapsed = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "shared_sessions_driver": "step_many",
        "shared_sessions_steps": steps,
        "shared_sessions_steps_per_s": round(steps / elapsed),
        "shared_sessions_rounds": len(rounds),
        "shared_sessions_round_p50_ms": round(_pct(rounds, 0.5) / 1000, 3),
        "shared_sessions_round_max_ms": round(max(rounds) / 1e6, 3),
        "shared_sessions_errors": errors,
        **_host_cpu(cpu0, cpu1, steps),
        "shared_sessions_stepped": sum(1 for e in envs if e.status.turns_taken() > 0),
        "shared_sessions_batch_frames": sum(c._batch.frames_sent for c in (pool.containers() if pool else [])
                                            if getattr(c, "_batch", None) is not None),
    }


def _openenv(n: int) -> dict[str, Any]:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "openenv_counter.py"
    try:
        import openenv  # noqa: F401
    except ImportError:
        return {"openenv_error": "openenv-core is not installed (pip install openenv-core)"}
    r = subprocess.run([sys.executable, str(script), "bench", str(n)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return {"openenv_error": r.stderr[-500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_shared_sessions(sessions: int = 1000, threads: int = 16, seconds: float = 10.0,
                          per_container: int = 125, driver: str = "threads") -> dict[str, Any]:
    """``sessions`` Counter-v0 episodes held open at once, ``per_container`` to a shared
    container (each session is a server thread: the containers get ``pids`` room for them),
    stepped by ``threads`` threads (each owns ``sessions / threads`` episodes and steps
    them in turn, as fast as it can) for ``seconds``: step latency p50/p99/max over every
    step of every thread, throughput, the driving process's CPU a step (user + system), and
    what holding the sessions took. ``driver="step_many"``: one thread plays rounds of
    :func:`envfactory.step_many` over every session instead (a round's time is each step's
    latency there)."""
    from envfactory.registry import make, spec
    from envfactory.runtime.container import Limits
    from envfactory.runtime.pool import Pool

    s = spec("Counter-v0")
    pool = Pool(s, sessions_per_container=per_container,
                limits=Limits(pids=max(256, 2 * (per_container + 64) + 64), memory_mb=512))
    envs: list[Any] = []
    out: dict[str, Any] = {"shared_sessions": sessions, "shared_sessions_threads": threads,
                           "shared_sessions_per_container": per_container}
    try:
        t0 = time.perf_counter()
        pool.prewarm(-(-sessions // per_container))  # the containers, started up front
        out["shared_sessions_containers_start_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        for _ in range(sessions):
            e = make("Counter-v0", runtime="docker", pool=pool, max_turns=10**9)
            e.reset(0)
            envs.append(e)
        out["shared_sessions_open_s"] = round(time.perf_counter() - t0, 2)
        out["shared_sessions_containers"] = len(pool.containers())
        if driver == "step_many":
            out.update(_rounds_of_step_many(envs, seconds, pool))
            return out
        if driver != "threads":
            raise ValueError(f"driver must be 'threads' or 'step_many', not {driver!r}")
        lat: list[list[int]] = [[] for _ in range(threads)]
        errors = [0] * threads
        stop = threading.Event()
        start = threading.Barrier(threads + 1)

        def run(k: int) -> None:
            mine = envs[k::threads]
            clock, out_k = time.perf_counter_ns, lat[k]
            start.wait()
            i = 0
            while not stop.is_set():
                e = mine[i % len(mine)]
                i += 1
                t = clock()
                try:
                    r = e.step(ACTION)
                except Exception:
                    errors[k] += 1
                    continue
                out_k.append(clock() - t)
                if r.messages[0]["content"].startswith("Error"):
                    errors[k] += 1

        ts = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
        for t in ts:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(seconds)
        stop.set()
        for t in ts:
            t.join(60)
        elapsed = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        allv = [x for v in lat for x in v]
        touched = sum(1 for e in envs if e.status.turns_taken() > 0)
        out.update({
            "shared_sessions_steps": len(allv),
            "shared_sessions_steps_per_s": round(len(allv) / elapsed),
            "shared_sessions_step_p50_ms": round(_pct(allv, 0.5) / 1000, 3),
            "shared_sessions_step_p99_ms": round(_pct(allv, 0.99) / 1000, 3),
            "shared_sessions_step_p999_ms": round(_pct(allv, 0.999) / 1000, 3),
            "shared_sessions_step_max_ms": round(max(allv) / 1e6, 3),
            "shared_sessions_errors": sum(errors),
            **_host_cpu(cpu0, cpu1, len(allv)),
        })
        out["shared_sessions_stepped"] = touched  # sessions that took at least one step
    finally:
        for e in envs:
            e.close()
        pool.shutdown()
    return out


def bench_sessions_drivers(pairs: int = 3, seconds: float = 8.0, sessions: int = 1000) -> dict[str, Any]:
    """``sessions`` held on one engine, stepped for ``seconds`` by 16 threads (each step waiting on
    its own session's reply) and by :func:`envfactory.step_many` rounds from one thread (the turns
    bound for one container in one batch frame), alternated ``pairs`` times in this run: steps/s of
    each (min/median/max), the ratio of each pair, and the machine's load."""
    import os

    threads, many, ratios = [], [], []
    load0 = os.getloadavg()[0]
    for _ in range(pairs):
        t = bench_shared_sessions(sessions=sessions, seconds=seconds, driver="threads")
        m = bench_shared_sessions(sessions=sessions, seconds=seconds, driver="step_many")
        threads.append(t["shared_sessions_steps_per_s"])
        many.append(m["shared_sessions_steps_per_s"])
        ratios.append(many[-1] / threads[-1])
    spread = lambda v: [round(min(v), 2), round(sorted(v)[len(v) // 2], 2), round(max(v), 2)]  # noqa: E731
    return {"sessions_drivers_sessions": sessions, "sessions_drivers_pairs": pairs,
            "sessions_threads_steps_per_s": spread(threads), "sessions_step_many_steps_per_s": spread(many),
            "sessions_step_many_vs_threads_ratio": spread(ratios),
            "sessions_step_many_host_cpu_us_per_step": m["shared_sessions_host_cpu_us_per_step"],
            "sessions_step_many_batch_frames": m["shared_sessions_batch_frames"],
            "sessions_drivers_load": [round(load0, 2), round(os.getloadavg()[0], 2)]}


FLOOR_SERVER = r"""
import os, socket, struct, threading
path = os.environ.get("ENVFACTORY_SOCKET", "/run/envf/s")
reply = bytes.fromhex(REPLY_HEX)
magic = b"ENVF"

def serve(c):
    buf = b""
    try:
        while True:
            d = c.recv(65536)
            if not d:
                return
            buf += d
            if buf.startswith(magic):
                buf = buf[4:]
            while len(buf) >= 4:
                n = struct.unpack_from(">I", buf)[0]
                if len(buf) < 4 + n:
                    break
                buf = buf[4 + n:]
                c.sendall(reply)
    finally:
        c.close()

s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path + ".tmp")
s.listen(64)
os.rename(path + ".tmp", path)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
"""The transport floor's server (:func:`bench_step_floor`): a bare echo in Python, a thread per
connection like the real server, that answers each whole frame with one fixed reply frame (the
bytes of the real server's reply to the same step) and does nothing else: no JSON, no world."""


def _spread(v: list[float]) -> list[float]:
    s = sorted(v)
    return [round(s[0], 2), round(s[len(s) // 2], 2), round(s[-1], 2)]


def bench_step_floor(n: int = 4000, repeats: int = 3, env: str = "Counter-v0", gap_us: int = 0) -> dict[str, Any]:
    """The Docker step against its transport floor, same run, interleaved in rounds of 50:

    * ``docker_step``: ``env.step(ACTION)`` of a Docker episode (the referee on the host, one
      ``run`` request to the container's world);
    * ``server_rt``: that same ``run`` request sent straight on a second session's channel
      (:meth:`SessionLink.request`, no referee): the container's side and the transport;
    * ``floor_rt``: the same request bytes, the same client code (:meth:`SessionLink.request`), to
      :data:`FLOOR_SERVER` in a container of the same image, limits and hardening (a
      :class:`~envfactory.runtime.container.Container` that runs it instead of the server),
      answering the real reply's bytes;
    * ``local_step``: the same step on the local runtime (the host's own share of a step).

    ``repeats`` runs of ``n`` steps each; per run the p50 / p99 of each and the ratios
    ``docker_step / floor_rt``; reported as [min, median, max] over the runs, with the load.
    ``gap_us``: a pause before each step (``1000``: as a rollout steps, a model's turn apart, when
    both ends have gone idle and their caches cold; ``0``: back to back).

    Where a step's time goes on a 2-core VM: the round trip's two thread wake-ups cost the most when
    the server thread and the host's thread sit on different cores (a halted vCPU woken, its caches
    cold: 2-3x the same-core round trip, for the floor and the server alike). Which core the kernel
    wakes a thread on is its choice, per thread and from one round to the next: compare the step and
    the floor of the same run, and look at min and max."""
    import os

    from envfactory.registry import make, spec
    from envfactory.runtime import wire
    from envfactory.runtime.container import Container
    from envfactory.runtime.docker_session import SessionLink
    from envfactory.runtime.pool import Pool

    s = spec(env)
    pool = Pool(s, sessions_per_container=16)
    load0 = os.getloadavg()
    floor = None
    envs: list[Any] = []
    try:
        dock = make(env, runtime="docker", pool=pool, max_turns=10**9)
        local = make(env, max_turns=10**9)
        raw = make(env, runtime="docker", pool=pool, max_turns=10**9)
        envs += [dock, local, raw]
        for e in envs:
            e.reset(0)
        link: SessionLink = raw._world._link  # type: ignore[attr-defined]
        req = raw._world._run_request("agent_0", 1, [_action_call()])  # type: ignore[attr-defined]
        req.pop("state", None)
        reply = link.request(req)
        reply_frame = wire.encode_frame(reply)
        floor = Container(pool.client, s, pool.image, max_sessions=1, limits=pool.limits,
                          command=["python3", "-c", f"REPLY_HEX = {reply_frame.hex()!r}\n" + FLOOR_SERVER])
        flink = SessionLink(pool, f"{env} (floor)", 30.0)
        flink.attach(floor, "floor")

        def rt(lk: SessionLink) -> Any:
            return lambda _a: lk.request(req)

        cases = {"docker_step": dock.step, "server_rt": rt(link), "floor_rt": rt(flink), "local_step": local.step}
        runs: dict[str, list[list[float]]] = {k: [[], []] for k in cases}
        ratios: dict[str, list[float]] = {"docker_step_vs_floor_p50": [], "server_rt_vs_floor_p50": [],
                                          "docker_step_vs_floor_p99": []}
        for k, f in cases.items():
            _timed(f, ACTION, 200)
        for _ in range(repeats):
            t: dict[str, list[int]] = {k: [] for k in cases}
            for _ in range(n // 50):
                for k, f in cases.items():
                    t[k] += _timed(f, ACTION, 50, gap_us / 1e6)
            for k in cases:
                runs[k][0].append(_pct(t[k], 0.5))
                runs[k][1].append(_pct(t[k], 0.99))
            ratios["docker_step_vs_floor_p50"].append(_pct(t["docker_step"], 0.5) / _pct(t["floor_rt"], 0.5))
            ratios["server_rt_vs_floor_p50"].append(_pct(t["server_rt"], 0.5) / _pct(t["floor_rt"], 0.5))
            ratios["docker_step_vs_floor_p99"].append(_pct(t["docker_step"], 0.99) / _pct(t["floor_rt"], 0.99))
        out: dict[str, Any] = {"floor_steps_per_run": n, "floor_runs": repeats, "floor_gap_us": gap_us,
                               "floor_request_bytes": link.sent_bytes, "floor_reply_bytes": len(reply_frame)}
        for k, (p50, p99) in runs.items():
            out[f"{k}_p50_us"] = _spread(p50)
            out[f"{k}_p99_us"] = _spread(p99)
        out.update({k: _spread(v) for k, v in ratios.items()})
        out["floor_load"] = [round(load0[0], 2), round(os.getloadavg()[0], 2)]
        return out
    finally:
        for e in envs:
            e.close()
        if floor is not None:
            floor.remove()
        pool.shutdown()


def _action_call() -> Any:
    """The tool call :data:`ACTION` parses to."""
    from envfactory.task import ToolCall

    call = json.loads(ACTION.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    return ToolCall(call["name"], call["arguments"])


def bench_docker(n: int = 4000) -> dict[str, Any]:
    from envfactory.registry import make, spec
    from envfactory.runtime.pool import Pool

    s = spec("Counter-v0")
    out: dict[str, Any] = {}
    pool = Pool(s, sessions_per_container=16)

    def docker(p: Pool = pool, **kw: Any) -> Any:
        return make("Counter-v0", runtime="docker", pool=p, **kw)

    try:
        # cold start: a new container until its first reset returned
        colds = []
        for _ in range(3):
            t0 = time.perf_counter_ns()
            c = pool.start_container()
            with pool._cond:
                pool._live.append(c)
            e = docker()
            e.reset(0)
            colds.append(time.perf_counter_ns() - t0)
            e.close()
        out["docker_cold_start_ms"] = round(_pct(colds, 0.5) / 1000, 1)

        # step round trip, interleaved with the local runtime
        local = make("Counter-v0", max_turns=10**9)
        dock = docker(max_turns=10**9)
        local.reset(0)
        dock.reset(0)
        _timed(dock.step, ACTION, 200)
        ls, ds = [], []
        for _ in range(n // 50):
            ls += _timed(local.step, ACTION, 50)
            ds += _timed(dock.step, ACTION, 50)
        dock.close()
        p50, p50l = _pct(ds, 0.5), _pct(ls, 0.5)
        out.update({
            "docker_step_p50_us": round(p50, 1), "docker_step_p99_us": round(_pct(ds, 0.99), 1),
            "local_step_p50_us": round(p50l, 1), "local_step_p99_us": round(_pct(ls, 0.99), 1),
            "docker_step_p50_vs_local_ratio": round(p50 / p50l, 2),
            "docker_step_p99_vs_local_ratio": round(_pct(ds, 0.99) / _pct(ls, 0.99), 2),
        })

        # warm acquire + reset: a shared container already running
        warm = []
        for _ in range(50):
            t0 = time.perf_counter_ns()
            e = docker()
            e.reset(0)
            warm.append(time.perf_counter_ns() - t0)
            e.close()
        out["docker_warm_acquire_reset_ms"] = round(_pct(warm, 0.5) / 1000, 2)

        # throughput, 32 concurrent sessions (two shared containers) vs 32 local sessions
        tl = _throughput(lambda: make("Counter-v0", max_turns=10**9), 32, 2.0)
        td = _throughput(lambda: docker(max_turns=10**9), 32, 3.0)
        out.update({"docker_throughput_32_sessions_steps_per_s": round(td),
                    "local_throughput_32_sessions_steps_per_s": round(tl),
                    "docker_throughput_vs_local_ratio": round(td / tl, 3)})
    finally:
        pool.shutdown()

    # warm acquire + reset with a container per session (isolation="container")
    per = Pool(dataclasses.replace(s, isolation="container"), warm=1)
    try:
        samples = []
        for _ in range(8):
            per.prewarm(1)
            t0 = time.perf_counter_ns()
            e = make("Counter-v0", runtime="docker", pool=per)
            e.reset(0)
            samples.append(time.perf_counter_ns() - t0)
            e.close()
        out["docker_warm_acquire_reset_per_session_container_ms"] = round(_pct(samples, 0.5) / 1000, 2)
    finally:
        per.shutdown()

    # the step against its transport floor (an echo server in a container of the same image), same run
    out.update(bench_step_floor(n=2000, repeats=3))
    out.update(bench_shared_sessions())
    out.update(bench_sessions_drivers())

    oe = _openenv(2000)
    if "p50_us" in oe:
        out.update({"openenv_step_p50_us": round(oe["p50_us"], 1), "openenv_step_p99_us": round(oe["p99_us"], 1),
                    "docker_step_p50_vs_openenv_ratio": round(p50 / oe["p50_us"], 3)})
    else:
        out.update(oe)
    return out


def bench_work_snapshots(n: int = 200, files_kb: int = 64, n_writing: int = 60,
                         module: str = "docker_attack_env") -> dict[str, Any]:
    """The cost of the per-step snapshot of a world that runs agent code (``isolation="container"``),
    on two episodes of ``CodeSandbox-v0`` (registered by ``module``, the test environment), one
    snapshotting every step (``resume=True``, the default: state + tar.gz of ``/tmp`` in each
    ``run`` reply) and one not (``resume=False``), steps interleaved; p50s and their ratio, for:

    * ``idle``: a cheap step (``write_file``) while the work folder holds ``files_kb`` KiB of
      random files it does not change (the snapshot sends the state and "unchanged");
    * ``writing``: a step whose agent code (``run_python``) rewrites those ``files_kb`` KiB every
      time (the snapshot archives and sends the whole folder each step).
    """
    import importlib

    from envfactory.registry import make
    from envfactory.task import ToolCall

    importlib.import_module(module)
    turns = max(n, n_writing) + 10
    eps = [make("CodeSandbox-v0", runtime="docker", resume=flag, step_timeout=30, max_turns=turns)
           for flag in (True, False)]
    fill = ToolCall("run_python", {"code": f"import os\nopen('/tmp/f', 'wb').write(os.urandom({files_kb} << 10))"})
    cases = {"idle": (ToolCall("write_file", {"path": "/x", "content": "1"}), n), "writing": (fill, n_writing)}
    out: dict[str, Any] = {"work_folder_kb": files_kb}
    try:
        for case, (act, steps) in cases.items():
            times: list[list[float]] = [[], []]
            for ep in eps:
                ep.reset(0)
                ep.step(fill)
            time.sleep(0.2)  # older than the racy window (a write that recent is archived again)
            for i in range(steps + 5):
                for k, ep in enumerate(eps):
                    t = time.perf_counter_ns()
                    ep.step(act)
                    if i >= 5:  # warm-up
                        times[k].append(time.perf_counter_ns() - t)
            with_snap, without = _pct(times[0], 0.5), _pct(times[1], 0.5)
            out.update({f"{case}_snapshot_step_p50_us": round(with_snap, 1),
                        f"{case}_no_snapshot_step_p50_us": round(without, 1),
                        f"{case}_snapshot_vs_none_ratio": round(with_snap / without, 3), f"{case}_steps": steps})
        return out
    finally:
        for ep in eps:
            ep.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["floor"]:
        kw = dict(a.split("=", 1) for a in args[1:])
        print(json.dumps(bench_step_floor(**{k: (v if k == "env" else int(v)) for k, v in kw.items()}), indent=1))
    elif args[:1] == ["snapshots"]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        kw = dict(a.split("=", 1) for a in args[1:])
        print(json.dumps(bench_work_snapshots(**{k: int(v) for k, v in kw.items()}), indent=1))
    elif args[:1] == ["drivers"]:
        kw = dict(a.split("=", 1) for a in args[1:])
        print(json.dumps(bench_sessions_drivers(**{k: (float(v) if k == "seconds" else int(v)) for k, v in kw.items()}),
                         indent=1))
    elif args[:1] == ["sessions"]:
        kw = dict(a.split("=", 1) for a in args[1:])
        print(json.dumps(bench_shared_sessions(**{k: (float(v) if k == "seconds" else v if k == "driver" else int(v))
                                                 for k, v in kw.items()}), indent=1))
    else:
        print(json.dumps(bench_docker(), indent=1))
