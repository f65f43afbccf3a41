"""ARPO's entropy-triggered branching rollout (Dong et al. 2025); GRPO is ARPO with branching off.

For every task, a global budget of ``M`` trajectories:

1. sample ``N`` full trajectories from the task's opening (``N ≤ M``);
2. ``H_initial`` of a trajectory = mean normalised entropy of its first ``k``
   generated tokens (recomputed for every trajectory of every training step;
   a branch shares those tokens with its parent, so it shares the value);
3. after each tool response, ``H_t`` = mean entropy of the next ``k`` generated
   tokens and ``ΔH = H_t − H_initial``;
4. branch with probability ``clip(α + β·ΔH, 0, 1)`` (or, in ``threshold`` mode,
   when ``ΔH > τ``): the branch continues from the tool response with a copy of
   the token prefix and loss mask **and a fork of the environment**, and
   samples its own next turn;
5. keep exactly ``M``: when candidates exceed the remaining budget, the highest
   ``ΔH`` win; when branching leaves budget unused, fresh trajectories fill it.

To branch *at* the tool response, every live trajectory that could still
branch is forked just before its next turn is generated; the fork is kept as
the branch when the turn's entropy says so and closed otherwise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .advantages import Lineage

if TYPE_CHECKING:
    from envfactory import Environment, Task

    from ..policy import Policy
    from ..rollout import RolloutState, Trajectory

__all__ = ["ARPO", "GRPO", "Group", "sample_groups", "initial_entropy", "turn_entropy"]


@dataclass
class ARPO:
    """ARPO's rollout and update settings (paper defaults).

    Attributes:
        M: Trajectories per task (the global rollout budget).
        N: Initial full trajectories per task.
        k: Tokens whose mean entropy measures ``H_initial`` and ``H_t``.
        alpha, beta: Branch probability ``clip(α + β·ΔH, 0, 1)``.
        mode: ``"probability"`` (the paper) or ``"threshold"`` (branch iff ``ΔH > tau``).
        tau: The threshold of ``threshold`` mode.
        Z: Branches created per branching decision.
        branching: ``False`` gives GRPO: ``M`` independent trajectories.
        attribution: ``"soft"`` (paper default) or ``"hard"`` advantages for shared prefixes.
        clip_eps: ``ε`` of the clipped ratio.
        kl_coef: ``β_KL`` of the k3 KL penalty to the reference (initial) policy; 0 disables it.
        updates: Policy updates per rollout batch (GRPO's ``μ``): each re-scores the same samples
            and takes one clipped step; the ratio to the *sampling* logprobs bounds how far the
            later updates move. 1 is on-policy (the paper's setting).
    """

    M: int = 16
    N: int = 8
    k: int = 20
    alpha: float = 0.5
    beta: float = 0.2
    mode: Literal["probability", "threshold"] = "probability"
    tau: float = 0.0
    Z: int = 1
    branching: bool = True
    attribution: Literal["soft", "hard"] = "soft"
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    updates: int = 1

    def __post_init__(self) -> None:
        if self.updates < 1:
            raise ValueError(f"updates must be at least 1 (got {self.updates})")
        if not 1 <= self.N <= self.M:
            raise ValueError(f"need 1 <= N <= M, got N={self.N}, M={self.M}")
        if self.k < 1 or self.Z < 1:
            raise ValueError(f"k and Z must be at least 1 (got k={self.k}, Z={self.Z})")
        if self.mode not in ("probability", "threshold"):
            raise ValueError(f"mode must be 'probability' or 'threshold', not {self.mode!r}")
        if self.attribution not in ("soft", "hard"):
            raise ValueError(f"attribution must be 'soft' or 'hard', not {self.attribution!r}")

    @property
    def name(self) -> str:
        return "ARPO" if self.branching else "GRPO"

    def branch_probability(self, delta_h: float) -> float:
        """``clip(α + β·ΔH, 0, 1)`` (probability mode) or ``1[ΔH > τ]`` (threshold mode)."""
        if self.mode == "threshold":
            return 1.0 if delta_h > self.tau else 0.0
        return min(1.0, max(0.0, self.alpha + self.beta * delta_h))


@dataclass
class GRPO(ARPO):
    """GRPO: ``M`` independent trajectories per task, the same advantages and loss as ARPO."""

    branching: bool = False

    def __post_init__(self) -> None:
        self.N = self.M
        super().__post_init__()


@dataclass
class Group:
    """The ``M`` trajectories of one task and how they share prefixes.

    Attributes:
        trajectories: Exactly ``M`` finished trajectories (initial, branches, fills).
        lineage: Prefix sharing (:class:`~agents.algorithms.advantages.Lineage`).
        delta_h: ``ΔH`` at the branch point of each branch (``None`` for others).
        kinds: ``"initial"``, ``"branch"`` or ``"fill"`` per trajectory.
        branch_prefill_tokens: Prompt tokens the backend ran for each branch's
            first turn (what it recomputed instead of reusing the parent's cache).
    """

    env_name: str
    task_id: str
    trajectories: list["Trajectory"] = field(default_factory=list)
    lineage: Lineage = field(default_factory=Lineage)
    delta_h: list[float | None] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    branch_prefill_tokens: list[float] = field(default_factory=list)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def initial_entropy(traj: "Trajectory", k: int) -> float:
    """``H_initial``: mean entropy of the trajectory's first ``k`` generated (loss-mask 1) tokens."""
    vals = [h for h, m in zip(traj.entropies, traj.loss_mask) if m][:k]
    return _mean(vals)


def turn_entropy(traj: "Trajectory", k: int) -> float:
    """``H_t``: mean entropy of the first ``k`` tokens of the last assistant turn."""
    if not traj.turn_spans:
        return 0.0
    a, b = traj.turn_spans[-1]
    return _mean(list(traj.entropies[a:min(b, a + k)]))


@dataclass
class _Live:
    state: "RolloutState"
    group: int
    index: int  # position in its group


def sample_groups(
    policy: "Policy",
    tasks: list[tuple["Environment", "str | Task"]],
    algo: ARPO,
    *,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    max_turns: int | None = None,
) -> list[Group]:
    """Roll out ``algo.M`` trajectories for each ``(env, task)``, all tasks batched together.

    Each task's opening is rendered once (on ``env``, which is reset) and every
    trajectory runs on its own fork, so ``env`` is left untouched afterwards
    apart from that reset. Returns one :class:`Group` per task, in order.
    """
    from ..rollout import advance, start

    rng = random.Random(seed)
    templates: list["RolloutState"] = []
    groups: list[Group] = []
    live: list[_Live] = []
    for env, task in tasks:
        opening = start(policy, env, task, max_turns=max_turns)
        templates.append(opening.fork())  # frees `env` for the next task's reset
        g = Group(env_name=opening.traj.env_name, task_id=opening.traj.task_id)
        groups.append(g)
        for _ in range(algo.N):
            live.append(_Live(templates[-1].fork(), len(groups) - 1, _add(g, "initial")))

    def budget_left(gi: int) -> int:
        return algo.M - len(groups[gi].kinds)

    round_no = 0
    fresh_branches: list[_Live] = []
    while True:
        active = [x for x in live if not x.state.done]
        if not active:
            break
        # Fork each trajectory that could branch, at its tool response, before its next turn.
        preforks: dict[int, "RolloutState"] = {}
        if algo.branching:
            for x in active:
                if x.state.traj.turn_spans and budget_left(x.group) > 0:
                    preforks[id(x)] = x.state.fork()
        # Branches' first turns run in their own call so their prefill is measured alone.
        branch_ids = {id(x) for x in fresh_branches}
        batches = [[x for x in active if id(x) in branch_ids], [x for x in active if id(x) not in branch_ids]]
        for batch in batches:
            if not batch:
                continue
            before = policy.prefill_tokens_computed()
            advance(policy, [x.state for x in batch], max_new_tokens=max_new_tokens,
                    temperature=temperature, seed=rng.randrange(2**31))
            if batch is batches[0]:
                per = (policy.prefill_tokens_computed() - before) / len(batch)
                for x in batch:
                    groups[x.group].branch_prefill_tokens.append(per)
        fresh_branches = []
        round_no += 1
        # Decide branches from the entropy of the turn just generated.
        candidates: list[tuple[float, _Live, "RolloutState"]] = []
        for x in active:
            pre = preforks.pop(id(x), None)
            if pre is None:
                continue
            traj = x.state.traj
            delta_h = turn_entropy(traj, algo.k) - initial_entropy(traj, algo.k)
            if rng.random() < algo.branch_probability(delta_h):
                candidates.append((delta_h, x, pre))
            else:
                _close(pre)
        candidates.sort(key=lambda c: -c[0])
        for delta_h, x, pre in candidates:
            g = groups[x.group]
            copies = [pre] + [pre.fork() for _ in range(algo.Z - 1)]
            for c in copies:
                if budget_left(x.group) > 0:
                    shared = len(c.traj.response_ids)
                    idx = _add(g, "branch", parent=x.index, shared=shared, delta_h=delta_h)
                    nx = _Live(c, x.group, idx)
                    live.append(nx)
                    fresh_branches.append(nx)
                else:
                    _close(c)
        # Nothing left that could branch: fill the unused budget with fresh trajectories.
        if not any(not x.state.done for x in live):
            for gi, g in enumerate(groups):
                for _ in range(budget_left(gi)):
                    live.append(_Live(templates[gi].fork(), gi, _add(g, "fill")))
    for x in sorted(live, key=lambda x: (x.group, x.index)):
        groups[x.group].trajectories.append(x.state.traj)
        _close(x.state)
    for t in templates:
        _close(t)
    for g in groups:
        assert len(g.trajectories) == algo.M, (len(g.trajectories), algo.M)
    return groups


def _add(g: Group, kind: str, *, parent: int = -1, shared: int = 0, delta_h: float | None = None) -> int:
    g.kinds.append(kind)
    g.delta_h.append(delta_h)
    return g.lineage.add(parent, shared)


def _close(state: Any) -> None:
    env = getattr(state, "env", None)
    if env is not None:
        try:
            env.close()
        except Exception:  # a dead container must not kill the rollout
            pass
