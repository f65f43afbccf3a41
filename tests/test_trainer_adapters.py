"""The adapters for trainers that run beyond one machine, each driving an envfactory episode to
reward 1 through the trainer's own classes where its package is installed here (SkyRL's skyrl-gym),
and through a stand-in of its documented interface where it cannot be installed beside this
project's pins (said per test). Every adapter module imports without its trainer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import envfactory
from envfactory.checks.scripted import OraclePolicy

ROOT = Path(__file__).resolve().parents[1]


def _oracle(name: str, task_id: str) -> list[str]:
    return OraclePolicy.actions(envfactory.spec(name).task(task_id))


@pytest.mark.parametrize("module", ["envfactory.faces.skyrl"])
def test_adapters_import_without_their_trainer(module):
    """With the trainer's package made unimportable, the module still imports, and the class that
    needs it says which package to install."""
    code = f"""
import sys
for blocked in ("skyrl_gym", "verifiers", "nemo_gym", "verl"):
    sys.modules[blocked] = None
import {module} as m
print("imported")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "imported" in r.stdout, r.stderr


# -- SkyRL (skyrl-gym 0.4: the real BaseTextEnv) -----------------------------------------
def test_skyrl_episode_to_reward_one_through_skyrl_gym():
    skyrl_gym = pytest.importorskip("skyrl_gym")
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    from envfactory.faces.skyrl import register_skyrl, skyrl_rows

    assert register_skyrl() == "envfactory" and register_skyrl() == "envfactory"  # once
    rows = skyrl_rows("Counter-v0", split="rl")
    assert rows and all(envfactory.spec("Counter-v0").split(r["task_id"]) == "rl" for r in rows)
    row = rows[0]
    assert "<tools>" in row["prompt"][0]["content"] and row["prompt"][1]["role"] == "user"
    # as SkyRL's generator does: the row without its prompt is the env's extras
    extras = {k: v for k, v in row.items() if k not in ("prompt", "env_class")}
    env = skyrl_gym.make(row["env_class"], env_config={}, extras=extras)
    assert isinstance(env, BaseTextEnv)
    chat, meta = env.init([dict(m) for m in row["prompt"]])
    assert chat == row["prompt"] and meta["task_id"] == row["task_id"]
    out = None
    for action in _oracle("Counter-v0", row["task_id"]):
        assert out is None or not out["done"]
        out = env.step(action)
        chat += [{"role": "assistant", "content": action}, *out["observations"]]
    assert out is not None and out["done"] and out["reward"] == 1.0
    assert env.get_metrics()["success"] == 1.0
    assert any(m["role"] == "tool" for m in chat)
    env.close()


def test_skyrl_seeded_rows_draw_from_their_split():
    skyrl_gym = pytest.importorskip("skyrl_gym")
    from envfactory.faces.skyrl import register_skyrl

    register_skyrl()
    env = skyrl_gym.make("envfactory", env_config={"env_name": "Counter-v0"}, extras={"seed": 3})
    _, meta = env.init(None)
    assert envfactory.spec("Counter-v0").split(meta["task_id"]) == "rl"
    same = envfactory.make("Counter-v0", split="rl")
    same.reset(seed=3)  # the one seeding rule: the same task as make(...).reset(seed=...)
    assert same.task is not None and same.task.id == meta["task_id"] == env.task_id
    env.close()
    with pytest.raises(ValueError, match="env_name"):
        skyrl_gym.make("envfactory", env_config={}, extras={})
