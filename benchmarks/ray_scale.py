"""``envfactory bench --only scale``: episodes/s through Ray worlds with 1, 2 and 4 actors against
the in-process runtime, measured in the same run."""

from __future__ import annotations

from typing import Any, Sequence

from envfactory.definition import ToolEnvSpec
from envfactory.runtime.ray_world import RayPool, RayWorld, _ray
from envfactory.state import State
from envfactory.task import Task


class BusyState(State):
    n: int = 0


def _busy(state: BusyState, ms: float) -> str:
    """Burn ``ms`` of CPU (holding the GIL, as a Python tool does)."""
    import time as _time

    end = _time.perf_counter() + ms / 1000.0
    n = 0
    while _time.perf_counter() < end:
        n += 1
    state.n += 1
    return str(state.n)


def busy_spec() -> ToolEnvSpec:
    """A one-tool environment whose tool burns CPU for ``ms`` milliseconds (the bench's heavy case)."""
    from envfactory.task import call
    from envfactory.tooling import make_tool

    work = make_tool(_busy, name="work", description="Burn CPU for a while.")
    task = Task(id="busy", instruction="Work four times.", initial_state=BusyState(),
                solution=[call("work", ms=5.0)] * 4, check=lambda s: s.n == 4)
    return ToolEnvSpec(name="Busy-v0", domain="bench", description="CPU-bound tool calls.",
                       state_type=BusyState, tools=[work], tasks=[task])


def _play_all(episodes: list[Any], threads: int) -> tuple[float, int]:
    """Play every episode's reference solution (then the end); wall seconds and steps."""
    import time as _time
    from concurrent.futures import ThreadPoolExecutor

    def one(ep: Any) -> int:
        task = ep.spec.get_tasks()[ep._bench_task]
        ep.reset(task.id)
        for c in task.solution:
            ep.step(c.to_hermes())
        ep.step("done")
        return len(task.solution) + 1

    t0 = _time.perf_counter()
    if threads > 1:
        with ThreadPoolExecutor(threads) as ex:
            steps = sum(ex.map(one, episodes))
    else:
        steps = sum(one(ep) for ep in episodes)
    return _time.perf_counter() - t0, steps


def bench_scale(episodes: int = 48, workers: Sequence[int] = (1, 2, 4)) -> dict[str, Any]:
    """Episodes/s and steps/s of reference plays through Ray worlds with 1, 2 and 4 actors,
    against the in-process runtime in the same run, for a cheap environment (Bank-v0: tools
    take microseconds, so Ray's round trips dominate) and a CPU-bound one (each call burns
    5 ms holding the GIL: in one process threads cannot overlap it; actors can). Episodes
    are played by 16 threads (as :func:`agents.rollout.advance` does for remote worlds);
    in-process, sequentially (threads only add GIL contention there)."""
    from envfactory.episode import Episode
    from envfactory.registry import spec as lookup

    ray = _ray()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    out: dict[str, Any] = {"scale_episodes": episodes}
    for label, spec in (("bank", lookup("Bank-v0")), ("busy", busy_spec())):
        tasks = [t for t in range(len(spec.get_tasks())) if spec.get_tasks()[t].solution]
        local = [Episode(spec) for _ in range(episodes)]
        for i, ep in enumerate(local):
            ep._bench_task = tasks[i % len(tasks)]
        _play_all(local[:2], 1)  # warm-up
        s_local, steps = _play_all(local, 1)
        out[f"scale_{label}_inprocess_episodes_per_s"] = round(episodes / s_local, 1)
        out[f"scale_{label}_inprocess_steps_per_s"] = round(steps / s_local, 1)
        for n in workers:
            pool = RayPool(n)
            try:
                eps = [Episode(spec, RayWorld(spec, pool=pool)) for _ in range(episodes)]
                for i, ep in enumerate(eps):
                    ep._bench_task = tasks[i % len(tasks)]
                _play_all(eps[:2], 1)  # warm-up: the actors import the environment
                s_ray, steps = _play_all(eps, 16)
                for ep in eps:
                    ep.close()
            finally:
                pool.close()
            out[f"scale_{label}_ray{n}_episodes_per_s"] = round(episodes / s_ray, 1)
            out[f"scale_{label}_ray{n}_steps_per_s"] = round(steps / s_ray, 1)
            out[f"scale_{label}_ray{n}_vs_inprocess_ratio"] = round(s_local / s_ray, 3)
            if n == 1:
                out[f"scale_{label}_ray_added_ms_per_episode"] = round((s_ray - s_local) / episodes * 1000, 2)
    return out
