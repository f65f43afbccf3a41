"""Vector environments: gymnasium.make_vec runs several envfactory episodes in worker processes
with the same observations as one env at a time (text never goes through shared memory)."""

from __future__ import annotations

import gymnasium
import pytest

import envfactory  # noqa: F401  (registers the Gymnasium ids)
from envfactory.faces.gym_env import ToolGymEnv

NAME = "Counter-v0"
CALL = '<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call>'


def _one_at_a_time(seed: int, n: int):
    out = []
    for i in range(n):
        env = ToolGymEnv(NAME)
        obs, info = env.reset(seed=seed + i)
        step = env.step(CALL)
        out.append((obs, info["task_id"], step[0], step[1], step[2]))
        env.close()
    return out


@pytest.mark.parametrize("how", [{}, {"vectorization_mode": "async", "vector_kwargs": {"shared_memory": False}},
                                 {"vectorization_mode": "sync"}])
def test_make_vec_matches_single_envs(how):
    want = _one_at_a_time(5, 3)
    vec = gymnasium.make_vec(f"envfactory/{NAME}", num_envs=3, **how)
    try:
        if not how:
            assert isinstance(vec, gymnasium.vector.AsyncVectorEnv)  # the default: worker processes
        obs, info = vec.reset(seed=5)
        assert list(obs) == [w[0] for w in want] and list(info["task_id"]) == [w[1] for w in want]
        assert all(0 < len(o) < 2000 for o in obs)  # real text, not 65,536 padding characters
        obs, reward, terminated, truncated, info = vec.step([CALL] * 3)
        assert list(obs) == [w[2] for w in want]
        assert list(reward) == [w[3] for w in want] and list(terminated) == [w[4] for w in want]
    finally:
        vec.close()


def test_shared_memory_is_refused_with_a_clear_error():
    with pytest.raises(TypeError, match="shared memory"):
        gymnasium.make_vec(f"envfactory/{NAME}", num_envs=2, vectorization_mode="async")


def test_vector_env_honours_the_split():
    spec = envfactory.spec("Bank-v0")
    splits = {t.id: spec.split(t) for t in spec.get_tasks()}
    vec = gymnasium.make_vec("envfactory/Bank-v0", num_envs=2, vectorization_mode="sync")
    try:  # the default split: never an evaluation task unless asked for
        drawn = {t for s in range(0, 120, 2) for t in vec.reset(seed=s)[1]["task_id"]}
        assert {splits[t] for t in drawn} == {"sft", "rl"}
    finally:
        vec.close()
    vec = gymnasium.make_vec("envfactory/Bank-v0", num_envs=2, split="eval")  # worker processes get the split
    try:
        assert isinstance(vec, gymnasium.vector.AsyncVectorEnv)
        for s in range(0, 20, 2):
            _, info = vec.reset(seed=s)
            assert {splits[t] for t in info["task_id"]} == {"eval"}
    finally:
        vec.close()
