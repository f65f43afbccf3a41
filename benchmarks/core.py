"""The engine's ``envfactory bench`` sections: step, fork, bigstate, docker, scale.

Every timing key carries its unit (``_us``, ``_ms``, ``_s``) and every
comparison is a ``_ratio`` against a baseline measured in the same run, because
machines here are noisy. Sections are independent functions returning flat
dicts, announced in the ``envfactory.bench`` entry-point group (pyproject.toml).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import gymnasium
from gymnasium import spaces

from .big_states import BenchCustomerDB, BenchTree

__all__ = ["bench_step", "bench_fork", "bench_bigstate", "bench_docker", "bench_scale", "PlainCounterEnv",
           "PlainToolEnv", "PlainTaskEnv"]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class PlainCounterEnv(gymnasium.Env):
    """The baseline: a hand-written Gymnasium env doing the same work as Counter-v0.

    It parses the same Hermes tool-call text, applies ``increment`` and returns
    the same observation text, with no framework at all.
    """

    def __init__(self) -> None:
        self.observation_space = spaces.Text(4096, min_length=0)
        self.action_space = spaces.Text(4096, min_length=0)
        self.value = 0
        self.turn = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.value = 0
        self.turn = 0
        return "Make the counter show 10.", {}

    def step(self, action: str):
        self.turn += 1
        outs = []
        for body in _CALL.findall(action):
            try:
                call = json.loads(body)
                by = call["arguments"].get("by", 1)
                if call["name"] != "increment" or not isinstance(by, int):
                    raise ValueError("bad call")
                self.value += by
                outs.append(f"<tool_response>\n{self.value}\n</tool_response>")
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                outs.append(f"<tool_response>\nError: {exc}\n</tool_response>")
        terminated = not outs
        return "\n".join(outs), 0.0, terminated, False, {"turn": self.turn}


class PlainToolEnv(PlainCounterEnv):
    """The second baseline: the same hand-written env, calling Counter-v0's own ``increment``
    tool function on Counter-v0's own (pydantic) state, as a hand-written env over the
    same tools would. Against it the ratio is the framework's cost alone, without the
    difference between the tool's body and ``PlainCounterEnv``'s one-line increment."""

    def __init__(self) -> None:
        super().__init__()
        from envfactory.registry import spec

        counter = spec("Counter-v0")
        self._fn = counter.all_tools["increment"].fn
        self._state_type = counter.state_type
        self.state = self._state_type()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.state = self._state_type()
        return super().reset(seed=seed, options=options)

    def step(self, action: str):
        self.turn += 1
        outs = []
        for body in _CALL.findall(action):
            try:
                call = json.loads(body)
                if call["name"] != "increment":
                    raise ValueError("unknown tool")
                outs.append(f"<tool_response>\n{self._fn(self.state, **call['arguments'])}\n</tool_response>")
            except Exception as exc:  # noqa: BLE001 - a tool error is an observation
                outs.append(f"<tool_response>\nError: {exc}\n</tool_response>")
        terminated = not outs
        return "\n".join(outs), 0.0, terminated, False, {"turn": self.turn}


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) / 1000.0


def _time_episodes(env: gymnasium.Env, action: str, episodes: int, episode_len: int,
                   reset: Callable[[], Any]) -> list[float]:
    """Per-step time (ns) of each episode of ``episode_len`` identical steps;
    resets stay outside the timed region, and timing whole episodes keeps the
    clock's own overhead out of the per-step figure."""
    samples = []
    clock = time.perf_counter_ns
    step = env.step
    for _ in range(episodes):
        reset()
        t0 = clock()
        for _ in range(episode_len):
            step(action)
        samples.append((clock() - t0) / episode_len)
    return samples


class PlainTaskEnv(PlainToolEnv):
    """The third baseline, for ``reset`` + calls: :class:`PlainToolEnv` whose ``reset`` starts from a
    task's initial state as a hand-written env over the same pydantic state would, with the same copy
    (:func:`envfactory.copy_state`, the fastest deep copy of it), and returns the instruction."""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        task = (options or {})["task"]
        self.state = self._copy(task.initial_state)
        self.value = 0
        self.turn = 0
        return task.instruction, {}

    def __init__(self) -> None:
        super().__init__()
        from envfactory.state import copy_state

        self._copy = copy_state


def _spread(values: list[float], digits: int = 2) -> tuple[float, float, float]:
    return round(min(values), digits), round(statistics.median(values), digits), round(max(values), digits)


def _put(out: dict[str, Any], key: str, unit: str, values: list[float]) -> None:
    """``key_{min,median,max}_<unit>`` of one figure measured once per repeat."""
    lo, mid, hi = _spread(values, 3 if unit == "ratio" else 2)
    out[f"{key}_min_{unit}"], out[f"{key}_median_{unit}"], out[f"{key}_max_{unit}"] = lo, mid, hi


def _final_answer_samples(episode: Any, task: Any, n: int) -> tuple[list[float], list[float]]:
    """Per-step time (ns) of the last reference call (a plain step) and of the final answer right
    after it (the step that ends and judges the episode), each timed on its own, ``n`` episodes:
    the same position in the same episode, so the difference is the judging."""
    clock = time.perf_counter_ns
    calls = [c.to_hermes() for c in task.solution]
    answer = " ".join(task.answer_facts) or "Done."
    plain, final = [], []
    step = episode.step
    for _ in range(n):
        episode.reset(task)
        for c in calls[:-1]:
            step(c)
        t0 = clock()
        step(calls[-1])
        t1 = clock()
        r = step(answer)
        t2 = clock()
        plain.append(t1 - t0)
        final.append(t2 - t1)
        if not (r.terminated and r.info.get("success")):
            raise RuntimeError(f"{task.id}: the reference solution and answer did not end in success ({r.info})")
    return plain, final


def _referee_figures(repeats: int, n: int) -> dict[str, Any]:
    """The referee against hand-written code, repeated: ``reset`` + 3 calls against
    :class:`PlainTaskEnv` (the same pydantic state, parse and tool), ``reset`` alone against the
    task copy, and the final-answer step against a plain step, for a task judged by a check
    function (Counter-v0), by the reference's final-state hash (FileSystem-v0) and by the changed
    leaves (a spec file's ChangeCheck, Hotel-v1). Each repeat takes medians over ``n`` samples;
    each figure is reported as min/median/max over the repeats."""
    from envfactory.registry import make
    from envfactory.state import copy_state

    action = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    counter = make("Counter-v0", max_turns=10**9)
    task = counter.spec.task(0)
    plain = PlainTaskEnv()
    options = {"task": task}
    judged = {"check": (counter, task)}
    fs = make("FileSystem-v0")
    hashed = [t for t in fs.spec.get_tasks() if t.check is None and not t.answer_facts and len(t.solution) >= 2]
    if hashed:
        judged["hash"] = (fs, hashed[0])
    try:
        hotel = make("Hotel-v1")
        changed = [t for t in hotel.spec.get_tasks() if type(t.check).__name__ == "ChangeCheck"
                   and not t.answer_facts and len(t.solution) >= 2]
        if changed:
            judged["changecheck"] = (hotel, changed[0])
    except Exception:  # noqa: BLE001 - a missing spec file leaves the other figures
        pass
    clock = time.perf_counter_ns
    figures: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        figures.setdefault(key, []).append(value)

    ep_reset, ep_step, pl_reset, pl_step = counter.reset, counter.step, plain.reset, plain.step
    init = task.initial_state
    for _ in range(repeats):
        ours, theirs, resets, copies = [], [], [], []
        for _ in range(n):  # interleaved, so that drift hits both equally
            t0 = clock()
            ep_reset(task)
            ep_step(action)
            ep_step(action)
            ep_step(action)
            t1 = clock()
            pl_reset(options=options)
            pl_step(action)
            pl_step(action)
            pl_step(action)
            t2 = clock()
            ep_reset(task)
            t3 = clock()
            copy_state(init)
            t4 = clock()
            ours.append(t1 - t0)
            theirs.append(t2 - t1)
            resets.append(t3 - t2)
            copies.append(t4 - t3)
        o, p = statistics.median(ours) / 1000, statistics.median(theirs) / 1000
        r, c = statistics.median(resets) / 1000, statistics.median(copies) / 1000
        add("step_reset3_envfactory", o)
        add("step_reset3_plain_pydantic", p)
        add("step_reset3_vs_plain_pydantic", o / p)
        add("step_reset_envfactory", r)
        add("step_reset_task_copy", c)
        add("step_reset_beyond_copy", r - c)
        for how, (episode, t) in judged.items():
            plain_ns, final_ns = _final_answer_samples(episode, t, max(200, n // 10))
            pm, fm = statistics.median(plain_ns) / 1000, statistics.median(final_ns) / 1000
            add(f"step_final_{how}", fm)
            add(f"step_final_{how}_plain_step", pm)
            add(f"step_final_{how}_vs_plain_step", fm / pm)
    out: dict[str, Any] = {}
    for key, values in figures.items():
        _put(out, key, "ratio" if key.endswith(("_vs_plain_pydantic", "_vs_plain_step")) else "us", values)
    out["step_final_tasks"] = {how: f"{episode.spec.name}/{t.id}" for how, (episode, t) in judged.items()}
    out["step_repeats"] = repeats
    return out


def bench_step(n: int = 20000, repeats: int = 5) -> dict[str, Any]:
    """Median time of one trivial tool-call step: envfactory (Gymnasium adapter over
    the local runtime, and the engine's own ``Episode.step``) against
    :class:`PlainCounterEnv`, interleaved in rounds; then the referee figures
    (:func:`_referee_figures`: ``reset`` + 3 calls against a hand-written ``gymnasium.Env`` with
    the same pydantic state, the final-answer step against a plain step), each repeated
    ``repeats`` times with min/median/max, and the machine's load before and after."""
    from envfactory.faces.gym_env import ToolGymEnv

    load_before = [round(x, 2) for x in os.getloadavg()]
    action = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    ours = ToolGymEnv("Counter-v0", max_turns=10**9)
    episode = ours.env  # the engine alone, without the Gymnasium face
    plain = PlainCounterEnv()
    same_tool = PlainToolEnv()
    ours_s: list[float] = []
    plain_s: list[float] = []
    tool_s: list[float] = []
    episode_s: list[float] = []
    episode_len = 50
    for _ in range(n // episode_len):  # interleave so drift hits all equally
        plain_s += _time_episodes(plain, action, 1, episode_len, lambda: plain.reset(seed=0))
        tool_s += _time_episodes(same_tool, action, 1, episode_len, lambda: same_tool.reset(seed=0))
        ours_s += _time_episodes(
            ours, action, 1, episode_len, lambda: ours.reset(seed=0, options={"task": 0})
        )
        episode_s += _time_episodes(episode, action, 1, episode_len, lambda: episode.reset(0))
    o, p, e = _median_us(ours_s), _median_us(plain_s), _median_us(episode_s)
    t = _median_us(tool_s)
    out = {
        "step_envfactory_us": round(o, 2),
        "step_episode_us": round(e, 2),
        "step_plain_gymnasium_us": round(p, 2),
        "step_plain_same_tool_us": round(t, 2),
        "step_envfactory_vs_plain_ratio": round(o / p, 2),
        "step_episode_vs_plain_ratio": round(e / p, 2),
        "step_envfactory_vs_same_tool_ratio": round(o / t, 2),
        "step_episode_vs_same_tool_ratio": round(e / t, 2),
        "step_samples": len(ours_s) * episode_len,
    }
    out.update(_referee_figures(repeats, max(1000, n // 4)))
    out["step_loadavg_before"] = load_before
    out["step_loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["step_cpus"] = os.cpu_count()
    return out


def bench_fork(n: int = 2000, n_write: int = 200) -> dict[str, Any]:
    """Median ``fork()`` time on each built-in environment, mid-way through its
    longest reference solution (so the state carries the episode's changes).

    A fork is copy-on-write (:class:`envfactory.world.LocalWorld`): the state is copied by the
    first writing call on a side, so ``fork_<env>_first_write_us`` times a fork and the child's
    next writing step together (the next writing call of the reference solution the agent to move
    may make), and ``fork_first_write_max_us`` is their max: what a branch that writes costs;
    ``fork_<env>_write_alone_us`` is the same step on a fork whose state is already its own (the
    same run's baseline), so ``fork_copy_moved_to_first_write_max_us`` (the largest difference) is
    the copy a fork once took, now taken by the first write."""
    from envfactory.registry import make, specs

    out: dict[str, Any] = {}
    worst = worst_write = worst_moved = 0.0
    over = 0
    for s in specs():
        env = make(s.name)
        task = max(s.get_tasks(), key=lambda t: len(t.solution))
        env.reset(task.id)
        half = max(1, len(task.solution) // 2)
        for c in task.solution[:half]:
            while env.status.next_agent not in (c.agent, None) and c.agent is not None:
                env.act(env.status.next_agent, "")  # the others pass until it is this call's agent's turn
            env.act(env.status.next_agent, c.to_hermes())
        clock = time.perf_counter_ns
        samples = []
        for _ in range(n):
            t0 = clock()
            env.fork()
            samples.append(clock() - t0)
        us = _median_us(samples)
        worst = max(worst, us)
        over += us > 100
        out[f"fork_{s.name}_us"] = round(us, 2)
        who = env.status.next_agent
        tools = s.all_tools
        write = next((c for c in task.solution[half:] + task.solution[:half]
                      if c.agent in (None, who) and c.name in tools and not tools[c.name].read_only), None)
        if who is not None and write is not None:
            action, wsamples, alone = write.to_hermes(), [], []
            for _ in range(n_write):
                t0 = clock()
                env.fork().act(who, action)
                wsamples.append(clock() - t0)
                child = env.fork()
                child.state  # noqa: B018 - a caller given the state: the child's own copy, taken now
                t0 = clock()
                child.act(who, action)  # the same step, the state already its own: the baseline
                alone.append(clock() - t0)
            wus, aus = _median_us(wsamples), _median_us(alone)
            worst_write = max(worst_write, wus)
            out[f"fork_{s.name}_first_write_us"] = round(wus, 2)
            out[f"fork_{s.name}_write_alone_us"] = round(aus, 2)
            worst_moved = max(worst_moved, wus - aus)
        t0 = clock()
        for _ in range(200):
            s.state_type.model_validate(env.state.model_dump())
        baseline = (clock() - t0) / 200 / 1000
        out[f"fork_{s.name}_vs_pydantic_roundtrip_ratio"] = round(us / baseline, 3)
    out["fork_max_us"] = round(worst, 2)
    out["fork_envs_over_100us"] = over
    out["fork_first_write_max_us"] = round(worst_write, 2)
    out["fork_copy_moved_to_first_write_max_us"] = round(worst_moved, 2)  # first write less the step alone
    return out


def bench_docker() -> dict[str, Any]:
    """The Docker runtime against local and OpenEnv (see :mod:`benchmarks.docker_runtime`);
    a ``docker_error`` note instead when no Docker engine answers."""
    try:
        from envfactory.runtime.pool import docker_client

        docker_client()
    except RuntimeError as exc:
        return {"docker_error": str(exc)}
    from .docker_runtime import bench_docker as run

    return run()


def bench_scale() -> dict[str, Any]:
    """Ray worlds with 1, 2 and 4 actors against in-process (see
    :func:`benchmarks.ray_scale.bench_scale`; a ``scale_error`` note without Ray), then
    sessions held over two Docker engines (:func:`bench_engines`; a ``scale_engines_error`` note
    without Docker)."""
    out: dict[str, Any] = {}
    try:
        import ray  # noqa: F401
    except ImportError:
        out["scale_error"] = "ray is not installed (pip install 'envfactory[ray]')"
    else:
        from .ray_scale import bench_scale as run

        out.update(run())
    if os.environ.get("ENVFACTORY_BENCH_SCALE_ENGINES", "1") != "0":
        out.update(bench_engines())
    return out


SECOND_ENGINE_DIR = os.environ.get("ENVFACTORY_DOCKERD2_DIR", "/tmp/ef-dockerd2")


def _second_engine() -> tuple[str | None, bool, str]:
    """A second Docker engine: ``(url, started_here, note)``; the one in
    :data:`SECOND_ENGINE_DIR` (started by ``scripts/second-dockerd.sh``, as the tests do, when
    it is not running), or ``None`` and why not."""
    import subprocess

    from envfactory.runtime.pool import engine_answers

    url = f"unix://{SECOND_ENGINE_DIR}/docker.sock"
    if engine_answers(url) is None:
        return url, False, ""
    script = Path(__file__).resolve().parent.parent / "scripts" / "second-dockerd.sh"
    if not script.is_file():
        return None, False, f"no {script} (a source checkout has it)"
    r = subprocess.run(["bash", str(script), "start", SECOND_ENGINE_DIR], capture_output=True, text=True,
                       timeout=180)
    if r.returncode != 0:
        return None, False, f"a second engine could not be started: {r.stderr.strip()[-300:]}"
    return url, True, ""


def _cgroup_read(kind: str, cid: str, name: str) -> int | None:
    for base in (f"/sys/fs/cgroup/{kind}/docker/{cid}", f"/sys/fs/cgroup/system.slice/docker-{cid}.scope"):
        try:
            return int(Path(base, name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


def bench_engines(levels: tuple[int, ...] = (256, 1000, 2000), threads: int = 16, rounds: int = 4,
                  per_container: int = 64) -> dict[str, Any]:
    """Sessions held at once over two Docker engines, and step latency while they are held.

    ``Counter-v0`` sessions, ``per_container`` to a shared container, placed by one
    :class:`~envfactory.runtime.pool.Pool` over the engines (``$ENVFACTORY_DOCKER_HOSTS`` when it
    names two or more, else the default engine and a second one, started as the tests start it;
    without one, it measures one engine and says so in ``scale_engines_note``). The sessions are
    opened in levels (256, 1,000, 2,000 held); at each level every held session takes ``rounds``
    steps, driven by ``threads`` threads (each steps its share of the sessions in turn, as a
    rollout's workers would), and the step latencies' p50/p99 are reported, with the same
    drive over as many in-process sessions in the same run (``..._vs_local_ratio``) and, at 256
    and 1,000, over the same sessions on one engine only (``..._two_vs_one_engine_ratio``). Host
    and container CPU per step and container memory per session come from the process's CPU
    time and the containers' cgroups (for docs/scale.md)."""
    import gc as pygc
    import math
    import threading

    from envfactory import registry
    from envfactory.runtime.pool import Pool, docker_client, resolve_docker_hosts
    from envfactory.runtime.wire import encode_frame

    try:
        docker_client()
    except RuntimeError as exc:
        return {"scale_engines_error": str(exc)}
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * max(levels) + 1024  # a channel and an HTTP connection per session, twice over
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
        except (ValueError, OSError):
            pass
    out: dict[str, Any] = {}
    hosts = resolve_docker_hosts()
    started = False
    if not hosts or len(hosts) < 2:
        first = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        second, started, note = _second_engine()
        if second is None:
            hosts = (first,)
            out["scale_engines_note"] = f"measured ONE Docker engine: {note}"
        else:
            hosts = (first, second)
    out["scale_engines"] = len(hosts)
    spec_ = registry.spec("Counter-v0")
    action = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'

    def drive(eps: list[Any], rounds: int = rounds) -> tuple[list[float], float, float]:
        """``rounds`` steps of every session by ``threads`` threads: latencies (ns), wall s, CPU s."""
        lat: list[list[float]] = [[] for _ in range(threads)]
        errors: list[BaseException] = []

        def run(i: int) -> None:
            mine, clock, rec = eps[i::threads], time.perf_counter_ns, lat[i]
            try:
                for _ in range(rounds):
                    for e in mine:
                        t0 = clock()
                        e.step(action)
                        rec.append(clock() - t0)
            except BaseException as exc:
                errors.append(exc)

        ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        c0, w0 = time.process_time(), time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        if errors:
            raise errors[0]
        return [x for r in lat for x in r], wall, cpu

    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(len(xs) * q))] / 1e6

    def container_cpu_ns(pool: Pool) -> int:
        return sum(_cgroup_read("cpuacct", c.id, "cpuacct.usage") or 0 for c in pool.containers())

    def held(pool: Pool, eps: list[Any], level: int) -> float:
        t0 = time.perf_counter()
        while len(eps) < level:
            e = registry.make("Counter-v0", runtime="docker", pool=pool, max_turns=10**9)
            e.reset(0)
            eps.append(e)
        return time.perf_counter() - t0

    def measure(pool: Pool, eps: list[Any], key: str) -> dict[str, Any]:
        drive(eps, 1)  # every session once first: the containers' servers warm, the machine settled
        pygc.collect()  # the baselines' garbage is not collected inside the timed drive
        k0 = container_cpu_ns(pool)
        lat, wall, cpu = drive(eps)
        steps = len(lat)
        row = {f"{key}_step_p50_ms": round(pct(lat, 0.5), 3), f"{key}_step_p99_ms": round(pct(lat, 0.99), 3),
               f"{key}_steps_per_s": round(steps / wall),
               f"{key}_host_cpu_us_per_step": round(cpu / steps * 1e6, 1)}
        k1 = container_cpu_ns(pool)
        if k1:
            row[f"{key}_container_cpu_us_per_step"] = round((k1 - k0) / steps / 1000, 1)
        return row

    # the in-process baseline at each level, same drive
    local_p: dict[int, tuple[float, float]] = {}
    for level in levels:
        eps = [registry.make("Counter-v0", max_turns=10**9) for _ in range(level)]
        for e in eps:
            e.reset(0)
        lat, wall, cpu = drive(eps)
        local_p[level] = (pct(lat, 0.5), pct(lat, 0.99))
        del eps
        out[f"scale_local_{level}_sessions_step_p50_ms"] = round(local_p[level][0], 4)
        out[f"scale_local_{level}_sessions_step_p99_ms"] = round(local_p[level][1], 4)

    def run_levels(pool_hosts: tuple[str, ...], tag: str, lv: tuple[int, ...]) -> int:
        pool = Pool(spec_, docker_hosts=pool_hosts, sessions_per_container=per_container, warm=0)
        eps: list[Any] = []
        most = 0
        prev_mem: tuple[int, int] | None = None
        try:
            t0 = time.perf_counter()
            pool.prewarm(math.ceil(max(lv) / per_container / len(pool_hosts)))
            out[f"scale_{tag}_prewarm_{len(pool.containers())}_containers_s"] = round(time.perf_counter() - t0, 2)
            for level in lv:
                try:
                    opened = held(pool, eps, level)
                except Exception as exc:  # the most this machine holds
                    out[f"scale_{tag}_{level}_sessions_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    break
                key = f"scale_{tag}_{level}_sessions"
                out[f"{key}_open_ms_per_session"] = round(opened / max(1, level - most) * 1000, 3)
                try:
                    out.update(measure(pool, eps, key))
                except Exception as exc:
                    out[f"{key}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    break
                most = level
                out[f"{key}_vs_local_p50_ratio"] = round(out[f"{key}_step_p50_ms"] / local_p[level][0], 2)
                out[f"{key}_per_engine"] = [r["sessions"] for r in pool.host_rows()]
                mem = [_cgroup_read("memory", c.id, "memory.usage_in_bytes") for c in pool.containers()]
                mem = [m for m in mem if m]
                if mem:
                    out[f"{key}_container_mem_mb_mean"] = round(sum(mem) / len(mem) / 2**20, 1)
                    out[f"{key}_containers_mem_mb"] = round(sum(mem) / 2**20, 1)
                    if prev_mem is not None:  # what one more session costs, same containers
                        out[f"scale_{tag}_mem_kb_per_added_session"] = round(
                            (sum(mem) - prev_mem[0]) / (level - prev_mem[1]) / 1024, 1)
                    prev_mem = (sum(mem), level)
        finally:
            for e in eps:
                try:
                    e.close()
                except Exception:
                    pass
            pool.shutdown()
        return most

    try:
        tag = "two_engines" if len(hosts) > 1 else "one_engine"
        out[f"scale_{tag}_most_sessions_held"] = run_levels(hosts, tag, levels)
        if len(hosts) > 1:  # the same on the first engine alone, same run
            run_levels(hosts[:1], "one_engine", tuple(lv for lv in levels if lv <= 1000))
            for level in levels:
                two, one = (out.get(f"scale_{t}_{level}_sessions_step_p50_ms") for t in ("two_engines", "one_engine"))
                if two and one:
                    out[f"scale_{level}_sessions_two_vs_one_engine_p50_ratio"] = round(two / one, 2)
                    out[f"scale_{level}_sessions_two_vs_one_engine_p99_ratio"] = round(
                        out[f"scale_two_engines_{level}_sessions_step_p99_ms"]
                        / out[f"scale_one_engine_{level}_sessions_step_p99_ms"], 2)
    finally:
        if started:
            import subprocess

            subprocess.run(["bash", str(Path(__file__).resolve().parent.parent / "scripts" / "second-dockerd.sh"),
                            "stop", SECOND_ENGINE_DIR], capture_output=True, timeout=120)

    # bytes a step puts on the wire (request and reply frames), over every built-in environment's
    # reference solutions (the cost of a step when the referee and the engine are on different hosts)
    req, rep = [], []
    for name in registry.names():
        s_ = registry.spec(name)
        if s_.multi_agent:
            continue
        for task in s_.get_tasks()[:5]:
            ep = registry.make(name)
            ep.reset(task.id)
            for c in task.solution:
                req.append(len(encode_frame({"op": "run", "agent": "agent_0", "round": 1,
                                             "calls": [{"name": c.name, "arguments": c.arguments}]})))
                r = ep.step(c.to_hermes())
                rep.append(len(encode_frame({"ok": True, "outcomes": [
                    {"content": m["content"], "ok": True, "kind": "ok"} for m in r.messages]})))
    if req:
        out.update({"scale_step_request_bytes_p50": int(pct(req, 0.5) * 1e6),
                    "scale_step_request_bytes_p99": int(pct(req, 0.99) * 1e6),
                    "scale_step_reply_bytes_p50": int(pct(rep, 0.5) * 1e6),
                    "scale_step_reply_bytes_p99": int(pct(rep, 0.99) * 1e6), "scale_step_frames": len(req)})
    return out


# -- bigstate: copy-on-write forks of large third-party states (from_class) ----------------------
def bench_bigstate(nodes: int = 10_000, records: int = 5_000, n: int = 200) -> dict[str, Any]:
    """Forks and snapshots of large states held through ``from_class``: a ``nodes``-node object
    tree (one graph: parent pointers, a cursor, an RNG) and ``records`` pydantic records.
    A fork is copy-on-write (:func:`envfactory.factory.classes.pystate.lazy_state_copy`): it shares
    the values, and the first tool call on a side copies that side's values, so the copy is
    reported too (``first_call_after_fork``), each against ``copy.deepcopy`` of the same state."""
    import copy

    from envfactory.episode import Episode
    from envfactory.factory.from_class import ClassTask, from_class
    from envfactory.task import call

    clock = time.perf_counter_ns
    out: dict[str, Any] = {}
    cases = {
        "tree": from_class(BenchTree, name="BigTree-v0", domain="bench", loader="_load_scenario",
                           tasks=[ClassTask("t", "Enter child 0.", {"nodes": nodes, "seed": 1},
                                            [call("enter", index=0)])]),
        "records": from_class(BenchCustomerDB, name="BigRecords-v0", domain="bench",
                              tasks=[ClassTask("t", "Credit customer 1 with 5.", {"records": records},
                                               [call("credit", customer_id=1, amount=5.0)])]),
    }
    act = {"tree": call("grow", name="x").to_hermes(), "records": call("credit", customer_id=2, amount=1.0).to_hermes()}
    for name, spec in cases.items():
        ep = Episode(spec)
        ep.reset("t")
        ep.step(spec.task("t").solution[0].to_hermes())
        state = ep.state
        forks, samples = [], []
        for _ in range(n):
            t0 = clock()
            forks.append(ep.fork())
            samples.append(clock() - t0)
        fork_us = _median_us(samples)
        first = []
        for child in forks[:10]:
            t0 = clock()
            child.step(act[name])
            first.append(clock() - t0)
        del forks
        deep = []
        for _ in range(5):
            t0 = clock()
            copy.deepcopy(state)
            deep.append(clock() - t0)
        deep_us = _median_us(deep)
        snaps, restores = [], []
        for _ in range(3):
            t0 = clock()
            snap = json.dumps(ep.snapshot())
            snaps.append(clock() - t0)
            t0 = clock()
            Episode(spec).restore(json.loads(snap))
            restores.append(clock() - t0)
        snap_us, restore_us = _median_us(snaps), _median_us(restores)
        out[f"bigstate_{name}_fork_us"] = round(fork_us, 2)
        out[f"bigstate_{name}_fork_vs_deepcopy_ratio"] = round(fork_us / deep_us, 5)
        out[f"bigstate_{name}_first_call_after_fork_ms"] = round(_median_us(first) / 1000, 3)
        out[f"bigstate_{name}_first_call_vs_deepcopy_ratio"] = round(_median_us(first) / deep_us, 3)
        out[f"bigstate_{name}_deepcopy_ms"] = round(deep_us / 1000, 3)
        out[f"bigstate_{name}_snapshot_ms"] = round(snap_us / 1000, 3)
        out[f"bigstate_{name}_snapshot_vs_deepcopy_ratio"] = round(snap_us / deep_us, 3)
        out[f"bigstate_{name}_restore_ms"] = round(restore_us / 1000, 3)
        out[f"bigstate_{name}_restore_vs_deepcopy_ratio"] = round(restore_us / deep_us, 3)
        out[f"bigstate_{name}_snapshot_bytes"] = len(snap)
    from .snapshot_big import bench_snapshots

    out.update(bench_snapshots())  # snapshot and restore, 5 repeats, also of a multi-MB dict of dicts
    return out
