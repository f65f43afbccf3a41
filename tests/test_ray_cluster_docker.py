"""ARPO on a Ray cluster whose worlds are Docker worlds spread over two Docker engines.

The test setup starts a Ray cluster of two nodes on this machine (a head and a worker node,
``ray.cluster_utils.Cluster``, Ray's own multi-node test utility: separate raylets, object
stores and worker processes) and a second ``dockerd`` (``scripts/second-dockerd.sh``, see
tests/test_docker_engines.py). ``Trainer(..., config)`` with ``runtime: {rollout: ray, workers: 2, ray_options: {"world_runtime":
"docker", "docker_hosts": [both engines]})`` puts one ``WorldHost`` actor on each node (pinned),
and each actor's container pool spreads its worlds over both engines. With a deterministic
scripted first turn, the same seed must give the same two training steps as the in-process path:
the same metrics, the same samples (ids, advantages, loss masks) and the same updated weights.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")  # under CI=true a missing ray fails (tests/conftest.py)

from test_docker_engines import FIRST, SECOND_DIR, extra_engine  # noqa: E402
from test_ray import assert_same_step, trainer_pair  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def engines():
    import envfactory
    from envfactory.runtime.images import image_for
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
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    assert len(nodes) == 2
    # one actor pinned to each node (the default, SPREAD, is best effort)
    per_node = [NodeAffinitySchedulingStrategy(node_id=n, soft=False) for n in nodes]
    (hf_a, local), (hf_b, far) = trainer_pair(workers=2, ray_options={
        "world_runtime": "docker", "docker_hosts": engines, "step_timeout": 60.0, "scheduling_strategy": per_node})
    try:
        for _ in range(2):  # a short training: the second step's rollouts run on the updated policy
            assert_same_step(local, far, hf_a, hf_b)
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
