"""Training teams of LLM agents: per-role token-in/token-out trajectories, self-play and per-role updates."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import envfactory
from agents.policy import Policy
from agents.rollout_check import invariant_problems
from agents.team_rollout import team_rollout
from agents.team_trainer import TeamTrainer
from envfactory.multi.team import OraclePolicy

ENV = "MultiRecords-v0"
TASK = "records-000"


@pytest.fixture(scope="module")
def tiny_path():
    from agents.tiny import build_tiny_model

    return build_tiny_model()


def _policy(path):
    from agents.hf_policy import HFPolicy

    torch.manual_seed(0)
    return HFPolicy(path, device="cpu")


class Recording(Policy):
    """Delegates to a policy and remembers, per prompt, the ids it sampled."""

    def __init__(self, inner):
        self.inner, self.tokenizer, self.seen = inner, inner.tokenizer, {}

    def generate(self, prompts, **kw):
        gens = self.inner.generate(prompts, **kw)
        for p, g in zip(prompts, gens):
            self.seen.setdefault(tuple(p), []).append(list(g.token_ids))
        return gens

    def prefill_tokens_computed(self):
        return self.inner.prefill_tokens_computed()


@pytest.mark.parametrize("mode", ["aec", "parallel"])
def test_team_trajectories_are_token_in_token_out(tiny_path, mode):
    rec = Recording(_policy(tiny_path))
    eps = team_rollout(rec, [(envfactory.make_multi(ENV, max_rounds=2), 0) for _ in range(2)], mode=mode,
                       max_new_tokens=16, seed=3)
    turns = 0
    for e in eps:
        assert e.error is None, e.error
        for agent, t in e.trajectories.items():
            # Each turn span holds exactly what the backend sampled for the role's own context at that turn.
            # (Episodes of the same task may share a prompt: its span is one of the samples drawn for it.)
            for a, b in t.turn_spans:
                assert list(t.response_ids[a:b]) in rec.seen[tuple(t.prompt_ids + t.response_ids[:a])]
            assert invariant_problems(t, rec.tokenizer) == [], (agent, mode)
            assert t.turns >= 1 and sum(t.loss_mask) == sum(b - a for a, b in t.turn_spans)
            assert agent in rec.tokenizer.decode(t.prompt_ids)  # the role's own system prompt
            turns += t.turns
    assert turns >= 4
    a, b = eps[0].trajectories.values()
    assert a.prompt_ids != b.prompt_ids  # each role sees its own opening, not the other's


def test_oracle_team_gives_per_role_payoffs_and_observations(tiny_path):
    """Mixed-motive game: each role trajectory carries its agent's payoff; teammates' letters are inserted (mask 0)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    spec = envfactory.spec("MultiDeal-v0")
    eps = team_rollout(OraclePolicy(), [(envfactory.make_multi("MultiDeal-v0"), t.id) for t in spec.get_tasks()],
                       tokenizer=tok)
    assert any(len(set(e.rewards.values())) > 1 for e in eps), "the test needs unequal payoffs"
    for e in eps:
        assert e.success
        for agent, t in e.trajectories.items():
            assert t.reward == e.rewards[agent] and invariant_problems(t, tok) == []
            inserted = tok.decode([i for i, m in zip(t.response_ids, t.loss_mask) if m == 0])
            other = next(a for a in e.trajectories if a != agent)
            assert other in inserted  # the teammate's letter reached this role as an observation


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _changed(before, model):
    return any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def _alternating():
    """A random tiny model never succeeds; 0, 1, 0, 1... per call gives every role's group of 2 a signal."""
    calls = itertools.count()
    return lambda agent, traj, episode: float(next(calls) % 2)


def test_shared_policy_train_step_updates_weights(tiny_path):
    pol = _policy(tiny_path)
    tr = TeamTrainer(pol, [ENV], M=2, tasks=[TASK], max_rounds=1, tasks_per_step=1, max_new_tokens=8, lr=1e-3,
                     reward_fn=_alternating(), seed=1)
    before = _weights(pol.model)
    row = tr.train_step()
    (samples,) = tr.last_samples.values()
    assert {s.agent for s in samples} == {"reader_0", "writer_0"}, "self-play trains every role's trajectories"
    assert row["learners"]["reader_0,writer_0"]["sequences"] == len(samples) > 0
    assert _changed(before, pol.model)


def test_policy_per_role_learns_only_from_its_own_trajectories(tiny_path):
    reader, writer = _policy(tiny_path), _policy(tiny_path)

    alt = _alternating()

    def reward(agent, traj, episode):  # the writer's rewards are all equal: no signal for it
        return alt(agent, traj, episode) if agent == "reader_0" else 1.0

    tr = TeamTrainer({"reader_0": reader, "writer_0": writer}, [ENV], M=2, tasks=[TASK], max_rounds=1,
                     tasks_per_step=1, max_new_tokens=8, lr=1e-3, reward_fn=reward, seed=1)
    wr, ww = _weights(reader.model), _weights(writer.model)
    tr.train_step()
    got = {tuple(sorted(tr.learners[k].agents)): v for k, v in tr.last_samples.items()}
    assert {s.agent for s in got[("reader_0",)]} == {"reader_0"} and len(got[("reader_0",)]) == 2
    assert got[("writer_0",)] == []
    assert _changed(wr, reader.model), "the reader's policy had signal and must move"
    assert not _changed(ww, writer.model), "the writer's policy moved on trajectories that are not its own"

    tr.reward_fn = _alternating()  # now both have signal: each learner gets exactly its own role's trajectories
    tr.train_step()
    got = {tuple(sorted(tr.learners[k].agents)): v for k, v in tr.last_samples.items()}
    for (agent,), samples in got.items():
        assert samples and {s.agent for s in samples} == {agent}
    assert _changed(ww, writer.model)


def test_team_trainer_rejects_an_incomplete_team(tiny_path):
    with pytest.raises(KeyError, match="writer_0"):
        TeamTrainer({"reader_0": _policy(tiny_path)}, [ENV])


@pytest.mark.slow
def test_sft_on_reference_joint_solutions_fits_each_roles_turns(tiny_path):
    """Each learner of a per-role team is fitted on its own role's turns of the oracle's joint play."""
    reader, writer = _policy(tiny_path), _policy(tiny_path)
    tr = TeamTrainer({"reader_0": reader, "writer_0": writer}, [ENV], tasks=[TASK], seed=0)
    first = tr.sft(epochs=1, lr=3e-3, batch_size=1)["learners"]
    last = tr.sft(epochs=8, lr=3e-3, batch_size=1)["learners"]
    for role in ("reader_0", "writer_0"):
        assert last[role]["examples"] == 1
        assert last[role]["final_nll"] < first[role]["final_nll"] - 2.0, (role, first, last)


def test_agents_trainer_on_multi_agent_envs_is_a_team_trainer(tiny_path):
    """``agents.Trainer`` is the one entry point: on multi-agent environments it trains the team (GRPO)."""
    from agents import Trainer
    from agents.algorithms.arpo import ARPO, GRPO

    pol = _policy(tiny_path)
    tr = Trainer(pol, [ENV], GRPO(M=2), tasks=[TASK], max_rounds=1, tasks_per_step=1, max_new_tokens=8,
                 lr=1e-3, reward_fn=_alternating(), seed=1, show_progress=False)
    assert isinstance(tr, TeamTrainer) and tr.M == 2
    assert set(tr.learner_of("reader_0").agents) == {"reader_0", "writer_0"}
    before = _weights(pol.model)
    assert tr.train_step()["step"] == 1
    assert _changed(before, pol.model)
    with pytest.raises(ValueError, match="GRPO"):
        Trainer(pol, [ENV], ARPO())
    with pytest.raises(ValueError, match="mixes single- and multi-agent"):
        Trainer(pol, [ENV, "Lights-v0"], GRPO(M=2))
    with pytest.raises(TypeError, match="format_coef"):
        Trainer(pol, [ENV], GRPO(M=2), format_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        Trainer(pol, [ENV], GRPO(M=2, kl_coef=0.1))
