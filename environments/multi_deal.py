"""MultiDeal-v0 (mixed motive): two traders split a pool of items with private valuations.

A "Deal or No Deal" negotiation (Lewis et al., 2017). Each trader values books,
hats and balls differently and has a private walk-away value. A trader
proposes which items it keeps (the other side gets the rest); the other side
accepts a proposal addressed to it, which closes the deal. The joint task
succeeds when a deal is closed that gives both sides at least their walk-away
value; each trader's own reward is the share of its total value it obtained.

Tasks: four hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiDeal/<k>")``) up to 50: pools of 5-7 items, values worth 10 to each
trader, walk-away values just below the Nash-bargaining split, which is the reference deal.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

from pydantic import BaseModel

import envfactory.faces.pettingzoo_env as multi
from envfactory import ConflictError, MultiState, Role, Task, ToolEnvSpec, ToolError, by, register, tool
from tools.messaging import TOOLS as MESSAGING

ITEMS = ("books", "hats", "balls")
TRADERS = ("trader_0", "trader_1")


class Proposal(BaseModel):
    id: str
    proposer: str
    keep: dict[str, int]          # what the proposer keeps
    status: str = "open"          # open | replaced | accepted


class DealState(MultiState):
    pool: dict[str, int]
    proposals: list[Proposal] = []
    deal: dict[str, dict[str, int]] | None = None   # agent -> items


def _other(agent: str) -> str:
    return TRADERS[1] if agent == TRADERS[0] else TRADERS[0]


@tool
def propose(state: DealState, books: int, hats: int, balls: int) -> str:
    """Propose a split: the numbers of items YOU keep; the other trader gets the rest.

    Args:
        books: Books you keep.
        hats: Hats you keep.
        balls: Balls you keep.
    """
    if state.deal is not None:
        raise ConflictError("the deal is already closed")
    keep = {"books": books, "hats": hats, "balls": balls}
    for item, n in keep.items():
        if not 0 <= n <= state.pool[item]:
            raise ToolError(f"{item} must be between 0 and {state.pool[item]}")
    for p in state.proposals:
        if p.proposer == state.acting and p.status == "open":
            p.status = "replaced"
    pid = f"P-{len(state.proposals) + 1}"
    state.proposals.append(Proposal(id=pid, proposer=state.acting, keep=keep))
    rest = {i: state.pool[i] - keep[i] for i in ITEMS}
    return f"Proposal {pid} sent to {_other(state.acting)}: you keep {keep}, they get {rest}."


@tool
def accept(state: DealState, proposal_id: str) -> str:
    """Accept the other trader's proposal; this closes the deal.

    Args:
        proposal_id: The proposal id, like 'P-1'.
    """
    p = next((p for p in state.proposals if p.id == proposal_id), None)
    if p is None:
        raise ToolError(f"no proposal {proposal_id!r}")
    if p.proposer == state.acting:
        raise ToolError("you cannot accept your own proposal; the other trader must")
    if state.deal is not None or p.status != "open":
        raise ConflictError(f"proposal {proposal_id} is {p.status if state.deal is None else 'closed'}")
    p.status = "accepted"
    state.deal = {p.proposer: dict(p.keep),
                  state.acting: {i: state.pool[i] - p.keep[i] for i in ITEMS}}
    return f"Deal closed on {proposal_id}."


@tool(read_only=True)
def list_proposals(state: DealState) -> str:
    """List every proposal so far with its status."""
    return "\n".join(f"{p.id} by {p.proposer}: keeps {p.keep} ({p.status})" for p in state.proposals) or \
        "No proposals yet."


def _value(values: dict[str, int], items: dict[str, int]) -> int:
    return sum(values[i] * items[i] for i in ITEMS)


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(pool: dict[str, int], values: dict[str, dict[str, int]], walk: dict[str, int],
            keep0: dict[str, int], seed: int | None = None) -> None:
        def check(state: DealState) -> bool:
            return state.deal is not None and all(_value(values[a], state.deal[a]) >= walk[a] for a in TRADERS)

        notes = {a: f"Your values per item: {values[a]} (the other trader's values differ and are unknown to "
                    f"you). Walk-away value: {walk[a]}; a deal worth less to you than that is worse than none. "
                    f"The pool is {pool}." for a in TRADERS}
        rest = {i: pool[i] - keep0[i] for i in ITEMS}
        task = Task(
            id=f"deal-{len(out):03d}",
            instruction=f"Negotiate how to split a pool of items {pool} between trader_0 and trader_1. "
                        "A deal needs one side's proposal and the other's acceptance.",
            private=notes, initial_state=DealState(pool=dict(pool)), check=check,
            metadata={"values": values, "walk": walk, **({} if seed is None else {"generator_seed": seed})},
            solution=[by("trader_0", "send_message", to="trader_1",
                         content=f"My values are {values['trader_0']}. What do you value?"),
                      by("trader_1", "send_message", to="trader_0", content=f"My values are {values['trader_1']}."),
                      by("trader_0", "propose", **keep0),
                      by("trader_1", "accept", proposal_id="P-1")])
        out.append(task)
        assert all(_value(values[a], d) >= walk[a] for a, d in (("trader_0", keep0), ("trader_1", rest)))

    add({"books": 3, "hats": 2, "balls": 1}, {"trader_0": {"books": 2, "hats": 2, "balls": 0},
                                               "trader_1": {"books": 0, "hats": 2, "balls": 6}},
        {"trader_0": 6, "trader_1": 8}, {"books": 3, "hats": 1, "balls": 0})
    add({"books": 1, "hats": 3, "balls": 2}, {"trader_0": {"books": 4, "hats": 0, "balls": 3},
                                               "trader_1": {"books": 1, "hats": 3, "balls": 0}},
        {"trader_0": 8, "trader_1": 7}, {"books": 1, "hats": 0, "balls": 2})
    add({"books": 2, "hats": 2, "balls": 2}, {"trader_0": {"books": 1, "hats": 2, "balls": 2},
                                               "trader_1": {"books": 3, "hats": 1, "balls": 1}},
        {"trader_0": 6, "trader_1": 6}, {"books": 0, "hats": 2, "balls": 1})
    add({"books": 4, "hats": 1, "balls": 1}, {"trader_0": {"books": 1, "hats": 4, "balls": 2},
                                               "trader_1": {"books": 2, "hats": 0, "balls": 2}},
        {"trader_0": 6, "trader_1": 6}, {"books": 1, "hats": 1, "balls": 1})
    seed = 0
    while len(out) < N_TASKS:
        add(*generate(random.Random(f"MultiDeal/{seed}")), seed=seed)
        seed += 1
    return out


N_TASKS = 50


def _values(rng: random.Random, pool: dict[str, int], total: int = 10) -> dict[str, int]:
    """Per-item values (integers) worth ``total`` for the whole pool, as in Lewis et al. (2017)."""
    while True:
        v = {i: rng.randint(0, total) for i in ITEMS}
        if _value(v, pool) == total and sum(x > 0 for x in v.values()) >= 2:
            return v


def generate(rng: random.Random) -> tuple:
    """A pool of 5-7 items, private values worth 10 to each trader, walk-away values, and the
    reference split: the one maximising the product of both sides' values (Nash bargaining)."""
    while True:
        pool = {i: rng.randint(1, 4) for i in ITEMS}
        if 5 <= sum(pool.values()) <= 7:
            break
    values = {a: _values(rng, pool) for a in TRADERS}
    splits = [dict(zip(ITEMS, k)) for k in itertools.product(*(range(pool[i] + 1) for i in ITEMS))]

    def worth(keep0: dict[str, int]) -> tuple[int, int]:
        return _value(values["trader_0"], keep0), _value(values["trader_1"], {i: pool[i] - keep0[i] for i in ITEMS})

    best = max(splits, key=lambda k: (worth(k)[0] * worth(k)[1], -abs(worth(k)[0] - worth(k)[1])))
    v0, v1 = worth(best)
    walk = {"trader_0": max(1, v0 - rng.randint(1, 3)), "trader_1": max(1, v1 - rng.randint(1, 3))}
    return pool, values, walk, best


def payoff(task: Task, state: DealState, success: bool) -> dict[str, float]:
    """Each trader's share of its own total value of the pool (0 without a deal)."""
    if state.deal is None:
        return dict.fromkeys(TRADERS, 0.0)
    values = task.metadata["values"]
    return {a: round(_value(values[a], state.deal[a]) / _value(values[a], state.pool), 4) for a in TRADERS}


SPEC = register(ToolEnvSpec(
    name="MultiDeal-v0",
    domain="negotiation",
    description="Mixed motive: two traders with private valuations split items; each is paid its own share.",
    state_type=DealState,
    roles=[Role(t, "a trader: get as much value for yourself as you can, but a deal below your walk-away value "
                "is worse than none (see your private notes)", [propose, accept, list_proposals]) for t in TRADERS],
    tools=MESSAGING,
    tasks=tasks,
    max_turns=8,
    terminal=lambda state: state.deal is not None,
    payoff=payoff,
))


def env(**kwargs: Any) -> Any:
    """PettingZoo AEC env of MultiDeal-v0."""
    return multi.env(SPEC.name, **kwargs)


def parallel_env(**kwargs: Any) -> Any:
    """PettingZoo Parallel env of MultiDeal-v0."""
    return multi.parallel_env(SPEC.name, **kwargs)
