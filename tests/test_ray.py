"""The Ray runtime: worlds in Ray actors, the referee here (envfactory.runtime.ray_world), and
A Trainer with runtime.rollout "ray": the same episodes and the same batch as in-process, a dead actor's worlds
rebuilt by replay, a hung one's batch a truncated episode, counted."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")  # under CI=true a missing ray fails (tests/conftest.py)

import envfactory  # noqa: E402
from envfactory import Episode, State, Task, ToolEnvSpec, call, tool  # noqa: E402
from envfactory.runtime.ray_world import RayPool, RayWorld  # noqa: E402


@pytest.fixture(scope="module")
def pool():
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    p = RayPool(2, step_timeout=20.0)
    yield p
    p.close()
    ray.shutdown()


def _kill(actor):
    """ray.kill, then wait until the actor is really gone (the kill is asynchronous: a call made
    right after it may still reach the old actor)."""
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")


def _ray_episode(name, pool, **kw):
    s = envfactory.spec(name)
    return Episode(s, RayWorld(s, pool=pool), **kw)


def _play(ep, task):
    """The reference solution of ``task`` (each role in turn, the others passing), then the end."""
    results = []
    for c in task.solution:
        if ep.spec.multi_agent:
            while ep.status.next_agent != c.agent:
                results.append(ep.act(ep.status.next_agent, "").messages)
            results.append(ep.act(c.agent, c.to_hermes()).messages)
        else:
            results.append(ep.step(c.to_hermes()).messages)
    return results


@pytest.mark.parametrize("name", ["Counter-v0", "Bank-v0", "FindLight-v1", "MultiRooms-v0"])
def test_ray_worlds_play_like_local_ones(pool, name):
    spec = envfactory.spec(name)
    for task in spec.get_tasks()[:2]:
        far, near = _ray_episode(name, pool), envfactory.make(name)
        far.reset(task.id), near.reset(task.id)
        assert _play(far, task) == _play(near, task)
        assert far.state == near.state
        assert all(far.transcript(a) == near.transcript(a) for a in near.agents)
        while not near.done:  # the rest of the episode: everyone passes
            a = near.status.next_agent
            assert far.act(a, "").rewards == near.act(a, "").rewards
        assert far.success is near.success and far.rewards == near.rewards and far.status.ended_by == near.status.ended_by
        far.close()


def test_forks_spread_over_the_actors_and_stay_independent(pool):
    spec = envfactory.spec("Counter-v0")
    task = spec.task("counter-0-9")
    ep = _ray_episode("Counter-v0", pool)
    ep.reset(task.id)
    ep.step(call("increment", by=3).to_hermes())
    forks = [ep.fork() for _ in range(4)]
    assert {f._world._slot for f in forks} == {0, 1}, "forks are placed round-robin over the actors"
    forks[0].step(call("increment", by=2).to_hermes())
    forks[1].step(call("reset_counter").to_hermes())
    assert [f.state.value for f in forks] == [5, 0, 3, 3] and ep.state.value == 3
    snap = forks[0].snapshot()
    other = _ray_episode("Counter-v0", pool)
    other.restore(snap)
    assert other.step(call("increment", by=1).to_hermes()).messages[0]["content"] == "6"
    for e in forks + [ep, other]:
        e.close()


def test_a_dead_actor_is_replaced_and_its_worlds_rebuilt_by_replay(pool):
    spec = envfactory.spec("Bank-v0")
    task = max((t for t in spec.get_tasks() if not t.answer_facts), key=lambda t: len(t.solution))
    far, near = _ray_episode("Bank-v0", pool), envfactory.make("Bank-v0")
    far.reset(task.id), near.reset(task.id)
    half = len(task.solution) // 2
    for c in task.solution[:half]:
        far.step(c.to_hermes()), near.step(c.to_hermes())
    bystander = far.fork()  # on the other actor, or the same one: its state must survive either way
    mid = far.state.model_dump()
    before = dict(pool.stats)
    _kill(pool._actors[far._world._slot])
    for c in task.solution[half:]:
        assert far.step(c.to_hermes()).messages == near.step(c.to_hermes()).messages
    assert far.state == near.state
    assert pool.stats["dead_workers"] == before["dead_workers"] + 1
    assert pool.stats["replayed_worlds"] >= before["replayed_worlds"] + 1
    r_far, r_near = far.step("done"), near.step("done")
    assert r_far.reward == r_near.reward == 1.0
    assert bystander.state.model_dump() == mid
    bystander.close(), far.close()


def test_every_world_of_a_dead_actor_is_rebuilt_not_only_the_first_to_notice():
    """Two worlds on one actor; it dies; the first world used replaces it. The second must notice
    that its actor was replaced (the new one never held it) and rebuild too, not fail."""
    one = RayPool(1, step_timeout=20.0)
    try:
        spec = envfactory.spec("Counter-v0")
        a, b = (Episode(spec, RayWorld(spec, pool=one)) for _ in range(2))
        for ep in (a, b):
            ep.reset("counter-0-9")
            ep.step(call("increment", by=2).to_hermes())
        _kill(one._actors[0])
        assert a.step(call("increment", by=1).to_hermes()).messages[0]["content"] == "3"
        assert b.step(call("increment", by=3).to_hermes()).messages[0]["content"] == "5"
        assert one.stats["dead_workers"] == 1 and one.stats["replayed_worlds"] == 2
        assert (a.state.value, b.state.value) == (3, 5)
    finally:
        one.close()


# -- a hung actor: an environment whose tool sleeps (defined here, pickled to the actors) -----------
class Slow(State):
    n: int = 0


@tool
def nap(state: Slow, seconds: float) -> str:
    """Sleep, then count.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    state.n += 1
    return str(state.n)


@tool
def crash(state: Slow) -> str:
    """End the worker process that runs it (a tool that crashes its host, every time)."""
    import os

    os._exit(1)


SLOW = ToolEnvSpec(name="RaySlow-v0", domain="test", description="A tool that can hang.", state_type=Slow,
                   tools=[nap, crash], tasks=[Task(id="nap", instruction="Nap once.", initial_state=Slow(),
                                            solution=[call("nap", seconds=0.0)],
                                            check=lambda s: s.n == 1)])


def test_a_batch_that_overruns_ends_the_episode_as_truncated_and_is_counted(pool):
    ray.cloudpickle.register_pickle_by_value(__import__(__name__))
    quick = RayPool(1, step_timeout=3.0)
    try:
        ep = Episode(SLOW, RayWorld(SLOW, pool=quick))
        ep.reset("nap")
        assert ep.step(call("nap", seconds=0.0).to_hermes()).messages[0]["content"] == "1"
        t0 = time.perf_counter()
        r = ep.step(call("nap", seconds=60.0).to_hermes())
        assert time.perf_counter() - t0 < 30
        assert r.truncated and r.info.get("timeout") and r.messages[0]["content"].startswith("Error:")
        assert quick.stats["timeouts"] == 1
        again = Episode(SLOW, RayWorld(SLOW, pool=quick))  # the pool serves on with a fresh actor
        again.reset("nap")
        assert again.step(call("nap", seconds=0.0).to_hermes()).messages[0]["content"] == "1"
    finally:
        quick.close()
        ray.cloudpickle.unregister_pickle_by_value(__import__(__name__))


def test_a_batch_that_kills_every_worker_it_reaches_ends_the_episode_as_lost(pool):
    """The dead actor is replaced and the batch sent again, once; when it kills the replacement
    too, the world is lost: the episode ends as truncated (``info["world_lost"]``), not raised."""
    ray.cloudpickle.register_pickle_by_value(__import__(__name__))
    quick = RayPool(1, step_timeout=20.0)
    try:
        ep = Episode(SLOW, RayWorld(SLOW, pool=quick))
        ep.reset("nap")
        assert ep.step(call("nap", seconds=0.0).to_hermes()).messages[0]["content"] == "1"
        r = ep.step(call("crash").to_hermes())
        assert r.truncated and r.info["world_lost"] and ep.status.ended_by == "world_lost" and r.reward == 0.0
        assert "replacement too" in r.messages[0]["content"]
        assert quick.stats["dead_workers"] == 2
        again = Episode(SLOW, RayWorld(SLOW, pool=quick))  # the pool serves on with a fresh actor
        again.reset("nap")
        assert again.step(call("nap", seconds=0.0).to_hermes()).messages[0]["content"] == "1"
    finally:
        quick.close()
        ray.cloudpickle.unregister_pickle_by_value(__import__(__name__))


def test_make_names_the_ray_runtime(pool):
    ep = envfactory.make("Counter-v0", runtime="ray", pool=pool)
    assert isinstance(ep._world, RayWorld)
    ep.reset(0)
    assert ep.step(call("increment", by=2).to_hermes()).messages[0]["content"].isdigit()
    ep.close()


# -- a Trainer with runtime.rollout "ray": the same batch as in-process ---------------------------------
def trainer_pair(**ray_kwargs):
    """The same ARPO trainer on FindLight-v0 twice, in-process and with ``rollout="ray"`` (``ray_kwargs``:
    ``workers``, ``ray_options``): a scripted first turn, then the tiny model; seeded alike.
    Returns ``((hf_a, local), (hf_b, far))``."""
    torch = pytest.importorskip("torch")
    from agents import Trainer
    from agents.algorithms.objectives import ARPO
    from agents.policies.hf_policy import HFPolicy
    from agents.policies.scripted_model import ScriptedModel
    from agents.models.tiny import build_tiny_model
    from agents.train_config import OptimConfig, OutputConfig, RuntimeConfig, SamplingConfig, TrainerConfig

    path = build_tiny_model()

    def trainer(rollout):
        torch.manual_seed(0)
        hf = HFPolicy(path, device="cpu")
        first = call("locate", thing="key").to_hermes()
        pol = ScriptedModel(hf.tokenizer, lambda prompt, turn: None if turn else first, fallback=hf)
        pol.model = hf.model
        kw = ray_kwargs if rollout == "ray" else {}
        # branch_after='any': this test is about forking, not ARPO's branch-after-valid-results rule
        cfg = TrainerConfig(algorithm=ARPO(M=4, N=2, k=4, alpha=1.0, beta=0.0, branch_after="any"), seed=3,
                            sampling=SamplingConfig(max_new_tokens=8, max_turns=3),
                            optim=OptimConfig(lr=1e-3, tasks_per_step=2), runtime=RuntimeConfig(rollout=rollout, **kw),
                            output=OutputConfig(show_progress=False))
        return hf, Trainer(pol, ["FindLight-v0"], cfg, reward_fn=lambda t: float(sum(t.response_ids) % 2))

    return trainer("local"), trainer("ray")


def assert_same_step(local, far, hf_a, hf_b):
    """One training step each: the same metrics, samples and updated weights, no Ray faults.
    Returns the local step's samples."""
    import torch

    row_a, row_b = local.train_step(), far.train_step()
    assert row_b["errors"] == 0, row_b
    for key in ("success", "reward", "episodes", "branches", "errors", "rounds", "tokens_generated",
                "trained_tokens", "loss"):
        assert row_a[key] == row_b[key], key
    assert row_b["ray"] == {"dead_workers": 0, "replayed_worlds": 0, "timeouts": 0}
    (sa,), (sb,) = local.last_samples.values(), far.last_samples.values()
    assert [(s.ids, s.advantages, s.mask) for s in sa] == [(s.ids, s.advantages, s.mask) for s in sb]
    assert row_a["branches"] > 0 and row_a["errors"] == 0
    for p, q in zip(hf_a.model.parameters(), hf_b.model.parameters()):
        assert torch.equal(p, q)
    return sa


def test_trainer_on_ray_takes_the_same_step_as_in_process(pool):
    (hf_a, local), (hf_b, far) = trainer_pair(workers=2)
    try:
        sa = assert_same_step(local, far, hf_a, hf_b)
        assert any("<tool_response>" in pol_text for pol_text in [hf_a.tokenizer.decode(s.ids) for s in sa])
    finally:
        far.close()
    assert far.ray_pool.closed
