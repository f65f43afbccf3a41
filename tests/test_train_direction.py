"""One RL step moves the policy the right way: the successful trajectory of a group becomes
more likely, the failed ones as a whole less likely; the trainer's log-probs of the sampled
tokens equal the sampling log-probs at the same temperature (importance ratio 1 before the update).
Runs in ~10 s on 2 cores."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import agents.trainer as trainer_mod  # noqa: E402
from agents.algorithms.objectives import GRPO  # noqa: E402
from agents.algorithms.branching import sample_groups  # noqa: E402
from agents.algorithms.logprobs import token_logprobs  # noqa: E402
from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig  # noqa: E402
from agents.trainer import Trainer  # noqa: E402

T = 0.7


def _config(algorithm) -> TrainerConfig:
    return TrainerConfig(algorithm=algorithm, tasks=["lights-bath-on"],
                         sampling=SamplingConfig(max_new_tokens=10, max_turns=1, temperature=T),
                         optim=OptimConfig(lr=1e-3, tasks_per_step=1), output=OutputConfig(show_progress=False))


def _summed_logprobs(tr: Trainer, trajs) -> list[float]:
    with torch.no_grad():
        lps = token_logprobs(tr.model, [t.prompt_ids + t.response_ids for t in trajs],
                             [len(t.prompt_ids) for t in trajs], temperature=T, pad_id=tr._pad_id())
    return [float((lp * torch.tensor(t.loss_mask, dtype=lp.dtype)).sum()) for t, lp in zip(trajs, lps)]


def test_one_step_raises_the_success_and_lowers_the_failures(monkeypatch):
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model

    torch.manual_seed(0)
    policy = HFPolicy(build_tiny_model(), device="cpu")
    tr = Trainer(policy, ["Lights-v0"], _config(GRPO(M=6)))
    groups = sample_groups(policy, tr.pool, GRPO(M=6), max_new_tokens=10, temperature=T, seed=3)
    trajs = groups[0].trajectories
    # Sampling log-probs (behaviour policy at T) agree with the trainer's at the same T: ratio 1.
    with torch.no_grad():
        lps = token_logprobs(tr.model, [t.prompt_ids + t.response_ids for t in trajs],
                             [len(t.prompt_ids) for t in trajs], temperature=T, pad_id=tr._pad_id())
    for t, lp in zip(trajs, lps):
        m = torch.tensor(t.loss_mask, dtype=torch.bool)
        assert torch.allclose(lp[m], torch.tensor(t.logprobs)[m], atol=1e-3)
    winner = trajs[0]
    tr.reward_fn = lambda t: 1.0 if t is winner else 0.0
    monkeypatch.setattr(trainer_mod, "sample_groups", lambda *a, **k: groups)
    before = _summed_logprobs(tr, trajs)
    row = tr.train_step()
    after = _summed_logprobs(tr, trajs)
    assert row["trained_sequences"] == 6
    delta = [a - b for a, b in zip(after, before)]
    assert delta[0] > 0.0, delta
    assert sum(delta[1:]) < 0.0, delta


def test_several_updates_per_batch_take_that_many_steps_further_the_same_way(monkeypatch):
    """``updates=3`` (GRPO's μ): three optimizer steps on one batch, moving the winner further than one."""
    from agents.policies.hf_policy import HFPolicy
    from agents.models.tiny import build_tiny_model

    with pytest.raises(ValueError, match="updates"):
        GRPO(M=4, updates=0)
    torch.manual_seed(0)
    deltas = {}
    for updates in (1, 3):
        policy = HFPolicy(build_tiny_model(), device="cpu")
        tr = Trainer(policy, ["Lights-v0"], _config(GRPO(M=6, updates=updates)))
        if updates == 1:
            groups = sample_groups(policy, tr.pool, GRPO(M=6), max_new_tokens=10, temperature=T, seed=3)
            trajs = groups[0].trajectories
            winner = trajs[0]
        tr.reward_fn = lambda t: 1.0 if t is winner else 0.0
        monkeypatch.setattr(trainer_mod, "sample_groups", lambda *a, **k: groups)
        before = _summed_logprobs(tr, trajs)
        tr.train_step()
        after = _summed_logprobs(tr, trajs)
        assert {int(s["step"]) for s in tr.optimizer.state.values()} == {updates}
        deltas[updates] = [a - b for a, b in zip(after, before)]
    # "further the same way": the group-normalised objective sum(A_i * delta log p_i) gains more
    # from three steps than from one. (The winner's own log-prob alone need not: Adam's first steps
    # are ~lr per weight whatever the gradient, and how they split between pushing the winner up and
    # the losers down depends on the model; it flipped when the tokenizer corpus changed.)
    rewards = [1.0] + [0.0] * (len(trajs) - 1)
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    adv = [(r - mean) / std for r in rewards]
    gain = {u: sum(a * d for a, d in zip(adv, deltas[u])) for u in deltas}
    assert deltas[1][0] > 0.0 and deltas[3][0] > 0.0, deltas
    assert gain[3] > gain[1] > 0.0, (gain, deltas)
    assert sum(deltas[3][1:]) < 0.0, deltas
