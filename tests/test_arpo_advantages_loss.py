"""Advantages (soft/hard attribution) and the clipped loss against hand-computed values."""

from __future__ import annotations

import pytest

from agents.algorithms.advantages import (Lineage, group_advantages, hard_token_advantages,
                                          soft_token_advantages)


def test_group_advantages_hand_computed():
    # mean 0.5, sample std sqrt(1/3) = 0.57735 -> +-0.5 / 0.57735 = +-0.866025
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    assert adv == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)
    # one success out of four: mean .25, var (0.5625 + 3*0.0625)/3 = 0.25, std 0.5
    assert group_advantages([0, 0, 1, 0], eps=0.0) == pytest.approx([-0.5, -0.5, 1.5, -0.5])


def test_equal_rewards_carry_no_signal():
    assert group_advantages([1, 1, 1]) == [0.0, 0.0, 0.0]
    assert group_advantages([0, 0]) == [0.0, 0.0]
    assert group_advantages([1]) == [0.0]


def test_soft_attribution_every_token_gets_its_trajectory_advantage():
    assert soft_token_advantages([1.0, -2.0], [2, 3]) == [[1.0, 1.0], [-2.0, -2.0, -2.0]]


def test_hard_attribution_shared_prefix_gets_mean_advantage():
    lin = Lineage()
    lin.add()                      # 0: root, 4 tokens
    lin.add(parent=0, shared=2)    # 1: branch of 0 sharing 2 tokens, 5 tokens
    lin.add()                      # 2: root, 3 tokens
    lin.add(parent=1, shared=1)    # 3: branch of 1 sharing 1 token (so also token 0 of traj 0)
    adv = [1.0, -1.0, 0.5, 3.0]
    got = hard_token_advantages(adv, [4, 5, 3, 2], lin)
    t0 = (1.0 - 1.0 + 3.0) / 3     # token 0 of traj 0 is in trajectories 0, 1, 3
    t1 = (1.0 - 1.0) / 2           # token 1 of traj 0 is in trajectories 0 and 1
    assert got[0] == pytest.approx([t0, t1, 1.0, 1.0])
    assert got[1] == pytest.approx([t0, t1, -1.0, -1.0, -1.0])
    assert got[2] == pytest.approx([0.5, 0.5, 0.5])
    assert got[3] == pytest.approx([t0, 3.0])
    # without sharing, hard attribution equals soft attribution
    assert hard_token_advantages(adv, [2, 2, 2, 2], Lineage.independent(4)) == soft_token_advantages(adv, [2] * 4)


def test_lineage_rejects_a_branch_before_its_parent():
    with pytest.raises(ValueError, match="parent"):
        Lineage().add(parent=0, shared=1)
