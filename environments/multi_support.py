"""MultiSupport-v0 (information asymmetry): a customer and a support agent resolve a complaint.

``customer_0`` knows what went wrong and holds the PIN that authorizes refunds
(private notes), but cannot see the shop's systems. ``support_0`` can search
orders and open refund requests, but does not know which order the complaint is
about, and cannot authorize a refund. Each knows what the other needs.

Tasks: four hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiSupport/<k>")``) up to 50: a shop with 2-3 customers' orders, one
complaint (full, half or partial refund) and a PIN drawn for the task.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel

import envfactory.faces.pettingzoo_env as multi
from envfactory import ConflictError, MultiState, Role, Task, ToolEnvSpec, ToolError, by, register, tool
from tools.messaging import TOOLS as MESSAGING


class Order(BaseModel):
    id: str
    customer: str
    item: str
    amount_cents: int
    status: str = "delivered"


class Refund(BaseModel):
    id: str
    order_id: str
    amount_cents: int
    reason: str
    status: str = "pending"


class SupportState(MultiState):
    orders: dict[str, Order]
    refunds: dict[str, Refund] = {}
    pin: str


def _money(cents: int) -> str:
    return f"{cents / 100:.2f}"


@tool(read_only=True)
def search_orders(state: SupportState, customer: str) -> str:
    """List a customer's orders.

    Args:
        customer: The customer's full name.
    """
    hits = [o for o in state.orders.values() if o.customer.lower() == customer.lower()]
    return "\n".join(f"{o.id} | {o.item} | {_money(o.amount_cents)} | {o.status}" for o in hits) or \
        f"No orders for {customer!r}."


@tool
def open_refund(state: SupportState, order_id: str, amount: float, reason: str) -> str:
    """Open a refund request; it takes effect once the customer authorizes it.

    Args:
        order_id: The order id, like 'O-501'.
        amount: Amount to refund, in dollars.
        reason: Why.
    """
    order = state.orders.get(order_id)
    if order is None:
        raise ToolError(f"no order {order_id!r}; find it with search_orders")
    cents = round(amount * 100)
    if not 0 < cents <= order.amount_cents:
        raise ToolError(f"a refund must be between 0.01 and the order total {_money(order.amount_cents)}")
    if any(r.order_id == order_id and r.status != "cancelled" for r in state.refunds.values()):
        raise ConflictError(f"order {order_id} already has a refund request")
    rid = f"R-{len(state.refunds) + 1}"
    state.refunds[rid] = Refund(id=rid, order_id=order_id, amount_cents=cents, reason=reason)
    return f"Refund request {rid} opened for {_money(cents)} on {order_id}; the customer must authorize it."


@tool
def authorize_refund(state: SupportState, request_id: str, pin: str) -> str:
    """Authorize a refund request with your PIN; the money is then returned.

    Args:
        request_id: The refund request id, like 'R-1'.
        pin: Your 4-digit refund PIN.
    """
    r = state.refunds.get(request_id)
    if r is None:
        raise ToolError(f"no refund request {request_id!r}; ask support for its id")
    if pin != state.pin:
        raise ToolError("wrong PIN")
    if r.status != "pending":
        raise ConflictError(f"request {request_id} is already {r.status}")
    r.status = "refunded"
    state.orders[r.order_id].status = "refunded"
    return f"Refund {request_id} authorized: {_money(r.amount_cents)} returned."


_ORDERS = [("O-501", "Dana Wu", "blue kettle", 4999), ("O-502", "Dana Wu", "tea cups (set of 4)", 2400),
           ("O-503", "Dana Wu", "kettle descaler", 899), ("O-504", "Omar Haddad", "desk lamp", 3550),
           ("O-505", "Omar Haddad", "lamp bulb", 650), ("O-506", "Omar Haddad", "desk lamp", 3550)]


def world(pin: str, orders: list[tuple[str, str, str, int]] = _ORDERS) -> SupportState:
    return SupportState(orders={i: Order(id=i, customer=c, item=it, amount_cents=a) for i, c, it, a in orders},
                        pin=pin)


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(customer: str, pin: str, problem: str, order: str, amount: float,
            orders: list[tuple[str, str, str, int]] = _ORDERS, seed: int | None = None) -> None:
        cents = round(amount * 100)

        def check(state: SupportState) -> bool:
            done = [r for r in state.refunds.values() if r.status == "refunded"]
            return len(done) == 1 and done[0].order_id == order and done[0].amount_cents == cents

        out.append(Task(
            id=f"support-{len(out):03d}",
            instruction="A customer has a complaint about an order. Resolve it: the right order must be refunded "
                        "by the right amount, authorized by the customer.",
            private={"customer_0": f"You are {customer}. {problem} Your refund PIN is {pin}; never share it.",
                     "support_0": "You do not know yet who the customer is or what went wrong; ask them."},
            initial_state=world(pin, orders), check=check,
            metadata={} if seed is None else {"generator_seed": seed},
            solution=[by("customer_0", "send_message", to="support_0", content=f"I am {customer}. {problem}"),
                      by("support_0", "search_orders", customer=customer),
                      by("support_0", "open_refund", order_id=order, amount=amount, reason=problem),
                      by("support_0", "send_message", to="customer_0",
                         content="Refund request R-1 is open; please authorize it."),
                      by("customer_0", "authorize_refund", request_id="R-1", pin=pin)]))

    add("Dana Wu", "4821", "My blue kettle arrived broken; I want the full price back.", "O-501", 49.99)
    add("Dana Wu", "4821", "The descaler I ordered leaked in the box; please refund it.", "O-503", 8.99)
    add("Omar Haddad", "7310", "One of my two desk lamps flickers; I was told to ask for half its price back.",
        "O-504", 17.75)
    add("Omar Haddad", "7310", "The lamp bulb never arrived. I want a refund for it.", "O-505", 6.50)
    seed = 0
    while len(out) < N_TASKS:
        add(*generate(random.Random(f"MultiSupport/{seed}")), seed=seed)
        seed += 1
    return out


N_TASKS = 50
_CUSTOMERS = ("Dana Wu", "Omar Haddad", "Lucia Ferri", "Kwame Mensah", "Hana Sato", "Piotr Nowak", "Aisha Bello",
              "Mikael Berg", "Sofia Reyes", "Tariq Aziz", "Nora Kim", "Emeka Obi")
_ITEMS = [("blue kettle", 4999), ("tea cups (set of 4)", 2400), ("kettle descaler", 899), ("desk lamp", 3550),
          ("lamp bulb", 650), ("wool blanket", 6200), ("chef knife", 7400), ("cutting board", 2250),
          ("french press", 3100), ("coffee grinder", 8900), ("linen napkins", 1800), ("water filter", 2799),
          ("toaster", 4550), ("glass jar", 575), ("bath towel", 1999), ("table runner", 1525)]
_PROBLEMS = [
    ("full", "My {item} arrived broken; I want the full price back."),
    ("full", "The {item} I ordered never arrived. Please refund it."),
    ("full", "I received the wrong item instead of my {item}; refund it in full, please."),
    ("half", "My {item} has a scratch; I was told to ask for half its price back."),
    ("half", "The {item} works but is the wrong colour; I agreed to keep it for half its price back."),
    ("part", "I was charged {extra} too much for my {item}; please refund the difference."),
]


def generate(rng: random.Random) -> tuple:
    """One procedurally generated complaint: (customer, pin, problem, order, amount, orders)."""
    customers = rng.sample(_CUSTOMERS, rng.randint(2, 3))
    orders: list[tuple[str, str, str, int]] = []
    for c in customers:
        for item, cents in rng.sample(_ITEMS, rng.randint(2, 4)):
            orders.append((f"O-{601 + len(orders)}", c, item, cents))
    oid, customer, item, cents = rng.choice(orders)
    how, text = rng.choice(_PROBLEMS)
    if how == "full":
        refund = cents
    elif how == "half":
        refund = cents // 2
    else:
        refund = min(cents - 1, 100 * rng.randint(1, 5))
    problem = text.format(item=item, extra=f"{refund / 100:.2f}")
    pin = f"{rng.randint(0, 9999):04d}"
    return customer, pin, problem, oid, refund / 100, orders


SPEC = register(ToolEnvSpec(
    name="MultiSupport-v0",
    domain="support",
    description="Information asymmetry: the customer knows the problem and the PIN; support has the order system.",
    state_type=SupportState,
    roles=[Role("customer_0", "the customer: you know your problem (see your private notes) and hold the PIN that "
                "authorizes refunds, but you cannot see the shop's systems", [authorize_refund]),
           Role("support_0", "the support agent: you can search orders and open refund requests; only the "
                "customer can authorize them", [search_orders, open_refund])],
    tools=MESSAGING,
    tasks=tasks,
    max_turns=10,
))


def env(**kwargs: Any) -> Any:
    """PettingZoo AEC env of MultiSupport-v0."""
    return multi.env(SPEC.name, **kwargs)


def parallel_env(**kwargs: Any) -> Any:
    """PettingZoo Parallel env of MultiSupport-v0."""
    return multi.parallel_env(SPEC.name, **kwargs)
