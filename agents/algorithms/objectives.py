"""GRPO, ARPO and the RFT control as values behind one small protocol (:class:`Algorithm`).

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

  Where it branches (``branch_after``): by default only after a valid tool
  result (``"valid_tool_result"``, this project's choice; the ARPO reference
  implementation branches after every tool result, failed ones included,
  which ``"any"`` reproduces): the
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
  weight ``scale_ema``, kept in a :class:`RunningScale` that the sampler's caller owns (the
  :class:`~agents.trainer.Trainer` for its whole run; one :func:`~agents.algorithms.branching.sample_groups`
  call otherwise), never on the ARPO value; the first round uses its own RMS), so ``β`` sets how far entropy moves ``P`` and, when entropy generally
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

The objects here are settings, frozen values: a :class:`~agents.train_config.TrainerConfig` that
holds one compares equal before and after training. The sampler that plays the groups, ARPO's
branching included, is :mod:`agents.algorithms.branching`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, Sequence

from agents.algorithms.advantages import Lineage, group_advantages, hard_token_advantages, soft_token_advantages

if TYPE_CHECKING:
    from agents.rollout import Trajectory

__all__ = ["Algorithm", "ARPO", "GRPO", "RFT", "RunningScale", "initial_entropy", "turn_entropy", "standardize"]

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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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
        branch_after: ``"valid_tool_result"`` (default): branch only at an observation answering
            a turn whose tool calls all succeeded (at least one call, no tool or parse error);
            ``"any"``: after every observation, failed calls included (as the ARPO reference
            implementation does).
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

    def scores(self, delta_hs: Sequence[float], scale: "RunningScale | None" = None) -> list[float]:
        """The ``ΔĤ`` of a round's decisions (probability mode with ``standardize``): their ``ΔH``
        over the running RMS (``scale="run"``: ``scale`` is updated with this round; without one,
        the round's own RMS) or their z-scores (``"zscore"``); else the raw ``ΔH``."""
        if not (self.mode == "probability" and self.standardize):
            return [float(d) for d in delta_hs]
        if self.scale == "zscore":
            return standardize(delta_hs)
        if not delta_hs:
            return []
        s = (scale if scale is not None else self.running_scale()).update(delta_hs)
        return [float(d) / s if s > 1e-8 else 0.0 for d in delta_hs]

    def branch_probabilities(self, delta_hs: Sequence[float], scale: "RunningScale | None" = None) -> list[float]:
        """``P`` of each of a sampling round's branching decisions, from their raw ``ΔH``."""
        return [self.branch_probability(x) for x in self.scores(delta_hs, scale)]

    def running_scale(self) -> "RunningScale":
        """A fresh running scale of ``ΔH`` for a run (``scale="run"``), weighted by ``scale_ema``."""
        return RunningScale(self.scale_ema)

    def delta_h(self, traj: "Trajectory") -> float:
        """``ΔH = H_t − H_initial`` of a trajectory's last turn."""
        return turn_entropy(traj, self.k) - initial_entropy(traj, self.k)

    def token_advantages(self, adv: Sequence[float], lengths: Sequence[int], lineage: Lineage) -> list[list[float]]:
        if self.attribution == "hard":
            return hard_token_advantages(adv, lengths, lineage)
        return soft_token_advantages(adv, lengths)


@dataclass
class RunningScale:
    """The running RMS of ``ΔH`` over a run's sampling rounds (ARPO's ``scale="run"``): run state,
    owned by whoever runs the rounds (the Trainer saves it with its checkpoints), never by the
    ARPO settings.

    Attributes:
        ema: The weight of each new round's mean ``ΔH²`` (1: the round's own RMS only).
        mean_square: The running mean of ``ΔH²`` (``None`` before the first round).
    """

    ema: float = 0.1
    mean_square: float | None = None

    def update(self, delta_hs: Sequence[float]) -> float:
        """Fold one round's ``ΔH`` into the running mean square; return the scale (its root)."""
        ms = sum(d * d for d in delta_hs) / len(delta_hs)
        prev = self.mean_square
        self.mean_square = ms if prev is None else (1.0 - self.ema) * prev + self.ema * ms
        return math.sqrt(self.mean_square)


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
