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
  4. branch with probability ``P = clip(α + β·ΔĤ, 0, 1)`` where ``ΔĤ`` is ``ΔH``
     standardised over the branching decisions of the same sampling round
     (z-score across every group of the batch; see below), or, in ``threshold``
     mode, when the raw ``ΔH > τ``. A branching decision creates exactly ``Z``
     branches: each continues from the observation with a copy of every role's
     token prefix and loss mask **and a fork of the episode**, and samples its
     own next turn;
  5. keep exactly ``M``: a decision branches only when its group's remaining
     budget holds all ``Z`` branches; when candidates exceed it, the highest
     ``ΔH`` win; when branching leaves budget unused, fresh rollouts fill it.

  To branch *at* the observation, every live rollout that could still branch
  is forked just before its next turn is generated; the fork is kept as the
  branch when the turn's entropy says so and closed otherwise. A branch does
  not decide at its own origin (its first turn): that point already has its
  ``Z`` siblings; it branches from its later observations like any rollout.

  Why standardise: the per-token entropy is the renormalised top-20 entropy
  divided by ``log |V|``, so ``ΔH`` lies within about ``±0.36`` and in practice
  within a few hundredths; ``α + β·ΔH`` with the paper's ``β = 0.2`` then stays
  within about ±0.01 of ``α``: branching is a coin flip whatever the entropy.
  The z-score puts ``ΔH`` on a unit scale, so ``β`` sets how far entropy moves
  ``P`` (``β = 0.2``: ``P = α ± 0.2`` one standard deviation from the round's
  mean) and ``β = 0`` gives ``P = α`` exactly (the random-branching control).
  A round with a single decision, or equal ``ΔH`` everywhere, gives ``ΔĤ = 0``.
  ``standardize=False`` restores the raw ``ΔH``. Every decision is recorded in
  :attr:`Group.decisions` (``ΔH``, ``ΔĤ``, ``P``, whether it branched).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, Sequence

from .advantages import Lineage, hard_token_advantages, soft_token_advantages

if TYPE_CHECKING:
    from ..rollout import Rollout, Team, Trajectory

__all__ = ["Algorithm", "ARPO", "GRPO", "Group", "BranchDecision", "sample_groups", "initial_entropy",
           "turn_entropy", "standardize"]


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
        alpha, beta: Branch probability ``clip(α + β·ΔĤ, 0, 1)`` (``β = 0``: ``P = α``, random branching).
        mode: ``"probability"`` (the paper) or ``"threshold"`` (branch iff the raw ``ΔH > tau``).
        tau: The threshold of ``threshold`` mode.
        Z: Branches created per branching decision (exactly ``Z``, or none when the group's
            remaining budget cannot hold them).
        attribution: ``"soft"`` (paper default) or ``"hard"`` advantages for shared prefixes.
        standardize: ``ΔĤ`` is ``ΔH`` z-scored over the decisions of a sampling round
            (default); ``False`` uses the raw ``ΔH``.
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
    standardize: bool = True

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
        """``clip(α + β·x, 0, 1)`` of an (already scaled) ``x`` (probability mode), or
        ``1[x > τ]`` (threshold mode)."""
        if self.mode == "threshold":
            return 1.0 if delta_h > self.tau else 0.0
        if not self.beta:
            return min(1.0, max(0.0, self.alpha))  # exactly α: the random-branching control
        return min(1.0, max(0.0, self.alpha + self.beta * delta_h))

    def scores(self, delta_hs: Sequence[float]) -> list[float]:
        """The ``ΔĤ`` of a round's decisions: z-scores of their ``ΔH`` (probability mode with
        ``standardize``), else the raw ``ΔH``."""
        if self.mode == "probability" and self.standardize:
            return standardize(delta_hs)
        return [float(d) for d in delta_hs]

    def branch_probabilities(self, delta_hs: Sequence[float]) -> list[float]:
        """``P`` of each of a sampling round's branching decisions, from their raw ``ΔH``."""
        return [self.branch_probability(x) for x in self.scores(delta_hs)]

    def delta_h(self, traj: "Trajectory") -> float:
        """``ΔH = H_t − H_initial`` of a trajectory's last turn."""
        return turn_entropy(traj, self.k) - initial_entropy(traj, self.k)

    def token_advantages(self, adv: Sequence[float], lengths: Sequence[int], lineage: Lineage) -> list[list[float]]:
        if self.attribution == "hard":
            return hard_token_advantages(adv, lengths, lineage)
        return soft_token_advantages(adv, lengths)


@dataclass
class BranchDecision:
    """One branching decision: a rollout (``index`` in its group) after the turn it just played.

    Attributes:
        delta_h: The raw ``ΔH = H_t − H_initial``.
        score: ``ΔĤ``, what ``P`` is computed from (``ΔH`` standardised over the round, or raw).
        p: The branch probability ``P`` (0 or 1 in threshold mode).
        drawn: Whether the draw said "branch".
        branched: Whether ``Z`` branches were made (the draw said so and the budget held them).
    """

    index: int
    delta_h: float
    score: float
    p: float
    drawn: bool = False
    branched: bool = False


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
        decisions: Every branching decision taken for this group's rollouts (ARPO).
    """

    env_name: str
    task_id: str
    agents: list[str]
    episodes: list["Rollout"] = field(default_factory=list)
    lineages: dict[str, Lineage] = field(default_factory=dict)
    delta_h: list[float | None] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    branch_prefill_tokens: list[float] = field(default_factory=list)
    decisions: list[BranchDecision] = field(default_factory=list)

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


def standardize(xs: Sequence[float], eps: float = 1e-8) -> list[float]:
    """z-scores ``(x − mean) / std`` (population std); all zeros for fewer than two values
    or values that (nearly) do not differ."""
    n = len(xs)
    if n < 2:
        return [0.0] * n
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
    if std < eps:
        return [0.0] * n
    return [(x - mean) / std for x in xs]


def initial_entropy(traj: "Trajectory", k: int) -> float:
    """``H_initial``: mean entropy of the first ``k`` tokens of the trajectory's first turn
    (fewer when that turn is shorter: the window never runs into later turns)."""
    if not traj.turn_spans:
        return 0.0
    a, b = traj.turn_spans[0]
    return _mean(list(traj.entropies[a:min(b, a + k)]))


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
                  temperature: float = 1.0, seed: int = 0, mode: str = "aec", tokenizer: Any = None,
                  max_context: int | None = None) -> list[Group]:
    """Roll out ``algo.M`` episodes of each ``(episode, task)`` with ``team``, all tasks batched together.

    Each task's opening is rendered once (on the given episode, which is reset) and
    every rollout plays on its own fork, so the episode is left untouched afterwards
    apart from that reset (it is never closed here, even when its reset failed).
    ``max_context`` bounds every role's sequence (see :func:`agents.rollout.advance`);
    a rollout cut by it is still judged on its state. Returns one :class:`Group` per task,
    in order.
    """
    from ..rollout import advance, start

    rng = random.Random(seed)
    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, max_context=max_context)
    Z = getattr(algo, "Z", 1)
    templates: list["Rollout"] = []
    groups: list[Group] = []
    live: list[_Live] = []
    for env, task in tasks:
        opening = start(team, env, task, mode=mode, tokenizer=tokenizer, max_new_tokens=max_new_tokens,
                        max_context=max_context)
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
            # Nothing left that could branch: fill the unused budget with fresh rollouts.
            if all(budget_left(gi) == 0 for gi in range(len(groups))):
                break
            for gi, g in enumerate(groups):
                live += [_Live(templates[gi].fork(), gi, g.add("fill")) for _ in range(budget_left(gi))]
            continue
        # Fork each rollout whose next players have observed something since a turn, before that
        # turn -- except a branch about to play its first turn: that is the point it branched from.
        preforks: dict[int, "Rollout"] = {}
        branch_ids = {id(x) for x in fresh_branches}
        if algo.branching:
            for x in active:
                trajs = x.state.trajectories
                if (id(x) not in branch_ids and budget_left(x.group) >= Z
                        and any(trajs[a].turn_spans for a in x.state.acting())):
                    pre = x.state.fork()
                    if pre.error is None:
                        preforks[id(x)] = pre
                    else:
                        _close(pre)
        # Branches' first turns run in their own call so their prefill is measured alone.
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
        # Decide branches from the entropy of the turns just played, all of this round's decisions together.
        deciding: list[tuple[float, _Live, "Rollout"]] = []
        for x in active:
            pre = preforks.pop(id(x), None)
            if pre is None:
                continue
            played = [a for a, t in pre.trajectories.items()
                      if t.turn_spans and len(x.state.trajectories[a].turn_spans) > len(t.turn_spans)]
            delta_h = max((algo.delta_h(x.state.trajectories[a]) for a in played), default=None)
            if delta_h is None:
                _close(pre)
            else:
                deciding.append((delta_h, x, pre))
        candidates: list[tuple[float, _Live, "Rollout", BranchDecision]] = []
        if deciding:
            scores = algo.scores([d for d, _, _ in deciding])
            for (delta_h, x, pre), score in zip(deciding, scores):
                d = BranchDecision(x.index, delta_h, score, algo.branch_probability(score))
                groups[x.group].decisions.append(d)
                d.drawn = rng.random() < d.p
                if d.drawn:
                    candidates.append((delta_h, x, pre, d))
                else:
                    _close(pre)
        candidates.sort(key=lambda c: -c[0])
        for delta_h, x, pre, d in candidates:
            if budget_left(x.group) < Z:  # exactly Z siblings per branch point, or none
                _close(pre)
                continue
            d.branched = True
            for c in [pre] + [pre.fork() for _ in range(Z - 1)]:
                shared = {a: len(t.response_ids) for a, t in c.trajectories.items()}
                idx = groups[x.group].add("branch", parent=x.index, shared=shared, delta_h=delta_h)
                live.append(nx := _Live(c, x.group, idx))
                if not c.done:
                    fresh_branches.append(nx)
    for x in sorted(live, key=lambda x: (x.group, x.index)):
        groups[x.group].episodes.append(x.state)
        _close(x.state)
    for t in templates:
        _close(t)
    for g in groups:
        assert len(g.episodes) == algo.M, (len(g.episodes), algo.M)
    return groups


def _close(state: Any) -> None:
    """Close a rollout's own episode (never one it shares: see :meth:`agents.rollout.Rollout.close`)."""
    try:
        state.close()
    except Exception:  # a dead container must not kill the rollout
        pass
