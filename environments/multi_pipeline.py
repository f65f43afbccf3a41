"""MultiPipeline-v0 (handoff pipeline): intake, warehouse and shipping fulfil an order.

``intake_0`` has the customer's order (private notes) and registers it;
``warehouse_0`` packs registered orders; ``shipping_0`` ships packed parcels to
an address it must be told. Each stage needs the previous stage's output (ids
returned by tools), which only reaches the next stage through a handoff message.

Tasks: four hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiPipeline/<k>")``) up to 50, cycling through the goals of :data:`GOALS`: ship
everything; ship only the urgent orders; everything express, or everything ground; leave out a
cancelled order; ship a gift to its recipient; hold an unpaid order in the warehouse; fill only
what the stock allows (the stock is the warehouse's to see); ship to a changed address; a carrier
rule by town; a cap on the quantity; a rush (4-5 orders, each clerk does one job per round, the
last truck leaves at the end of round N + 3: only the three stations working in parallel make it;
one agent holding every tool and note cannot, see :mod:`envfactory.checks.merged`). :func:`outcome`
says what each goal makes of each order, and the check compares every work order with it.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel

import envfactory.faces.pettingzoo_env as multi
from envfactory import ConflictError, MultiState, Role, Task, ToolEnvSpec, ToolError, by, register, tool
from tools.messaging import TOOLS as MESSAGING


class WorkOrder(BaseModel):
    id: str
    customer: str
    sku: str
    quantity: int
    status: str = "registered"       # registered -> packed -> shipped
    package: str | None = None
    address: str | None = None
    carrier: str | None = None


class PipelineState(MultiState):
    stock: dict[str, int]
    orders: dict[str, WorkOrder] = {}
    packages: dict[str, str] = {}    # package id -> work order id
    one_job: bool = False            # rush tasks: each clerk does one job (register, pack, ship) per round
    deadline: int = 0                # rush tasks: the last round in which a parcel can ship (0: none)
    jobs: dict[str, int] = {}        # clerk -> the round of its last job


def _job(state: PipelineState) -> None:
    """Count a job for the acting clerk (rush tasks allow one per round each)."""
    if state.one_job:
        if state.jobs.get(state.acting) == state.round:
            raise ToolError("you already did a job this round: each clerk can register, pack or ship only once "
                            "per round")
        state.jobs[state.acting] = state.round


@tool
def register_order(state: PipelineState, customer: str, sku: str, quantity: int) -> str:
    """Register a customer's order; returns its work-order id.

    Args:
        customer: The customer's name.
        sku: The product code, like 'MUG-RED'.
        quantity: How many.
    """
    if quantity < 1:
        raise ToolError("quantity must be at least 1")
    _job(state)
    wid = f"WO-{len(state.orders) + 1}"
    state.orders[wid] = WorkOrder(id=wid, customer=customer, sku=sku.upper(), quantity=quantity)
    return f"Registered work order {wid}: {quantity} x {sku.upper()} for {customer}."


@tool(read_only=True)
def list_stock(state: PipelineState) -> str:
    """List the products in stock."""
    return "\n".join(f"{sku}: {n}" for sku, n in state.stock.items())


@tool
def pack_order(state: PipelineState, order_id: str) -> str:
    """Pick and pack a registered work order; returns the parcel id.

    Args:
        order_id: The work-order id, like 'WO-1'.
    """
    wo = state.orders.get(order_id)
    if wo is None:
        raise ToolError(f"no work order {order_id!r}; intake_0 registers orders and gives their ids")
    if wo.status != "registered":
        raise ConflictError(f"{order_id} is already {wo.status}")
    if state.stock.get(wo.sku, 0) < wo.quantity:
        raise ToolError(f"not enough {wo.sku} in stock ({state.stock.get(wo.sku, 0)} left)")
    _job(state)
    state.stock[wo.sku] -= wo.quantity
    pid = f"PKG-{len(state.packages) + 1}"
    state.packages[pid] = order_id
    wo.status, wo.package = "packed", pid
    return f"Packed {order_id} into parcel {pid}."


@tool
def ship_parcel(state: PipelineState, parcel_id: str, address: str, carrier: Literal["ground", "express"]) -> str:
    """Ship a packed parcel.

    Args:
        parcel_id: The parcel id, like 'PKG-1'.
        address: The delivery address.
        carrier: 'ground' or 'express' (for urgent orders).
    """
    wid = state.packages.get(parcel_id)
    if wid is None:
        raise ToolError(f"no parcel {parcel_id!r}; warehouse_0 packs orders and gives parcel ids")
    wo = state.orders[wid]
    if wo.status == "shipped":
        raise ConflictError(f"parcel {parcel_id} was already shipped")
    if state.deadline and state.round > state.deadline:
        raise ConflictError(f"the last truck left at the end of round {state.deadline}; nothing ships any more")
    _job(state)
    wo.status, wo.address, wo.carrier = "shipped", address, carrier
    return f"Shipped {parcel_id} ({wid}) by {carrier} to {address}."


STOCK = {"MUG-RED": 10, "MUG-BLUE": 2, "TEAPOT": 3, "KETTLE": 1}


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(orders: list[tuple[str, str, int, str, str]], stock: dict[str, int] = STOCK,
            seed: int | None = None) -> None:
        """A hand-written task: every order ships (express for the urgent ones)."""
        placed = [PlacedOrder(customer=c, sku=sku, quantity=q, address=addr, urgent=car == "express")
                  for c, sku, q, addr, car in orders]
        notes = " ".join(f"{c} wants {q} x {sku}, to be delivered to {addr}"
                         f"{' urgently' if car == 'express' else ''}." for c, sku, q, addr, car in orders)
        add_goal(placed, stock, "ship_all", None, seed, notes=notes,
                 instruction="Fulfil the customer order(s) that intake_0 has received: register, pack and ship "
                             "each one to the right address with the right carrier (express for urgent orders).")

    def add_goal(placed: list[PlacedOrder], stock: dict[str, int], goal: str, param: Any, seed: int | None,
                 notes: str | None = None, instruction: str | None = None) -> None:
        wanted = [(o, outcome(goal, param, o, stock)) for o in placed]
        meta: dict[str, Any] = {} if seed is None else {"generator_seed": seed, "goal": goal}
        if goal == "rush":
            # the pipelined reference is a turn-order schedule (the scripted oracle plays one step of
            # the joint plan at a time, so in simultaneous rounds it cannot overlap the stations); one
            # agent holding every tool does one job per round: 3 per order, past the deadline
            meta.update(modes=["aec"], deadline=param, jobs=3 * len(placed))
        expected = sorted((o.customer, o.sku, q, status, addr, car) for o, (status, q, addr, car) in wanted
                          if status != "absent")

        def check(state: PipelineState) -> bool:
            got = sorted((w.customer, w.sku, w.quantity, w.status, w.address, w.carrier)
                         for w in state.orders.values())
            return got == expected

        steps, wo, pkg = [], 0, 0
        if goal == "rush":  # one hand-over up front, then one order per round through all three stations
            plan = "; ".join(f"WO-{k} = {q} x {o.sku} for {o.customer}, to {addr} by {car}"
                             for k, (o, (_, q, addr, car)) in enumerate(wanted, 1))
            steps.append(by("intake_0", "send_message", to="all",
                            content=f"I register one order per round, in this order: {plan}. Pack WO-k as parcel "
                                    "PKG-k and ship it the same round."))
            for k, (o, (_, q, addr, car)) in enumerate(wanted, 1):
                steps += [by("intake_0", "register_order", customer=o.customer, sku=o.sku, quantity=q),
                          by("warehouse_0", "pack_order", order_id=f"WO-{k}"),
                          by("shipping_0", "ship_parcel", parcel_id=f"PKG-{k}", address=addr, carrier=car)]
            wanted = []
        for o, (status, q, addr, car) in wanted:
            if status == "absent":
                continue
            wo += 1
            steps.append(by("intake_0", "register_order", customer=o.customer, sku=o.sku, quantity=q))
            if status == "registered":
                steps += [by("warehouse_0", "list_stock"),
                          by("warehouse_0", "send_message", to="intake_0",
                             content=f"WO-{wo} cannot be filled: not enough {o.sku} in stock.")]
                continue
            steps.append(by("intake_0", "send_message", to="warehouse_0", content=f"Please pack WO-{wo}."))
            if status == "shipped":
                steps.append(by("intake_0", "send_message", to="shipping_0",
                                content=f"WO-{wo} goes to {addr} by {car}."))
            pkg += 1
            steps.append(by("warehouse_0", "pack_order", order_id=f"WO-{wo}"))
            if status == "shipped":
                steps += [by("warehouse_0", "send_message", to="shipping_0", content=f"WO-{wo} is parcel PKG-{pkg}."),
                          by("shipping_0", "ship_parcel", parcel_id=f"PKG-{pkg}", address=addr, carrier=car)]
        out.append(Task(
            id=f"pipeline-{len(out):03d}",
            instruction=instruction or GOALS[goal][0](param, len(placed)),
            private={"intake_0": "Order details: " + (notes or " ".join(note(o) for o in placed))},
            initial_state=PipelineState(stock=dict(stock), one_job=goal == "rush",
                                        deadline=param if goal == "rush" else 0),
            check=check, solution=steps, metadata=meta))

    add([("Ines Park", "MUG-RED", 2, "12 Elm St, Springfield", "ground")])
    add([("Tom Okafor", "TEAPOT", 1, "4 Harbour Rd, Portsmouth", "express")])
    add([("Lea Braun", "MUG-BLUE", 2, "88 Hill Ave, Leeds", "ground")])
    add([("Sam Ruiz", "KETTLE", 1, "9 Bay St, Cork", "express"),
         ("Ines Park", "MUG-RED", 4, "12 Elm St, Springfield", "ground")])
    seed = 0
    while len(out) < N_TASKS:
        goal = list(GOALS)[seed % len(GOALS)]
        placed, stock, param = generate(random.Random(f"MultiPipeline/{seed}"), goal)
        add_goal(placed, stock, goal, param, seed)
        seed += 1
    return out


N_TASKS = 50
_SKUS = ("MUG-RED", "MUG-BLUE", "TEAPOT", "KETTLE", "PLATE-WHITE", "BOWL-GREY", "SPOON-SET", "TRAY-OAK",
         "VASE-TALL", "JUG-CLAY")
_PEOPLE = ("Ines Park", "Tom Okafor", "Lea Braun", "Sam Ruiz", "Ravi Shah", "Mona Lind", "Yuki Mori",
           "Gus Adler", "Zoe Marsh", "Ali Demir", "Ola Berg", "Pia Kurz")
_STREETS = ("Elm St", "Harbour Rd", "Hill Ave", "Bay St", "Mill Lane", "Park Row", "Canal Walk", "Station Rd")
_TOWNS = ("Springfield", "Portsmouth", "Leeds", "Cork", "Galway", "York", "Bergen", "Lyon", "Porto", "Ghent")

# The goals of generated tasks: ``(instruction(param, n_orders), orders needed)``. What each goal makes
# of every order (shipped where and how, left packed or registered, or not registered) is :func:`outcome`.
GOALS: dict[str, tuple[Any, int]] = {
    "ship_all": (lambda p, n: f"Intake has just taken {'an order' if n == 1 else f'{n} orders'} by phone. Get "
                              f"{'it' if n == 1 else 'each one'} registered, packed and shipped to the address the "
                              "customer gave: express if the customer said it is urgent, ground otherwise.", 1),
    "urgent_only": (lambda p, n: "Only today's urgent orders leave the building: ship those by express. Every other "
                                 "order intake received is registered and packed, and waits on the shelf for "
                                 "tomorrow's ground run.", 2),
    "priority": (lambda p, n: "These customers are on our priority plan: every order intake received goes out by "
                              "express to the customer's address, urgent or not.", 2),
    "ground_only": (lambda p, n: "The express courier is on strike today. Ship every order intake received by "
                                 "ground, the ones the customers called urgent included.", 2),
    "cancelled": (lambda p, n: "Fulfil the orders intake took (express for urgent ones, ground otherwise), but "
                               "leave out any order the customer has cancelled since: it must not even be "
                               "registered.", 2),
    "gift": (lambda p, n: "One of today's orders is a gift. Ship every order to the person who will receive it "
                          "(for the gift, the recipient, not the buyer), express when urgent and ground otherwise.",
             2),
    "hold": (lambda p, n: "Register and pack every order intake received, but ship only the paid ones (by express "
                          "if urgent, else ground); an order whose payment is still pending stays packed in the "
                          "warehouse.", 2),
    "stock_short": (lambda p, n: "Fulfil what the stock allows. An order the warehouse cannot fill from stock stays "
                                 "registered and is not packed; every other order ships, express if urgent.", 2),
    "address_change": (lambda p, n: "Ship intake's orders to where each customer wants them now: a customer who "
                                    "changed the delivery address after ordering gets the parcel at the newer "
                                    "address. Express for urgent orders, ground otherwise.", 2),
    "town_rule": (lambda p, n: f"Our same-day courier only serves {p}: a parcel for an address in {p} goes by "
                               "express, every other parcel by ground, whatever the customer said about urgency.",
                  2),
    "rush": (lambda p, n: f"The carrier's last truck of the day leaves at the end of round {p}: all {n} orders intake "
                          "took must be registered, packed and shipped by then (express if urgent, ground "
                          "otherwise). Each of you can do only one job (register, pack or ship) per round, so work "
                          "in parallel.", 4),
    "cap": (lambda p, n: "This week a customer may buy at most two of any product: register each order for two "
                         "units if more were asked (the quantity asked for otherwise), then pack and ship it, "
                         "express if urgent.", 2),
}


class PlacedOrder(BaseModel):
    """An order as intake took it, with what the goal's story adds to it."""

    customer: str
    sku: str
    quantity: int
    address: str
    urgent: bool
    cancelled: bool = False
    hold: bool = False
    gift_to: str | None = None       # the recipient's name
    gift_address: str | None = None
    new_address: str | None = None


def note(o: PlacedOrder) -> str:
    """How intake's private notes describe an order."""
    base = f"{o.customer} wants {o.quantity} x {o.sku}"
    if o.cancelled:
        return f"{o.customer} ordered {o.quantity} x {o.sku} for {o.address}, then phoned back to cancel it."
    if o.gift_to:
        text = (f"{base} as a gift for {o.gift_to}, who lives at {o.gift_address} ({o.customer}'s own address is "
                f"{o.address})")
    elif o.new_address:
        text = f"{base}, to be delivered to {o.address}; later {o.customer} wrote to say: send it to {o.new_address}"
    else:
        text = f"{base}, to be delivered to {o.address}"
    text = ("Urgent: " if o.urgent else "") + text
    return text + (" (payment still pending)." if o.hold else ".")


def outcome(goal: str, param: Any, o: PlacedOrder, stock: dict[str, int]) -> tuple[str, int, str | None, str | None]:
    """What ``goal`` wants of order ``o``: ``(status, quantity, address, carrier)``; status ``absent``
    (never registered), ``registered``, ``packed`` or ``shipped``."""
    qty = min(o.quantity, 2) if goal == "cap" else o.quantity
    carrier = "express" if o.urgent else "ground"
    if goal == "priority":
        carrier = "express"
    elif goal == "ground_only":
        carrier = "ground"
    elif goal == "town_rule":
        carrier = "express" if o.address.endswith(f", {param}") else "ground"
    if o.cancelled:
        return "absent", qty, None, None
    if goal == "stock_short" and stock.get(o.sku, 0) < qty:
        return "registered", qty, None, None
    if o.hold or (goal == "urgent_only" and not o.urgent):
        return "packed", qty, None, None
    return "shipped", qty, o.gift_address or o.new_address or o.address, carrier


def _address(rng: random.Random, town: str | None = None) -> str:
    return f"{rng.randint(1, 99)} {rng.choice(_STREETS)}, {town or rng.choice(_TOWNS)}"


def generate(rng: random.Random, goal: str = "ship_all") -> tuple[list[PlacedOrder], dict[str, int], Any]:
    """Orders (as many as the goal needs, or one more), a stock and the goal's parameter (a town), drawn
    so that the goal makes a difference: an urgent and a non-urgent order, one cancelled, a gift, a
    pending payment, an order the stock cannot fill, a changed address, orders in and out of the town,
    a quantity above the cap. At least one order always ships."""
    n = rng.randint(4, 5) if goal == "rush" else max(GOALS[goal][1], rng.choice((1, 1, 2)))
    stock = {sku: rng.randint(2, 12) for sku in rng.sample(_SKUS, rng.randint(3, 6))}
    left = dict(stock)
    orders = []
    param = rng.choice(_TOWNS) if goal == "town_rule" else n + 3 if goal == "rush" else None
    for k in range(n):
        sku = rng.choice([x for x, q in left.items() if q > 0])
        qty = rng.randint(1, min(4, left[sku]))
        if goal == "cap" and k == 0:
            qty = rng.randint(3, 4)
            stock[sku] = left[sku] = max(left[sku], qty)
        left[sku] -= qty
        town = (param if k == 0 else rng.choice([t for t in _TOWNS if t != param])) if goal == "town_rule" else None
        urgent = rng.random() < 0.5
        if goal in ("urgent_only", "priority", "ground_only", "town_rule"):
            urgent = k == 0 if goal in ("urgent_only", "ground_only") else k != 0  # the goal overrides the urge
        customer = rng.choice([p for p in _PEOPLE if all(p != o.customer for o in orders)])
        orders.append(PlacedOrder(customer=customer, sku=sku, quantity=qty, address=_address(rng, town), urgent=urgent))
    last = orders[-1]
    if goal == "cancelled":
        last.cancelled = True
    elif goal == "gift":
        last.gift_to = rng.choice([p for p in _PEOPLE if all(p != o.customer for o in orders)])
        last.gift_address = _address(rng)
    elif goal == "hold":
        last.hold = True
    elif goal == "address_change":
        last.new_address = _address(rng)
    elif goal == "stock_short":
        short = rng.choice([x for x in _SKUS if all(x != o.sku for o in orders)])
        stock[short] = rng.randint(0, 2)
        last.sku, last.quantity = short, stock[short] + rng.randint(1, 3)
    rng.shuffle(orders)
    return orders, stock, param


SPEC = register(ToolEnvSpec(
    name="MultiPipeline-v0",
    domain="fulfilment",
    description="Handoff pipeline: intake registers, warehouse packs, shipping ships; ids pass by message.",
    state_type=PipelineState,
    roles=[Role("intake_0", "the intake clerk: you have the customer's order (private notes) and register it",
                [register_order]),
           Role("warehouse_0", "the warehouse packer: you pack registered work orders into parcels",
                [list_stock, pack_order]),
           Role("shipping_0", "the shipping clerk: you ship packed parcels to the address you are given",
                [ship_parcel])],
    tools=MESSAGING,
    tasks=tasks,
    max_turns=16,
))


def env(**kwargs: Any) -> Any:
    """PettingZoo AEC env of MultiPipeline-v0."""
    return multi.env(SPEC.name, **kwargs)


def parallel_env(**kwargs: Any) -> Any:
    """PettingZoo Parallel env of MultiPipeline-v0."""
    return multi.parallel_env(SPEC.name, **kwargs)
