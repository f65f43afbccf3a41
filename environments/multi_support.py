"""MultiSupport-v0 (information asymmetry): a customer and a support agent resolve a complaint.

``customer_0`` knows what went wrong and holds the PIN that authorizes refunds
(private notes), but cannot see the shop's systems. ``support_0`` can search
orders and open refund requests, but does not know which order the complaint is
about, and cannot authorize a refund. Each knows what the other needs.

Tasks: four hand-written ones, then generated ones (:func:`generate`, seeded
``random.Random("MultiSupport/<k>")``) up to 50: a shop with 2-3 customers' orders and a PIN
drawn for the task, cycling through the goals of :data:`GOALS`: a complaint (full, half or
partial refund); two orders at once; a returns policy with a restocking fee; a price match; a
caller acting for the family member who ordered; a cap on the refund; a discount code not
applied; a duplicate charge; a late-delivery credit; a faulty batch. The amount owed follows from
the goal, what the customer says and the prices that only support can see; the check compares
the refunds authorized with it.
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


_BASE_INSTRUCTION = ("A customer has a complaint about an order. Resolve it: the right order must be refunded by the "
                     "right amount, authorized by the customer.")

# Generated goals: the instruction each one gives (the amounts follow from it, from what only the
# customer knows and from the prices only support can see).
GOALS: dict[str, str] = {
    "complaint": _BASE_INSTRUCTION,
    "two": "A customer writes in about two orders that went wrong. Refund each of them by what the customer is owed, "
           "with the customer authorizing every refund.",
    "restocking": "Apply the returns policy to the customer's request: an item that arrived damaged or never arrived "
                  "is refunded in full; an item sent back because the customer changed their mind gets its price "
                  "back minus a 20% restocking fee (to the nearest cent). The customer authorizes the refund.",
    "price_match": "We match competitors' prices for 30 days after a purchase. The customer found something they "
                   "bought from us cheaper elsewhere: refund the difference between what they paid and the "
                   "competitor's price, on that order, authorized by the customer.",
    "proxy": "Someone is contacting support on behalf of the family member who placed an order. Find the order under "
             "the name of the person who placed it and refund what is owed; the caller authorizes the refund with "
             "the PIN they were given.",
    "cap": "Support may refund at most $40.00 on one order without a manager, and no manager is in today: refund what "
           "the customer is owed, but no more than $40.00, on the right order; the customer authorizes it.",
    "coupon": "A customer's discount code was not applied at checkout. Refund the discount it should have given (its "
              "percentage of that order's price, to the nearest cent) on that order, authorized by the customer.",
    "duplicate": "A customer was charged twice for the same purchase. Refund the duplicate, the later of the two "
                 "identical orders, in full, and nothing else; the customer authorizes it.",
    "late": "Our delivery promise: an order that arrives late earns 10% of its price back (to the nearest cent). "
            "Credit the customer for the order that came late; the customer authorizes the credit.",
    "batch": "A customer's whole batch of one product turned out faulty. Refund in full every order of that product "
             "the customer placed, and nothing else, each refund authorized by the customer.",
}


def _pct(cents: int, pct: int) -> int:
    return (cents * pct + 50) // 100


def tasks() -> list[Task]:
    out: list[Task] = []

    def add(customer: str, pin: str, problem: str, order: str, amount: float,
            orders: list[tuple[str, str, str, int]] = _ORDERS, seed: int | None = None) -> None:
        add_goal(customer, pin, problem, [(order, round(amount * 100))], orders, seed)

    def add_goal(customer: str, pin: str, problem: str, refunds: list[tuple[str, int]],
                 orders: list[tuple[str, str, str, int]] = _ORDERS, seed: int | None = None,
                 goal: str = "complaint", caller: str | None = None) -> None:
        wanted = sorted(refunds)

        def check(state: SupportState) -> bool:
            done = sorted((r.order_id, r.amount_cents) for r in state.refunds.values() if r.status == "refunded")
            return done == wanted

        me = caller or customer
        intro = f"I am {me}" + (f", writing for {customer}, who placed the order" if caller else "") + "."
        ids = [f"R-{k}" for k in range(1, len(refunds) + 1)]
        solution = [by("customer_0", "send_message", to="support_0", content=f"{intro} {problem}"),
                    by("support_0", "search_orders", customer=customer)]
        solution += [by("support_0", "open_refund", order_id=o, amount=c / 100, reason=problem) for o, c in refunds]
        solution.append(by("support_0", "send_message", to="customer_0",
                           content=f"Refund request{'s' if len(ids) > 1 else ''} {' and '.join(ids)} "
                                   f"{'are' if len(ids) > 1 else 'is'} open; please authorize."))
        solution += [by("customer_0", "authorize_refund", request_id=r, pin=pin) for r in ids]
        who = (f"You are {caller}, contacting the shop for {customer}, who placed the order and gave you the refund "
               f"PIN.") if caller else f"You are {customer}."
        out.append(Task(
            id=f"support-{len(out):03d}",
            instruction=_BASE_INSTRUCTION if seed is None else GOALS[goal],
            private={"customer_0": f"{who} {problem} Your refund PIN is {pin}; never share it.",
                     "support_0": "You do not know yet who the customer is or what went wrong; ask them."},
            initial_state=world(pin, orders), check=check,
            metadata={} if seed is None else {"generator_seed": seed, "goal": goal},
            solution=solution))

    add("Dana Wu", "4821", "My blue kettle arrived broken; I want the full price back.", "O-501", 49.99)
    add("Dana Wu", "4821", "The descaler I ordered leaked in the box; please refund it.", "O-503", 8.99)
    add("Omar Haddad", "7310", "One of my two desk lamps flickers; I was told to ask for half its price back.",
        "O-504", 17.75)
    add("Omar Haddad", "7310", "The lamp bulb never arrived. I want a refund for it.", "O-505", 6.50)
    seed = 0
    while len(out) < N_TASKS:
        goal = list(GOALS)[seed % len(GOALS)]
        customer, pin, problem, refunds, orders, caller = generate(random.Random(f"MultiSupport/{seed}"), goal)
        add_goal(customer, pin, problem, refunds, orders, seed=seed, goal=goal, caller=caller)
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


def generate(rng: random.Random, goal: str = "complaint") -> tuple:
    """One procedurally generated case for ``goal``: ``(customer, pin, problem, refunds, orders, caller)``,
    where ``refunds`` lists the ``(order id, cents)`` the goal owes, ``problem`` is what the customer
    (or ``caller``, for ``proxy``) says, and the shop holds 2-3 customers' orders."""
    customers = rng.sample(_CUSTOMERS, rng.randint(2, 3))
    orders: list[tuple[str, str, str, int]] = []
    for c in customers:
        for item, cents in rng.sample(_ITEMS, rng.randint(2, 4)):
            orders.append((f"O-{601 + len(orders)}", c, item, cents))
    oid, customer, item, cents = rng.choice(orders)
    pin = f"{rng.randint(0, 9999):04d}"
    caller = None
    if goal == "complaint":
        how, text = rng.choice(_PROBLEMS)
        refund = cents if how == "full" else cents // 2 if how == "half" else min(cents - 1, 100 * rng.randint(1, 5))
        problem = text.format(item=item, extra=f"{refund / 100:.2f}")
        return customer, pin, problem, [(oid, refund)], orders, caller
    if goal in ("two", "duplicate", "batch"):
        if goal == "two":
            other = rng.choice([o for o in orders if o[1] == customer and o[0] != oid])
            problem = (f"My {item} arrived broken, I want the full price back. And the {other[2]} never arrived, "
                       "so please refund that too.")
            return customer, pin, problem, [(oid, cents), (other[0], other[3])], orders, caller
        twin = (f"O-{601 + len(orders)}", customer, item, cents)
        orders.append(twin)  # the same product again, ordered later
        if goal == "duplicate":
            problem = f"I was charged twice for my {item}: I only meant to buy one."
            return customer, pin, problem, [(twin[0], cents)], orders, caller
        problem = f"Every {item} I bought from you is faulty; I have two and neither works. I want my money back."
        return customer, pin, problem, [(oid, cents), (twin[0], cents)], orders, caller
    if goal == "restocking":
        if rng.random() < 0.5:
            problem = f"I changed my mind about the {item} and want to send it back."
            return customer, pin, problem, [(oid, _pct(cents, 80))], orders, caller
        problem = rng.choice((f"My {item} arrived damaged.", f"My {item} never arrived."))
        return customer, pin, problem, [(oid, cents)], orders, caller
    if goal == "price_match":
        seen = rng.randint(cents // 2, cents - 100)
        seen -= seen % 25
        problem = f"Last week I bought the {item} from you, and now I see it for ${seen / 100:.2f} at another shop."
        return customer, pin, problem, [(oid, cents - seen)], orders, caller
    if goal == "proxy":
        caller = rng.choice([c for c in _CUSTOMERS if c not in customers])
        problem = f"The {item} {customer} ordered arrived broken; {customer} wants the full price back."
        return customer, pin, problem, [(oid, cents)], orders, caller
    if goal == "cap":
        if rng.random() < 0.7:  # mostly the dearest order, so the cap bites
            oid, customer, item, cents = max(orders, key=lambda o: o[3])
        problem = f"My {item} arrived broken; I want the full price back."
        return customer, pin, problem, [(oid, min(cents, 4000))], orders, caller
    if goal == "coupon":
        pct = rng.choice((10, 15, 20, 25))
        problem = f"I had a {pct}% discount code for my {item}, but it was not applied when I paid."
        return customer, pin, problem, [(oid, _pct(cents, pct))], orders, caller
    if goal == "late":
        problem = f"My {item} arrived {rng.randint(3, 12)} days after the promised date."
        return customer, pin, problem, [(oid, _pct(cents, 10))], orders, caller
    raise ValueError(f"no goal {goal!r}")


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
