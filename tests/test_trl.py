"""TRL's ``GRPOTrainer`` in environment mode on an envfactory environment (``agents/trl_env.py``):
the adapter plays like ``envfactory.make``, and two real GRPO steps of the embedded tiny model on CPU
(``examples/trl/train_grpo.py``) carry the environment's reward to the trainer and change the weights."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from conftest import require_module, require_torch

require_torch()
require_module("trl", "pip install 'envfactory[trl]' (scripts/setup.sh installs it)")

import envfactory  # noqa: E402
from envfactory import ToolCall  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAME = "FindLight-v0"


def _replay(row) -> tuple[float, bool]:
    """A recorded rollout (its tool calls, one per turn, then its final answer) through envfactory.make."""
    ep = envfactory.make(NAME)
    ep.reset(row["task_id"])
    for name, arguments in row["calls"]:
        if not ep.done:  # a call after the end is answered by the adapter, as make() would refuse it
            ep.step([ToolCall(name, dict(arguments))])
    if row["answer"] is not None and not ep.done:
        ep.step(row["answer"])
    return ep.rewards["agent_0"], ep.done


def test_adapter_tools_parsing_and_reward():
    from transformers.utils import get_json_schema

    from agents.trl_env import TRLEnvironment, parse_response

    env = TRLEnvironment(NAME, split="rl")
    spec = envfactory.spec(NAME)
    assert {t.id for t in env.tasks} == {t.id for t in spec.tasks_in("rl")}
    ds = env.dataset()
    assert len(ds) == len(env.tasks) and ds[0]["prompt"][1]["content"] == env.tasks[0].instruction
    inst = env.factory()
    # each tool is a method whose rendered schema is the tool's own
    for s in spec.tool_schemas():
        f = s["function"]
        got = get_json_schema(getattr(inst, f["name"]))["function"]
        assert got["name"] == f["name"] and got["description"] == " ".join(f["description"].split())
        assert got["parameters"]["required"] == f["parameters"].get("required", [])
        assert {k: v["type"] for k, v in got["parameters"]["properties"].items()} == \
            {k: v["type"] for k, v in f["parameters"]["properties"].items()}
    # the reference solution through the methods: reward 1; half of it, or no answer: 0
    task = env.tasks[0]
    insts = []
    for calls in (task.solution, task.solution[:1], task.solution):
        e = env.factory()
        e.reset(**ds[0])
        for c in calls:
            want = envfactory.make(NAME)
            assert isinstance(getattr(e, c.name)(**c.arguments), str)
        insts.append(e)
    completions = [[{"role": "assistant", "content": "Done."}], [{"role": "assistant", "content": "Done."}],
                   [{"role": "assistant", "content": "", "tool_calls": [{}]}, {"role": "tool", "content": "x"}]]
    assert env.reward(completions, environments=insts) == [1.0, 0.0, 0.0]
    assert [r["done"] for r in env.history] == [True, True, False]
    # an error is an observation, as in make()
    e = env.factory()
    e.reset(task_id=task.id)
    want = envfactory.make(NAME)
    want.reset(task.id)
    assert e.turn_on(room="nowhere") == want.step([ToolCall("turn_on", {"room": "nowhere"})]).messages[0]["content"]
    # parsing: envfactory's parser, Hermes blocks (several), a malformed block gives no tool_calls
    from transformers import AutoTokenizer

    from agents import pretrained_tiny_model
    from agents.trl_env import prepare_tokenizer

    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(pretrained_tiny_model(seed=0)))
    text = ('<tool_call>\n{"name": "locate", "arguments": {"thing": "keys"}}\n</tool_call>'
            '<tool_call>{"name": "turn_on", "arguments": {"room": "hall"}}</tool_call><|im_end|>')
    msg = tok.parse_response(tok(text)["input_ids"], prefix=[])
    assert [c["function"] for c in msg["tool_calls"]] == [{"name": "locate", "arguments": {"thing": "keys"}},
                                                          {"name": "turn_on", "arguments": {"room": "hall"}}]
    assert "tool_calls" not in parse_response(tok, '<tool_call>{"name": "locate", "arguments": {</tool_call>')


@pytest.mark.slow
def test_grpo_trainer_two_steps_env_reward():
    sys.path.insert(0, str(ROOT / "examples" / "trl"))
    try:
        import train_grpo
    finally:
        sys.path.pop(0)
    shaping, batch = 0.5, 16
    out = train_grpo.main(["--env", NAME, "--steps", "2", "--batch", str(batch), "--generations", "8",
                           "--max-completion-length", "96", "--shaping", str(shaping), "--output-dir",
                           str(ROOT / "runs" / "test-trl")])
    hist, logs = out["history"], out["log_history"]
    assert out["steps"] == 2 and len(hist) == 2 * batch
    for row in hist:
        # the episode's own reward, replayed through make() from the rollout's calls and final answer
        reward, done = _replay(row)
        assert (row["reward"], row["done"]) == (reward, done), row
        part = shaping * row["tool_ok"] / row["tool_calls"] if row["tool_calls"] else 0.0
        assert math.isclose(row["returned"], reward + part)
    # what the trainer logged is what the environment returned, step by step
    for i, h in enumerate(logs):
        rows = hist[i * batch:(i + 1) * batch]
        assert math.isclose(h["reward"], sum(r["returned"] for r in rows) / batch, rel_tol=1e-5, abs_tol=1e-6)
    assert any(h["reward_std"] > 0 for h in logs)
    assert out["tensors_changed"] > 0  # the update moved the weights
