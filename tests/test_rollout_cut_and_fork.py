"""Rollouts the trainer cuts are still judged, and forks never share (or close) another's episode
(issue 13). Scripted policies on Counter-v0, the tiny model's tokenizer; fast."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import envfactory  # noqa: E402
from agents.algorithms.objectives import ARPO, GRPO  # noqa: E402
from agents.algorithms.branching import sample_groups  # noqa: E402
from agents.rollout import advance, rollout, start  # noqa: E402
from agents.policies.scripted_model import ScriptedModel  # noqa: E402

SOLVE = '<tool_call>\n{"name": "increment", "arguments": {"by": 3}}\n</tool_call>'  # counter-0-3 in one call
MORE = '<tool_call>\n{"name": "read_counter", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from agents.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model())


def _solver(tokenizer):
    """Solves counter-0-3 on its first turn, then keeps reading the counter (never answers)."""
    return ScriptedModel(tokenizer, lambda p, turn: SOLVE if turn == 0 else MORE)


def _length_after_first_turn(tokenizer, max_new_tokens):
    s = start(_solver(tokenizer), envfactory.make("Counter-v0"), "counter-0-3", max_new_tokens=max_new_tokens)
    opening = len(s.ids)
    advance([s], max_new_tokens=max_new_tokens)
    return opening, len(s.ids)


# -- 5. a rollout cut by max_context (or the trainer's max_turns) is judged on its state -------------
def test_a_solved_state_cut_by_max_context_is_rewarded(tokenizer):
    new = 48
    opening, after = _length_after_first_turn(tokenizer, new)
    limit = after + new - 1  # the opening fits a turn; after the first turn, nothing more fits
    assert opening + new <= limit
    (ro,) = rollout(_solver(tokenizer), [(envfactory.make("Counter-v0"), "counter-0-3")], max_new_tokens=new,
                    max_context=limit)
    t = ro.trajectory
    assert ro.error is None and t.turns == 1 and t.truncated and not t.terminated
    assert ro.env.state.value == 3 and not ro.env.done  # the rollout, not the episode, ended it
    assert ro.success and t.success and t.reward == 1.0 and ro.rewards == {"agent_0": 1.0}
    assert ro.ended_by == "max_context" and ro.rounds == 1

    # an unsolved state cut the same way still gets 0
    unsolved = ScriptedModel(tokenizer, lambda p, turn: MORE)
    (ro,) = rollout(unsolved, [(envfactory.make("Counter-v0"), "counter-0-3")], max_new_tokens=new, max_context=limit)
    assert ro.trajectory.truncated and not ro.success and ro.trajectory.reward == 0.0


def test_sampler_passes_max_context_and_judges_the_cut(tokenizer):
    new = 48
    _, after = _length_after_first_turn(tokenizer, new)
    (g,) = sample_groups(_solver(tokenizer), [(envfactory.make("Counter-v0"), "counter-0-3")], GRPO(M=3),
                         max_new_tokens=new, max_context=after + new - 1, tokenizer=tokenizer)
    assert [e.trajectory.turns for e in g.episodes] == [1, 1, 1]
    assert all(e.success and e.trajectory.reward == 1.0 for e in g.episodes)


def test_trainers_max_turns_ends_the_episode_which_judges_it(tokenizer):
    """The trainer's max_turns is the episodes' own turn limit, so a cut episode is judged (not 0)."""
    torch = pytest.importorskip("torch")
    from agents import Trainer
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model
    from agents.train_config import SamplingConfig, TrainerConfig

    pol = _solver(tokenizer)
    torch.manual_seed(0)
    pol.model = HFPolicy(build_tiny_model(), device="cpu").model
    tr = Trainer(pol, ["Counter-v0"], TrainerConfig(algorithm=GRPO(M=2), tasks=["counter-0-3"], respect_splits=False,
                                                    sampling=SamplingConfig(max_turns=1, max_new_tokens=32)))
    (g,) = tr._groups(tr.pairs(), GRPO(M=2), 0, 1.0)
    for e in g.episodes:
        assert e.trajectory.turns == 1 and e.ended_by == "max_turns" and e.trajectory.truncated
        assert e.success and e.trajectory.reward == 1.0


# -- 8. forks never share an episode; clean-up never closes the caller's episode ---------------------
class _Watched:
    """Wraps an episode and counts close() calls; reset can be made to fail, fork too."""

    def __init__(self, env, fail_reset=False, fail_fork=False):
        self._env, self.fail_reset, self.fail_fork, self.closed = env, fail_reset, fail_fork, 0
        self.spec, self.agents = env.spec, env.agents

    def __getattr__(self, name):
        return getattr(self._env, name)

    def reset(self, task=None, *, seed=None):
        if self.fail_reset:
            raise ConnectionError("container did not start")
        return self._env.reset(task, seed=seed)

    def fork(self):
        if self.fail_fork:
            raise ConnectionError("container went away")
        return self._env.fork()

    def close(self):
        self.closed += 1


def test_forking_a_finished_rollout_forks_its_episode(tokenizer):
    pol = ScriptedModel(tokenizer, lambda p, turn: SOLVE if turn == 0 else "Done: it shows 3.")
    env = _Watched(envfactory.make("Counter-v0"))
    s = start(pol, env, "counter-0-3")
    while not s.done:
        advance([s], max_new_tokens=64)
    assert s.success
    b = s.fork()
    assert b.env is not s.env and b.env is not env._env
    assert b.env.state == s.env.state and b.success and b.env.done
    b.close()
    s.close()  # the rollout start() made holds the caller's episode: never closed by it
    assert env.closed == 0 and s.env.state.value == 3


def test_a_failed_reset_never_closes_the_callers_episode(tokenizer):
    env = _Watched(envfactory.make("Counter-v0"), fail_reset=True)
    pol = ScriptedModel(tokenizer, lambda p, turn: SOLVE)
    for algo in (GRPO(M=3), ARPO(M=4, N=2)):  # ARPO: every initial rollout is over at once; fills make M
        (g,) = sample_groups(pol, [(env, "counter-0-3")], algo, max_new_tokens=32, tokenizer=tokenizer)
        assert env.closed == 0, "the sampler's clean-up closed the trainer's own environment"
        assert len(g.episodes) == algo.M
        assert all(e.error and "reset failed: ConnectionError" in e.error for e in g.episodes)


def test_a_failing_fork_fails_only_the_copy(tokenizer):
    env = _Watched(envfactory.make("Counter-v0"))
    s = start(_solver(tokenizer), env, "counter-0-3")
    env.fail_fork = True
    b = s.fork()
    assert b.done and "fork failed: ConnectionError" in b.error and not s.done and s.error is None
    b.close()
    assert env.closed == 0
    advance([s], max_new_tokens=32)
    assert s.error is None and s.env.state.value == 3
