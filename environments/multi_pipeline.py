"""MultiPipeline-v0 (handoff pipeline): intake, warehouse and shipping fulfil an order.

``intake_0`` has the customer's order (private notes) and registers it;
``warehouse_0`` packs registered orders; ``shipping_0`` ships packed parcels to
an address it must be told. Each stage needs the previous stage's output (ids
returned by tools), which only reaches the next stage through a handoff message.

Tasks: four hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiPipeline/<k>")``) up to 50: one or two orders against a stock drawn for the task.
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
    wo.status, wo.address, wo.carrier = "shipped", address, carrier
    return f"Shipped {parcel_id} ({wid}) by {carrier} to {address}."


STOCK = {"MUG-RED": 10, "MUG-BLUE": 2, "TEAPOT": 3, "KETTLE": 1}


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(orders: list[tuple[str, str, int, str, str]], stock: dict[str, int] = STOCK,
            seed: int | None = None) -> None:
        notes = " ".join(f"{c} wants {q} x {sku}, to be delivered to {addr}"
                         f"{' urgently' if car == 'express' else ''}." for c, sku, q, addr, car in orders)

        def check(state: PipelineState) -> bool:
            shipped = sorted((w.customer, w.sku, w.quantity, w.address, w.carrier)
                             for w in state.orders.values() if w.status == "shipped")
            return shipped == sorted(orders) and all(w.status == "shipped" for w in state.orders.values())

        steps = []
        for n, (c, sku, q, addr, car) in enumerate(orders, 1):
            steps += [by("intake_0", "register_order", customer=c, sku=sku, quantity=q),
                      by("intake_0", "send_message", to="warehouse_0", content=f"Please pack WO-{n}."),
                      by("intake_0", "send_message", to="shipping_0",
                         content=f"WO-{n} goes to {addr} by {car}."),
                      by("warehouse_0", "pack_order", order_id=f"WO-{n}"),
                      by("warehouse_0", "send_message", to="shipping_0", content=f"WO-{n} is parcel PKG-{n}."),
                      by("shipping_0", "ship_parcel", parcel_id=f"PKG-{n}", address=addr, carrier=car)]
        out.append(Task(
            id=f"pipeline-{len(out):03d}",
            instruction="Fulfil the customer order(s) that intake_0 has received: register, pack and ship each "
                        "one to the right address with the right carrier (express for urgent orders).",
            private={"intake_0": "Order details: " + notes}, initial_state=PipelineState(stock=dict(stock)),
            check=check, solution=steps, metadata={} if seed is None else {"generator_seed": seed}))

    add([("Ines Park", "MUG-RED", 2, "12 Elm St, Springfield", "ground")])
    add([("Tom Okafor", "TEAPOT", 1, "4 Harbour Rd, Portsmouth", "express")])
    add([("Lea Braun", "MUG-BLUE", 2, "88 Hill Ave, Leeds", "ground")])
    add([("Sam Ruiz", "KETTLE", 1, "9 Bay St, Cork", "express"),
         ("Ines Park", "MUG-RED", 4, "12 Elm St, Springfield", "ground")])
    seed = 0
    while len(out) < N_TASKS:
        add(*generate(random.Random(f"MultiPipeline/{seed}")), seed=seed)
        seed += 1
    return out


N_TASKS = 50
_SKUS = ("MUG-RED", "MUG-BLUE", "TEAPOT", "KETTLE", "PLATE-WHITE", "BOWL-GREY", "SPOON-SET", "TRAY-OAK",
         "VASE-TALL", "JUG-CLAY")
_PEOPLE = ("Ines Park", "Tom Okafor", "Lea Braun", "Sam Ruiz", "Ravi Shah", "Mona Lind", "Yuki Mori",
           "Gus Adler", "Zoe Marsh", "Ali Demir", "Ola Berg", "Pia Kurz")
_STREETS = ("Elm St", "Harbour Rd", "Hill Ave", "Bay St", "Mill Lane", "Park Row", "Canal Walk", "Station Rd")
_TOWNS = ("Springfield", "Portsmouth", "Leeds", "Cork", "Galway", "York", "Bergen", "Lyon", "Porto", "Ghent")


def generate(rng: random.Random) -> tuple[list[tuple[str, str, int, str, str]], dict[str, int]]:
    """One or two orders and a stock that can serve them (a scarce item may be exactly used up)."""
    stock = {sku: rng.randint(1, 12) for sku in rng.sample(_SKUS, rng.randint(3, 6))}
    left = dict(stock)
    orders = []
    for _ in range(rng.choice((1, 1, 2))):
        sku = rng.choice([k for k, n in left.items() if n > 0])
        qty = rng.randint(1, min(4, left[sku]))
        left[sku] -= qty
        addr = f"{rng.randint(1, 99)} {rng.choice(_STREETS)}, {rng.choice(_TOWNS)}"
        orders.append((rng.choice(_PEOPLE), sku, qty, addr, rng.choice(("ground", "express"))))
    return orders, stock


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
