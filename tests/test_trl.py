"""TRL's ``GRPOTrainer`` in environment mode on an envfactory environment (``agents/harness/trl_env.py``):
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


def _replay(row, name: str = NAME) -> tuple[float, bool]:
    """A recorded rollout (its tool calls, one per turn, then its final answer) through envfactory.make."""
    ep = envfactory.make(name)
    ep.reset(row["task_id"])
    for name, arguments in row["calls"]:
        if not ep.done:  # a call after the end is answered by the adapter, as make() would refuse it
            ep.step([ToolCall(name, dict(arguments))])
    if row["answer"] is not None and not ep.done:
        ep.step(row["answer"])
    return ep.rewards["agent_0"], ep.done


def test_adapter_tools_parsing_and_reward():
    from transformers.utils import get_json_schema

    from agents.harness.trl_env import TRLEnvironment, parse_response

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
    from agents.harness.trl_env import prepare_tokenizer

    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(pretrained_tiny_model(seed=0)))
    text = ('<tool_call>\n{"name": "locate", "arguments": {"thing": "keys"}}\n</tool_call>'
            '<tool_call>{"name": "turn_on", "arguments": {"room": "hall"}}</tool_call><|im_end|>')
    msg = tok.parse_response(tok(text)["input_ids"], prefix=[])
    assert [c["function"] for c in msg["tool_calls"]] == [{"name": "locate", "arguments": {"thing": "keys"}},
                                                          {"name": "turn_on", "arguments": {"room": "hall"}}]
    assert "tool_calls" not in parse_response(tok, '<tool_call>{"name": "locate", "arguments": {</tool_call>')


@pytest.mark.slow
def test_grpo_example_as_documented_learns_from_the_sparse_reward():
    """``examples/trl/train_grpo.py`` as documented (its defaults: FindLight-v3's first 4 rl tasks, the tiny
    model after reader SFT, the sparse reward, no shaping; 24 steps, a few minutes on 2 cores): the reward
    of the last quarter of the steps is above the first quarter's over the same tasks, the weights move, and
    every reward TRL got is the episode's own, replayed through make()."""
    import collections
    import contextlib
    import io

    sys.path.insert(0, str(ROOT / "examples" / "trl"))
    try:
        import train_grpo
    finally:
        sys.path.pop(0)
    batch, steps = 16, 24
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        out = train_grpo.main(["--output-dir", str(ROOT / "runs" / "test-trl")])
    hist, logs = out["history"], out["log_history"]
    assert out["env"] == "FindLight-v3" and "reader" in Path(out["model"]).name
    assert out["steps"] == steps and len(hist) == steps * batch
    rl = [t.id for t in envfactory.spec("FindLight-v3").tasks_in("rl")][:4]
    for row in hist:
        assert row["task_id"] in rl  # the first 4 tasks of the rl split, never another split's
        # the episode's own reward, replayed through make() from the rollout's calls and final answer
        assert (row["reward"], row["done"]) == _replay(row, out["env"]), row
        assert row["returned"] == row["reward"]  # no shaping: the sparse reward alone
    # what the trainer logged is what the environment returned, step by step
    for i, h in enumerate(logs):
        rows = hist[i * batch:(i + 1) * batch]
        assert math.isclose(h["reward"], sum(r["returned"] for r in rows) / batch, rel_tol=1e-5, abs_tol=1e-6)
    assert 0 < out["successes"] < len(hist)
    assert out["tensors_changed"] > 0  # the sparse reward alone moved the weights
    # the first and last quarters played the same tasks equally often, so their rewards compare
    quarter = steps // 4 * batch
    assert collections.Counter(r["task_id"] for r in hist[:quarter]) == \
        collections.Counter(r["task_id"] for r in hist[-quarter:])
    rewards = [h["reward"] for h in logs]
    assert out["reward_first"] == pytest.approx(sum(rewards[:6]) / 6)
    assert out["reward_last"] == pytest.approx(sum(rewards[-6:]) / 6)
    # what the sparse reward taught, on any host (the reader may already succeed on nearly every rollout of
    # these tasks, leaving the quarters' reward no room to rise): training raised the log-probability of
    # the rewarded completions against the others
    assert all(len(r["completion_ids"]) > 0 for r in hist)
    assert out["logprob_moved"] > 0 and out["learning_signal"] > 0, \
        (out["logprob_rewarded"], out["logprob_unrewarded"], rewards)
    text = printed.getvalue()
    trend = "rising" if out["reward_last"] > out["reward_first"] else "not rising"
    assert f"reward: first quarter {out['reward_first']:.3f} -> last quarter {out['reward_last']:.3f} ({trend})" in text
    assert f"{out['tensors_changed']}/{out['tensors']} weight tensors changed" in text
    assert f"(difference {out['learning_signal']:+.4f})" in text


def test_grpo_example_with_a_constant_reward_shows_no_learning_signal(monkeypatch):
    """The check above can fail: the same example, its reward replaced by a constant, moves no weight
    (every GRPO advantage is 0) and its learning signal is exactly 0."""
    from agents.harness.trl_env import TRLEnvironment

    sys.path.insert(0, str(ROOT / "examples" / "trl"))
    try:
        import train_grpo
    finally:
        sys.path.pop(0)
    sparse = TRLEnvironment.reward

    def constant(self, completions, environments=None, **kw):
        sparse(self, completions, environments, **kw)  # the episodes end and are recorded as before
        return [1.0] * len(completions)

    monkeypatch.setattr(TRLEnvironment, "reward", constant)
    out = train_grpo.main(["--steps", "3", "--output-dir", str(ROOT / "runs" / "test-trl-constant")])
    assert out["steps"] == 3 and out["rollouts"] == 3 * 16 and out["tensors_changed"] == 0
    assert out["logprob_moved"] == 0.0  # no completion's log-probability moved
    assert not out["learning_signal"] > 0  # 0 (or undefined, when every rollout succeeded): the check fails


def test_sampled_mask_leaves_out_the_tool_results_trl_appended():
    """The learning signal scores the tokens the model sampled: each assistant turn to its end-of-turn
    token, then nothing until the assistant header that opens the next turn."""
    from transformers import AutoTokenizer

    from agents import build_tiny_model
    from agents.harness.trl_env import prepare_tokenizer, sampled_mask

    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(build_tiny_model()))
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    turn1, tool, turn2 = ids("<tool_call>{}</tool_call><|im_end|>"), ids("\n<|im_start|>user\n<tool_response>\nok\n"
                                                                       "</tool_response><|im_end|>\n"), ids("Done.<|im_end|>")
    header = ids("<|im_start|>assistant\n")
    mask = sampled_mask(tok, turn1 + tool + header + turn2)
    assert mask == [1] * len(turn1) + [0] * (len(tool) + len(header)) + [1] * len(turn2)
    assert sampled_mask(tok, turn1 + tool) == [1] * len(turn1) + [0] * len(tool)  # cut off after a tool result


def test_shaping_adds_partial_credit_for_error_free_calls():
    from agents.harness.trl_env import TRLEnvironment

    env = TRLEnvironment(NAME, split="rl", shaping=0.5)
    task = env.tasks[0]
    e = env.factory()
    e.reset(task_id=task.id)
    getattr(e, task.solution[0].name)(**task.solution[0].arguments)  # one call that runs
    e.turn_on(room="nowhere")                                          # one call that fails
    got = env.reward([[{"role": "assistant", "content": "Done."}]], environments=[e])
    row = env.history[-1]
    assert (row["tool_calls"], row["tool_ok"]) == (2, 1)
    assert got == [row["reward"] + 0.5 * 1 / 2]
