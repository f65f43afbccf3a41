"""The k3 KL cannot overflow, and a KL penalty does not dilute the policy gradient (issue 13).
Needs torch; the training check uses the tiny model on Counter-v0 (a few seconds)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")  # a failure under CI=true (see conftest)
pytest.importorskip("transformers")

from agents.algorithms.loss import kl_k3, policy_loss  # noqa: E402


def _t(rows, grad=False):
    return torch.tensor(rows, dtype=torch.float32, requires_grad=grad)


# -- 6. k3: exp(r) - r - 1 with r = log pi_ref - log pi, clamped -------------------------------------
def test_k3_is_finite_for_extreme_log_probs_and_exact_for_ordinary_ones():
    logp = _t([[-1e4, 0.0, -3.0, -200.0]], grad=True)
    ref = _t([[0.0, -1e4, -3.5, -0.01]])
    k = kl_k3(logp, ref)
    assert torch.isfinite(k).all() and (k >= 0).all()
    # a masked position with absurd values (padding, an inserted token) must not turn the loss into NaN
    loss, st = policy_loss(logp, logp.detach(), _t([[0.0, 0.0, 1.0, 0.0]]), _t([[0, 0, 1, 1]]), ref_logp=ref,
                           kl_coef=0.1)
    assert math.isfinite(loss.item()) and math.isfinite(st.kl)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    r = -3.5 - -3.0  # ordinary values are not touched by the clamp
    assert k[0, 2].item() == pytest.approx(math.exp(r) - r - 1, rel=1e-5)


def test_k3_estimates_kl_of_the_policy_to_the_reference():
    """Sampling tokens from pi, the mean of k3 is KL(pi || pi_ref) (not KL(pi_ref || pi))."""
    g = torch.Generator().manual_seed(0)
    pi, ref = torch.tensor([0.9, 0.05, 0.05]), torch.tensor([0.2, 0.4, 0.4])
    tokens = torch.multinomial(pi, 200_000, replacement=True, generator=g)
    est = kl_k3(pi.log()[tokens], ref.log()[tokens]).mean().item()
    forward = float((pi * (pi / ref).log()).sum())
    reverse = float((ref * (ref / pi).log()).sum())
    assert est == pytest.approx(forward, rel=0.03) and abs(forward - reverse) > 0.1


# -- 7. zero-advantage groups kept for the KL term do not shrink the policy gradient ------------------
def test_pg_token_mean_excludes_samples_without_signal():
    logp = _t([[-1.0, -2.0], [-1.5, -0.5]], grad=True)
    adv, mask = _t([[1.0, 1.0], [0.0, 0.0]]), _t([[1, 1], [1, 1]])
    only, _ = policy_loss(logp[:1], logp[:1].detach(), adv[:1], mask[:1])
    both, st = policy_loss(logp, logp.detach(), adv, mask, num_tokens=4, pg_num_tokens=2)
    assert both.item() == pytest.approx(only.item()) and st.pg_loss == pytest.approx(only.item())


@pytest.fixture(scope="module")
def tiny_path():
    from agents.models.tiny import build_tiny_model

    return build_tiny_model()


def _grads_after_one_step(tiny_path, kl_coef):
    from agents import Trainer
    from agents.algorithms.objectives import GRPO
    from agents.policies.hf_policy import HFPolicy
    from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig

    calls = {"n": 0}

    def reward(traj):  # counter-0-3: 0, 1 (signal); counter-0-4: 1, 1 (no signal)
        if traj.task_id != "counter-0-3":
            return 1.0
        calls["n"] += 1
        return float(calls["n"] % 2 == 0)

    torch.manual_seed(0)
    pol = HFPolicy(tiny_path, device="cpu")
    cfg = TrainerConfig(algorithm=GRPO(M=2, kl_coef=kl_coef), tasks=["counter-0-3", "counter-0-4"],
                        respect_splits=False, sampling=SamplingConfig(max_new_tokens=8, max_turns=1),
                        optim=OptimConfig(lr=0.0, tasks_per_step=2, grad_clip=0.0),
                        output=OutputConfig(show_progress=False))
    tr = Trainer(pol, ["Counter-v0"], cfg, reward_fn=reward)
    row = tr.train(1)[0]
    (samples,) = tr.last_samples.values()
    return row, samples, {n: p.grad.clone() for n, p in pol.model.named_parameters() if p.grad is not None}


def test_a_kl_penalty_keeps_the_policy_gradient_of_the_signal_groups(tiny_path):
    row0, s0, g0 = _grads_after_one_step(tiny_path, 0.0)
    row1, s1, g1 = _grads_after_one_step(tiny_path, 0.1)
    # without KL the no-signal group is dropped; with KL it is trained on, for the KL term only
    assert len(s0) == 2 and len(s1) == 4
    # At the first update the reference is the policy itself (KL and its gradient are 0), so the
    # gradient is the policy gradient alone: the same with or without the KL term.
    assert g0.keys() == g1.keys() and g0
    scale = max(v.abs().max().item() for v in g0.values())
    assert scale > 0
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-6 * scale, rtol=1e-4), n
    assert sum(not s.signal for s in s1) == 2
    assert row1["learners"]["agent_0"]["pg_tokens"] == row0["trained_tokens"] < row1["trained_tokens"]


# -- the KL term applies when a caller drives train_step itself (the quickstart and arpo_vs_grpo do) --
def test_train_step_alone_builds_the_reference_and_applies_the_kl_term(tiny_path):
    """Before the fix only train() and train_agent_loop() built the reference: train_step on its own
    ran with kl exactly 0.0 at every step although kl_coef was set."""
    from agents import Trainer
    from agents.algorithms.objectives import GRPO
    from agents.policies.hf_policy import HFPolicy
    from agents.train_config import OptimConfig, OutputConfig, SamplingConfig, TrainerConfig

    torch.manual_seed(0)
    pol = HFPolicy(tiny_path, device="cpu")
    cfg = TrainerConfig(algorithm=GRPO(M=2, kl_coef=0.1), tasks=["counter-0-3", "counter-0-4"],
                        respect_splits=False, sampling=SamplingConfig(max_new_tokens=8, max_turns=1),
                        optim=OptimConfig(lr=1e-2, tasks_per_step=2), output=OutputConfig(show_progress=False))
    calls = {"n": 0}

    def reward(traj):  # every group gets signal: 0, 1 within it, so the first update moves the policy
        calls["n"] += 1
        return float(calls["n"] % 2 == 0)

    tr = Trainer(pol, ["Counter-v0"], cfg, reward_fn=reward)
    first = tr.train_step()
    (ln,) = tr.learners
    assert ln.ref_model is not None and ln.ref_model is not pol.model
    assert first["kl"] == pytest.approx(0.0, abs=1e-6) and first["grad_norm"] > 0
    ref0 = {n: p.clone() for n, p in ln.ref_model.named_parameters()}
    second = tr.train_step()
    assert second["kl"] > 1e-6  # the policy moved away from the step-0 reference, which stayed put
    assert all(torch.equal(p, ref0[n]) for n, p in ln.ref_model.named_parameters())
