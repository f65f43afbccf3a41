"""Fuzz the referee with generated model outputs on both runtimes, side by side (issue 17).

Every generated output (Hermes ``<tool_call>`` blocks with valid and invalid JSON,
unknown tools, wrong argument types, huge and deeply nested arguments, control
characters and lone surrogates, unclosed tags, many calls, OpenAI-style message
dicts and lists of calls) is played as one step on an in-process episode and on a
Docker episode of the same environment and task (``lanes`` such pairs, one thread
each, every Docker session sharing one container with ``bystanders`` sessions that
play the reference solution over and over meanwhile). Counted:

* ``escaped``: exceptions escaping ``step()`` (either runtime);
* ``hangs``: steps slower than ``--deadline`` seconds (either runtime; a Docker step
  that resumed its world after its container died is counted in ``resumed_steps``
  instead), and steps the Docker world ended by its ``step_timeout``;
* ``bystanders_lost``: bystander steps that raised or whose result differs from
  the same move on an in-process twin;
* ``differences``: steps whose ``StepResult.to_json()`` differ between the runtimes,
  and episodes whose final states (canonical JSON) differ.

Not part of CI (``tests/adversarial/test_differential_fuzz.py`` is the small CI-sized
version). Usage::

    python benchmarks/fuzz_runtimes.py --n 1000000            # the full run
    python benchmarks/fuzz_runtimes.py --seconds 600          # as many as fit in 10 minutes
    python benchmarks/fuzz_runtimes.py --n 2000 --env Bank-v0 --json out.json

Prints progress, then one JSON object with the counts, throughput (outputs per
second) and the time 10**6 outputs would take at that rate; the first few failing
outputs of each kind are kept (``examples``) with their seed to replay them.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import string
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import envfactory  # noqa: E402
from envfactory.checks.scripted import OraclePolicy, random_value  # noqa: E402
from envfactory.state import canonical_json  # noqa: E402

_PRINTABLE = string.ascii_letters + string.digits + " /._-:{}[]\"'\\,<>"
_NASTY = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\u0085", "\u2028", "\u2029", "\ufeff", "\ufffe",
          "\ud800", "\udfff", "\U0001f600", "\r", "\n", "\t", "\\", '"', "</tool_call>", "<tool_call>",
          "\\u0000", "\\ud800", "}", "{", "\u202e", "\u200b"]
_UNKNOWN = ["", " ", "rm_rf", "__import__", "list_dir ", "LIST_DIR", "read_file\x00", "\ud800", "a" * 300,
            "tool_call", "null", "0", "../read_file", "read-file", "tools.read_file", "\u202eelif_daer"]


def _text(rng: random.Random, size: int | None = None) -> str:
    n = size if size is not None else rng.choice((0, 1, 3, 8, 20, 60))
    if n > 256:  # a huge text: a random piece, repeated (as fast as memory)
        piece = _text(rng, 97)
        return (piece * (n // 97 + 1))[:n]
    r = rng.random()
    if r < 0.55:
        return "".join(rng.choice(_PRINTABLE) for _ in range(n))
    if r < 0.85:
        return "".join(rng.choice(_NASTY) if rng.random() < 0.3 else rng.choice(_PRINTABLE) for _ in range(n))
    return "".join(chr(rng.randrange(0x20, 0x30000)) for _ in range(n))


def _nested(rng: random.Random, depth: int) -> Any:
    v: Any = rng.choice((1, "x", None, True))
    for _ in range(depth):
        v = [v] if rng.random() < 0.5 else {"k": v}
    return v


def _wrong(rng: random.Random) -> Any:
    """A value of a random (likely wrong) type, sometimes huge or deep."""
    r = rng.random()
    if r < 0.15:
        return rng.choice((None, True, False, 0, -1, 1.5, float(2 ** 60), 2 ** 70, -(2 ** 63)))
    if r < 0.3:
        return [_text(rng) for _ in range(rng.randint(0, 4))]
    if r < 0.4:
        return {_text(rng, 4): _text(rng) for _ in range(rng.randint(0, 3))}
    if r < 0.5:
        return _nested(rng, rng.choice((5, 50, 200, 600)))  # deeper: as text (_bad_json)
    if r < 0.56:
        return _text(rng, rng.choice((1000, 20000, 200000)))
    if r < 0.6:
        return rng.choice((1e308, -1e308, 1e-320, 123456789012345678901234567890))
    return _text(rng)


def _arguments(rng: random.Random, fn: dict[str, Any] | None) -> Any:
    props = (fn or {}).get("parameters", {}).get("properties", {})
    r = rng.random()
    if r < 0.4 and fn is not None:  # valid (as far as types go)
        return {k: random_value(v, rng, text=_text) for k, v in props.items()}
    if r < 0.6:  # a wrong type here and there, a key missing or extra
        args = {k: (_wrong(rng) if rng.random() < 0.5 else random_value(v, rng, text=_text))
                for k, v in props.items() if rng.random() < 0.85}
        if rng.random() < 0.3:
            args[_text(rng, 6)] = _wrong(rng)
        return args
    if r < 0.7:
        return _wrong(rng)  # not an object at all
    if r < 0.8:
        return {}
    return {k: _wrong(rng) for k in props} or {"x": _wrong(rng)}


def _bad_json(rng: random.Random, good: str) -> str:
    r = rng.randrange(9)
    if r == 0:
        return good[: rng.randint(0, max(0, len(good) - 1))]  # truncated
    if r == 1:
        return good.replace('"', "'")
    if r == 2:
        return good[:-1] + ",}"
    if r == 3:
        return good + good
    if r == 4:
        i = rng.randint(0, len(good))
        return good[:i] + rng.choice(_NASTY) + good[i:]
    if r == 5:
        return "[" * rng.choice((10, 1000, 100000)) + "]" * rng.choice((0, 10))
    if r == 6:
        return '{"name": "x", "arguments": ' + "9" * rng.choice((400, 5000, 50000)) + "}"
    if r == 7:
        return "NaN" if rng.random() < 0.5 else '{"name": Infinity}'
    return _text(rng)


def _call_json(rng: random.Random, names: list[str], fns: dict[str, Any]) -> str:
    name = rng.choice(names) if rng.random() < 0.8 else rng.choice(_UNKNOWN + [_text(rng)])
    body: dict[str, Any] = {"name": name, "arguments": _arguments(rng, fns.get(name))}
    r = rng.random()
    if r < 0.05:
        body = {"function": body}
    elif r < 0.1:
        body = {"name": _wrong(rng), "arguments": body["arguments"]}
    elif r < 0.13:
        try:
            body["arguments"] = json.dumps(body["arguments"], ensure_ascii=False)  # a string of JSON
        except (ValueError, RecursionError):
            body["arguments"] = "{"
    elif r < 0.15:
        del body["arguments"]
    try:
        s = json.dumps(body, ensure_ascii=rng.random() < 0.5)
    except (ValueError, RecursionError):
        s = '{"name": "x"}'
    return s if rng.random() < 0.8 else _bad_json(rng, s)


_MAX_TEXT = 3 << 20
"""The generator stops adding calls to a text past this many characters (3x the parser's 1 MiB cap).
Unbounded, it built texts of up to 600 MB, holding the GIL for seconds while other lanes' steps were
being timed: the harness's own work read as multi-second Docker steps (see ``slow_steps``)."""


def _hermes(rng: random.Random, names: list[str], fns: dict[str, Any]) -> str:
    n = rng.choice((0, 1, 1, 1, 2, 3, 5, 20, 200)) if rng.random() < 0.97 else rng.randint(200, 2000)
    parts = []
    if rng.random() < 0.4:
        parts.append(_text(rng))
    made: list[str] = []
    size = 0
    for i in range(n):
        # many calls: a few distinct ones, repeated (as a model that loops would)
        call = _call_json(rng, names, fns) if i < 8 else rng.choice(made)
        made.append(call)
        size += len(call)
        if size > _MAX_TEXT:  # over the action cap already: more tests nothing, and costs the harness seconds
            break
        r = rng.random()
        if r < 0.85:
            parts.append(f"<tool_call>{call}</tool_call>")
        elif r < 0.9:
            parts.append(f"<tool_call>{call}")  # unclosed
        elif r < 0.93:
            parts.append(f"<tool_call><tool_call>{call}</tool_call></tool_call>")
        elif r < 0.96:
            parts.append(f"<tool_call>\n```json\n{call}\n```\n</tool_call>")
        else:
            parts.append(f"<TOOL_CALL>{call}</TOOL_CALL>")
        if rng.random() < 0.2:
            parts.append(_text(rng))
    if rng.random() < 0.1:
        parts.append("Task complete. " + _text(rng))
    return rng.choice(("", "\n", " ")).join(parts)


def _openai(rng: random.Random, names: list[str], fns: dict[str, Any]) -> Any:
    calls = []
    for i in range(rng.choice((0, 1, 1, 2, 4, 40))):
        name = rng.choice(names) if rng.random() < 0.8 else rng.choice(_UNKNOWN + [_wrong(rng)])
        args: Any = _arguments(rng, fns.get(name) if isinstance(name, str) else None)
        r = rng.random()
        if r < 0.6:
            try:
                args = json.dumps(args)
            except (ValueError, RecursionError):
                args = "{"
            if rng.random() < 0.15:
                args = _bad_json(rng, args)
        elif r < 0.7:
            args = _wrong(rng)
        fn: Any = {"name": name, "arguments": args}
        if rng.random() < 0.05:
            fn = _wrong(rng)
        call: Any = {"id": f"call_{i}", "type": "function", "function": fn}
        if rng.random() < 0.05:
            call = _wrong(rng)
        calls.append(call)
    r = rng.random()
    if r < 0.15:
        return calls  # a bare list of calls
    msg: dict[str, Any] = {"role": "assistant",
                           "content": _text(rng) if rng.random() < 0.7 else rng.choice((None, [], {"a": 1}, 3))}
    if r < 0.9:
        msg["tool_calls"] = calls if rng.random() < 0.95 else _wrong(rng)
    return msg


def generate(rng: random.Random, schemas: list[dict[str, Any]]) -> Any:
    """One model output: Hermes text (most), an OpenAI-style message dict or call list, or noise."""
    fns = {s["function"]["name"]: s["function"] for s in schemas}
    names = list(fns)
    r = rng.random()
    try:
        if r < 0.65:
            return _hermes(rng, names, fns)
        if r < 0.9:
            return _openai(rng, names, fns)
    except RecursionError:  # the generator's own limit (a thread's stack): plain deep text instead
        return "<tool_call>" + "[" * 5000 + "</tool_call>"
    return _text(rng, rng.choice((0, 5, 100, 5000)))


# -- known bugs, outside the runtimes: with --skip-known, outputs that would hit them are counted, not played
# tools/filesystem.py: make_dir loops forever on a path that normalizes to a leading "//" (posixpath
# keeps two leading slashes; dirname("//x") is "//", never "/"): an in-process step never returns.
_KNOWN = re.compile(r"""["']//""")


def known_bug(action: Any) -> bool:
    return bool(_KNOWN.search(action if isinstance(action, str) else repr(action)))


# -- the run -------------------------------------------------------------------------------
class Tally:
    KINDS = ("escaped", "hangs", "bystanders_lost", "differences", "state_differences")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(self.KINDS, 0)
        self.outputs = 0
        self.skipped_known = 0
        self.resumed_steps = 0  # docker steps that resumed their world on a fresh container (not hangs)
        self.resumed_seconds = 0.0  # the slowest of them
        self.steps_docker_timeout = 0
        self.bystander_steps = 0
        self.examples: dict[str, list[dict[str, Any]]] = {k: [] for k in self.KINDS}
        self.errors: dict[str, int] = {}
        self.current: dict[int, tuple[int, str, float]] = {}  # lane -> (seed, runtime, started)
        self.gone_states = 0  # episodes the Docker world ended by timeout / loss: no final state to compare
        self.slow_reports: list[dict[str, Any]] = []  # what the watchdog saw during slow steps
        self.gc_slow: list[tuple[Any, float, Any]] = []  # host GCs over 0.1 s: (generation, seconds, collected)

    def stuck(self, over: float) -> dict[int, dict[str, Any]]:
        now = time.monotonic()
        return {k: {"seed": s, "runtime": rt, "for_s": round(now - t, 1)}
                for k, (s, rt, t) in list(self.current.items()) if now - t > over}

    def bad(self, kind: str, **example: Any) -> None:
        with self.lock:
            self.counts[kind] += 1
            if len(self.examples[kind]) < 5:
                self.examples[kind].append({k: (repr(v)[:600] if not isinstance(v, (int, float)) else v)
                                            for k, v in example.items()})


def _container_cpu(c: Any) -> float | None:
    """CPU seconds the container has used (its cgroup), or None."""
    try:
        pid = c.client.api.inspect_container(c.id)["State"]["Pid"]
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().strip().splitlines()
        for line in lines:  # cgroup v1: the cpuacct controller
            _, ctrl, rel = line.split(":", 2)
            if "cpuacct" in ctrl.split(","):
                with open(f"/sys/fs/cgroup/{ctrl}{rel}/cpuacct.usage") as f:
                    return int(f.read()) / 1e9
        rel = lines[-1].split("::", 1)[-1]  # cgroup v2
        with open(f"/sys/fs/cgroup{rel}/cpu.stat") as f:
            return int(f.readline().split()[1]) / 1e6
    except Exception:  # noqa: BLE001
        return None


def _gc_watch(tally: Tally) -> None:
    """Log host garbage collections over 0.1 s (they hold the GIL: every lane waits)."""
    import gc

    started = [0.0]

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            dt = time.perf_counter() - started[0]
            if dt > 0.1:
                tally.gc_slow.append((info.get("generation"), round(dt, 2), info.get("collected")))

    gc.callbacks.append(cb)


def _watchdog(tally: Tally, pool: Any, over: float, stop: threading.Event, keep: int = 6) -> None:
    """While a step runs longer than ``over`` seconds, record once per stall what every host
    thread is doing and what the container reports (state, memory, processes), to diagnose
    slow steps after the fact (``slow_steps`` in the report)."""
    import traceback

    reported: set[tuple[int, int]] = set()
    while not stop.wait(0.5):
        stuck = {k: v for k, v in list(tally.current.items()) if time.monotonic() - v[2] > over}
        new = {k: v for k, v in stuck.items() if (k, v[0]) not in reported}
        if not new or len(tally.slow_reports) >= keep:
            continue
        reported.update((k, v[0]) for k, v in new.items())
        import os

        def _ticks() -> dict[str, int]:
            out = {}
            for tid in os.listdir("/proc/self/task"):
                try:
                    f = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                    out[tid] = int(f[11]) + int(f[12])
                except (OSError, IndexError, ValueError):
                    pass
            return out

        names = {str(t.native_id): t.name for t in threading.enumerate()}
        ticks0 = _ticks()
        cpu0, wall0 = time.process_time(), time.monotonic()
        ccpu0 = {c.name: _container_cpu(c) for c in pool.containers()}
        import os
        import shutil
        import subprocess

        if shutil.which("py-spy"):  # the whole picture, GIL holder and idle threads included
            dump = subprocess.run(["py-spy", "dump", "--pid", str(os.getpid())], capture_output=True, text=True,
                                  timeout=30).stdout
            print("[watchdog] py-spy dump:\n" + dump[-6000:], file=sys.stderr, flush=True)
            for c in pool.containers():  # and the container's server (a child of its init)
                try:
                    init = c.client.api.inspect_container(c.id)["State"]["Pid"]
                    kids = Path(f"/proc/{init}/task/{init}/children").read_text().split()
                    for kid in kids:
                        d = subprocess.run(["py-spy", "dump", "--pid", kid], capture_output=True, text=True,
                                           timeout=30)
                        print(f"[watchdog] py-spy dump of {c.name}'s server:\n" + (d.stdout + d.stderr)[-8000:],
                              file=sys.stderr, flush=True)
                except Exception as exc:  # noqa: BLE001
                    print(f"[watchdog] cannot dump {c.name}: {exc!r}", file=sys.stderr, flush=True)
        samples: dict[str, int] = {}
        for _ in range(20):  # where the host threads are, sampled over the next second
            time.sleep(0.05)
            for ident, f in sys._current_frames().items():
                if ident == threading.get_ident():
                    continue
                top = traceback.extract_stack(f, limit=3)
                key = " <- ".join(f"{Path(fr.filename).name}:{fr.lineno}:{fr.name}" for fr in reversed(top))
                samples[key] = samples.get(key, 0) + 1
        ticks1 = _ticks()
        hz = os.sysconf("SC_CLK_TCK")
        burning = {names.get(t, f"tid {t}"): round((ticks1[t] - ticks0.get(t, 0)) / hz, 2)
                   for t in ticks1 if ticks1[t] - ticks0.get(t, 0) > 0}
        print(f"[watchdog] host CPU by thread (s): {burning}", file=sys.stderr, flush=True)
        host_cpu = round((time.process_time() - cpu0) / (time.monotonic() - wall0), 2)
        ccpu = {n: (round((_container_cpu(c) - ccpu0[n]) / (time.monotonic() - wall0), 2)
                    if ccpu0.get(n) is not None else None)
                for c in pool.containers() for n in [c.name]}
        still = [k for k in new if k in tally.current]
        print("[watchdog] host stack samples: " + "; ".join(f"{n}x {k}" for k, n in
                                                        sorted(samples.items(), key=lambda kv: -kv[1])[:8]),
              file=sys.stderr, flush=True)
        frames = sys._current_frames()
        threads = {t.ident: t.name for t in threading.enumerate()}
        stacks = {threads.get(ident, str(ident)): "".join(traceback.format_stack(f, limit=8))[-1500:]
                  for ident, f in frames.items()}
        containers = []
        for c in pool.containers():
            try:
                attrs = c.client.api.inspect_container(c.id)["State"]
                st = c.client.api.stats(c.id, stream=False)
                mem = st.get("memory_stats", {})
                containers.append({"name": c.name, "status": attrs.get("Status"), "oom": attrs.get("OOMKilled"),
                                   "mem_mb": round(mem.get("usage", 0) / 2 ** 20, 1),
                                   "mem_limit_mb": round(mem.get("limit", 0) / 2 ** 20, 1),
                                   "pids": st.get("pids_stats", {}).get("current"),
                                   "cpu_total_s": round(st.get("cpu_stats", {}).get("cpu_usage", {})
                                                        .get("total_usage", 0) / 1e9, 1)})
            except Exception as exc:  # noqa: BLE001 -- a diagnosis, best effort
                containers.append({"name": getattr(c, "name", "?"), "error": repr(exc)[:200]})
        try:
            import os

            load = os.getloadavg()
        except OSError:
            load = None
        tally.slow_reports.append({"host_cpu": host_cpu, "container_cpu": ccpu, "still_stuck": still,
                                   "stuck": {k: {"seed": v[0], "runtime": v[1],
                                                 "for_s": round(time.monotonic() - v[2], 1)} for k, v in stuck.items()},
                                   "load": load, "containers": containers, "stacks": stacks})
        print(f"[watchdog] slow step(s) {list(new.values())}: over the next 1 s: host CPU {host_cpu}, "
              f"container CPU {ccpu}, still stuck {still}; gc {tally.gc_slow[-3:]}; load {load}, containers {containers}",
              file=sys.stderr, flush=True)
        for name, st in stacks.items():
            if name.startswith(("lane", "bystander", "MainThread")) or "envfactory" in st:
                print(f"  -- {name}:\n" + "\n".join(st.splitlines()[-6:]), file=sys.stderr, flush=True)


def _step(ep: Any, action: Any) -> tuple[Any, float, BaseException | None]:
    t0 = time.perf_counter()
    try:
        r = ep.step(action)
    except BaseException as exc:  # noqa: BLE001 -- counting what escapes is the point
        return None, time.perf_counter() - t0, exc
    return r, time.perf_counter() - t0, None


def lane(k: int, name: str, task: Any, seed: int, quota: int, stop_at: float, deadline: float,
         pool: Any, tally: Tally, max_turns: int, step_timeout: float, skip_known: bool = False) -> None:
    local = envfactory.make(name, max_turns=max_turns)
    dock = envfactory.make(name, runtime="docker", pool=pool, max_turns=max_turns, step_timeout=step_timeout)
    schemas = local.tool_schemas()
    try:
        local.reset(task)
        dock.reset(task)
        for i in range(quota):
            if time.monotonic() > stop_at:
                break
            s = seed * 1_000_003 + k * 10_000_019 + i
            action = generate(random.Random(s), schemas)
            if skip_known and known_bug(action):
                with tally.lock:
                    tally.skipped_known += 1
                continue
            tally.current[k] = (s, "local", time.monotonic())
            a, ta, ea = _step(local, action)
            tally.current[k] = (s, "docker", time.monotonic())
            resumed = dock.world.resumed
            b, tb, eb = _step(dock, action)
            resumed = dock.world.resumed != resumed  # its container died (another lane's doing, or this output's)
            tally.current.pop(k, None)
            with tally.lock:
                tally.outputs += 1
            if ea or eb:
                tally.bad("escaped", seed=s, local=ea, docker=eb)
                for e in (ea, eb):
                    if e is not None:
                        with tally.lock:
                            tally.errors[type(e).__name__] = tally.errors.get(type(e).__name__, 0) + 1
                local.reset(task)
                dock.reset(task)
                continue
            if resumed:
                with tally.lock:
                    tally.resumed_steps += 1
                    tally.resumed_seconds = max(tally.resumed_seconds, tb)
            if ta > deadline or (tb > deadline and not resumed) or b.info.get("timeout"):
                tally.bad("hangs", seed=s, local_s=round(ta, 3), docker_s=round(tb, 3))
                if b.info.get("timeout"):
                    with tally.lock:
                        tally.steps_docker_timeout += 1
            ja, jb = a.to_json(), b.to_json()
            if ja != jb:
                tally.bad("differences", seed=s, local=ja, docker=jb)
            if a.done or b.done:
                if dock.ended_by in ("timeout", "world_lost"):  # its state went with the world
                    with tally.lock:
                        tally.gone_states += 1
                else:
                    sa, sb = canonical_json(local.state), canonical_json(dock.state)
                    if sa != sb:
                        tally.bad("state_differences", seed=s, local=sa, docker=sb)
                local.reset(task)
                dock.reset(task)
    finally:
        dock.close()


def bystander(k: int, name: str, task: Any, stop: threading.Event, pool: Any, tally: Tally,
              pause: float = 0.02) -> None:
    """Plays the reference solution over and over on Docker, each move checked against an
    in-process twin; anything else is a lost bystander."""
    t = envfactory.spec(name).task(task) if isinstance(task, str) else envfactory.spec(name).get_tasks()[task]
    actions = OraclePolicy.actions(t)
    local = envfactory.make(name)
    dock = envfactory.make(name, runtime="docker", pool=pool)
    try:
        while not stop.is_set():
            try:
                ra, rb = local.reset(task), dock.reset(task)
                if ra != rb:
                    tally.bad("bystanders_lost", bystander=k, reset=True)
                for act in actions:
                    a, b = local.step(act), dock.step(act)
                    with tally.lock:
                        tally.bystander_steps += 1
                    if a.to_json() != b.to_json():
                        tally.bad("bystanders_lost", bystander=k, local=a.to_json(), docker=b.to_json())
                    if a.done:
                        break
                    if stop.wait(pause):
                        return
                if canonical_json(local.state) != canonical_json(dock.state) or not dock.success:
                    tally.bad("bystanders_lost", bystander=k, final_state=True)
            except Exception as exc:  # noqa: BLE001
                tally.bad("bystanders_lost", bystander=k, error=exc)
                time.sleep(0.5)
    finally:
        dock.close()


def run(n: int, *, env: str = "FileSystem-v0", task: int = -1, seed: int = 0, seconds: float | None = None,
        lanes: int = 4, bystanders: int = 3, deadline: float = 5.0, step_timeout: float = 20.0,
        max_turns: int = 8, progress: bool = True, skip_known: bool = False) -> dict[str, Any]:
    from envfactory.runtime.docker import stats
    from envfactory.runtime.pool import Pool

    spec = envfactory.spec(name := env)
    task_id = spec.get_tasks()[task].id
    pool = Pool(spec, sessions_per_container=lanes + bystanders + 4)
    pool.prewarm(1)  # one container, shared by every session
    tally = Tally()
    stop_at = time.monotonic() + (seconds if seconds is not None else 1e12)
    stop = threading.Event()
    per = [n // lanes + (1 if k < n % lanes else 0) for k in range(lanes)]
    t0 = time.monotonic()
    try:
        bys = [threading.Thread(target=bystander, args=(k, name, task_id, stop, pool, tally), daemon=True,
                                name=f"bystander-{k}")
               for k in range(bystanders)]
        workers = [threading.Thread(target=lane, args=(k, name, task_id, seed, per[k], stop_at, deadline, pool,
                                                       tally, max_turns, step_timeout, skip_known), daemon=True,
                                    name=f"lane-{k}")
                   for k in range(lanes)]
        for t in bys + workers:
            t.start()
        _gc_watch(tally)
        threading.Thread(target=_watchdog, args=(tally, pool, min(deadline, 3.0), stop), daemon=True,
                         name="watchdog").start()
        last = time.monotonic()
        while any(t.is_alive() for t in workers):
            for t in workers:
                t.join(1.0)
            now = time.monotonic()
            if now > stop_at + 60:  # a lane stuck in one step: report it, leave it
                break
            if progress and now - last > 30:
                last = now
                el = last - t0
                print(f"[{el:7.1f}s] {tally.outputs} outputs ({tally.outputs / el:.0f}/s) {tally.counts} "
                      f"stuck={tally.stuck(deadline)} resume={stats()}", file=sys.stderr, flush=True)
        elapsed = time.monotonic() - t0
        stuck = tally.stuck(deadline)
        stop.set()
        for t in bys:
            t.join(60)
        containers = pool.containers()
    finally:
        stop.set()
        pool.shutdown()
    rate = tally.outputs / elapsed if elapsed else 0.0
    return {
        "env": name, "task": task_id, "seed": seed, "lanes": lanes, "bystanders": bystanders,
        "outputs": tally.outputs, "skipped_known_bug": tally.skipped_known, "seconds": round(elapsed, 1),
        "outputs_per_s": round(rate, 1),
        "extrapolated_s_for_1e6": round(1e6 / rate) if rate else None,
        **tally.counts, "docker_step_timeouts": tally.steps_docker_timeout,
        "resumed_steps": tally.resumed_steps, "resumed_step_max_s": round(tally.resumed_seconds, 2),
        "bystander_steps": tally.bystander_steps, "escaped_by_type": tally.errors,
        "docker_episodes_gone": tally.gone_states, "slow_steps": tally.slow_reports, "host_gc_over_0_1s": tally.gc_slow,
        "stuck_at_end": stuck, "containers_at_end": len(containers), "resume_stats": stats(),
        "examples": tally.examples,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10 ** 6, help="model outputs to play (default 10**6)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--env", default="FileSystem-v0")
    p.add_argument("--task", type=int, default=-1, help="task index")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lanes", type=int, default=4, help="fuzzing threads (local+docker episode pairs)")
    p.add_argument("--bystanders", type=int, default=3)
    p.add_argument("--deadline", type=float, default=5.0, help="a step slower than this is a hang")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--skip-known", action="store_true",
                   help="count, do not play, outputs that hit a known bug outside the runtimes (see known_bug)")
    p.add_argument("--json", help="also write the report here")
    a = p.parse_args(argv)
    out = run(a.n, env=a.env, task=a.task, seed=a.seed, seconds=a.seconds, lanes=a.lanes,
              bystanders=a.bystanders, deadline=a.deadline, max_turns=a.max_turns,
              skip_known=a.skip_known)
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if a.json:
        Path(a.json).write_text(text)
    bad = out["escaped"] + out["hangs"] + out["bystanders_lost"] + out["differences"] + out["state_differences"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
