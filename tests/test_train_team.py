"""Training teams of LLM agents with the one Trainer: per-role token-in/token-out trajectories, self-play
and a learner per role, ARPO with episode forks on a 3-role environment, and checkpoint resume."""

from __future__ import annotations

import itertools
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import envfactory  # noqa: E402
from agents import Trainer  # noqa: E402
from agents.algorithms.objectives import ARPO, GRPO  # noqa: E402
from agents.algorithms.branching import sample_groups  # noqa: E402
from agents.policies.policy import Generation, Policy, default_stop_ids  # noqa: E402
from agents.rollout import rollout  # noqa: E402
from agents.rollout_check import invariant_problems  # noqa: E402
from agents.policies.scripted_model import ScriptedModel  # noqa: E402
from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig  # noqa: E402
from envfactory import Episode, MultiState, Role, Task, ToolEnvSpec, by, tool  # noqa: E402
from envfactory.checks.scripted import OraclePolicy  # noqa: E402

ENV = "MultiRecords-v0"
TASK = "records-000"


def _config(algorithm, *, seed, tasks=(TASK,), max_turns=1, out=None, respect_splits=True) -> TrainerConfig:
    """One task per step, 8 tokens a turn, lr 1e-3, quiet."""
    return TrainerConfig(algorithm=algorithm, tasks=list(tasks) if tasks else None, seed=seed,
                         respect_splits=respect_splits, sampling=SamplingConfig(max_new_tokens=8, max_turns=max_turns),
                         optim=OptimConfig(lr=1e-3, tasks_per_step=1),
                         output=OutputConfig(dir=str(out) if out else None, show_progress=False))


@pytest.fixture(scope="module")
def tiny_path():
    from agents.models.tiny import build_tiny_model

    return build_tiny_model()


def _policy(path):
    from agents.policies.hf_policy import HFPolicy

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
    eps = rollout(rec, [(envfactory.make(ENV, max_turns=2), 0) for _ in range(2)], mode=mode, max_new_tokens=16,
                  seed=3)
    turns = 0
    for e in eps:
        assert e.error is None, e.error
        for agent, t in e.trajectories.items():
            # Each turn span holds exactly what the backend sampled for the role's own context at that turn.
            for a, b in t.turn_spans:
                assert list(t.response_ids[a:b]) in rec.seen[tuple(t.prompt_ids + t.response_ids[:a])]
            assert invariant_problems(t, rec.tokenizer) == [], (agent, mode)
            assert t.turns >= 1 and sum(t.loss_mask) == sum(b - a for a, b in t.turn_spans)
            assert agent in rec.tokenizer.decode(t.prompt_ids)  # the role's own system prompt
            turns += t.turns
    assert turns >= 4
    a, b = eps[0].trajectories.values()
    assert a.prompt_ids != b.prompt_ids  # each role sees its own opening, not the other's


def test_reference_team_gives_per_role_payoffs_and_observations(tiny_path):
    """Mixed-motive game: each role trajectory carries its agent's payoff; teammates' letters are inserted (mask 0)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    spec = envfactory.spec("MultiDeal-v0")
    eps = rollout(OraclePolicy(), [(envfactory.make("MultiDeal-v0"), t.id) for t in spec.get_tasks()],
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
    return lambda traj: float(next(calls) % 2)


def test_shared_policy_train_step_updates_weights(tiny_path):
    pol = _policy(tiny_path)
    tr = Trainer(pol, [ENV], _config(GRPO(M=2), seed=1), reward_fn=_alternating())
    assert isinstance(tr, Trainer) and set(tr.learner_of("reader_0").agents) == {"reader_0", "writer_0"}
    before = _weights(pol.model)
    row = tr.train_step()
    (samples,) = tr.last_samples.values()
    assert {s.agent for s in samples} == {"reader_0", "writer_0"}, "self-play trains every role's trajectories"
    assert row["learners"]["reader_0,writer_0"]["sequences"] == row["trained_sequences"] == len(samples) > 0
    assert _changed(before, pol.model)


def test_policy_per_role_learns_only_from_its_own_trajectories(tiny_path):
    reader, writer = _policy(tiny_path), _policy(tiny_path)
    alt = _alternating()

    def reward(traj):  # the writer's rewards are all equal: no signal for it
        return alt(traj) if traj.agent == "reader_0" else 1.0

    tr = Trainer({"reader_0": reader, "writer_0": writer}, [ENV], _config(GRPO(M=2), seed=1), reward_fn=reward)
    wr, ww = _weights(reader.model), _weights(writer.model)
    tr.train_step()
    got = tr.last_samples
    assert {s.agent for s in got["reader_0"]} == {"reader_0"} and len(got["reader_0"]) == 2
    assert got["writer_0"] == []
    assert _changed(wr, reader.model), "the reader's policy had signal and must move"
    assert not _changed(ww, writer.model), "the writer's policy moved on trajectories that are not its own"

    tr.reward_fn = _alternating()  # now both have signal: each learner gets exactly its own role's trajectories
    tr.train_step()
    for agent, samples in tr.last_samples.items():
        assert samples and {s.agent for s in samples} == {agent}
    assert _changed(ww, writer.model)


def test_trainer_rejects_an_incomplete_team(tiny_path):
    with pytest.raises(KeyError, match="writer_0"):
        Trainer({"reader_0": _policy(tiny_path)}, [ENV])


@pytest.mark.slow
def test_sft_on_reference_joint_solutions_fits_each_roles_turns(tiny_path):
    """Each learner of a per-role team is fitted on its own role's turns of the reference joint play."""
    reader, writer = _policy(tiny_path), _policy(tiny_path)
    tr = Trainer({"reader_0": reader, "writer_0": writer}, [ENV],
                 TrainerConfig(tasks=[TASK], output=OutputConfig(show_progress=False)))
    first = tr.sft([TASK], epochs=1, lr=3e-3, batch_size=1)["learners"]
    last = tr.sft([TASK], epochs=8, lr=3e-3, batch_size=1)["learners"]
    for role in ("reader_0", "writer_0"):
        assert last[role]["examples"] == 1
        assert last[role]["final_nll"] < first[role]["final_nll"] - 2.0, (role, first, last)


# -- a 3-role environment: ARPO branches fork the whole joint episode ------------------------------
class TallyState(MultiState):
    total: int = 0


@tool
def add(state: TallyState, by: int) -> str:
    """Add to the shared total.

    Args:
        by: How much to add.
    """
    state.total += by
    return f"total={state.total}"


@tool
def take(state: TallyState, by: int) -> str:
    """Take from the shared total.

    Args:
        by: How much to take.
    """
    state.total -= by
    return f"total={state.total}"


@tool
def double(state: TallyState) -> str:
    """Double the shared total."""
    state.total *= 2
    return f"total={state.total}"


OPS = {"add": lambda v, a: v + a["by"], "take": lambda v, a: v - a["by"], "double": lambda v, a: 2 * v}
ROLE_CALL = {"adder_0": "add", "taker_0": "take", "doubler_0": "double"}

TALLY = ToolEnvSpec(
    name="Tally-v0", domain="arithmetic", state_type=TallyState, tools=[],
    roles=[Role("adder_0", "who can add", [add]), Role("taker_0", "who can take", [take]),
           Role("doubler_0", "who can double", [double])],
    tasks=[Task(id="tally-6", instruction="Make the total 6.", initial_state=TallyState(),
                solution=[by("adder_0", "add", by=3), by("doubler_0", "double")],
                check=lambda s: s.total == 6)],
    max_turns=3,
)


class TallyPolicy(Policy):
    """Every turn, the role calls its own tool; ``by`` cycles 1, 2, 3 over *calls of generate*, so a
    branch takes a different step than its parent. Entropy 0.1 on a role's first turn, 0.9 later."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0
        self.stop = default_stop_ids(tokenizer)[-1]

    def generate(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=None, seed=None):
        out = []
        for p in prompts:
            self.calls += 1
            text = self.tokenizer.decode(p)
            name = ROLE_CALL[re.search(r"You are (\w+_\d)", text).group(1)]
            args = {} if name == "double" else {"by": self.calls % 3 + 1}
            ids = self.tokenizer(envfactory.ToolCall(name, args).to_hermes(), add_special_tokens=False)["input_ids"]
            ids.append(self.stop)
            h = 0.9 if "<tool_response>" in text else 0.1
            out.append(Generation(ids, [-0.5] * len(ids), [h] * len(ids), "stop"))
        return out

    def prefill_tokens_computed(self):
        return 0


def test_arpo_branches_fork_a_three_role_episode_and_siblings_never_see_each_others_state(tiny_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    (g,) = sample_groups(TallyPolicy(tok), [(Episode(TALLY), "tally-6")], ARPO(M=8, N=2, alpha=1.0, beta=0.0),
                         max_new_tokens=40, seed=0)
    assert len(g.episodes) == 8 and g.kinds.count("branch") == 6
    assert set(g.lineages) == {"adder_0", "taker_0", "doubler_0"}
    finals = set()
    for i, e in enumerate(g.episodes):
        assert e.error is None and e.rounds == 3
        # Replay this episode's own calls: every total a role was told is the running total of *its*
        # episode. A sibling's calls (made on its own fork of the world) would break the sequence.
        value, told = 0, {a: [] for a in e.trajectories}
        for entry in e.env.status.log:
            value = OPS[entry["name"]](value, entry["arguments"])
            told[entry["agent"]].append(f"total={value}")
        for agent, t in e.trajectories.items():
            assert [m["content"] for m in t.messages if m["role"] == "tool"] == told[agent]
            assert invariant_problems(t, tok) == []
            p, shared = g.lineages[agent].parent[i], g.lineages[agent].shared[i]
            if p >= 0:  # every role's prefix is copied from the parent, then the branch plays on its own
                parent = g.episodes[p].trajectories[agent]
                assert t.response_ids[:shared] == parent.response_ids[:shared]
        finals.add(e.env.state.total)
    assert len(finals) > 1, "branches never diverged: the test would be vacuous"


def test_team_training_runs_arpo_with_forks_on_three_roles(tiny_path):
    hf = _policy(tiny_path)

    def first_turn_calls(prompt, turn):  # each role's first turn calls its tool; later turns are sampled
        if turn:
            return None
        name = ROLE_CALL[re.search(r"You are (\w+_\d)", hf.tokenizer.decode(prompt)).group(1)]
        return envfactory.ToolCall(name, {} if name == "double" else {"by": 2}).to_hermes()

    pol = ScriptedModel(hf.tokenizer, first_turn_calls, fallback=hf)
    pol.model = hf.model  # trained in place: the fallback samples from the trained weights
    tr = Trainer(pol, [Episode(TALLY, max_turns=2)],
                 # branch_after='any': this test is about forking, not ARPO's branch-after-valid-results rule
                 _config(ARPO(M=4, N=2, k=4, alpha=1.0, beta=0.0, branch_after="any"), seed=0, tasks=None, max_turns=None,
                         respect_splits=False), reward_fn=_alternating())
    before = _weights(hf.model)
    row = tr.train_step()
    assert row["branches"] == 2 and row["episodes"] == 4 and row["errors"] == 0
    (samples,) = tr.last_samples.values()
    assert {s.agent for s in samples} == {"adder_0", "taker_0", "doubler_0"}
    assert _changed(before, hf.model)


# -- checkpoints: a resumed team run takes the same steps as an uninterrupted one -------------------
def _team_trainer(path, out):
    from agents.policies.hf_policy import HFPolicy

    torch.manual_seed(0)
    team = {"reader_0": HFPolicy(path, device="cpu"), "writer_0": HFPolicy(path, device="cpu")}
    return Trainer(team, [ENV], _config(GRPO(M=4, kl_coef=0.1, updates=2), seed=0, out=out),
                   reward_fn=lambda t: float(sum(t.response_ids) % 2))


def test_team_training_resumes_from_a_checkpoint(tiny_path, tmp_path):
    a = _team_trainer(tiny_path, tmp_path / "a")
    a.train(1)
    w1 = {r: _weights(a.learner_of(r).model) for r in ("reader_0", "writer_0")}
    a.train(2)
    assert any(_changed(w1[r], a.learner_of(r).model) for r in w1), "step 2 changed nothing: vacuous"
    ckpt = tmp_path / "a" / "checkpoints" / "step-1"
    assert {p.name for p in ckpt.iterdir()} >= {"reader_0", "writer_0", "trainer_state.json"}
    assert (ckpt / "reader_0" / "reference.safetensors").exists()

    b = _team_trainer(tiny_path, tmp_path / "b")
    b.output_dir = tmp_path / "a"
    b.train(2, resume=str(ckpt))
    assert b.step == 2
    for r in ("reader_0", "writer_0"):
        la, lb = a.learner_of(r), b.learner_of(r)
        for k, v in la.model.state_dict().items():
            assert torch.allclose(v, lb.model.state_dict()[k], atol=1e-6), (r, k)
        sa, sb = la.optimizer.state_dict()["state"], lb.optimizer.state_dict()["state"]
        assert sa.keys() == sb.keys() and all(int(sa[i]["step"]) == int(sb[i]["step"]) == 4 for i in sa)
        assert lb.ref_model is not None
        for k, v in la.ref_model.state_dict().items():
            assert torch.equal(v, lb.ref_model.state_dict()[k])
    rows = [r for r in b.log.rows if r.get("step") == 2]
    assert rows[0]["tokens_generated"] == [r for r in a.log.rows if r.get("step") == 2][0]["tokens_generated"]
