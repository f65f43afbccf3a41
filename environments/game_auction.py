"""GameAuction-v0 (zero-sum, hidden values): two bidders in sealed-bid auctions.

Several lots are up for auction at once. Each bidder values every lot privately
(an integer from 0 to 20, drawn independently for each bidder: the other's
values are unknown) and has a budget. A bidder seals one bid per lot
(``bid(lot, amount)``, 0 to decline); bids are binding and count against the
budget. A lot closes when both bids are in: the higher bid wins; a tie leaves
the lot unsold. What the winner pays is the task's format (:data:`FORMATS`):
its own bid (first-price), the other bid (second-price), its own bid with a
public reserve price per lot below which no bid wins (reserve), or every
bidder pays its bid, win or lose (all-pay). A lot only one bidder bid on by the
end of the episode goes to that bidder (an absent opponent loses by default).
The episode ends when every lot has closed.

Payoff (zero-sum): a bidder's surplus is the value of the lots it won minus
what it paid; ``bidder_0`` gets ``(surplus_0 - surplus_1) / scale`` and
``bidder_1`` the negative, where ``scale`` is the sum over lots of the higher
of the two values (clipped to [-1, 1]). Success (the task): the auction
was completed, every lot closed with both bids in.

The expert (:class:`ExpertBidder`) bids the format's equilibrium for two
bidders with uniform values (:func:`expert_bids`: half its value first-price,
its value second-price, value squared over 40 (at least 1) all-pay), within its budget;
the reference solution is expert against expert.
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


FORMATS = ("first", "second", "reserve", "all_pay")


class AuctionState(MultiState):
    lots: list[str]
    budget: dict[str, int]                      # agent -> budget
    bids: dict[str, dict[str, int]] = {}        # lot -> {agent: amount}
    format: str = "first"                       # first | second | reserve | all_pay (FORMATS)
    reserve: dict[str, int] = {}                # lot -> the lowest bid that can win it (format "reserve")


def _other(agent: str) -> str:
    return BIDDERS[1] if agent == BIDDERS[0] else BIDDERS[0]


def _spent(state: AuctionState, agent: str) -> int:
    return sum(b.get(agent, 0) for b in state.bids.values())


def _closed(state: AuctionState, lot: str) -> bool:
    return len(state.bids.get(lot, {})) == len(BIDDERS)


def _result(state: AuctionState, lot: str) -> tuple[str | None, int]:
    """The winner of a lot (``None``: unsold) and the price the winner pays: the higher bid wins (a tie,
    or no bid at or above the lot's reserve, leaves it unsold); it pays its own bid (first-price,
    reserve, all-pay) or the other bid, at least the reserve (second-price)."""
    lot_bids = state.bids.get(lot, {})
    floor = max(1, state.reserve.get(lot, 0))
    offers = {a: b for a, b in lot_bids.items() if b >= floor}
    if not offers:
        return None, 0
    top = max(offers.values())
    winners = [a for a, b in offers.items() if b == top]
    if len(winners) > 1:
        return None, 0
    if state.format == "second":
        return winners[0], max([b for a, b in lot_bids.items() if a != winners[0]] + [state.reserve.get(lot, 0)])
    return winners[0], top


def _paid(state: AuctionState, lot: str) -> dict[str, int]:
    """What each bidder pays for ``lot``: the winner its price; in an all-pay auction everyone its bid."""
    if state.format == "all_pay":
        return dict(state.bids.get(lot, {}))
    winner, price = _result(state, lot)
    return {} if winner is None else {winner: price}


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
    winner, price = _result(state, lot)
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
            winner, price = _result(state, lot)
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
    """Each bidder's value of the lots it won minus what it paid (lots with one bid go to that bidder;
    in an all-pay auction every bid is paid)."""
    out = dict.fromkeys(BIDDERS, 0)
    for lot in state.lots:
        winner, _ = _result(state, lot)
        if winner is not None:
            out[winner] += values[winner][lot]
        for a, paid in _paid(state, lot).items():
            out[a] -= paid
    return out


def payoff(task: Task, state: AuctionState, success: bool) -> dict[str, float]:
    """Zero-sum: bidder_0 gets (surplus_0 - surplus_1) / scale (within [-1, 1]), bidder_1 the negative."""
    values = task.metadata["values"]
    s = surplus(values, state)
    scale = sum(max(values[a][lot] for a in BIDDERS) for lot in state.lots) or 1
    r = round(max(-1.0, min(1.0, (s["bidder_0"] - s["bidder_1"]) / scale)), 4)
    return {"bidder_0": r, "bidder_1": -r if r else 0.0}


def expert_bids(values: dict[str, int], lots: list[str], budget: int, fmt: str = "first",
                reserve: dict[str, int] | None = None) -> dict[str, int]:
    """The expert's sealed bids, scaled down to the budget: half its value (first-price: the
    equilibrium of two bidders with uniform values); its value (second-price: bidding the truth is
    dominant); half its value but at least the reserve where the value exceeds it, else nothing
    (reserve); value squared over twice the top value (all-pay's equilibrium)."""
    reserve = reserve or {}
    if fmt == "second":
        want = {lot: values[lot] for lot in lots}
    elif fmt == "reserve":
        want = {lot: max(values[lot] // 2, reserve.get(lot, 0)) if values[lot] > reserve.get(lot, 0) else 0
                for lot in lots}
    elif fmt == "all_pay":
        want = {lot: max(1, values[lot] ** 2 // (2 * MAX_VALUE)) if values[lot] >= 2 else 0 for lot in lots}
    else:
        want = {lot: values[lot] // 2 for lot in lots}
    total = sum(want.values())
    if total > budget and fmt == "reserve":  # a bid cut below the reserve is wasted: fund the best lots whole
        left, kept = budget, dict.fromkeys(lots, 0)
        for lot in sorted(lots, key=lambda x: (want[x] - values[x], x)):
            if 0 < want[lot] <= left:
                kept[lot], left = want[lot], left - want[lot]
        return kept
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


_RULES = {
    "first": "The higher sealed bid wins a lot and pays its own bid.",
    "second": "The higher sealed bid wins a lot but pays only the other bidder's bid (second-price: bidding what a "
              "lot is worth to you is safe).",
    "reserve": "Every lot has a reserve price ({reserves}): a bid below it cannot win. Above it, the higher sealed "
               "bid wins and pays its own bid.",
    "all_pay": "All-pay rules: the higher sealed bid wins the lot, but BOTH bidders pay what they bid, win or lose.",
}


def draw_reserves(rng: random.Random, lots: list[str], values: dict[str, dict[str, int]]) -> dict[str, int]:
    """Public reserve prices from 2 to 8, drawn until every bidder values some lot at least 2 above its
    reserve (so there is something worth bidding on for both)."""
    top = 8
    while True:
        reserve = {lot: rng.randint(2, top) for lot in lots}
        if all(any(values[a][lot] >= reserve[lot] + 2 for lot in lots) for a in BIDDERS):
            return reserve
        top = max(2, top - 1)


def instruction(lots: list[str], fmt: str, reserve: dict[str, int]) -> str:
    """The task's words: the lots, the auction's rules, how a bidder is scored."""
    rules = _RULES[fmt].format(reserves=", ".join(f"{lot} {reserve[lot]}" for lot in reserve))
    return (f"Sealed-bid auction of {', '.join(lots)} between bidder_0 and bidder_1: bid on every lot (0 declines). "
            f"{rules} You are scored on your surplus (value won minus price paid) against the other bidder's.")


def tasks() -> list[Task]:
    """Fifty auctions; the format cycles through :data:`FORMATS` (task 0 is first-price)."""
    out = []
    for seed in range(N_TASKS):
        rng = random.Random(f"GameAuction/{seed}")
        lots, values, budget = generate(rng)
        fmt = FORMATS[seed % len(FORMATS)]
        reserve = draw_reserves(rng, lots, values) if fmt == "reserve" else {}
        plan = {a: expert_bids(values[a], lots, budget[a], fmt, reserve) for a in BIDDERS}
        solution = [by(a, "bid", lot=lot, amount=plan[a][lot]) for lot in lots for a in BIDDERS]
        out.append(Task(
            id=f"auction-{seed:03d}",
            instruction=(f"Sealed-bid auction of {', '.join(lots)} between bidder_0 and bidder_1: bid on every lot "
                         "(0 declines). The higher bid wins a lot and pays its bid; you are scored on your surplus "
                         "(value won minus price paid) against the other bidder's.") if seed == 0
            else instruction(lots, fmt, reserve),
            private={a: _private(values[a], budget[a]) for a in BIDDERS},
            initial_state=AuctionState(lots=lots, budget=budget, format=fmt, reserve=reserve),
            check=lambda state: all(_closed(state, lot) for lot in state.lots),
            solution=solution, metadata={"values": values, "budget": budget, "generator_seed": seed, "format": fmt}))
    return out


class ExpertBidder:
    """Strong scripted bidder: seals :func:`expert_bids` lot by lot, from its own values and budget
    only (its private notes), then passes."""

    name = "expert"
    stochastic = False

    def act(self, episode: Any, agent: str, seed: int) -> Any:
        task, state = episode.task, episode.state
        plan = expert_bids(task.metadata["values"][agent], state.lots, task.metadata["budget"][agent], state.format,
                           state.reserve)
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
