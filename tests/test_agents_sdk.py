"""The OpenAI Agents SDK, unchanged, trains: its default model calls the Responses API, served by the
endpoint over the policy; its tools are the environment's, served by ``envfactory serve --protocol
mcp`` (examples/agents_sdk/play.py). The SDK's import name is ``agents``, as is this project's
training package, so it runs in a virtual environment of its own (built here once, from the package
registry, under ``$ENVFACTORY_CACHE/venvs``); a missing one fails under CI."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import venv_python  # noqa: E402

from agents.algorithms.objectives import GRPO  # noqa: E402
from agents.harness.agent_loop import run_agent_loop  # noqa: E402
from agents.harness.endpoint import ChatEndpoint  # noqa: E402
from agents.models.tiny import build_tiny_model  # noqa: E402
from agents.policies.hf_policy import HFPolicy  # noqa: E402
from agents.policies.scripted_model import ScriptedModel  # noqa: E402
from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig  # noqa: E402
from agents.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.slow

SDK = "openai-agents==0.25.0"
TASK = "counter-0-1"
SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "agents_sdk" / "play.py"


@pytest.fixture(scope="module")
def sdk_python() -> str:
    return venv_python(SDK.replace("==", "-"), [SDK])


def sdk_loop(sdk_python: str):
    """The agent loop ``train_agent_loop`` calls: the SDK's agent in its own process, playing the
    run's task; the reward its MCP server reported."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def loop(base_url: str, episode) -> float:
        done = subprocess.run([sdk_python, str(SCRIPT), "--base-url", base_url, "--envfactory-python", sys.executable,
                               "--env", episode.spec.name, "--task", episode.task.id, "--max-turns", "3"],
                              cwd=str(SCRIPT.parent), env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return float(json.loads(done.stdout.strip().splitlines()[-1])["reward"])

    return loop


def _counter():
    import envfactory

    env = envfactory.make("Counter-v0", max_turns=3)
    env.reset(TASK)
    return env


@pytest.fixture(scope="module")
def hf() -> HFPolicy:
    torch.manual_seed(0)
    return HFPolicy(build_tiny_model(), device="cpu")


def test_the_sdk_plays_an_episode_to_reward_1_recorded_as_one_chain(sdk_python: str, hf: HFPolicy) -> None:
    call = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'
    scripted = ScriptedModel(hf.tokenizer, lambda p, turn: call if turn == 0 else "The counter shows 1.")
    with ChatEndpoint(scripted, max_tokens=32) as ep:
        [run] = run_agent_loop(sdk_loop(sdk_python), ep, [(_counter(), TASK)], 1)
    assert run.error is None and run.reward == 1.0
    [traj] = run.trajectories  # the SDK's second request continued the first's ids token for token
    assert traj.turns == 2 and traj.tool_calls == 1 and traj.reward == 1.0
    assert sum(traj.loss_mask) == sum(b - a for a, b in traj.turn_spans)


def test_the_sdk_trains_two_steps_on_the_ids_it_was_served(sdk_python: str, hf: HFPolicy, tmp_path) -> None:
    cfg = TrainerConfig(algorithm=GRPO(M=2), tasks=[TASK], seed=1,
                        sampling=SamplingConfig(max_new_tokens=16, max_turns=2, temperature=1.0),
                        optim=OptimConfig(lr=1e-3, tasks_per_step=1),
                        output=OutputConfig(show_progress=False, dir=str(tmp_path)))
    tr = Trainer(hf, ["Counter-v0"], cfg)
    runs_seen = itertools.count()
    tr.reward_fn = lambda t: float(next(runs_seen) % 2 == 0)  # one winner in each group of 2 runs
    before = [p.detach().clone() for p in tr.model.parameters()]
    rows = tr.train_agent_loop(sdk_loop(sdk_python), steps=2)
    assert [r["step"] for r in rows] == [1, 2] and all(r["errors"] == 0 and r["episodes"] == 2 for r in rows)
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    trained = tr.last_samples["agent_0"]
    recorded = [t.prompt_ids + t.response_ids for r in tr.last_runs for t in r.trajectories]
    assert [s.ids for s in trained] == recorded and len(trained) == 2  # what the SDK was served, trained on
    assert [s.advantages[0] > 0 for s in trained] == [True, False]
