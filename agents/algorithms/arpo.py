"""GRPO and ARPO: two algorithms behind one small protocol (:class:`Algorithm`).

Both draw ``M`` rollouts per task (the group), for one agent or a team, and
score every role's trajectories by group-normalised outcome advantages with
the same clipped loss. They differ only in how the group is sampled and how a
shared prefix is credited:

* **GRPO**: ``M`` independent rollouts from the task's opening.
* **ARPO** (Dong et al. 2025), entropy-triggered branching:

  1. sample ``N`` full rollouts from the task's opening (``N ≤ M``);
  2. ``H_initial`` of a trajectory = mean normalised entropy of its first ``k``
     generated tokens (a branch shares those tokens with its parent, so it
     shares the value);
  3. after each observation (tool response, letters), ``H_t`` = mean entropy
     of the next ``k`` generated tokens and ``ΔH = H_t − H_initial`` (in a
     parallel round, the largest ``ΔH`` of the roles that played);
  4. branch with probability ``clip(α + β·ΔH, 0, 1)`` (or, in ``threshold``
     mode, when ``ΔH > τ``): the branch continues from the observation with a
     copy of every role's token prefix and loss mask **and a fork of the
     episode**, and samples its own next turn;
  5. keep exactly ``M``: when candidates exceed the remaining budget, the
     highest ``ΔH`` win; when branching leaves budget unused, fresh rollouts fill it.

  To branch *at* the observation, every live rollout that could still branch
  is forked just before its next turn is generated; the fork is kept as the
  branch when the turn's entropy says so and closed otherwise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, Sequence

from .advantages import Lineage, hard_token_advantages, soft_token_advantages

if TYPE_CHECKING:
    from ..rollout import Rollout, Team, Trajectory

__all__ = ["Algorithm", "ARPO", "GRPO", "Group", "sample_groups", "initial_entropy", "turn_entropy"]


class Algorithm(Protocol):
    """What the sampler and the trainer ask of an algorithm."""

    name: ClassVar[str]
    branching: ClassVar[bool]
    M: int          # rollouts per task (the group)
    clip_eps: float  # ε of the clipped ratio
    kl_coef: float   # β of the k3 KL penalty to the reference (initial) policy; 0 disables it
    updates: int     # policy updates per rollout batch (μ); 1 is on-policy

    @property
    def initial(self) -> int:
        """Rollouts sampled in full from each task's opening."""

    def token_advantages(self, adv: Sequence[float], lengths: Sequence[int], lineage: Lineage) -> list[list[float]]:
        """Each response token's advantage, from the trajectories' advantages."""


@dataclass
class _Update:
    """The update settings every algorithm has (see :class:`Algorithm`)."""

    M: int = 16
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    updates: int = 1

    def __post_init__(self) -> None:
        if self.updates < 1:
            raise ValueError(f"updates must be at least 1 (got {self.updates})")
        if self.M < 1:
            raise ValueError(f"M must be at least 1 (got {self.M})")


@dataclass
class GRPO(_Update):
    """GRPO: ``M`` independent rollouts per task; every token gets its trajectory's advantage."""

    name: ClassVar[str] = "GRPO"
    branching: ClassVar[bool] = False

    @property
    def initial(self) -> int:
        return self.M

    def token_advantages(self, adv: Sequence[float], lengths: Sequence[int], lineage: Lineage) -> list[list[float]]:
        return soft_token_advantages(adv, lengths)


@dataclass
class ARPO(_Update):
    """ARPO's rollout and credit settings (paper defaults).

    Attributes:
        N: Initial full rollouts per task.
        k: Tokens whose mean entropy measures ``H_initial`` and ``H_t``.
        alpha, beta: Branch probability ``clip(α + β·ΔH, 0, 1)``.
        mode: ``"probability"`` (the paper) or ``"threshold"`` (branch iff ``ΔH > tau``).
        tau: The threshold of ``threshold`` mode.
        Z: Branches created per branching decision.
        attribution: ``"soft"`` (paper default) or ``"hard"`` advantages for shared prefixes.
    """

    name: ClassVar[str] = "ARPO"
    branching: ClassVar[bool] = True
    N: int = 8
    k: int = 20
    alpha: float = 0.5
    beta: float = 0.2
    mode: Literal["probability", "threshold"] = "probability"
    tau: float = 0.0
    Z: int = 1
    attribution: Literal["soft", "hard"] = "soft"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.N <= self.M:
            raise ValueError(f"need 1 <= N <= M, got N={self.N}, M={self.M}")
        if self.k < 1 or self.Z < 1:
            raise ValueError(f"k and Z must be at least 1 (got k={self.k}, Z={self.Z})")
        if self.mode not in ("probability", "threshold"):
            raise ValueError(f"mode must be 'probability' or 'threshold', not {self.mode!r}")
        if self.attribution not in ("soft", "hard"):
            raise ValueError(f"attribution must be 'soft' or 'hard', not {self.attribution!r}")

    @property
    def initial(self) -> int:
        return self.N

    def branch_probability(self, delta_h: float) -> float:
        """``clip(α + β·ΔH, 0, 1)`` (probability mode) or ``1[ΔH > τ]`` (threshold mode)."""
        if self.mode == "threshold":
            return 1.0 if delta_h > self.tau else 0.0
        return min(1.0, max(0.0, self.alpha + self.beta * delta_h))

    def delta_h(self, traj: "Trajectory") -> float:
        """``ΔH = H_t − H_initial`` of a trajectory's last turn."""
        return turn_entropy(traj, self.k) - initial_entropy(traj, self.k)

    def token_advantages(self, adv: Sequence[float], lengths: Sequence[int], lineage: Lineage) -> list[list[float]]:
        if self.attribution == "hard":
            return hard_token_advantages(adv, lengths, lineage)
        return soft_token_advantages(adv, lengths)


@dataclass
class Group:
    """The ``M`` rollouts of one task and how they share prefixes.

    Attributes:
        episodes: Exactly ``M`` finished rollouts (initial, branches, fills), each with a
            trajectory per role.
        lineages: Per role, prefix sharing (:class:`~agents.algorithms.advantages.Lineage`).
        delta_h: ``ΔH`` at the branch point of each branch (``None`` for others).
        kinds: ``"initial"``, ``"branch"`` or ``"fill"`` per rollout.
        branch_prefill_tokens: Prompt tokens the backend ran for each branch's
            first turn (what it recomputed instead of reusing the parent's cache).
    """

    env_name: str
    task_id: str
    agents: list[str]
    episodes: list["Rollout"] = field(default_factory=list)
    lineages: dict[str, Lineage] = field(default_factory=dict)
    delta_h: list[float | None] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    branch_prefill_tokens: list[float] = field(default_factory=list)

    @property
    def trajectories(self) -> list["Trajectory"]:
        """The sole agent's trajectories (single-agent environments)."""
        return [e.trajectory for e in self.episodes]

    @property
    def lineage(self) -> Lineage:
        """The sole agent's lineage (single-agent environments)."""
        (only,) = self.lineages.values()
        return only

    def add(self, kind: str, *, parent: int = -1, shared: dict[str, int] | None = None,
            delta_h: float | None = None) -> int:
        self.kinds.append(kind)
        self.delta_h.append(delta_h)
        for a in self.agents:
            i = self.lineages.setdefault(a, Lineage()).add(parent, (shared or {}).get(a, 0))
        return i


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def initial_entropy(traj: "Trajectory", k: int) -> float:
    """``H_initial``: mean entropy of the trajectory's first ``k`` generated (loss-mask 1) tokens."""
    return _mean([h for h, m in zip(traj.entropies, traj.loss_mask) if m][:k])


def turn_entropy(traj: "Trajectory", k: int) -> float:
    """``H_t``: mean entropy of the first ``k`` tokens of the last assistant turn."""
    if not traj.turn_spans:
        return 0.0
    a, b = traj.turn_spans[-1]
    return _mean(list(traj.entropies[a:min(b, a + k)]))


@dataclass
class _Live:
    state: "Rollout"
    group: int
    index: int  # position in its group


def _prefill(states: list["Rollout"]) -> int:
    pols = {id(p): p for s in states for p in s.actors.values() if hasattr(p, "prefill_tokens_computed")}
    return sum(p.prefill_tokens_computed() for p in pols.values())


def sample_groups(team: "Team", tasks: list[tuple[Any, Any]], algo: Algorithm, *, max_new_tokens: int = 256,
                  temperature: float = 1.0, seed: int = 0, mode: str = "aec", tokenizer: Any = None) -> list[Group]:
    """Roll out ``algo.M`` episodes of each ``(episode, task)`` with ``team``, all tasks batched together.

    Each task's opening is rendered once (on the given episode, which is reset) and
    every rollout plays on its own fork, so the episode is left untouched afterwards
    apart from that reset. Returns one :class:`Group` per task, in order.
    """
    from ..rollout import advance, start

    rng = random.Random(seed)
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature)
    templates: list["Rollout"] = []
    groups: list[Group] = []
    live: list[_Live] = []
    for env, task in tasks:
        opening = start(team, env, task, mode=mode, tokenizer=tokenizer, max_new_tokens=max_new_tokens)
        templates.append(opening.fork())  # frees `env` for the next task's reset
        g = Group(opening.env_name, opening.task_id, list(opening.trajectories))
        groups.append(g)
        live += [_Live(templates[-1].fork(), len(groups) - 1, g.add("initial")) for _ in range(algo.initial)]

    def budget_left(gi: int) -> int:
        return algo.M - len(groups[gi].kinds)

    fresh_branches: list[_Live] = []
    while True:
        active = [x for x in live if not x.state.done]
        if not active:
            break
        # Fork each rollout whose next players have observed something since a turn, before that turn.
        preforks: dict[int, "Rollout"] = {}
        if algo.branching:
            for x in active:
                trajs = x.state.trajectories
                if budget_left(x.group) > 0 and any(trajs[a].turn_spans for a in x.state.acting()):
                    preforks[id(x)] = x.state.fork()
        # Branches' first turns run in their own call so their prefill is measured alone.
        branch_ids = {id(x) for x in fresh_branches}
        batches = [[x for x in active if id(x) in branch_ids], [x for x in active if id(x) not in branch_ids]]
        for batch in batches:
            if not batch:
                continue
            before = _prefill([x.state for x in batch])
            advance([x.state for x in batch], seed=rng.randrange(2**31), **kw)
            if batch is batches[0]:
                per = (_prefill([x.state for x in batch]) - before) / len(batch)
                for x in batch:
                    groups[x.group].branch_prefill_tokens.append(per)
        fresh_branches = []
        # Decide branches from the entropy of the turns just played.
        candidates: list[tuple[float, _Live, "Rollout"]] = []
        for x in active:
            pre = preforks.pop(id(x), None)
            if pre is None:
                continue
            played = [a for a, t in pre.trajectories.items()
                      if t.turn_spans and len(x.state.trajectories[a].turn_spans) > len(t.turn_spans)]
            delta_h = max((algo.delta_h(x.state.trajectories[a]) for a in played), default=None)
            if delta_h is not None and rng.random() < algo.branch_probability(delta_h):
                candidates.append((delta_h, x, pre))
            else:
                _close(pre)
        candidates.sort(key=lambda c: -c[0])
        for delta_h, x, pre in candidates:
            for c in [pre] + [pre.fork() for _ in range(algo.Z - 1)]:
                if budget_left(x.group) > 0:
                    shared = {a: len(t.response_ids) for a, t in c.trajectories.items()}
                    idx = groups[x.group].add("branch", parent=x.index, shared=shared, delta_h=delta_h)
                    live.append(nx := _Live(c, x.group, idx))
                    fresh_branches.append(nx)
                else:
                    _close(c)
        # Nothing left that could branch: fill the unused budget with fresh rollouts.
        if not any(not x.state.done for x in live):
            for gi, g in enumerate(groups):
                live += [_Live(templates[gi].fork(), gi, g.add("fill")) for _ in range(budget_left(gi))]
    for x in sorted(live, key=lambda x: (x.group, x.index)):
        groups[x.group].episodes.append(x.state)
        _close(x.state)
    for t in templates:
        _close(t)
    for g in groups:
        assert len(g.episodes) == algo.M, (len(g.episodes), algo.M)
    return groups


def _close(state: Any) -> None:
    try:
        state.env.close()
    except Exception:  # a dead container must not kill the rollout
        pass
