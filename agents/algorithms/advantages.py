"""Outcome advantages for a group of trajectories of one task (GRPO / ARPO).

Symbols follow the ARPO paper (Dong et al. 2025) and GRPO (Shao et al. 2024):

* ``r_i`` — the sparse outcome reward of trajectory ``i`` (task success, 1 or 0);
* ``Â_i = (r_i − mean(r)) / (std(r) + ε)`` — the group-normalised advantage over
  all ``M`` trajectories of the task (``std`` is the sample standard deviation,
  as in DeepSeekMath/verl; a group whose rewards are all equal carries no signal
  and gets ``Â = 0``);
* **soft attribution** (the paper's default): every response token of trajectory
  ``i`` gets ``Â_i``; tokens shared by branches appear once per trajectory, so a
  shared prefix implicitly receives the sum of its descendants' advantages;
* **hard attribution**: a token shared by several trajectories (a branch copies
  its parent's prefix) gets the *mean* advantage of the trajectories that share it.

Prefix sharing is described by :class:`Lineage`: trajectory ``i`` shares its first
``shared[i]`` response tokens with trajectory ``parent[i]`` (``-1`` for a root).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["group_advantages", "Lineage", "soft_token_advantages", "hard_token_advantages"]


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """``Â_i = (r_i − mean(r)) / (std(r) + eps)`` over one task's group.

    Args:
        rewards: ``r_1..r_M`` for the M trajectories of one task.
        eps: Added to the standard deviation; a group of identical rewards gives zeros.

    Returns:
        One advantage per trajectory, in order.
    """
    m = len(rewards)
    if m == 0:
        return []
    mean = sum(rewards) / m
    if m == 1:
        return [0.0]
    var = sum((r - mean) ** 2 for r in rewards) / (m - 1)
    std = math.sqrt(var)
    if std == 0.0:
        return [0.0] * m
    return [(r - mean) / (std + eps) for r in rewards]


@dataclass
class Lineage:
    """Which response tokens each trajectory of a group shares with another.

    Attributes:
        parent: ``parent[i]`` is the trajectory ``i`` branched from, or ``-1``.
            A parent always has a smaller index than its branches.
        shared: ``shared[i]`` response tokens of ``i`` are copies of its parent's
            first ``shared[i]`` response tokens (``0`` for a root).
    """

    parent: list[int] = field(default_factory=list)
    shared: list[int] = field(default_factory=list)

    @classmethod
    def independent(cls, m: int) -> "Lineage":
        """``m`` trajectories sampled from scratch (GRPO): nothing shared."""
        return cls(parent=[-1] * m, shared=[0] * m)

    def add(self, parent: int = -1, shared: int = 0) -> int:
        """Append a trajectory; return its index."""
        if parent >= len(self.parent):
            raise ValueError(f"parent {parent} does not exist yet (a branch comes after its parent)")
        if parent < 0 and shared:
            raise ValueError("a root trajectory shares no tokens")
        self.parent.append(parent)
        self.shared.append(shared)
        return len(self.parent) - 1

    def owner(self, i: int, p: int) -> tuple[int, int]:
        """The trajectory that first generated response token ``p`` of ``i``, and its position."""
        while self.parent[i] >= 0 and p < self.shared[i]:
            i = self.parent[i]
        return i, p


def soft_token_advantages(adv: Sequence[float], lengths: Sequence[int]) -> list[list[float]]:
    """Soft attribution: every response token of trajectory ``i`` gets ``Â_i``."""
    return [[a] * n for a, n in zip(adv, lengths, strict=True)]


def hard_token_advantages(adv: Sequence[float], lengths: Sequence[int], lineage: Lineage) -> list[list[float]]:
    """Hard attribution: a token shared by several trajectories gets the mean of their ``Â``.

    A token is identified by the trajectory that first generated it and its
    position (:meth:`Lineage.owner`); every copy of it in the group gets the mean
    advantage of the trajectories that contain a copy.
    """
    if not (len(adv) == len(lengths) == len(lineage.parent)):
        raise ValueError(f"{len(adv)} advantages, {len(lengths)} lengths, {len(lineage.parent)} lineage "
                         "entries: give one of each per trajectory")
    total: dict[tuple[int, int], float] = {}
    count: dict[tuple[int, int], int] = {}
    owners: list[list[tuple[int, int]]] = []
    for i, n in enumerate(lengths):
        row = [lineage.owner(i, p) for p in range(n)]
        owners.append(row)
        for key in row:
            total[key] = total.get(key, 0.0) + adv[i]
            count[key] = count.get(key, 0) + 1
    return [[total[k] / count[k] for k in row] for row in owners]
