"""ARPO as the reference does it, and fair RL controls (issue 32): branching only after valid tool
results, ΔH on a per-run scale (the mean P can leave α), branch outcome figures, the RFT control
(continued SFT on the policy's own successes) and the shuffled-rewards control. Deterministic fake
policies and fake groups; no model is trained."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

import envfactory  # noqa: E402
from agents.algorithms.advantages import Lineage  # noqa: E402
from agents.algorithms.objectives import ARPO, GRPO, RFT  # noqa: E402
from agents.algorithms.branching import Group, observation_kind, sample_groups  # noqa: E402
from agents.policies.policy import Generation, Policy, default_stop_ids  # noqa: E402
from agents.rollout import Trajectory  # noqa: E402
from agents.trainer import Learner, Trainer, shuffle_rewards, summarize  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from agents.models.tiny import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model())


CALLS = {
    "valid": '<tool_call>\n{"name": "increment", "arguments": {"by": 1}}\n</tool_call>',
    "parse_error": "<tool_call>\n{not json}\n</tool_call>",
    "tool_error": '<tool_call>\n{"name": "increment", "arguments": {"by": "x"}}\n</tool_call>',
}


class PatternPolicy(Policy):
    """Turn ``t`` of every rollout (``t`` = tool responses seen so far) makes the call ``pattern[t]``:
    a valid one, a malformed one (a parse error) or one the tool refuses (a tool error)."""

    def __init__(self, tokenizer, pattern):
        self.tokenizer, self.pattern = tokenizer, pattern
        self.stop = default_stop_ids(tokenizer)[-1]
        self.resp = tokenizer.convert_tokens_to_ids("<tool_response>")

    def generate(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=None, seed=None):
        out = []
        for p in prompts:
            text = CALLS[self.pattern[min(p.count(self.resp), len(self.pattern) - 1)]]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.stop]
            out.append(Generation(ids, [-0.5] * len(ids), [0.3] * len(ids), "stop"))
        return out


PATTERN = ["valid", "parse_error", "valid", "tool_error", "valid"]  # observations after turns 0..4


def _sample(tokenizer, algo, n_tasks=2):
    env = envfactory.make("Counter-v0", max_turns=len(PATTERN))
    tasks = ["counter-0-12", "counter-3-11"][:n_tasks]
    return sample_groups(PatternPolicy(tokenizer, PATTERN), [(env, t) for t in tasks], algo, max_new_tokens=40)


# -- 1. branch only after valid tool results ------------------------------------------------------------
def test_observation_kind_reads_the_turns_counts():
    assert observation_kind((1, 0, 0), (2, 0, 0)) == "valid"
    assert observation_kind((1, 0, 0), (2, 1, 0)) == "tool_error"
    assert observation_kind((1, 0, 0), (1, 0, 1)) == "parse_error"
    assert observation_kind((1, 0, 0), (2, 0, 1)) == "parse_error"  # a valid call and a malformed one
    assert observation_kind((1, 0, 0), (1, 0, 0)) == "no_tool_call"


def test_an_error_observation_is_no_branch_point(tokenizer):
    # never branches (P = α = 0): every initial rollout plays the whole pattern, 5 turns, 4 potential points
    # (then one fresh rollout fills the budget: with no budget left it decides nothing)
    groups = _sample(tokenizer, ARPO(M=4, N=3, k=10, alpha=0.0, beta=0.0))
    for g in groups:
        # decisions only after turns 0 and 2 (valid results); after 1 (parse) and 3 (tool error) skipped
        assert len(g.decisions) == 2 * 3 and {d.observation for d in g.decisions} == {"valid"}
        assert g.skipped == {"parse_error": 3, "tool_error": 3}
    s = summarize(groups)
    assert s["branch_decisions"] == 12 and s["branch_points_skipped_errors"] == 12 == s["branch_points_skipped"]
    # branch_after="any" (the earlier behaviour) decides at the error observations too
    every = _sample(tokenizer, ARPO(M=4, N=3, k=10, alpha=0.0, beta=0.0, branch_after="any"))
    for g in every:
        assert Counter(d.observation for d in g.decisions) == {"valid": 6, "parse_error": 3, "tool_error": 3}
        assert g.skipped == {}
    assert summarize(every)["branch_points_skipped_errors"] == 0


def test_branches_start_only_at_valid_tool_results(tokenizer):
    groups = _sample(tokenizer, ARPO(M=6, N=2, k=10, alpha=1.0, beta=0.0))
    resp_end = tokenizer.convert_tokens_to_ids("</tool_response>")
    branches = 0
    for g in groups:
        assert {d.observation for d in g.decisions} == {"valid"} and g.skipped
        for i, p in enumerate(g.lineage.parent):
            if p < 0:
                continue
            branches += 1
            t, shared = g.trajectories[i], g.lineage.shared[i]
            prefix = tokenizer.decode(t.response_ids[:shared])
            last = prefix[prefix.rfind("<tool_response>"):]
            assert "Error" not in last and resp_end in t.response_ids[:shared], last
    assert branches > 0


# -- 2. ΔH on a per-run scale ---------------------------------------------------------------------------
def test_run_scale_lets_a_general_rise_of_entropy_raise_branching():
    dh = [0.004, 0.01, 0.015, 0.02, 0.03]  # entropy rose after every tool result
    run = ARPO(alpha=0.5, beta=0.2).branch_probabilities(dh)
    z = ARPO(alpha=0.5, beta=0.2, scale="zscore").branch_probabilities(dh)
    assert sum(run) / len(run) > 0.5 + 0.1
    assert sum(z) / len(z) == pytest.approx(0.5)  # z-scoring pins the mean P at α
    assert run == sorted(run) and z == sorted(z)  # both: more entropy, more branching
    raw = ARPO(alpha=0.5, beta=0.2, standardize=False).branch_probabilities(dh)
    assert raw == pytest.approx([0.5 + 0.2 * d for d in dh])  # standardize=False: the raw ΔH
    assert ARPO(alpha=0.3, beta=0.0).branch_probabilities(dh) == [0.3] * len(dh)


def test_run_scale_is_kept_across_rounds():
    a = ARPO(alpha=0.5, beta=0.2, scale_ema=0.1)
    scale = a.running_scale()
    first = a.scores([0.01, 0.03], scale)
    assert scale.mean_square == pytest.approx((0.01**2 + 0.03**2) / 2)  # first round: its own RMS
    assert first == pytest.approx([0.01 / 0.02236068, 0.03 / 0.02236068], rel=1e-5)
    assert a.scores([0.01, 0.03], scale) == pytest.approx(first)  # same ΔH, same scale
    big = a.scores([0.1, 0.3], scale)  # a round 10x larger moves the scale by a tenth of the way only
    assert big[0] > 3 * first[0]
    assert a.scores([0.1, 0.3]) == pytest.approx(first)  # no scale given: the round's own RMS
    assert a == ARPO(alpha=0.5, beta=0.2, scale_ema=0.1)  # the run state never lands on the settings
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.beta = 0.5  # type: ignore[misc]
    with pytest.raises(ValueError):
        ARPO(scale="median")
    with pytest.raises(ValueError):
        ARPO(branch_after="never")


# -- 3. branch outcomes -------------------------------------------------------------------------------
def _traj(reward: float, agent: str = "agent_0") -> Trajectory:
    return Trajectory(env_name="X-v0", task_id="t", agent=agent, prompt_ids=[1, 2], response_ids=[3, 4, 5],
                      loss_mask=[1, 1, 1], logprobs=[-1.0] * 3, entropies=[0.0] * 3, turn_spans=[(0, 3)],
                      reward=reward, success=reward > 0)


def _group(rewards, parents=None, task="t") -> Group:
    g = Group("X-v0", task, ["agent_0"])
    g.episodes = [SimpleNamespace(trajectories={"agent_0": _traj(r)}, success=r > 0, rounds=1, error=None)
                  for r in rewards]
    parents = parents or [-1] * len(rewards)
    g.lineages = {"agent_0": Lineage(list(parents), [0 if p < 0 else 1 for p in parents])}
    g.kinds = ["initial" if p < 0 else "branch" for p in parents]
    return g


def test_summary_reports_how_often_a_branch_changes_the_reward():
    g = _group([1.0, 0.0, 1.0, 0.0], parents=[-1, 0, 0, 1])  # branch 1 differs, 2 same, 3 same as its parent 1
    s = summarize([g, _group([0.0, 0.0])])
    assert s["branches"] == 3 and s["branch_changes_reward"] == pytest.approx(1 / 3)
    assert summarize([_group([1.0, 0.0])])["branch_changes_reward"] is None


# -- 4. the controls: RFT and shuffled rewards --------------------------------------------------------------
def _trainer(algo, seed=0, step=0) -> Trainer:
    tr = Trainer.__new__(Trainer)
    tr.algorithm, tr.seed, tr.step, tr.reward_fn = algo, seed, step, None
    tr.branch_scale = algo.running_scale() if isinstance(algo, ARPO) else None
    tr.learners = [Learner(None, None, None, {"agent_0"})]
    return tr


def test_rft_trains_on_the_successes_only_with_advantage_one():
    assert RFT().advantages([1.0, 0.0, 0.5, -1.0]) == [1.0, 0.0, 1.0, 0.0]
    assert RFT().initial == RFT().M and not RFT.branching and RFT.name == "RFT"
    groups = [_group([1.0] * 4, task="all"), _group([1.0, 0.0, 0.0, 1.0], task="mixed"), _group([0.0] * 4)]
    rows = _trainer(RFT(M=4)).samples(groups)["agent_0"]
    # the all-success group carries SFT signal (GRPO drops it: equal rewards); failures are not trained on
    assert len(rows) == 6 and all(r.signal and r.advantages == [1.0] * 3 for r in rows)
    grpo = _trainer(GRPO(M=4)).samples(groups)["agent_0"]
    assert len(grpo) == 4 and {a for r in grpo for a in r.advantages} != {1.0}  # the mixed group only
    # with a KL penalty the failures stay for the KL term only (out of the policy-gradient token-mean)
    kl = _trainer(RFT(M=4, kl_coef=0.1)).samples(groups)["agent_0"]
    assert len(kl) == 12 and sum(r.signal for r in kl) == 6
    assert all(r.advantages == [0.0] * 3 for r in kl if not r.signal)


def test_the_diagnostic_arms_drop_one_part_of_their_update_each():
    """rft_mixed: RFT without the groups where every sample succeeded; grpo_pos: GRPO without
    its negative advantages (the quickstart's diagnostic arms)."""
    assert RFT(mixed_only=True).advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    assert RFT(mixed_only=True).advantages([1.0, 0.0, 1.0]) == [1.0, 0.0, 1.0] == RFT().advantages([1.0, 0.0, 1.0])
    groups = [_group([1.0] * 4, task="all"), _group([1.0, 0.0, 0.0, 1.0], task="mixed"), _group([0.0] * 4)]
    rows = _trainer(RFT(M=4, mixed_only=True)).samples(groups)["agent_0"]
    assert len(rows) == 2 and all(r.signal and r.advantages == [1.0] * 3 for r in rows)  # the mixed group's successes
    full, pos = GRPO().advantages([1.0, 0.0, 0.0, 0.0]), GRPO(negatives=0.0).advantages([1.0, 0.0, 0.0, 0.0])
    assert pos[0] == full[0] > 0 and pos[1:] == [0.0] * 3 and all(a < 0 for a in full[1:])
    assert GRPO(negatives=0.5).advantages([1.0, 0.0]) == [full2 if full2 > 0 else full2 / 2 for full2 in GRPO().advantages([1.0, 0.0])]
    with pytest.raises(ValueError, match="negatives"):
        GRPO(negatives=2.0)


def test_rft_on_policy_gradient_is_the_sft_gradient():
    import torch

    from agents.algorithms.loss import policy_loss

    torch.manual_seed(0)
    logits = torch.randn(2, 5, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 1, 1, 1]], dtype=torch.float32)
    n = int(mask.sum())
    logp = torch.nn.functional.logsigmoid(logits)
    loss, _ = policy_loss(logp, logp.detach(), torch.ones_like(logp), mask, num_tokens=n, pg_num_tokens=n)
    (g_rft,) = torch.autograd.grad(loss, logits)
    nll = -(torch.nn.functional.logsigmoid(logits) * mask).sum() / n  # the SFT token-mean NLL
    (g_sft,) = torch.autograd.grad(nll, logits)
    assert torch.allclose(g_rft, g_sft, atol=1e-6)


def test_shuffled_rewards_keep_the_multiset_and_are_seeded():
    rewards = {(0, "agent_0"): [1.0, 1.0, 1.0, 1.0], (1, "agent_0"): [0.0, 0.0, 0.0, 0.0],
               (0, "agent_1"): [5.0, 6.0], (1, "agent_1"): [7.0, 8.0]}
    a = shuffle_rewards(rewards, random.Random(1))
    assert a == shuffle_rewards(rewards, random.Random(1))
    assert any(shuffle_rewards(rewards, random.Random(s)) != a for s in range(2, 6))
    for agent in ("agent_0", "agent_1"):  # each role's rewards are permuted among themselves
        assert sorted(x for k, v in a.items() if k[1] == agent for x in v) == \
            sorted(x for k, v in rewards.items() if k[1] == agent for x in v)
    assert a != rewards and rewards[0, "agent_0"] == [1.0] * 4  # the input is left alone


def test_trainer_shuffles_rewards_across_the_batch_before_advantages():
    groups = [_group([1.0] * 4, task="a"), _group([0.0] * 4, task="b")]
    assert _trainer(GRPO(M=4)).samples(groups)["agent_0"] == []  # equal rewards in each group: no signal
    shuffled = _trainer(GRPO(M=4, shuffle_rewards=True), seed=3, step=2).samples(groups)["agent_0"]
    assert shuffled and sum(r.advantages[0] for r in shuffled) == pytest.approx(0.0, abs=1e-9)
    again = _trainer(GRPO(M=4, shuffle_rewards=True), seed=3, step=2).samples(groups)["agent_0"]
    assert [r.advantages for r in again] == [r.advantages for r in shuffled]  # seeded by seed and step
    other = [_trainer(GRPO(M=4, shuffle_rewards=True), seed=3, step=s).samples(groups)["agent_0"] for s in range(3, 8)]
    assert any([r.advantages for r in o] != [r.advantages for r in shuffled] for o in other)
    assert summarize(groups)["reward"] == 0.5  # the reported outcome is the true one


def test_controls_are_arms_and_config_names():
    from agents.quickstart.experiment import ARMS, QuickstartConfig, _algorithm
    from agents.train_config import TrainerConfig

    cfg = QuickstartConfig(arms=["rft", "grpo_shuffled"])
    assert {"rft", "grpo_shuffled", "arpo_beta0"} <= set(ARMS)
    assert isinstance(_algorithm("rft", cfg), RFT)
    assert _algorithm("grpo_shuffled", cfg) == GRPO(M=cfg.M, updates=cfg.updates, kl_coef=cfg.kl_coef,
                                                    shuffle_rewards=True)
    assert not _algorithm("grpo", cfg).shuffle_rewards
    t = TrainerConfig.from_dict({"algorithm": {"name": "rft", "M": 4}})
    assert t.algorithm == RFT(M=4) and TrainerConfig.from_dict(t.to_dict()) == t


def test_the_run_scale_is_saved_and_restored_with_a_checkpoint(monkeypatch, tmp_path):
    import agents.trainer as trainer_mod

    scale = ARPO().running_scale()
    ARPO().scores([0.01, 0.03], scale)
    saved = {}
    monkeypatch.setattr(trainer_mod, "save_checkpoint", lambda root, step, parts, state: saved.update(state))
    tr = _trainer(ARPO())
    tr.learners, tr.curriculum, tr.branch_scale.mean_square = [], None, scale.mean_square
    tr.save(str(tmp_path))
    assert saved["branch_scale"] == pytest.approx(scale.mean_square) and "run_mean_square" not in saved["algorithm"]
    for meta in ({"step": 1, "branch_scale": saved["branch_scale"]},
                 {"step": 1, "algorithm": {"run_mean_square": saved["branch_scale"]}}):  # a checkpoint of before
        tr = _trainer(ARPO())
        tr.learners, tr.curriculum, tr.log = [], None, SimpleNamespace(truncate_after=lambda step: None)
        monkeypatch.setattr(trainer_mod, "load_checkpoint", lambda path, parts, meta=meta: meta)
        tr.load(tmp_path)
        assert tr.step == 1 and tr.branch_scale.mean_square == pytest.approx(scale.mean_square)
    assert tr.algorithm == ARPO()
