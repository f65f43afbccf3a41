"""ARPO on a Ray cluster whose worlds are Docker worlds spread over two Docker engines.

The test setup starts a Ray cluster of two nodes on this machine (a head and a worker node,
``ray.cluster_utils.Cluster``, Ray's own multi-node test utility: separate raylets, object
stores and worker processes) and a second ``dockerd`` (``scripts/second-dockerd.sh``, see
tests/test_docker_engines.py). ``Trainer(..., rollout="ray", workers=2, ray_options={"world_runtime":
"docker", "docker_hosts": [both engines]})`` puts one ``WorldHost`` actor on each node (pinned),
and each actor's container pool spreads its worlds over both engines. With a deterministic
scripted first turn, the same seed must give the same step as the in-process path: the same
metrics, the same samples (ids, advantages, loss masks) and the same updated weights.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")  # under CI=true a missing ray fails (tests/conftest.py)

from test_docker_engines import FIRST, SECOND_DIR, extra_engine  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def engines():
    import envfactory
    from envfactory.images import image_for
    from envfactory.runtime.pool import copy_image, docker_client

    with extra_engine(SECOND_DIR) as second:
        # the image once, here, before two actors would both build it
        tag = image_for([envfactory.spec("FindLight-v0")], client=docker_client(FIRST))[0]
        copy_image(tag, docker_client(FIRST), docker_client(second))
        yield [FIRST, second]


@pytest.fixture(scope="module")
def cluster(engines):
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        from envfactory.runtime.pool import gc

        gc(docker_hosts=engines)  # whatever a killed actor process left on either engine


def test_arpo_over_ray_nodes_and_two_docker_engines_takes_the_same_step_as_in_process(cluster, engines):
    torch = pytest.importorskip("torch")
    from agents import Trainer
    from agents.algorithms.arpo import ARPO
    from agents.hf_policy import HFPolicy
    from agents.scripted_policy import ScriptedPolicy
    from agents.tiny import build_tiny_model
    from envfactory import call

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    assert len(nodes) == 2
    # one actor pinned to each node (the default, SPREAD, is best effort)
    per_node = [NodeAffinitySchedulingStrategy(node_id=n, soft=False) for n in nodes]
    path = build_tiny_model()

    def trainer(rollout):
        torch.manual_seed(0)
        hf = HFPolicy(path, device="cpu")
        first = call("locate", thing="key").to_hermes()
        pol = ScriptedPolicy(hf.tokenizer, lambda prompt, turn: None if turn else first, fallback=hf)
        pol.model = hf.model
        kw = {}
        if rollout == "ray":
            kw = {"workers": 2, "ray_options": {"world_runtime": "docker", "docker_hosts": engines,
                                                "step_timeout": 60.0, "scheduling_strategy": per_node}}
        return hf, Trainer(pol, ["FindLight-v0"], ARPO(M=4, N=2, k=4, alpha=1.0, beta=0.0), tasks_per_step=2,
                           max_new_tokens=8, max_turns=3, lr=1e-3, seed=3, show_progress=False,
                           reward_fn=lambda t: float(sum(t.response_ids) % 2), rollout=rollout, **kw)

    (hf_a, local), (hf_b, far) = trainer("local"), trainer("ray")
    try:
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
        pool = far.ray_pool
        assert sorted(pool.nodes()) == nodes, "one actor on each node"
        rows = pool.engines()
        assert rows and all(r["up"] for r in rows) and {r["host"] for r in rows} == set(engines)
        for url in engines:  # every engine served worlds (containers started there)
            assert sum(r["containers"] for r in rows if r["host"] == url) > 0, (url, rows)
    finally:
        far.close()
        local.close()
    assert far.ray_pool.closed
