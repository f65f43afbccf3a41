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
  instead), and steps the Docker world ended by its ``step_timeout``; ``retired_for_memory``
  (and ``amplify_retired_for_memory``) counts the shared containers retired past their memory
  mark (``Limits.retire_memory``: their sessions moved at an episode start, none resumed);
* ``bystanders_lost``: bystander steps that raised or whose result differs from
  the same move on an in-process twin;
* ``differences``: steps whose ``StepResult.to_json()`` differ between the runtimes,
  and episodes whose final states (canonical JSON) differ.

Beside the generated outputs, the attacks of issue 28 run for the whole run (each can be
turned off):

* amplification (``--amplify``, a share of seeds): a file of 100 KB or 1 MB, then turns of up
  to 255 copies, appends or reads of it, played like any output on both runtimes (the state
  and observation quotas must refuse and cut alike, and judging must survive);
* a timeout attacker (``SlowTool-v0``, tests/adversarial/slow_tool_env.py): tools that sleep
  or spin past a 1 s ``step_timeout``, over and over, in the container that two note-taking
  bystanders share; the attack must end only its own episode, and the bystanders' worlds are
  never moved (a resume there is an ``attack_failures``);
* a memory attacker (``--memory-every`` seconds, ``CodeSandbox-v0``, tests/docker_attack_env.py):
  60 children of 20 MiB in a 256 MiB per-session container; the episode must go on;
* the amplifying tools of issue 63 (``--amplify-lanes``, tests/adversarial/amplify_env.py:
  ``Amplify-v0``): lanes of their own whose outputs call ``multiply`` (``rows * times``), ``nest``
  (``rows = [rows, rows]`` up to 40 times), ``fill`` (up to 30 MB), the tools that raise
  ``SystemExit`` / ``KeyboardInterrupt`` / ``GeneratorExit``, mixes of them in one output, and
  generated outputs on the plain tools; two bystanders share the attacked container. After every
  output the in-process state must be within ``MAX_STATE_BYTES`` (else ``attack_failures``), and at
  every episode's end both runtimes must ``snapshot()`` without an exception (else ``escaped``);
* ``--held`` sessions (2,000 by default) opened with the default settings
  (``envfactory.make(name, runtime="docker")``) and held throughout; a roaming thread steps
  them through their reference solutions meanwhile, and at the end every one finishes its
  episode (``held``: errors, ``world_lost``, solved).

Every bystander's Docker step (the three reference players, the note takers, the held
sessions) is timed: ``bystander_stalls`` counts those over ``--stall`` (1 s).

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
from envfactory import quotas  # noqa: E402
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


def amplification(rng: random.Random, names: list[str]) -> list[Any]:
    """An amplification attack (issue 28), as the few outputs of one episode: a big file, then turns
    of up to 255 copies, appends or reads of it. Both runtimes must refuse the same calls (the state
    quota) and cut the same observations (the observation quota); the world must survive judging."""
    from envfactory import call

    if not {"write_file", "copy_file", "append_file", "read_file"} <= set(names):
        return []
    big = f"/home/user/big{rng.randrange(4)}.txt"
    out: list[Any] = [[call("write_file", path=big, content=rng.choice("xyz") * rng.choice((100_000, 1_000_000)))]]
    for turn in range(rng.randint(1, 4)):
        kind = rng.choice(("copy", "copy", "append", "read"))
        n = rng.choice((16, 64, 255))
        if kind == "copy":
            out.append([call("copy_file", source=big, destination=f"/home/user/c{turn}_{i}.txt") for i in range(n)])
        elif kind == "append":
            out.append([call("append_file", path=big, content=rng.choice("ab") * rng.choice((1000, 100_000)))
                        for _ in range(min(n, 16))])
        else:
            out.append([call("read_file", path=big)] * rng.choice((2, 40)))
    return out


def outputs(s: int, schemas: list[dict[str, Any]], amplify: float = 0.0) -> list[Any]:
    """What one seed plays: one generated output, or (with probability ``amplify``) the outputs of
    an amplification attack, played from a fresh episode."""
    rng = random.Random(s)
    if amplify and rng.random() < amplify:
        attack = amplification(rng, [f["function"]["name"] for f in schemas])
        if attack:
            return attack
    return [generate(rng, schemas)]


# -- known bugs, outside the runtimes: with --skip-known, outputs that would hit them are counted, not played
# tools/filesystem.py: make_dir loops forever on a path that normalizes to a leading "//" (posixpath
# keeps two leading slashes; dirname("//x") is "//", never "/"): an in-process step never returns.
_KNOWN = re.compile(r"""["']//""")


def known_bug(action: Any) -> bool:
    return bool(_KNOWN.search(action if isinstance(action, str) else repr(action)))


# -- the run -------------------------------------------------------------------------------
class Tally:
    KINDS = ("escaped", "hangs", "bystanders_lost", "differences", "state_differences", "bystander_stalls",
             "attack_failures")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(self.KINDS, 0)
        self.outputs = 0
        self.skipped_known = 0
        self.resumed_steps = 0  # docker steps that resumed their world on a fresh container (not hangs)
        self.resumed_seconds = 0.0  # the slowest of them
        self.steps_docker_timeout = 0
        self.bystander_steps = 0
        self.bystander_max_s = 0.0  # the slowest bystander step (Docker), any kind of bystander
        self.amplifications = 0  # amplification attacks played (their outputs count in ``outputs``)
        self.amp_outputs = 0  # outputs of the Amplify-v0 lanes (counted in ``outputs`` too)
        self.amp_refused = 0  # calls among them refused by the state quota (in-process count)
        self.amp_max_s = 0.0  # the slowest of them (both runtimes, and snapshots at an episode's end)
        self.amp_bystander_steps = 0  # steps of the bystanders in the attacked container
        self.amp_bystander_max_s = 0.0
        self.amp_resumed = 0  # worlds the amplify processes resumed after a container died
        self.amp_retired = 0  # their containers retired for memory
        self.attacks: dict[str, int] = {}  # attacks played beside the lanes, by kind
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

    def bystander_step(self, seconds: float, stall: float, **where: Any) -> None:
        """A bystander's Docker step took ``seconds``: over ``stall`` is a stall."""
        with self.lock:
            self.bystander_steps += 1
            self.bystander_max_s = max(self.bystander_max_s, seconds)
        if seconds > stall:
            self.bad("bystander_stalls", seconds=round(seconds, 3), **where)

    def attacked(self, kind: str) -> None:
        with self.lock:
            self.attacks[kind] = self.attacks.get(kind, 0) + 1

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


class Rotation:
    """A lane's tasks in turn (``--rotate-tasks``): each episode the next one, starting at the lane's
    own offset, so the lanes together play every kind of check (an answer, the final state's hash,
    a predicate) on states the outputs built."""

    def __init__(self, ids: list[str], offset: int) -> None:
        self.ids, self.i = ids, offset

    def next(self) -> str:
        self.i += 1
        return self.ids[self.i % len(self.ids)]


def _restart(local: Any, dock: Any, task: Any) -> None:
    """Both runtimes on a new episode of the same task (the next of a :class:`Rotation`)."""
    t = task.next() if isinstance(task, Rotation) else task
    local.reset(t)
    dock.reset(t)


def _play(k: int, s: int, action: Any, local: Any, dock: Any, task: Any, tally: Tally, deadline: float,
          snapshots: bool = False) -> None:
    """One output on both runtimes, compared; a finished episode starts again (with ``snapshots``,
    after both runtimes' ``snapshot()``: an exception there is ``escaped``)."""
    tally.current[k] = (s, "local", time.monotonic())
    a, ta, ea = _step(local, action)
    tally.current[k] = (s, "docker", time.monotonic())
    resumed = dock._world.resumed
    b, tb, eb = _step(dock, action)
    resumed = dock._world.resumed != resumed  # its container died (another lane's doing, or this output's)
    tally.current.pop(k, None)
    with tally.lock:
        tally.outputs += 1
    if ea or eb:
        tally.bad("escaped", seed=s, local=ea, docker=eb)
        for e in (ea, eb):
            if e is not None:
                with tally.lock:
                    tally.errors[type(e).__name__] = tally.errors.get(type(e).__name__, 0) + 1
        _restart(local, dock, task)
        return
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
    if snapshots:
        refused = sum(m["content"].startswith(quotas.STATE_QUOTA_PREFIX) for m in a.messages)
        with tally.lock:
            tally.amp_refused += refused
    if snapshots and (a.done or b.done) and dock.status.ended_by not in ("timeout", "world_lost"):
        for side, ep in (("local", local), ("docker", dock)):
            try:
                ep.snapshot()
            except BaseException as exc:  # noqa: BLE001 -- counting what escapes is the point
                tally.bad("escaped", seed=s, snapshot=side, error=exc)
    if a.done or b.done:
        if dock.status.ended_by in ("timeout", "world_lost"):  # its state went with the world
            with tally.lock:
                tally.gone_states += 1
        else:
            sa, sb = canonical_json(local.state), canonical_json(dock.state)
            if sa != sb:
                tally.bad("state_differences", seed=s, local=sa, docker=sb)
        _restart(local, dock, task)


def lane(k: int, name: str, task: Any, seed: int, quota: int, stop_at: float, deadline: float,
         pool: Any, tally: Tally, max_turns: int, step_timeout: float, skip_known: bool = False,
         amplify: float = 0.0) -> None:
    local = envfactory.make(name, max_turns=max_turns)
    dock = envfactory.make(name, runtime="docker", pool=pool, max_turns=max_turns, step_timeout=step_timeout)
    schemas = local.tool_schemas()
    try:
        _restart(local, dock, task)
        for i in range(quota):
            if time.monotonic() > stop_at:
                break
            s = seed * 1_000_003 + k * 10_000_019 + i
            actions = outputs(s, schemas, amplify)
            if len(actions) > 1:  # an attack: from a fresh episode
                with tally.lock:
                    tally.amplifications += 1
                _restart(local, dock, task)
            for action in actions:
                if skip_known and known_bug(action):
                    with tally.lock:
                        tally.skipped_known += 1
                    continue
                _play(k, s, action, local, dock, task, tally, deadline)
    finally:
        dock.close()


def bystander(k: int, name: str, task: Any, stop: threading.Event, pool: Any, tally: Tally,
              pause: float = 0.02, stall: float = 1.0) -> None:
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
                    a = local.step(act)
                    t0 = time.perf_counter()
                    b = dock.step(act)
                    tally.bystander_step(time.perf_counter() - t0, stall, bystander=k)
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


# -- the amplifying tools of issue 63 (Amplify-v0) ------------------------------------------------
_AMP_GENERIC = ("add", "count", "leave", "interrupt", "generator_exit")  # tools the generic outputs call
_AMP_MAX_ROWS = 1_000_000
"""``multiply`` is drawn so that the list it builds has at most this many rows: the tool's own
allocation happens before any quota can look at the state (in-process nothing bounds a tool's
memory), and the point is the state the call would leave, refused alike on both runtimes. The
bound holds for the rows each call of an output would see (an output of several calls compounds:
the million-output run of 2026-12-08 drew ``multiply(100)`` twice on 4,001 rows, and the second call's
own 40-million-row list took 610 MiB, past its 512 MiB container, before any quota could look)."""


def amplifying(rng: random.Random, rows: int, schemas: list[dict[str, Any]]) -> Any:
    """One output for ``Amplify-v0`` whose state has ``rows`` top-level rows: an amplifying call,
    an exiting one, a mix of them in one output, or a generated output on the plain tools."""
    from envfactory import call

    seen = [max(rows, 1)]  # the top-level rows the next call of this output would see, at most

    def one() -> Any:
        r = rng.random()
        if r < 0.35:
            times = rng.choice((2, 10, 100, 1000))
            while times > 1 and seen[0] * times > _AMP_MAX_ROWS:
                times = 1 if times == 2 else times // 10
            seen[0] *= times
            return call("multiply", times=times)
        if r < 0.6:
            seen[0] = max(seen[0], 2)  # [rows, rows] (if the call is refused, the rows stay)
            return call("nest", levels=rng.choice((1, 2, 5, 10, 20, 30, 40)))
        if r < 0.8:
            n = rng.choice((1, 100, 1000, 10_000))
            seen[0] += n
            return call("fill", n=n, width=rng.choice((1, 10, 100)))
        if r < 0.87:
            return call("leave", code=rng.choice((0, 1, 3)))
        if r < 0.94:
            return call("interrupt")
        return call("generator_exit")

    r = rng.random()
    if r < 0.6:
        return one()
    if r < 0.75:
        return [one() for _ in range(rng.randint(2, 4))]
    return generate(rng, schemas)


def _rows(ep: Any) -> int:
    rows = ep._world.view().rows  # (the world's own state, not a copy)
    return len(rows) if isinstance(rows, list) else 1


def amplify_lane(k: int, seed: int, running: Any, deadline: float, pool: Any, tally: Tally, max_turns: int,
                 step_timeout: float) -> None:
    """Outputs of :func:`amplifying`, played on both runtimes like any lane's, while ``running()``;
    after each, the in-process state is measured against the quota.
    ``deadline`` is this lane's own (``--amplify-deadline``): a refused call on a state of shared
    nestings near the quota walks tens of millions of containers (a dump writes each path), and
    the slowest output is reported (``amplify_output_max_s``)."""
    local = envfactory.make("Amplify-v0", max_turns=max_turns)
    dock = envfactory.make("Amplify-v0", runtime="docker", pool=pool, max_turns=max_turns,
                           step_timeout=step_timeout)
    schemas = [f for f in local.tool_schemas() if f["function"]["name"] in _AMP_GENERIC]
    task = "one-row"
    try:
        _restart(local, dock, task)
        i = 0
        while running():
            s = seed * 1_000_003 + k * 10_000_019 + i
            i += 1
            action = amplifying(random.Random(s), _rows(local), schemas)
            t0 = time.perf_counter()
            _play(k, s, action, local, dock, task, tally, deadline, snapshots=True)
            took = time.perf_counter() - t0
            with tally.lock:
                tally.amp_outputs += 1
                tally.amp_max_s = max(tally.amp_max_s, took)
            time.sleep(min(took, 2.0))  # half a core at most: the generated lanes share the machine
            size = quotas.state_size(local._world.view(), quotas.MAX_STATE_BYTES + 1)
            if size > quotas.MAX_STATE_BYTES:
                tally.bad("attack_failures", attack="amplify", seed=s, state_bytes=size)
                _restart(local, dock, task)
    finally:
        dock.close()



def _amplify_process(j: int, k: int, seed: int, deadline: float, max_turns: int, step_timeout: float, stall: float,
                     stop: Any, results: Any) -> None:
    """An Amplify-v0 lane and its two bystanders, in a process of their own: the big states' dumps
    and measures hold a process's GIL for seconds (pydantic and ``json`` in C), which would stall
    the generated lanes' threads. Puts its tally (a dict) on ``results`` once ``stop`` is set."""
    from envfactory.runtime.pool import Pool

    _import_test_env("amplify_env", _TESTS / "adversarial")
    tally = Tally()
    pool = Pool(envfactory.spec("Amplify-v0"), warm=0, sessions_per_container=6)
    done = threading.Event()
    # (their container's process is the attacker's too: a near-quota dump there holds its GIL for
    # seconds, so their slowest step is reported, not counted as a stall)
    threads = [threading.Thread(target=bystander, args=(f"amplify-{j}-{b}", "Amplify-v0", "one-row", done, pool, tally,
                                                        0.02, deadline), daemon=True) for b in range(2)]
    lane_t = threading.Thread(target=amplify_lane, args=(k, seed, lambda: not stop.is_set(), deadline, pool, tally,
                                                         max_turns, step_timeout), daemon=True)
    try:
        for t in (*threads, lane_t):
            t.start()
        while not stop.wait(1.0):
            pass
        lane_t.join(deadline + 60)
        done.set()
        for t in threads:
            t.join(60)
    finally:
        done.set()
        pool.shutdown()
        from envfactory.runtime.docker import stats as resume_stats

        results.put({"outputs": tally.outputs, "counts": tally.counts, "errors": tally.errors, "amp_outputs": tally.amp_outputs, "amp_refused": tally.amp_refused,
                     "resumed": resume_stats()["resumed"], "retired": pool.stats["retired_for_memory"],
                     "amp_max_s": tally.amp_max_s, "bystander_steps": tally.bystander_steps,
                     "bystander_max_s": tally.bystander_max_s, "stuck": bool(lane_t.is_alive()),
                     "examples_text": {k: [{a: str(b) for a, b in e.items()} for e in v]
                                       for k, v in tally.examples.items()}})


def _merge(tally: Tally, r: dict[str, Any]) -> None:
    """An amplify process's tally into the run's."""
    with tally.lock:
        tally.outputs += r["outputs"]
        for kind in Tally.KINDS:
            tally.counts[kind] += r["counts"][kind]
            room = 5 - len(tally.examples[kind])
            tally.examples[kind] += r["examples_text"][kind][:max(room, 0)]
        for name, n in r["errors"].items():
            tally.errors[name] = tally.errors.get(name, 0) + n
        tally.amp_outputs += r["amp_outputs"]
        tally.amp_refused += r["amp_refused"]
        tally.amp_max_s = max(tally.amp_max_s, r["amp_max_s"])
        tally.amp_bystander_steps += r["bystander_steps"]
        tally.amp_bystander_max_s = max(tally.amp_bystander_max_s, r["bystander_max_s"])
        tally.amp_resumed += r["resumed"]
        tally.amp_retired += r["retired"]
    if r["stuck"]:
        tally.bad("hangs", amplify_lane="still in a step at the end")


# -- attacks beside the lanes (issue 28) ---------------------------------------------------------
_TESTS = Path(__file__).resolve().parents[1] / "tests"

_HOG = """
import subprocess, sys, time
hog = "x = bytearray(20 << 20)\\nfor i in range(0, len(x), 4096): x[i] = 1\\nimport time; time.sleep(10)"
kids = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(60)]
time.sleep(5)
print(sum(k.poll() is not None for k in kids), "of 60 children were killed")
"""
"""60 children of 20 MiB each in a 256 MiB container (tests/adversarial/test_oom_spares_the_server.py)."""


def _import_test_env(module: str, folder: Path) -> None:
    """Import a test environment module under its own top-level name, as its tests do (the Docker
    runtime copies such a module into the image). ``folder`` goes first on ``sys.path``:
    benchmarks/ has a ``slow_tool_env`` of its own."""
    import importlib

    sys.path.insert(0, str(folder))
    try:
        importlib.import_module(module)
    finally:
        sys.path.remove(str(folder))


def timeout_attacker(stop: threading.Event, tally: Tally, pool: Any, seed: int, step_timeout: float = 1.0) -> None:
    """An agent whose tool overruns ``step_timeout`` (``nap``: asleep in C; ``spin``: a Python loop that
    holds the server's GIL between switches), over and over, in the container its bystanders share.
    Each must end only its own episode (``timeout``)."""
    from envfactory import call

    rng = random.Random(seed)
    while not stop.is_set():
        tool = "spin" if rng.random() < 0.25 else "nap"  # a spin burns a core of the container until stopped
        a = envfactory.make("SlowTool-v0", runtime="docker", pool=pool, step_timeout=step_timeout)
        try:
            a.reset(0)
            r = a.step(call(tool, seconds=rng.choice((1.5, 3.0))))
            if not (r.truncated and r.info.get("timeout") and a.status.ended_by == "timeout"):
                tally.bad("attack_failures", attack=f"timeout_{tool}", messages=r.messages, info=r.info)
        except Exception as exc:  # noqa: BLE001 -- counted
            tally.bad("attack_failures", attack=f"timeout_{tool}", error=exc)
        finally:
            a.close()
        tally.attacked(f"timeout_{tool}")
        stop.wait(rng.uniform(0.5, 4.0))


def note_bystander(k: int, stop: threading.Event, tally: Tally, pool: Any, stall: float) -> None:
    """Adds notes beside the timeout attacker, each checked against an in-process twin and timed; its
    world must never be moved (a resume means the attacker's timeout recycled the container)."""
    from envfactory import call

    local = envfactory.make("SlowTool-v0")
    dock = envfactory.make("SlowTool-v0", runtime="docker", pool=pool)
    try:
        while not stop.is_set():
            try:
                local.reset(0)
                dock.reset(0)
                for i in range(40):
                    a = local.step(call("note", text=f"{k}-{i}"))
                    t0 = time.perf_counter()
                    b = dock.step(call("note", text=f"{k}-{i}"))
                    tally.bystander_step(time.perf_counter() - t0, stall, bystander=f"note-{k}")
                    if a.to_json() != b.to_json():
                        tally.bad("bystanders_lost", bystander=f"note-{k}", local=a.to_json(), docker=b.to_json())
                    if stop.wait(0.02):
                        break
                if canonical_json(local.state) != canonical_json(dock.state):
                    tally.bad("bystanders_lost", bystander=f"note-{k}", final_state=True)
            except Exception as exc:  # noqa: BLE001
                tally.bad("bystanders_lost", bystander=f"note-{k}", error=exc)
                time.sleep(0.5)
        if dock._world.resumed:
            tally.bad("attack_failures", attack="timeout", bystander=f"note-{k}", resumed=dock._world.resumed)
    finally:
        dock.close()


def memory_attacker(stop: threading.Event, tally: Tally, every: float) -> None:
    """Every ``every`` seconds, an agent that forks 60 children of 20 MiB in its own 256 MiB container
    (``isolation="container"``): the OOM killer must take its processes, not the server, and the
    episode must go on."""
    from envfactory import call
    from envfactory.runtime.container import Limits

    while not stop.wait(every):
        ep = envfactory.make("CodeSandbox-v0", runtime="docker", step_timeout=60, resume=False,
                             limits=Limits(memory_mb=256, pids=256))
        try:
            ep.reset(0)
            c = ep._world.container
            r = ep.step(call("run_python", code=_HOG))
            after = ep.step(call("run_python", code="print(6 * 7)"))
            if (r.done or "world_lost" in r.info or ep._world.container is not c or c.dead
                    or after.messages[0]["content"].strip() != "42"):
                tally.bad("attack_failures", attack="memory", messages=r.messages, info=r.info,
                          after=after.messages)
        except Exception as exc:  # noqa: BLE001
            tally.bad("attack_failures", attack="memory", error=exc)
        finally:
            ep.close()
        tally.attacked("memory")


class Held:
    """``n`` sessions opened with the defaults (``envfactory.make(name, runtime="docker")``), held for
    the whole run beside the attacks; a roaming thread steps them through their reference solutions
    meanwhile (each step checked against an in-process twin, and timed); at the end every one
    finishes its episode. Counted: errors, ``world_lost``, episodes not solved."""

    def __init__(self, name: str, n: int, tally: Tally) -> None:
        self.tally = tally
        self.eps: list[tuple[Any, Any]] = []
        self.todo: list[list[Any]] = []
        self.errors: dict[str, int] = {}
        self.ended: dict[str, int] = {}
        self.solved = self.episodes = 0
        self.tasks = envfactory.spec(name).get_tasks()
        t0 = time.monotonic()
        for i in range(n):
            try:
                local, dock = envfactory.make(name), envfactory.make(name, runtime="docker")
                self.eps.append((local, dock))
                self.todo.append([])
                self._reset(len(self.eps) - 1, i)
            except Exception as exc:  # noqa: BLE001 -- counted
                self._error("open", exc)
        self.open_s = round(time.monotonic() - t0, 1)

    def _error(self, where: str, exc: BaseException) -> None:
        key = f"{where}: {type(exc).__name__}"
        self.errors[key] = self.errors.get(key, 0) + 1
        self.tally.bad("bystanders_lost", held=where, error=exc)

    def _reset(self, j: int, i: int) -> None:
        local, dock = self.eps[j]
        task = self.tasks[i % len(self.tasks)]
        local.reset(task.id)
        dock.reset(task.id)
        self.todo[j] = list(OraclePolicy.actions(task))

    def _step(self, j: int, stall: float) -> None:
        local, dock = self.eps[j]
        act = self.todo[j].pop(0)
        a = local.step(act)
        t0 = time.perf_counter()
        b = dock.step(act)
        self.tally.bystander_step(time.perf_counter() - t0, stall, held=j)
        if a.to_json() != b.to_json():
            self.tally.bad("bystanders_lost", held=j, local=a.to_json(), docker=b.to_json())
        if b.done or not self.todo[j]:
            ended = str(b.info.get("ended_by"))
            self.ended[ended] = self.ended.get(ended, 0) + 1
            self.episodes += 1
            self.solved += bool(b.info.get("success"))
            if not b.info.get("success"):
                self.tally.bad("bystanders_lost", held=j, ended_by=ended, messages=b.messages)
            self.todo[j] = []

    def roam(self, stop: threading.Event, stall: float, pause: float = 0.05) -> None:
        j = 0
        while self.eps and not stop.wait(pause):
            j = (j + 1) % len(self.eps)
            try:
                if not self.todo[j]:
                    self._reset(j, self.episodes + j)
                self._step(j, stall)
            except Exception as exc:  # noqa: BLE001
                self._error("roam", exc)

    def finish(self, stall: float) -> dict[str, Any]:
        t0 = time.monotonic()
        for j in range(len(self.eps)):
            try:
                while self.todo[j]:
                    self._step(j, stall)
            except Exception as exc:  # noqa: BLE001
                self._error("finish", exc)
        for _, dock in self.eps:
            try:
                dock.close()
            except Exception as exc:  # noqa: BLE001
                self._error("close", exc)
        return {"sessions": len(self.eps), "open_s": self.open_s, "finish_s": round(time.monotonic() - t0, 1),
                "episodes": self.episodes, "solved": self.solved, "ended_by": self.ended,
                "world_lost": self.ended.get("world_lost", 0), "errors": self.errors}


def run(n: int, *, env: str = "FileSystem-v0", task: int = -1, seed: int = 0, seconds: float | None = None,
        lanes: int = 4, bystanders: int = 3, deadline: float = 5.0, step_timeout: float = 20.0,
        max_turns: int = 8, progress: bool = True, skip_known: bool = False, amplify: float = 0.002,
        held: int = 2000, timeout_attack: bool = True, memory_every: float = 300.0,
        stall: float = 1.0, amplify_lanes: int = 1, amplify_deadline: float = 120.0,
        rotate_tasks: bool = False) -> dict[str, Any]:
    from envfactory.runtime.docker import stats
    from envfactory.runtime.pool import Pool

    spec = envfactory.spec(name := env)
    task_id = spec.get_tasks()[task].id
    pool = Pool(spec, sessions_per_container=lanes + bystanders + 4)
    pool.prewarm(1)  # one container, shared by every session
    tally = Tally()
    stop = threading.Event()
    per = [n // lanes + (1 if k < n % lanes else 0) for k in range(lanes)]
    extra: list[threading.Thread] = []
    slow_pool = None
    slow_started: list[Any] = []
    held_sessions = Held(name, held, tally) if held else None  # opened first: held through every attack
    if timeout_attack:
        _import_test_env("slow_tool_env", _TESTS / "adversarial")  # SlowTool-v0: nap, spin, note
        slow_pool = Pool(envfactory.spec("SlowTool-v0"), warm=0, sessions_per_container=8)
        start = slow_pool.start_container

        def counted() -> Any:  # the containers it starts: one, unless a timeout recycled it
            c = start()
            slow_started.append(c)
            return c

        slow_pool.start_container = counted  # type: ignore[method-assign]
        extra.append(threading.Thread(target=timeout_attacker, args=(stop, tally, slow_pool, seed), daemon=True,
                                      name="attack-timeout"))
        extra += [threading.Thread(target=note_bystander, args=(k, stop, tally, slow_pool, stall), daemon=True,
                                   name=f"bystander-note-{k}") for k in range(2)]
    if memory_every:
        _import_test_env("docker_attack_env", _TESTS)  # CodeSandbox-v0: agent code, a container each
        extra.append(threading.Thread(target=memory_attacker, args=(stop, tally, memory_every), daemon=True,
                                      name="attack-memory"))
    amp_procs: list[Any] = []
    if amplify_lanes:  # Amplify-v0: multiply, nest, fill, leave, ... (processes of their own)
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        amp_stop, amp_results = ctx.Event(), ctx.Queue()
        amp_procs = [ctx.Process(target=_amplify_process, args=(j, lanes + j, seed, amplify_deadline, max_turns,
                                                                step_timeout, stall, amp_stop, amp_results),
                                 daemon=True, name=f"amplify-{j}") for j in range(amplify_lanes)]
        for pr in amp_procs:
            pr.start()
    if held_sessions is not None:
        extra.append(threading.Thread(target=held_sessions.roam, args=(stop, stall), daemon=True, name="held-roam"))
    stop_at = time.monotonic() + (seconds if seconds is not None else 1e12)
    t0 = time.monotonic()
    try:
        bys = [threading.Thread(target=bystander, args=(k, name, task_id, stop, pool, tally, 0.02, stall),
                                daemon=True, name=f"bystander-{k}")
               for k in range(bystanders)] + extra
        ids = [t.id for t in spec.get_tasks()]
        workers = [threading.Thread(target=lane, args=(k, name, Rotation(ids, k * 7) if rotate_tasks else task_id,
                                                       seed, per[k], stop_at, deadline, pool,
                                                       tally, max_turns, step_timeout, skip_known, amplify),
                                    daemon=True, name=f"lane-{k}")
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
                      f"stuck={tally.stuck(deadline)} resume={stats()} retired={pool.stats['retired_for_memory']} "
                      f"attacks={tally.attacks} "
                      f"amplified={tally.amplifications} bystander_max={tally.bystander_max_s:.2f}s",
                      file=sys.stderr, flush=True)
        if amp_procs:
            amp_stop.set()
            for _ in amp_procs:
                try:
                    _merge(tally, amp_results.get(timeout=amplify_deadline + 180))
                except Exception as exc:  # noqa: BLE001 -- a lost process is a failure of the run
                    tally.bad("attack_failures", attack="amplify", error=f"no tally from its process: {exc!r}")
            for pr in amp_procs:
                pr.join(30)
        elapsed = time.monotonic() - t0
        stuck = tally.stuck(deadline)
        stop.set()
        for t in bys:
            t.join(60)
        containers = pool.containers()
        held_report = held_sessions.finish(stall) if held_sessions is not None else None
    finally:
        stop.set()
        pool.shutdown()
        if slow_pool is not None:
            slow_pool.shutdown()
        for pr in amp_procs:
            if pr.is_alive():
                pr.terminate()
    rate = tally.outputs / elapsed if elapsed else 0.0
    return {
        "env": name, "task": "rotated" if rotate_tasks else task_id, "seed": seed, "lanes": lanes,
        "bystanders": bystanders,
        "outputs": tally.outputs, "skipped_known_bug": tally.skipped_known, "seconds": round(elapsed, 1),
        "outputs_per_s": round(rate, 1),
        "extrapolated_s_for_1e6": round(1e6 / rate) if rate else None,
        **tally.counts, "docker_step_timeouts": tally.steps_docker_timeout,
        "resumed_steps": tally.resumed_steps, "resumed_step_max_s": round(tally.resumed_seconds, 2),
        "bystander_steps": tally.bystander_steps, "bystander_max_s": round(tally.bystander_max_s, 3),
        "stall_s": stall, "amplifications": tally.amplifications, "amplify_lanes": amplify_lanes,
        "amplify_outputs": tally.amp_outputs, "amplify_refused_calls": tally.amp_refused,
        "amplify_output_max_s": round(tally.amp_max_s, 2), "amplify_deadline_s": amplify_deadline,
        "amplify_bystander_steps": tally.amp_bystander_steps,
        "amplify_bystander_max_s": round(tally.amp_bystander_max_s, 2), "attacks": tally.attacks,
        "amplify_resumed_worlds": tally.amp_resumed, "amplify_retired_for_memory": tally.amp_retired,
        "timeout_pool_containers_started": len(slow_started), "held": held_report,
        "escaped_by_type": tally.errors,
        "docker_episodes_gone": tally.gone_states, "slow_steps": tally.slow_reports, "host_gc_over_0_1s": tally.gc_slow,
        "stuck_at_end": stuck, "containers_at_end": len(containers), "resume_stats": stats(),
        "retired_for_memory": pool.stats["retired_for_memory"],
        "examples": tally.examples,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10 ** 6, help="model outputs to play (default 10**6)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--env", default="FileSystem-v0")
    p.add_argument("--task", type=int, default=-1, help="task index")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rotate-tasks", action="store_true",
                   help="each lane plays the tasks in turn, an episode each (else --task throughout)")
    p.add_argument("--lanes", type=int, default=4, help="fuzzing threads (local+docker episode pairs)")
    p.add_argument("--bystanders", type=int, default=3)
    p.add_argument("--deadline", type=float, default=5.0, help="a step slower than this is a hang")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--skip-known", action="store_true",
                   help="count, do not play, outputs that hit a known bug outside the runtimes (see known_bug)")
    p.add_argument("--amplify", type=float, default=0.002,
                   help="share of seeds that play an amplification attack (a big file, copied, appended, read)")
    p.add_argument("--amplify-lanes", type=int, default=1,
                   help="lanes on Amplify-v0 (issue 63: multiply, nest, fill, SystemExit...; 0: none)")
    p.add_argument("--amplify-deadline", type=float, default=120.0,
                   help="an output of the Amplify-v0 lanes slower than this is a hang")
    p.add_argument("--held", type=int, default=2000, help="sessions opened with the defaults and held throughout")
    p.add_argument("--no-timeout-attack", action="store_true", help="no agent overrunning step_timeout")
    p.add_argument("--memory-every", type=float, default=300.0,
                   help="seconds between memory attacks in a per-session container (0: none)")
    p.add_argument("--stall", type=float, default=1.0, help="a bystander step slower than this is a stall")
    p.add_argument("--json", help="also write the report here")
    a = p.parse_args(argv)
    out = run(a.n, env=a.env, task=a.task, seed=a.seed, seconds=a.seconds, lanes=a.lanes,
              bystanders=a.bystanders, deadline=a.deadline, max_turns=a.max_turns,
              skip_known=a.skip_known, amplify=a.amplify, held=a.held, timeout_attack=not a.no_timeout_attack,
              memory_every=a.memory_every, stall=a.stall, amplify_lanes=a.amplify_lanes,
              amplify_deadline=a.amplify_deadline, rotate_tasks=a.rotate_tasks)
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if a.json:
        Path(a.json).write_text(text)
    bad = sum(out[k] for k in Tally.KINDS)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
