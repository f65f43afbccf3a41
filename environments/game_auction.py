"""GameAuction-v0 (zero-sum, hidden values): two bidders in sealed-bid first-price auctions.

Several lots are up for auction at once. Each bidder values every lot privately
(an integer from 0 to 20, drawn independently for each bidder: the other's
values are unknown) and has a budget. A bidder seals one bid per lot
(``bid(lot, amount)``, 0 to decline); bids are binding and count against the
budget. A lot closes when both bids are in: the higher bid wins and pays its
own bid; a tie leaves the lot unsold. A lot only one bidder bid on by the end
of the episode goes to that bidder at its bid (an absent opponent loses by
default). The episode ends when every lot has closed.

Payoff (zero-sum): a bidder's surplus is the value of the lots it won minus
what it paid; ``bidder_0`` gets ``(surplus_0 - surplus_1) / scale`` and
``bidder_1`` the negative, where ``scale`` is the sum over lots of the higher
of the two values (so payoffs lie in [-1, 1]). Success (the task): the auction
was completed, every lot closed with both bids in.

The expert (:class:`ExpertBidder`) shades its bids to half its value (the
equilibrium of a two-bidder first-price auction with uniform values),
within its budget; the reference solution is expert against expert.
"""

from __future__ import annotations

import random
from typing import Annotated, Any

from pydantic import Field

import envfactory.faces.pettingzoo_env as multi
from envfactory import ConflictError, MultiState, Role, Task, ToolEnvSpec, ToolError, by, register, tool
from envfactory.checks.scripted import PASS
from envfactory.task import ToolCall
from tools.messaging import TOOLS as MESSAGING

BIDDERS = ("bidder_0", "bidder_1")
N_TASKS = 50
MAX_VALUE = 20


class AuctionState(MultiState):
    lots: list[str]
    budget: dict[str, int]                      # agent -> budget
    bids: dict[str, dict[str, int]] = {}        # lot -> {agent: amount}


def _other(agent: str) -> str:
    return BIDDERS[1] if agent == BIDDERS[0] else BIDDERS[0]


def _spent(state: AuctionState, agent: str) -> int:
    return sum(b.get(agent, 0) for b in state.bids.values())


def _closed(state: AuctionState, lot: str) -> bool:
    return len(state.bids.get(lot, {})) == len(BIDDERS)


def _result(lot_bids: dict[str, int]) -> tuple[str | None, int]:
    """The winner of a lot (``None``: unsold) and the price it pays."""
    offers = {a: b for a, b in lot_bids.items() if b > 0}
    if not offers:
        return None, 0
    top = max(offers.values())
    winners = [a for a, b in offers.items() if b == top]
    return (winners[0], top) if len(winners) == 1 else (None, 0)


@tool
def bid(state: AuctionState, lot: str, amount: Annotated[int, Field(ge=0)]) -> str:
    """Seal your bid on a lot (one bid per lot; 0 declines it). Bids are binding and count against
    your budget; the other bidder learns nothing until the lot closes.

    Args:
        lot: The lot id, like 'lot-1'.
        amount: Your bid, a whole number from 0 to your remaining budget.
    """
    if lot not in state.lots:
        raise ToolError(f"no lot {lot!r}; lots: {', '.join(state.lots)}")
    me = state.acting
    if me in state.bids.get(lot, {}):
        raise ConflictError(f"you already bid on {lot}")
    left = state.budget[me] - _spent(state, me)
    if not 0 <= amount <= left:
        raise ToolError(f"a bid must be between 0 and your remaining budget {left}")
    state.bids.setdefault(lot, {})[me] = amount
    if not _closed(state, lot):
        return f"Sealed {amount} on {lot}; it closes when {_other(me)} has bid. Budget left: {left - amount}."
    winner, price = _result(state.bids[lot])
    theirs = state.bids[lot][_other(me)]
    what = "unsold (tie or no bids)" if winner is None else f"won by {winner} for {price}"
    return f"Sealed {amount} on {lot}. {lot} closed: {what} (the other bid was {theirs}). Budget left: {left - amount}."


@tool(read_only=True)
def auction_status(state: AuctionState) -> str:
    """The lots: which are closed (with both bids and the winner), your own sealed bids, your budget left."""
    me = state.acting
    lines = []
    for lot in state.lots:
        bids = state.bids.get(lot, {})
        if _closed(state, lot):
            winner, price = _result(bids)
            lines.append(f"{lot}: closed, bids {bids}, " + ("unsold" if winner is None else f"won by {winner} for {price}"))
        elif me in bids:
            lines.append(f"{lot}: open; you sealed {bids[me]}")
        else:
            lines.append(f"{lot}: open; you have not bid")
    lines.append(f"Budget left: {state.budget[me] - _spent(state, me)}")
    return "\n".join(lines)


def legal_moves(state: AuctionState, agent: str) -> list[ToolCall]:
    """The bids ``agent`` may seal now: any whole amount from 0 to its remaining budget on each lot it
    has not bid on yet."""
    left = state.budget[agent] - _spent(state, agent)
    return [ToolCall("bid", {"lot": lot, "amount": a}) for lot in state.lots if agent not in state.bids.get(lot, {})
            for a in range(left + 1)]


def surplus(values: dict[str, dict[str, int]], state: AuctionState) -> dict[str, int]:
    """Each bidder's value of the lots it won minus what it paid (lots with one bid go to that bidder)."""
    out = dict.fromkeys(BIDDERS, 0)
    for lot in state.lots:
        winner, price = _result(state.bids.get(lot, {}))
        if winner is not None:
            out[winner] += values[winner][lot] - price
    return out


def payoff(task: Task, state: AuctionState, success: bool) -> dict[str, float]:
    """Zero-sum: bidder_0 gets (surplus_0 - surplus_1) / scale, bidder_1 the negative."""
    values = task.metadata["values"]
    s = surplus(values, state)
    scale = sum(max(values[a][lot] for a in BIDDERS) for lot in state.lots) or 1
    r = round((s["bidder_0"] - s["bidder_1"]) / scale, 4)
    return {"bidder_0": r, "bidder_1": -r if r else 0.0}


def expert_bids(values: dict[str, int], lots: list[str], budget: int) -> dict[str, int]:
    """The expert's sealed bids: half its value on each lot (rounded down), scaled down to the budget."""
    want = {lot: values[lot] // 2 for lot in lots}
    total = sum(want.values())
    if total > budget:
        want = {lot: b * budget // total for lot, b in want.items()}
    return want


def _private(values: dict[str, int], budget: int) -> str:
    return (f"Your values: {values} (the other bidder's values are independent draws from 0 to {MAX_VALUE}, "
            f"unknown to you). Your budget is {budget}; your bids together may not exceed it.")


def generate(rng: random.Random) -> tuple[list[str], dict[str, dict[str, int]], dict[str, int]]:
    """Lots, each bidder's private values and budgets."""
    lots = [f"lot-{k}" for k in range(1, rng.randint(3, 5) + 1)]
    values = {a: {lot: rng.randint(0, MAX_VALUE) for lot in lots} for a in BIDDERS}
    budget = {a: max(5, int(sum(values[a].values()) * rng.uniform(0.3, 0.6))) for a in BIDDERS}
    return lots, values, budget


def tasks() -> list[Task]:
    out = []
    for seed in range(N_TASKS):
        lots, values, budget = generate(random.Random(f"GameAuction/{seed}"))
        plan = {a: expert_bids(values[a], lots, budget[a]) for a in BIDDERS}
        solution = [by(a, "bid", lot=lot, amount=plan[a][lot]) for lot in lots for a in BIDDERS]
        out.append(Task(
            id=f"auction-{seed:03d}",
            instruction=f"Sealed-bid auction of {', '.join(lots)} between bidder_0 and bidder_1: bid on every lot "
                        "(0 declines). The higher bid wins a lot and pays its bid; you are scored on your surplus "
                        "(value won minus price paid) against the other bidder's.",
            private={a: _private(values[a], budget[a]) for a in BIDDERS},
            initial_state=AuctionState(lots=lots, budget=budget),
            check=lambda state: all(_closed(state, lot) for lot in state.lots),
            solution=solution, metadata={"values": values, "budget": budget, "generator_seed": seed}))
    return out


class ExpertBidder:
    """Strong scripted bidder: seals :func:`expert_bids` lot by lot, from its own values and budget
    only (its private notes), then passes."""

    name = "expert"
    stochastic = False

    def act(self, episode: Any, agent: str, seed: int) -> Any:
        task, state = episode.task, episode.state
        plan = expert_bids(task.metadata["values"][agent], state.lots, task.metadata["budget"][agent])
        for lot in state.lots:
            if agent not in state.bids.get(lot, {}):
                return ToolCall("bid", {"lot": lot, "amount": plan[lot]}).to_hermes()
        return PASS


class NaiveBidder:
    """Weak scripted bidder (a rating baseline): bids its value minus one on each lot in order, as
    long as its budget lasts: it wins often and gains little."""

    name = "naive"
    stochastic = False

    def act(self, episode: Any, agent: str, seed: int) -> Any:
        task, state = episode.task, episode.state
        values = task.metadata["values"][agent]
        left = state.budget[agent] - _spent(state, agent)
        for lot in state.lots:
            if agent not in state.bids.get(lot, {}):
                return ToolCall("bid", {"lot": lot, "amount": max(0, min(values[lot] - 1, left))}).to_hermes()
        return PASS


SPEC = register(ToolEnvSpec(
    name="GameAuction-v0",
    domain="auction",
    description="Zero-sum: two bidders with private values and budgets in sealed-bid first-price auctions.",
    state_type=AuctionState,
    roles=[Role(b, "a bidder: win lots for less than they are worth to you (see your private notes); you are "
                "scored on your surplus minus the other bidder's", [bid, auction_status]) for b in BIDDERS],
    tools=MESSAGING,
    tasks=tasks,
    max_turns=12,
    terminal=lambda state: all(_closed(state, lot) for lot in state.lots),
    payoff=payoff,
    legal_actions=legal_moves,
    metadata={"competitive": True, "zero_sum": True, "expert": ExpertBidder, "policies": {"naive": NaiveBidder}},
))


def env(**kwargs: Any) -> Any:
    """PettingZoo AEC env of GameAuction-v0."""
    return multi.env(SPEC.name, **kwargs)


def parallel_env(**kwargs: Any) -> Any:
    """PettingZoo Parallel env of GameAuction-v0."""
    return multi.parallel_env(SPEC.name, **kwargs)
