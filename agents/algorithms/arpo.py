"""GRPO, ARPO and the RFT control behind one small protocol (:class:`Algorithm`).

All draw ``M`` rollouts per task (the group), for one agent or a team, and
train every role's trajectories with the same clipped loss. GRPO and ARPO
score them by group-normalised outcome advantages and differ only in how the
group is sampled and how a shared prefix is credited:

* **GRPO**: ``M`` independent rollouts from the task's opening.
* **ARPO** (Dong et al. 2025), entropy-triggered branching:

  1. sample ``N`` full rollouts from the task's opening (``N ≤ M``);
  2. ``H_initial`` of a trajectory = mean normalised entropy of its first ``k``
     generated tokens (a branch shares those tokens with its parent, so it
     shares the value);
  3. after each observation that is a valid tool result (``branch_after``, see
     below), ``H_t`` = mean entropy of the next ``k`` generated tokens and
     ``ΔH = H_t − H_initial`` (in a parallel round, the largest ``ΔH`` of the
     roles that played);
  4. branch with probability ``P = clip(α + β·ΔĤ, 0, 1)`` where ``ΔĤ`` is ``ΔH``
     divided by a running scale of the whole run (``scale="run"``, default) or
     z-scored over the round's decisions (``scale="zscore"``; see below), or, in
     ``threshold`` mode, when the raw ``ΔH > τ``. A branching decision creates exactly ``Z``
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

  Where it branches (``branch_after``): as the ARPO reference implementation
  does, only after a valid tool result (``"valid_tool_result"``, default): the
  role's turn before the observation made at least one tool call, none of which
  failed (``Trajectory.tool_errors``) and with no malformed call
  (``parse_errors``). An observation that is an error, or a turn without tool
  calls, is no branch point; such skipped points are counted per reason in
  :attr:`Group.skipped`. ``"any"`` branches after every observation.

  Why rescale: the per-token entropy is the renormalised top-20 entropy divided
  by ``log |V|``, so ``ΔH`` lies within about ``±0.36`` and in practice within a
  few hundredths; ``α + β·ΔH`` with the paper's ``β = 0.2`` then stays within
  about ±0.01 of ``α``: branching is a coin flip whatever the entropy.
  ``scale="run"`` divides the raw, *uncentred* ``ΔH`` by its running RMS over
  the whole run (an exponential moving average of each round's mean ``ΔH²``,
  weight ``scale_ema``, kept on the ARPO object; the first round uses its own
  RMS), so ``β`` sets how far entropy moves ``P`` and, when entropy generally
  rises after tool results (the paper's premise), the mean ``P`` rises above
  ``α``. ``scale="zscore"`` (the earlier behaviour) centres ``ΔH`` on the round's
  mean, which pins the mean ``P`` at ``α`` (up to the clip) whatever the
  entropy does: it only reorders branching between decisions. ``β = 0`` gives
  ``P = α`` exactly (the random-branching control); ``standardize=False``
  restores the raw ``ΔH``. Every decision is recorded in
  :attr:`Group.decisions` (``ΔH``, ``ΔĤ``, ``P``, whether it branched).

* **RFT** (rejection-sampling fine-tuning, a control): ``M`` independent
  rollouts per task as GRPO, trained with advantage 1 on every sampled token of
  the successful ones (reward > 0) and nothing from the others, through the same
  update path: continued SFT on the policy's own successes, matched to GRPO in
  rollouts and gradient steps.

Every algorithm turns a group's rewards into per-trajectory advantages with
``advantages(rewards)``, and ``shuffle_rewards=True`` (the shuffled-rewards
control) makes the trainer permute the rewards across all trajectories of a
step's batch (seeded) before that: the same reward distribution, no link to
what the trajectory did (see :meth:`agents.trainer.Trainer.samples`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, Sequence

from .advantages import Lineage, group_advantages, hard_token_advantages, soft_token_advantages

if TYPE_CHECKING:
    from ..rollout import Rollout, Team, Trajectory

__all__ = ["Algorithm", "ARPO", "GRPO", "RFT", "Group", "BranchDecision", "sample_groups", "initial_entropy",
           "turn_entropy", "standardize", "observation_kind"]

ObservationKind = Literal["valid", "tool_error", "parse_error", "no_tool_call"]


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

    def advantages(self, rewards: Sequence[float]) -> list[float]:
        """Each trajectory's advantage, from its group's rewards (one role's)."""

    def token_advantages(self, adv: Sequence[float], lengths: Sequence[int], lineage: Lineage) -> list[list[float]]:
        """Each response token's advantage, from the trajectories' advantages."""


@dataclass
class _Update:
    """The update settings every algorithm has (see :class:`Algorithm`).

    Attributes:
        shuffle_rewards: The shuffled-rewards control: the trainer permutes the rewards
            across all trajectories of a step's batch (seeded) before advantages are computed.
    """

    M: int = 16
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    updates: int = 1
    shuffle_rewards: bool = field(default=False, kw_only=True)  # keyword-only: subclasses' fields keep their places

    signal: ClassVar[Literal["group", "sample"]] = "group"
    """Which samples carry a policy-gradient signal: every sample of a group whose advantages
    are not all zero (``group``), or each sample with a non-zero advantage (``sample``)."""

    def __post_init__(self) -> None:
        if self.updates < 1:
            raise ValueError(f"updates must be at least 1 (got {self.updates})")
        if self.M < 1:
            raise ValueError(f"M must be at least 1 (got {self.M})")

    def advantages(self, rewards: Sequence[float]) -> list[float]:
        """Group-normalised advantages (:func:`~agents.algorithms.advantages.group_advantages`)."""
        return group_advantages(rewards)


@dataclass
class GRPO(_Update):
    """GRPO: ``M`` independent rollouts per task; every token gets its trajectory's advantage."""

    name: ClassVar[str] = "GRPO"
    branching: ClassVar[bool] = False
    negatives: float = field(default=1.0, kw_only=True)
    """Scale of the negative advantages (failures below their group's mean): 1 is GRPO; 0 pushes
    only successes up, with GRPO's normalisation (a diagnostic: what pushing failures down adds)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.negatives <= 1.0:
            raise ValueError(f"negatives must be within [0, 1] (got {self.negatives})")

    @property
    def initial(self) -> int:
        return self.M

    def advantages(self, rewards: Sequence[float]) -> list[float]:
        return [max(a, 0.0) + self.negatives * min(a, 0.0) for a in group_advantages(rewards)]  # no -0.0

    def token_advantages(self, adv: Sequence[float], lengths: Sequence[int], lineage: Lineage) -> list[list[float]]:
        return soft_token_advantages(adv, lengths)


@dataclass
class RFT(_Update):
    """Rejection-sampling fine-tuning (a control): ``M`` independent rollouts per task as GRPO;
    every sampled token of a successful trajectory (reward > 0) gets advantage 1, a failed one
    is not trained on (only for the KL term, with ``kl_coef``). With one update per batch the
    clipped loss's gradient is then the SFT (token-mean NLL) gradient on the successes."""

    name: ClassVar[str] = "RFT"
    branching: ClassVar[bool] = False
    signal: ClassVar[Literal["group", "sample"]] = "sample"
    mixed_only: bool = field(default=False, kw_only=True)
    """Train only on the successes of groups that also hold a failure (the groups GRPO learns
    from), not on groups where every sample succeeded (a diagnostic: what imitating the tasks the
    policy already solves adds)."""

    @property
    def initial(self) -> int:
        return self.M

    def advantages(self, rewards: Sequence[float]) -> list[float]:
        """1 for a success (reward > 0), else 0; never normalised, so an all-success group trains
        (unless ``mixed_only``)."""
        if self.mixed_only and all(r > 0 for r in rewards):
            return [0.0] * len(rewards)
        return [1.0 if r > 0 else 0.0 for r in rewards]

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
        standardize: ``ΔĤ`` is ``ΔH`` rescaled by ``scale`` (default); ``False`` uses the raw ``ΔH``.
        scale: ``"run"`` (default): ``ΔĤ = ΔH / s`` (not centred), ``s`` the running RMS of ``ΔH``
            over the run's rounds so far, this round included, so a general rise of entropy
            after tool results raises the mean ``P``; ``"zscore"``: ``ΔH`` z-scored over the
            decisions of a sampling round (the mean ``P`` is then pinned at ``α``).
        scale_ema: The weight of each new round's mean ``ΔH²`` in the running scale (1: the
            round's own RMS only).
        branch_after: ``"valid_tool_result"`` (default, as the ARPO reference implementation):
            branch only at an observation answering a turn whose tool calls all succeeded
            (at least one call, no tool or parse error); ``"any"``: after every observation.
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
    scale: Literal["run", "zscore"] = "run"
    scale_ema: float = 0.1
    branch_after: Literal["valid_tool_result", "any"] = "valid_tool_result"
    run_mean_square: float | None = field(default=None, init=False, repr=False, compare=False)
    """The running mean of ``ΔH²`` of ``scale="run"`` (``None`` before the first round)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scale not in ("run", "zscore"):
            raise ValueError(f"scale must be 'run' or 'zscore', not {self.scale!r}")
        if not 0.0 < self.scale_ema <= 1.0:
            raise ValueError(f"scale_ema must be in (0, 1] (got {self.scale_ema})")
        if self.branch_after not in ("valid_tool_result", "any"):
            raise ValueError(f"branch_after must be 'valid_tool_result' or 'any', not {self.branch_after!r}")
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
        """The ``ΔĤ`` of a round's decisions (probability mode with ``standardize``): their ``ΔH``
        over the running RMS (``scale="run"``, which this round updates) or their z-scores
        (``"zscore"``); else the raw ``ΔH``."""
        if not (self.mode == "probability" and self.standardize):
            return [float(d) for d in delta_hs]
        if self.scale == "zscore":
            return standardize(delta_hs)
        if not delta_hs:
            return []
        ms = sum(d * d for d in delta_hs) / len(delta_hs)
        prev = self.run_mean_square
        self.run_mean_square = ms if prev is None else (1.0 - self.scale_ema) * prev + self.scale_ema * ms
        s = math.sqrt(self.run_mean_square)
        return [float(d) / s if s > 1e-8 else 0.0 for d in delta_hs]

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
        score: ``ΔĤ``, what ``P`` is computed from (``ΔH`` rescaled, or raw).
        p: The branch probability ``P`` (0 or 1 in threshold mode).
        drawn: Whether the draw said "branch".
        branched: Whether ``Z`` branches were made (the draw said so and the budget held them).
        observation: What the decided-on observation was (:func:`observation_kind`; ``"valid"``
            unless ``branch_after="any"``).
    """

    index: int
    delta_h: float
    score: float
    p: float
    drawn: bool = False
    branched: bool = False
    observation: str = "valid"


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
        skipped: Potential branch points not decided on because the observation was no valid
            tool result (``branch_after="valid_tool_result"``), per reason: ``tool_error``,
            ``parse_error``, ``no_tool_call``.
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
    skipped: dict[str, int] = field(default_factory=dict)

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


_Counts = tuple[int, int, int]  # a role's tool calls, tool errors, parse errors so far


def _counts(t: "Trajectory") -> _Counts:
    return t.tool_calls, t.tool_errors, t.parse_errors


def observation_kind(before: _Counts, after: _Counts) -> ObservationKind:
    """What a role observes after a turn, from its ``(tool_calls, tool_errors, parse_errors)``
    counts before and after that turn: ``parse_error`` (a malformed call), ``tool_error``
    (a call failed), ``no_tool_call`` (none made), else ``valid`` (tool results, no error)."""
    calls, tool_errors, parse_errors = (b - a for a, b in zip(before, after))
    if parse_errors:
        return "parse_error"
    if tool_errors:
        return "tool_error"
    return "valid" if calls else "no_tool_call"


_SKIP_ORDER = ("parse_error", "tool_error", "no_tool_call")


@dataclass
class _Live:
    state: "Rollout"
    group: int
    index: int  # position in its group
    seen: dict[str, str] = field(default_factory=dict)  # per role: what it observed after its last turn


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
    any_obs = getattr(algo, "branch_after", "any") == "any"
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
        # With branch_after="valid_tool_result" only observations that are valid tool results count;
        # the other points are skipped (counted once the turn after them is played).
        preforks: dict[int, tuple["Rollout", dict[str, str]]] = {}
        skips: dict[int, tuple[str, dict[str, int]]] = {}  # reason, the roles' turn counts before
        branch_ids = {id(x) for x in fresh_branches}
        if algo.branching:
            for x in active:
                trajs = x.state.trajectories
                if id(x) in branch_ids or budget_left(x.group) < Z:
                    continue
                seen = {a: x.seen.get(a, "valid" if any_obs else "no_tool_call")
                        for a in x.state.acting() if trajs[a].turn_spans}
                if not seen:
                    continue
                if not any_obs and "valid" not in seen.values():
                    reason = next(r for r in _SKIP_ORDER if r in seen.values())
                    skips[id(x)] = (reason, {a: len(trajs[a].turn_spans) for a in seen})
                    continue
                pre = x.state.fork()
                if pre.error is None:
                    preforks[id(x)] = (pre, {**x.seen, **seen})
                else:
                    _close(pre)
        # Branches' first turns run in their own call so their prefill is measured alone.
        batches = [[x for x in active if id(x) in branch_ids], [x for x in active if id(x) not in branch_ids]]
        for batch in batches:
            if not batch:
                continue
            before = _prefill([x.state for x in batch])
            counts = [{a: (len(tr.turn_spans), _counts(tr)) for a, tr in x.state.trajectories.items()} for x in batch]
            advance([x.state for x in batch], seed=rng.randrange(2**31), **kw)
            if batch is batches[0]:
                per = (_prefill([x.state for x in batch]) - before) / len(batch)
                for x in batch:
                    groups[x.group].branch_prefill_tokens.append(per)
            for x, was in zip(batch, counts):  # what each role that played will observe next
                for a, tr in x.state.trajectories.items():
                    if len(tr.turn_spans) > was[a][0]:
                        x.seen[a] = observation_kind(was[a][1], _counts(tr))
        fresh_branches = []
        for x in active:
            skip = skips.pop(id(x), None)
            if skip is not None and any(len(x.state.trajectories[a].turn_spans) > n for a, n in skip[1].items()):
                groups[x.group].skipped[skip[0]] = groups[x.group].skipped.get(skip[0], 0) + 1
        # Decide branches from the entropy of the turns just played, all of this round's decisions together.
        deciding: list[tuple[float, _Live, "Rollout", str, dict[str, str]]] = []
        for x in active:
            if id(x) not in preforks:
                continue
            pre, seen = preforks.pop(id(x))
            played = [a for a, t in pre.trajectories.items()
                      if t.turn_spans and len(x.state.trajectories[a].turn_spans) > len(t.turn_spans)
                      and (any_obs or seen.get(a) == "valid")]
            best = max(((algo.delta_h(x.state.trajectories[a]), a) for a in played), default=None,
                       key=lambda c: c[0])
            if best is None:
                _close(pre)
            else:
                deciding.append((best[0], x, pre, seen.get(best[1], "valid"), seen))
        candidates: list[tuple[float, _Live, "Rollout", BranchDecision, dict[str, str]]] = []
        if deciding:
            scores = algo.scores([d for d, *_ in deciding])
            for (delta_h, x, pre, obs, seen_before), score in zip(deciding, scores):
                d = BranchDecision(x.index, delta_h, score, algo.branch_probability(score), observation=obs)
                groups[x.group].decisions.append(d)
                d.drawn = rng.random() < d.p
                if d.drawn:
                    candidates.append((delta_h, x, pre, d, seen_before))
                else:
                    _close(pre)
        candidates.sort(key=lambda c: -c[0])
        for delta_h, x, pre, d, seen_before in candidates:
            if budget_left(x.group) < Z:  # exactly Z siblings per branch point, or none
                _close(pre)
                continue
            d.branched = True
            for c in [pre] + [pre.fork() for _ in range(Z - 1)]:
                shared = {a: len(t.response_ids) for a, t in c.trajectories.items()}
                idx = groups[x.group].add("branch", parent=x.index, shared=shared, delta_h=delta_h)
                live.append(nx := _Live(c, x.group, idx, dict(seen_before)))
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
