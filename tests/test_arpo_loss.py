"""The clipped policy loss and the k3 KL against hand-computed values (needs torch)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")  # a failure under CI=true (see conftest)

from agents.algorithms.advantages import Lineage  # noqa: E402
from agents.algorithms.objectives import ARPO, GRPO  # noqa: E402
from agents.algorithms.loss import kl_k3, policy_loss  # noqa: E402



def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_clipped_loss_hand_computed_and_masked():
    L = math.log
    # token 0: ratio 2, A=+1 -> min(2, 1.2) = 1.2 ; token 1 is a tool token (mask 0, absurd values)
    # token 2: ratio .5, A=+1 -> min(.5, .8) = .5 ; row 2 token 0: ratio 2, A=-1 -> min(-2, -1.2) = -2
    logp = _t([[L(.5), 50.0, L(.25)], [L(.5), 0.0, 0.0]]).requires_grad_(True)
    old = _t([[L(.25), -50.0, L(.5)], [L(.25), 0.0, 0.0]])
    adv = _t([[1.0, 1000.0, 1.0], [-1.0, 0.0, 0.0]])
    mask = _t([[1, 0, 1], [1, 0, 0]])
    loss, st = policy_loss(logp, old, adv, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 2.0) / 3)
    assert st.tokens == 3 and st.clip_fraction == pytest.approx(1.0)
    loss.backward()
    g = logp.grad
    assert g[0, 0].item() == 0.0            # clipped on the favourable side: no gradient
    assert g[0, 1].item() == 0.0            # masked tool token: no gradient
    assert g[0, 2].item() == pytest.approx(-0.5 / 3)  # d(-ratio*A)/dlogp = -ratio*A / n
    assert g[1, 0].item() == pytest.approx(2.0 / 3)   # unclipped pessimistic side keeps its gradient


def test_on_policy_loss_is_minus_mean_advantage():
    logp = _t([[-1.0, -2.0, -3.0]]).requires_grad_(True)
    loss, st = policy_loss(logp, logp.detach(), _t([[0.5, 0.5, -2.0]]), _t([[1, 1, 1]]))
    assert loss.item() == pytest.approx(-(0.5 + 0.5 - 2.0) / 3)
    assert st.ratio_mean == pytest.approx(1.0) and st.clip_fraction == 0.0


def test_kl_k3_and_its_weight():
    d = math.log(0.25) - math.log(0.5)
    assert kl_k3(_t([math.log(.5)]), _t([math.log(.25)])).item() == pytest.approx(math.exp(d) - d - 1)
    assert kl_k3(_t([-1.3]), _t([-1.3])).item() == 0.0
    logp = _t([[math.log(.5)]])
    base, _ = policy_loss(logp, logp, _t([[1.0]]), _t([[1]]))
    with_kl, st = policy_loss(logp, logp, _t([[1.0]]), _t([[1]]), ref_logp=_t([[math.log(.25)]]), kl_coef=0.1)
    assert with_kl.item() - base.item() == pytest.approx(0.1 * (math.exp(d) - d - 1))
    assert st.kl == pytest.approx(math.exp(d) - d - 1)


def test_token_mean_denominator_for_micro_batches():
    logp = _t([[-1.0, -1.0]])
    full, _ = policy_loss(logp, logp, _t([[1.0, 3.0]]), _t([[1, 1]]))
    a, _ = policy_loss(logp[:, :1], logp[:, :1], _t([[1.0]]), _t([[1]]), num_tokens=2)
    b, _ = policy_loss(logp[:, 1:], logp[:, 1:], _t([[3.0]]), _t([[1]]), num_tokens=2)
    assert (a + b).item() == pytest.approx(full.item())


def test_branch_probability_and_grpo_is_arpo_without_branching():
    a = ARPO()
    assert (a.M, a.N, a.k, a.alpha, a.beta) == (16, 8, 20, 0.5, 0.2)
    assert a.branch_probability(0.0) == 0.5
    assert a.branch_probability(1.0) == pytest.approx(0.7)
    assert a.branch_probability(10.0) == 1.0 and a.branch_probability(-10.0) == 0.0
    t = ARPO(mode="threshold", tau=0.1)
    assert t.branch_probability(0.2) == 1.0 and t.branch_probability(0.05) == 0.0
    g = GRPO(M=6)
    assert not isinstance(g, ARPO) and g.initial == 6 and g.name == "GRPO"
    assert not hasattr(g, "N") and not hasattr(g, "alpha")  # GRPO has no branching knobs
    assert g.token_advantages([1.0, -1.0], [2, 1], Lineage.independent(2)) == [[1.0, 1.0], [-1.0]]
    assert a.initial == 8 and ARPO(attribution="hard").token_advantages(
        [1.0, -1.0], [2, 2], Lineage(parent=[-1, 0], shared=[0, 1])) == [[0.0, 1.0], [0.0, -1.0]]
    with pytest.raises(ValueError, match="N <= M"):
        ARPO(M=4, N=8)
    with pytest.raises(ValueError, match="updates"):
        GRPO(updates=0)
