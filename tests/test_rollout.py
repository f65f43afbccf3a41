"""Token-in/token-out rollouts with the HF backend and scripted policies (fast, CPU)."""

from __future__ import annotations

import json

import pytest

import envfactory
from agents.policies.hf_policy import HFPolicy
from agents.rollout import Trajectory, advance, rollout, start
from agents.rollout_check import invariant_problems
from agents.policies.scripted_model import RecordingPolicy, ScriptedModel
from agents.models.tiny import build_tiny_model
from agents.trajectories import load_trajectories, save_trajectories

LIST_ROOT = '<tool_call>\n{"name": "list_dir", "arguments": {"path": "/"}}\n</tool_call>'


@pytest.fixture(scope="module")
def hf() -> HFPolicy:
    return HFPolicy(build_tiny_model(), device="cpu")


def _first_turn_tool_call(hf: HFPolicy) -> ScriptedModel:
    """Turn 1 is a scripted tool call (so episodes go multi-turn); later turns are sampled by ``hf``."""
    return ScriptedModel(hf.tokenizer, lambda p, turn: LIST_ROOT if turn == 0 else None, fallback=hf)


def test_hf_multi_turn_token_in_token_out(hf: HFPolicy) -> None:
    rec = RecordingPolicy(_first_turn_tool_call(hf))
    pairs = [(envfactory.make("FileSystem-v0", max_turns=3), i) for i in range(3)] + [(envfactory.make("Counter-v0", max_turns=3), 0)]
    trajs = [r.trajectory for r in rollout(rec, pairs, max_new_tokens=24, temperature=1.0, seed=0)]
    sampled_by_prompt = {tuple(p): g.token_ids for p, g in rec.calls}
    for t in trajs:
        assert t.error is None
        assert t.turns >= 2 and t.tool_calls >= 1
        # the ids each turn was sampled from, looked up by its prompt: exactly the ids trained on
        seq = t.prompt_ids + t.response_ids
        sampled = [sampled_by_prompt[tuple(seq[: len(t.prompt_ids) + a])] for a, _ in t.turn_spans]
        assert invariant_problems(t, hf.tokenizer, sampled) == []
        # the model's turns after the first were really sampled by the HF model (logprobs < 0)
        a, b = t.turn_spans[1]
        assert all(lp < 0 for lp in t.logprobs[a:b])
        assert sum(t.loss_mask) == sum(b - a for a, b in t.turn_spans)


def test_hf_reuses_kv_across_turns(hf: HFPolicy) -> None:
    pol = _first_turn_tool_call(hf)
    env = envfactory.make("FileSystem-v0")
    state = start(pol, env, 0)
    advance([state], max_new_tokens=8, seed=1)  # scripted turn 1 + the tool response
    before = hf.prefill_tokens_computed()
    hf.clear_cache()
    hf.generate([state.ids], max_new_tokens=1, seed=0)  # cold: the whole prompt
    cold = hf.prefill_tokens_computed() - before
    assert cold == len(state.ids)
    branch = state.fork()  # an ARPO-style branch shares the prefix
    mid = hf.prefill_tokens_computed()
    advance([state, branch], max_new_tokens=8, seed=2)
    warm = hf.prefill_tokens_computed() - mid
    assert warm <= 2, f"both branches should reuse the cached prefix; recomputed {warm} tokens"


def test_malformed_output_is_an_error_observation(hf: HFPolicy) -> None:
    script = {
        0: '<tool_call>{"name": "list_dir", "arguments": {"path": "/"</tool_call>',  # broken JSON
        1: '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',        # unknown tool
        2: "<tool_call>never closed",                                                 # unclosed block
        3: "I give up.",
    }
    pol = ScriptedModel(hf.tokenizer, lambda p, turn: script[turn])
    [t] = [r.trajectory for r in rollout(pol, [(envfactory.make("FileSystem-v0", max_turns=6), 0)], max_new_tokens=64)]
    assert t.error is None and t.terminated and not t.success
    assert t.turns == 4 and t.parse_errors == 2 and t.tool_errors == 1
    tool_msgs = [m for m in t.messages if m["role"] == "tool"]
    assert [m["content"].startswith("Error:") for m in tool_msgs] == [True, True, True]
    assert invariant_problems(t, hf.tokenizer) == []


def test_length_cut_turns_are_closed_by_the_template(hf: HFPolicy) -> None:
    pol = ScriptedModel(hf.tokenizer, lambda p, turn: LIST_ROOT if turn == 0 else "done " * 50)
    [t] = [r.trajectory for r in rollout(pol, [(envfactory.make("FileSystem-v0", max_turns=3), 0)], max_new_tokens=12)]
    assert t.turns == 2 and t.terminated
    assert invariant_problems(t, hf.tokenizer) == []  # <|im_end|> was inserted with loss mask 0


class _CrashingEnv:
    """Wraps an environment so that step() raises, like a crashed container."""

    def __init__(self, env):
        self._env = env
        self.spec = env.spec

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, action):
        raise ConnectionError("container went away")


def test_one_failing_episode_does_not_kill_the_batch(hf: HFPolicy) -> None:
    pol = ScriptedModel(hf.tokenizer, lambda p, turn: LIST_ROOT if turn == 0 else "Done.", fail_on="/docs/")
    tasks = envfactory.spec("FileSystem-v0").get_tasks()
    docs = next(i for i, t in enumerate(tasks) if "/docs/" in t.instruction)
    other = next(i for i, t in enumerate(tasks) if "/docs/" not in t.instruction)
    pairs = [(_CrashingEnv(envfactory.make("FileSystem-v0")), other),  # environment crash
             (envfactory.make("FileSystem-v0"), docs),                   # backend fails this prompt
             (envfactory.make("FileSystem-v0"), other)]                  # healthy
    crashed, backend, healthy = [r.trajectory for r in rollout(pol, pairs, max_new_tokens=64)]
    assert "environment step failed: ConnectionError" in crashed.error
    assert "policy backend failed for agent_0: RuntimeError" in backend.error
    assert healthy.error is None and healthy.terminated and healthy.turns == 2


def test_fork_is_independent_and_jsonl_round_trips(hf: HFPolicy, tmp_path) -> None:
    pol = ScriptedModel(hf.tokenizer, lambda p, turn: [LIST_ROOT, "Answer A.", "Answer B."][min(turn, 2)])
    s = start(pol, envfactory.make("FileSystem-v0"), 0)
    advance([s], max_new_tokens=64)
    b = s.fork()
    advance([s], max_new_tokens=64)
    assert s.done and not b.done and len(b.trajectory.response_ids) < len(s.trajectory.response_ids)
    assert b.env is not s.env and b.env.state is not s.env.state
    path = tmp_path / "t.jsonl"
    assert save_trajectories([s.trajectory, b.trajectory], path) == path
    back = load_trajectories(path)
    assert back[0] == s.trajectory and isinstance(back[0], Trajectory)
    json.loads(path.read_text().splitlines()[1])
