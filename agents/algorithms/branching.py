"""The group sampler: ``M`` rollouts per task for one agent or a team, all tasks batched together,
with ARPO's entropy-triggered branching (forking every role's token prefix and the episode) when the
algorithm branches. The settings it reads, and the entropy arithmetic, are in
:mod:`agents.algorithms.objectives`."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agents.algorithms.advantages import Lineage
from agents.algorithms.objectives import Algorithm, RunningScale

if TYPE_CHECKING:
    from agents.rollout import Rollout, Team, Trajectory

__all__ = ["Group", "BranchDecision", "sample_groups", "observation_kind"]

ObservationKind = Literal["valid", "tool_error", "parse_error", "no_tool_call"]


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
                  max_context: int | None = None, scale: RunningScale | None = None) -> list[Group]:
    """Roll out ``algo.M`` episodes of each ``(episode, task)`` with ``team``, all tasks batched together.

    Each task's opening is rendered once (on the given episode, which is reset) and
    every rollout plays on its own fork, so the episode is left untouched afterwards
    apart from that reset (it is never closed here, even when its reset failed).
    ``max_context`` bounds every role's sequence (see :func:`agents.rollout.advance`);
    a rollout cut by it is still judged on its state. ``scale``: ARPO's running ``ΔH`` scale
    (``scale="run"``), updated in place; the Trainer passes the one it keeps for its run; without
    one, a fresh scale for this call. Returns one :class:`Group` per task, in order.
    """
    from agents.rollout import advance, start

    rng = random.Random(seed)
    if scale is None and hasattr(algo, "running_scale"):
        scale = algo.running_scale()
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
            scores = algo.scores([d for d, *_ in deciding], scale)
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
