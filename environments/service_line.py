"""ServiceLine-v0: an online shop's support line, as conversations with a customer who holds facts.

Each task is a :class:`~envfactory.conversation.Conversation` with the customer of Fernhill Home (an
online homeware shop). The customer states a situation and a goal ("I ordered a desk lamp on Monday
but I'm moving out before it's due -- can it go to my new place instead?"), then, once that is done,
a follow-up (update the phone number on the account, return an item from another order, ...), and
in some tasks a change of mind ("Actually, cancel the desk lamp altogether") whose reference undoes
or changes the earlier action.

The customer holds 2-4 facts only they know, which the reference calls need and no message
contains: the account's email or the order number (to find them), the postcode the account was
registered with (``verify_customer``: no change is made on an unverified customer), and, by
request, the address they are moving to or their new mobile phone. The scripted user tells a fact
when the agent's words name it. Every world holds 14-18 customers with 30-50 orders, the same items
ordered by several of them: without the facts an agent cannot tell whose order is meant.

Checks: the state after every user turn (``("state",)``), the final state, and on some tasks a
number the agent must read from a tool and tell the customer (a refund amount, a delivery date:
``Conversation.communicate``).

Each task carries a *twin* (``metadata["conversation_twin"]``): another customer of the same world
whose orders fit the same messages (the same items, statuses and dates), with their own facts and
reference. An agent that never asks sees the same messages and tool results in both, so it can
solve at most one; :func:`twin_task` builds the twin as a task of its own.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any, Literal

from pydantic import BaseModel, Field

from envfactory import State, Task, ToolEnvSpec, ToolError, call, register, tool
from envfactory.conversation import Conversation, UserTurn
from envfactory.state import state_hash
from envfactory.task import ToolCall

__all__ = ["N_TASKS", "SPEC", "TODAY", "TOOLS", "ShopState", "oracle_transcript", "tasks", "twin_task"]

TODAY = dt.date(2024, 6, 6)  # a Thursday
N_TASKS = 72
RETURN_DAYS = 30
REROUTE_DAYS = 2  # a redirected parcel arrives this many days later


# -- the world ----------------------------------------------------------------------------------------
class Item(BaseModel):
    name: str
    price: int  # pence
    returned: bool = False


class Order(BaseModel):
    number: str
    customer: str
    placed: str  # ISO dates
    status: Literal["processing", "shipped", "delivered", "cancelled"]
    items: list[Item]
    shipping: int  # pence
    delivery: str  # expected (processing, shipped) or actual (delivered) delivery date
    ship_to: str
    history: list[str] = Field(default_factory=list)


class Customer(BaseModel):
    id: str
    name: str
    email: str
    postcode: str  # the postcode the account was registered with (identity check)
    address: str  # the address on file
    phone: str


class Refund(BaseModel):
    order: str
    amount: int  # pence
    reason: str  # "cancellation" or "return of <item>"
    status: Literal["issued", "voided"] = "issued"


class ShopState(State):
    today: str
    customers: dict[str, Customer]
    orders: dict[str, Order]
    refunds: list[Refund] = Field(default_factory=list)
    verified: list[str] = Field(default_factory=list)  # customers who passed verify_customer


def money(pence: int) -> str:
    """Pence as pounds: 5295 -> '52.95'."""
    return f"{pence // 100}.{pence % 100:02d}"


def _day(iso: str) -> str:
    d = dt.date.fromisoformat(iso)
    return f"{d:%a} {d.day} {d:%B} {d.year}"


def _said_date(iso: str) -> str:
    """How a date is told to the customer (and checked as communicated): '8 June'."""
    d = dt.date.fromisoformat(iso)
    return f"{d.day} {d:%B}"


# -- tools --------------------------------------------------------------------------------------------
def _customer(state: Any, customer_id: str) -> Customer:
    c = state.customers.get(customer_id.strip().upper())
    if c is None:
        raise ToolError(f"no customer {customer_id!r}")
    return c


def _order(state: Any, order_number: str) -> Order:
    o = state.orders.get(order_number.strip().upper())
    if o is None:
        raise ToolError(f"no order {order_number!r}")
    return o


def _verified(state: Any, customer_id: str) -> None:
    if customer_id not in state.verified:
        raise ToolError(f"customer {customer_id} is not verified: call verify_customer with the postcode "
                        "their account was registered with before changing anything")


def _item(order: Order, item: str) -> Item:
    want = " ".join(item.lower().split())
    exact = [i for i in order.items if i.name.lower() == want]
    found = exact or [i for i in order.items if want and want in i.name.lower()]
    if len(found) != 1:
        names = ", ".join(i.name for i in order.items)
        raise ToolError(f"order {order.number} has no single item {item!r}; its items: {names}")
    return found[0]


def _total(order: Order) -> int:
    return sum(i.price for i in order.items if not i.returned) + order.shipping


def _show_customer(state: Any, c: Customer) -> str:
    ok = c.id in state.verified
    lines = [f"Customer {c.id}: {c.name}", f"Email: {c.email}",
             "Identity: verified" if ok else "Identity: not verified (verify_customer before any change)",
             f"Address on file: {c.address if ok else '(shown once the customer is verified)'}",
             f"Phone: {c.phone if ok else '(shown once the customer is verified)'}", "Orders:"]
    mine = sorted((o for o in state.orders.values() if o.customer == c.id), key=lambda o: (o.placed, o.number))
    for o in mine:
        lines.append(f"- {o.number}, placed {_day(o.placed)}, {o.status}: " + ", ".join(i.name for i in o.items))
    if not mine:
        lines.append("- none")
    return "\n".join(lines)


@tool(read_only=True)
def find_customer(state: Any, email: str) -> str:
    """Find a customer by the email address on their account; shows their id, name and orders.

    Args:
        email: The email address on the customer's account.
    """
    want = email.strip().lower()
    for c in state.customers.values():
        if c.email == want:
            return _show_customer(state, c)
    raise ToolError(f"no customer with the email {email!r}")


@tool(read_only=True)
def get_customer(state: Any, customer_id: str) -> str:
    """Show a customer: name, email, orders, and (once verified) the address and phone on file.

    Args:
        customer_id: The customer's id, e.g. 'C-214'.
    """
    return _show_customer(state, _customer(state, customer_id))


@tool(read_only=True)
def get_order(state: Any, order_number: str) -> str:
    """Show an order: its customer, status, items and prices, delivery date, delivery address (once the
    customer is verified) and refunds.

    Args:
        order_number: The order number, e.g. 'W-48213'.
    """
    o = _order(state, order_number)
    ok = o.customer in state.verified
    lines = [f"Order {o.number} for customer {o.customer}", f"Placed: {_day(o.placed)}", f"Status: {o.status}",
             "Items:"]
    lines += [f"- {i.name}: £{money(i.price)}" + (" (returned)" if i.returned else "") for i in o.items]
    lines += [f"Shipping: £{money(o.shipping)}", f"Total: £{money(_total(o))}"]
    if o.status == "delivered":
        lines.append(f"Delivered: {_day(o.delivery)}")
    elif o.status != "cancelled":
        lines.append(f"Expected delivery: {_day(o.delivery)}")
    lines.append(f"Deliver to: {o.ship_to if ok else '(shown once the customer is verified)'}")
    for r in state.refunds:
        if r.order == o.number:
            lines.append(f"Refund: £{money(r.amount)} for {r.reason} ({r.status})")
    return "\n".join(lines)


@tool
def verify_customer(state: Any, customer_id: str, postcode: str) -> str:
    """Verify that the caller is the customer: the postcode must be the one their account was registered
    with. Needed once per customer before any change to their account or orders.

    Args:
        customer_id: The customer's id, e.g. 'C-214'.
        postcode: The postcode the customer gives.
    """
    c = _customer(state, customer_id)
    if "".join(postcode.upper().split()) != "".join(c.postcode.split()):
        raise ToolError(f"that postcode does not match the account of customer {c.id}")
    if c.id not in state.verified:
        state.verified = sorted([*state.verified, c.id])
    return f"Customer {c.id} ({c.name}) is verified."


@tool
def change_delivery_address(state: Any, order_number: str, address: str) -> str:
    """Send an order that has not shipped yet to another address. The parcel is re-routed: it arrives
    two days later than planned.

    Args:
        order_number: The order number.
        address: The full new delivery address, with the postcode.
    """
    o = _order(state, order_number)
    _verified(state, o.customer)
    if o.status != "processing":
        raise ToolError(f"order {o.number} is {o.status}: only an order that has not shipped can be re-addressed")
    address = " ".join(address.split())
    if not address:
        raise ToolError("give the full new address")
    if address.lower() == o.ship_to.lower():
        raise ToolError(f"order {o.number} already goes to {o.ship_to}")
    o.ship_to = address
    o.delivery = (dt.date.fromisoformat(o.delivery) + dt.timedelta(days=REROUTE_DAYS)).isoformat()
    o.history.append(f"delivery address changed to {address}; now due {o.delivery}")
    return f"Order {o.number} will go to {address}. New expected delivery: {_day(o.delivery)}."


@tool
def reschedule_delivery(state: Any, order_number: str, date: str) -> str:
    """Ask the courier to deliver a shipped order on another day (within the next 14 days, not a Sunday).

    Args:
        order_number: The order number.
        date: The new delivery day, as YYYY-MM-DD.
    """
    o = _order(state, order_number)
    _verified(state, o.customer)
    if o.status != "shipped":
        raise ToolError(f"order {o.number} is {o.status}: only a shipped order's delivery can be rescheduled")
    try:
        day = dt.date.fromisoformat(date.strip())
    except ValueError:
        raise ToolError(f"date {date!r} is not YYYY-MM-DD") from None
    today = dt.date.fromisoformat(state.today)
    if not today < day <= today + dt.timedelta(days=14):
        raise ToolError(f"the courier delivers from tomorrow to 14 days ahead (today is {_day(state.today)})")
    if day.weekday() == 6:
        raise ToolError("the courier does not deliver on Sundays")
    if day.isoformat() == o.delivery:
        raise ToolError(f"order {o.number} is already due on {_day(o.delivery)}")
    o.delivery = day.isoformat()
    o.history.append(f"delivery rescheduled to {o.delivery}")
    return f"Order {o.number} will now be delivered on {_day(o.delivery)}."


@tool
def cancel_order(state: Any, order_number: str) -> str:
    """Cancel an order that has not shipped yet; its total (items and shipping) is refunded to the card.

    Args:
        order_number: The order number.
    """
    o = _order(state, order_number)
    _verified(state, o.customer)
    if o.status != "processing":
        raise ToolError(f"order {o.number} is {o.status}: only an order that has not shipped can be cancelled")
    amount = _total(o)
    o.status = "cancelled"
    o.history.append("cancelled at the customer's request")
    state.refunds.append(Refund(order=o.number, amount=amount, reason="cancellation"))
    return f"Order {o.number} is cancelled. Refund: £{money(amount)} to the original card."


@tool
def restore_order(state: Any, order_number: str) -> str:
    """Undo the cancellation of an order cancelled on this call: the order goes back to processing and
    its cancellation refund is voided.

    Args:
        order_number: The order number.
    """
    o = _order(state, order_number)
    _verified(state, o.customer)
    refund = next((r for r in state.refunds if r.order == o.number and r.reason == "cancellation"
                   and r.status == "issued"), None)
    if o.status != "cancelled" or refund is None:
        raise ToolError(f"order {o.number} has no cancellation that can be undone")
    o.status = "processing"
    refund.status = "voided"
    o.history.append("cancellation undone at the customer's request")
    return f"Order {o.number} is back in processing; the refund of £{money(refund.amount)} is voided."


@tool
def return_item(state: Any, order_number: str, item: str) -> str:
    """Return one item of a delivered order (within 30 days of delivery) for a refund of its price
    (shipping is not refunded).

    Args:
        order_number: The order number.
        item: The item's name, as the order lists it.
    """
    o = _order(state, order_number)
    _verified(state, o.customer)
    if o.status != "delivered":
        raise ToolError(f"order {o.number} is {o.status}: only delivered items can be returned")
    if dt.date.fromisoformat(o.delivery) + dt.timedelta(days=RETURN_DAYS) < dt.date.fromisoformat(state.today):
        raise ToolError(f"order {o.number} was delivered more than {RETURN_DAYS} days ago: too late to return")
    it = _item(o, item)
    if it.returned:
        raise ToolError(f"the {it.name} of order {o.number} is already being returned")
    it.returned = True
    o.history.append(f"return of {it.name} opened")
    state.refunds.append(Refund(order=o.number, amount=it.price, reason=f"return of {it.name}"))
    return (f"Return opened for the {it.name} of order {o.number}; a label is on its way. "
            f"Refund: £{money(it.price)} to the original card.")


@tool
def cancel_return(state: Any, order_number: str, item: str) -> str:
    """Cancel a return opened on this call: the customer keeps the item and the refund is voided.

    Args:
        order_number: The order number.
        item: The item's name, as the order lists it.
    """
    o = _order(state, order_number)
    _verified(state, o.customer)
    it = _item(o, item)
    refund = next((r for r in state.refunds if r.order == o.number and r.reason == f"return of {it.name}"
                   and r.status == "issued"), None)
    if not it.returned or refund is None:
        raise ToolError(f"the {it.name} of order {o.number} has no open return")
    it.returned = False
    refund.status = "voided"
    o.history.append(f"return of {it.name} cancelled")
    return f"The return of the {it.name} is cancelled; the refund of £{money(refund.amount)} is voided."


@tool
def update_account_address(state: Any, customer_id: str, address: str) -> str:
    """Change the address on a customer's account (used for future orders; orders already placed keep
    their own delivery address).

    Args:
        customer_id: The customer's id.
        address: The full new address, with the postcode.
    """
    c = _customer(state, customer_id)
    _verified(state, c.id)
    address = " ".join(address.split())
    if not address or address.lower() == c.address.lower():
        raise ToolError(f"give a new address (the one on file is {c.address})")
    c.address = address
    return f"The address on {c.id}'s account is now {address}."


@tool
def update_account_phone(state: Any, customer_id: str, phone: str) -> str:
    """Change the phone number on a customer's account (the courier texts it on delivery day).

    Args:
        customer_id: The customer's id.
        phone: The new phone number.
    """
    c = _customer(state, customer_id)
    _verified(state, c.id)
    phone = " ".join(phone.split())
    if not any(ch.isdigit() for ch in phone) or phone == c.phone:
        raise ToolError(f"give a new phone number (the one on file is {c.phone})")
    c.phone = phone
    return f"The phone number on {c.id}'s account is now {phone}."


TOOLS = [find_customer, get_customer, get_order, verify_customer, change_delivery_address, reschedule_delivery,
         cancel_order, restore_order, return_item, cancel_return, update_account_address, update_account_phone]


# -- worlds -------------------------------------------------------------------------------------------
FIRST_NAMES = ["Ama", "Tomasz", "Priya", "Callum", "Ines", "Declan", "Yusuf", "Harriet", "Mei", "Rowan", "Sade",
               "Oskar", "Niamh", "Bilal", "Freya", "Mateo", "Keira", "Anil", "Lotte", "Jonah", "Esme", "Farid",
               "Gwen", "Hamish", "Zara", "Idris", "Maren", "Tobias"]
LAST_NAMES = ["Okafor", "Nowak", "Raman", "Fraser", "Duarte", "Byrne", "Demir", "Walsh", "Chen", "Ellery",
              "Adeyemi", "Lindqvist", "Keane", "Hussain", "Marsh", "Ferreira", "Doyle", "Patel", "Visser", "Abbott",
              "Kaur", "Moreau", "Pryce", "Sutherland", "Okonjo", "Brennan", "Castell", "Ruiz"]
MAIL_DOMAINS = ["fernmail.com", "postbox.net", "quillmail.co.uk", "northwire.com", "letterbox.org"]
TOWNS = [("Leeds", "LS"), ("Bristol", "BS"), ("Manchester", "M"), ("Newcastle", "NE"), ("Edinburgh", "EH"),
         ("Cardiff", "CF"), ("Oxford", "OX"), ("York", "YO"), ("Norwich", "NR"), ("Exeter", "EX"),
         ("Brighton", "BN"), ("Cambridge", "CB")]
STREETS = ["Mill Lane", "Quarry Road", "Orchard Close", "Station Road", "Chapel Street", "Victoria Terrace",
           "Willow Way", "Abbey Road", "Market Street", "Rosebank Avenue", "Hawthorn Drive", "Canal Walk",
           "Beech Grove", "Castle Hill", "Kingsway", "Harbour View", "Elm Row", "Foundry Lane"]
# (name on the order, what the customer calls it, price in pence)
CATALOG = [
    ("brass desk lamp", "desk lamp", 4800), ("linen duvet cover", "duvet cover", 6500),
    ("oak side table", "side table", 12900), ("wool throw", "wool throw", 5400),
    ("cast-iron casserole dish", "casserole dish", 7900), ("bamboo bath mat", "bath mat", 1850),
    ("walnut chopping board", "chopping board", 3250), ("arched floor mirror", "floor mirror", 14500),
    ("rattan laundry basket", "laundry basket", 2900), ("stoneware dinner set", "dinner set", 8800),
    ("velvet cushion", "cushion", 2200), ("copper kettle", "kettle", 5900), ("glass carafe", "carafe", 1600),
    ("jute rug", "rug", 9900), ("ceramic plant pot", "plant pot", 2450), ("oak wall clock", "wall clock", 3600),
]
SHORT = {name: short for name, short, _ in CATALOG}
PRICE = {name: price for name, _, price in CATALOG}
_LETTERS = "ABDEFGHJLNPQRSTUWXYZ"
FREE_SHIPPING = 5000  # pence: orders from £50 ship free
SHIPPING = 495


class _Names:
    """Unique ids, emails, postcodes, phones and addresses for one world."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set()

    def fresh(self, make: Any) -> str:
        while True:
            v = make()
            if v not in self.used:
                self.used.add(v)
                return v

    def postcode(self, area: str) -> str:
        r = self.rng
        return self.fresh(lambda: f"{area}{r.randint(1, 19)} {r.randint(1, 9)}{r.choice(_LETTERS)}{r.choice(_LETTERS)}")

    def address(self, town: str | None = None) -> tuple[str, str]:
        r = self.rng
        town, area = next(t for t in TOWNS if t[0] == town) if town else r.choice(TOWNS)
        pc = self.postcode(area)
        flat = f"Flat {r.randint(1, 12)}, " if r.random() < 0.3 else ""
        return self.fresh(lambda: f"{flat}{r.randint(2, 140)} {r.choice(STREETS)}, {town} {pc}"), pc

    def phone(self) -> str:
        return self.fresh(lambda: f"07700 900{self.rng.randint(0, 999):03d}")

    def customer_id(self) -> str:
        return self.fresh(lambda: f"C-{self.rng.randint(100, 999)}")

    def order_number(self) -> str:
        return self.fresh(lambda: f"W-{self.rng.randint(10000, 99999)}")

    def email(self, first: str, last: str) -> str:
        r = self.rng
        f, la = first.lower(), last.lower()
        forms = [f"{f}.{la}", f"{f[0]}{la}{r.randint(1, 99)}", f"{la}.{f}", f"{f}{r.randint(70, 99)}", f"{f}_{la[:3]}"]
        return self.fresh(lambda: f"{r.choice(forms)}@{r.choice(MAIL_DOMAINS)}")

    def person(self) -> tuple[str, str, str]:
        r = self.rng
        name = self.fresh(lambda: f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}")
        first, last = name.split()
        return name, first, last


def _iso(days_ago: int) -> str:
    return (TODAY - dt.timedelta(days=days_ago)).isoformat()


def _dates(status: str, rng: random.Random) -> tuple[str, str]:
    """(placed, delivery) for an order of ``status``: a processing order is due within the week, a
    shipped one in 1-3 days, a delivered one came 3-20 days ago; an old delivered one (past the return
    window) and a cancelled one are noise."""
    if status == "processing":
        placed = rng.randint(1, 5)
        return _iso(placed), _iso(placed - 7)
    if status == "shipped":
        return _iso(rng.randint(3, 6)), _iso(-rng.randint(1, 3))
    if status == "delivered":
        placed = rng.randint(8, 25)
        return _iso(placed), _iso(placed - 5)
    if status == "old":
        placed = rng.randint(45, 90)
        return _iso(placed), _iso(placed - 5)
    placed = rng.randint(3, 30)
    return _iso(placed), _iso(placed - 7)


def _order_of(names: _Names, cid: str, status: str, items: list[str], ship_to: str, placed: str,
              delivery: str) -> Order:
    total = sum(PRICE[i] for i in items)
    return Order(number=names.order_number(), customer=cid, placed=placed,
                 status="delivered" if status == "old" else status,  # type: ignore[arg-type]
                 items=[Item(name=i, price=PRICE[i]) for i in items],
                 shipping=0 if total >= FREE_SHIPPING else SHIPPING, delivery=delivery, ship_to=ship_to)


def _new_customer(names: _Names) -> Customer:
    name, first, last = names.person()
    address, pc = names.address()
    return Customer(id=names.customer_id(), name=name, email=names.email(first, last), postcode=pc, address=address,
                    phone=names.phone())


# -- the conversation's words -------------------------------------------------------------------------
# Several constructions per request kind; {item} is what the customer calls it, {when} when they
# ordered it, {day} a delivery day they want. No fact is ever in these words.
FIRST = {
    "redirect": [
        "I ordered a {item} {when}, but I'm moving out before it's due. Can it go to my new place instead?",
        ("I'm moving house this week and the {item} I bought {when} is still set to go to my old flat. "
         "Could you send it to my new home?"),
        ("My {item} hasn't shipped yet, and I won't be living at the address on the order by the time it comes. "
         "Can you redirect it to where I'm moving?"),
        "Could you change where my {item} is being delivered? I'm moving and it's set to go to my current place.",
        ("The {item} I ordered {when} is addressed to a house I'm about to leave. Please have it delivered to my "
         "new one instead."),
    ],
    "cancel": [
        "I ordered a {item} {when} but I've since found one locally. Can you cancel it before it ships?",
        "Please cancel my {item} order; I don't need it any more.",
        "I'd like to cancel the {item} I bought {when}. It hasn't gone out yet.",
        "My partner already bought a {item}, so I'd like to cancel the one I ordered {when}.",
        "I changed my mind about the {item} I ordered {when}. Could you stop the order?",
    ],
    "return": [
        "The {item} I ordered {when} arrived {flaw}. I'd like to send it back for a refund.",
        "I want to return the {item} I got recently; it's not what I expected.",
        "My {item} came {flaw}. Can I return it and get my money back?",
        "I'd like a refund on the {item} from my last delivery; it doesn't suit the room.",
        "I'm not happy with the {item} I bought {when}. Please set up a return for it.",
    ],
    "reschedule": [
        "My {item} is on its way, but I'll be away the day it's due. Could it come on {day} instead?",
        "Nobody will be home when the {item} is due. Can you move the delivery to {day}?",
        "Could the courier bring my {item} on {day}? The day it's booked for doesn't work for me.",
        "I'm travelling this week, so please rebook the {item} delivery for {day}.",
        "The {item} I ordered {when} is due while I'm at work. Can it be delivered on {day} instead?",
    ],
}
ASK_REFUND = [" How much will I get back?", " What will the refund be?", " Can you tell me how much comes back to me?",
              " How much is the refund?"]
FOLLOW = {
    "when_arrive": [
        "Thanks! So when should it arrive now?",
        "Great. What's the new delivery date?",
        "Perfect. When can I expect it at the new place?",
        "And when will it turn up?",
    ],
    "account_address": [
        "Could you also update the address on my account so future orders go there?",
        "While you're at it, please put the place I'm moving to on my account as well.",
        "Can my account use the address I'm moving to from now on too?",
        "Please change my account's address to the new one as well.",
    ],
    "phone": [
        "Could you also put my new mobile on the account, so the courier can text me?",
        "I've changed phones recently. Please update the number on my account.",
        "Can you add my current mobile to my account for delivery texts?",
        "One more thing: the phone number you have for me is out of date. Could you update it?",
    ],
    "return_other": [
        "One more thing: the {item2} I got {when2} arrived {flaw}. Can I return that too?",
        "Also, I'd like to send back the {item2} from my other order.",
        "While I have you, the {item2} isn't right either. Please set up a return for it.",
        "Could you also refund the {item2}? It came {flaw}.",
    ],
    "cancel_other": [
        "Also, please cancel the {item3} I ordered; I've changed my mind about it.",
        "While you're there, can you cancel my {item3} order too?",
        "I don't need the {item3} any more either. Could you cancel it?",
        "One more: please stop the {item3} order before it ships.",
    ],
}
CHANGE = {
    "cancel_instead": [
        "Actually, cancel the {item} altogether. I'll buy one once I've settled in.",
        "Sorry, I've changed my mind: I don't want the {item} at all now. Please cancel it.",
        "On second thought, just cancel the {item} order.",
        "Actually, forget the delivery and cancel the {item} completely.",
    ],
    "revert": [
        "Actually, the move has fallen through. Please send the {item} to my current address after all.",
        "Sorry, scrap that: I'm staying put, so the {item} should go to my usual address.",
        "On second thought, keep the {item} going to the address on my account.",
        "Actually, can you switch the {item} back to the address it had before? The move's been delayed.",
    ],
    "restore": [
        "Actually, I've changed my mind. Please keep the {item} order going.",
        "Sorry, can you undo that cancellation? I do want the {item} after all.",
        "Wait, my partner says we need the {item}. Please reinstate the order.",
        "On second thought, I'll keep the {item}. Can you put the order back?",
    ],
    "keep": [
        "Actually, I'll keep the {item}. Please cancel the return.",
        "Sorry, scrap the return; I've decided the {item} is fine.",
        "On second thought, don't send a label for the {item}. I'm keeping it.",
        "Can you undo the {item} return? I've found a spot for it after all.",
    ],
    "move_again": [
        "Actually, {day} won't work either. Can you make it {day2}?",
        "Sorry, my plans changed again. Please move it to {day2}.",
        "Could we push it to {day2} instead? Something's come up.",
        "On second thought, {day2} would suit me better.",
    ],
}
FLAWS = ["damaged", "marked", "with a mark on it", "with a flaw in it"]
STATUS_OF = {"redirect": "processing", "cancel": "processing", "return": "delivered", "reschedule": "shipped"}
CHANGES = {"redirect": ["cancel_instead", "revert"], "cancel": ["restore"], "return": ["keep"],
           "reschedule": ["move_again"]}
FOLLOWS = {"redirect": ["when_arrive", "account_address", "phone", "return_other", "cancel_other"],
           "cancel": ["phone", "return_other", "cancel_other"], "return": ["phone", "return_other", "cancel_other"],
           "reschedule": ["phone", "return_other", "cancel_other"]}
KINDS = ["redirect", "cancel", "return", "reschedule"]
# the user's turns after the first: F a follow-up, C a change of mind
SHAPES = [("F",), ("F", "C"), ("C", "F"), ("F", "F"), ("F", "F", "C"), ("F", "C", "F")]


def _when(iso: str, rng: random.Random) -> str:
    days = (TODAY - dt.date.fromisoformat(iso)).days
    if days == 1:
        return "yesterday"
    if days <= 6:
        return rng.choice([f"on {dt.date.fromisoformat(iso):%A}", "a few days ago"])
    if days <= 13:
        return "last week"
    return rng.choice(["a few weeks ago", "a couple of weeks back"])


def _spoken_day(d: dt.date) -> str:
    return f"{d:%A} {d.day} {d:%B}"


# -- tasks --------------------------------------------------------------------------------------------
class _Plan:
    """One task's draw: the request kinds, the words, and the items and dates they refer to."""

    def __init__(self, i: int) -> None:
        rng = self.rng = random.Random(f"service-line/{i}")
        self.i = i
        self.kind = KINDS[i % 4]
        self.ident = ("email", "order number")[(i // 4) % 2]
        shape = SHAPES[(i // 8) % len(SHAPES)]
        change = rng.choice(CHANGES[self.kind])
        follows = list(FOLLOWS[self.kind])
        if change == "revert":  # "the address on my account" must still be the old one
            follows.remove("account_address")
        rng.shuffle(follows)
        fs = iter(follows)
        turns = [next(fs) if s == "F" else change for s in shape]
        if change == "cancel_instead" and change in turns:  # no "when will it arrive?" once it is cancelled
            for k in range(turns.index(change) + 1, len(turns)):
                if turns[k] == "when_arrive":
                    turns[k] = next(f for f in follows if f not in turns)
        self.turns = turns  # after the first
        names = [n for n, _, _ in CATALOG]
        rng.shuffle(names)
        self.item, self.item2, self.item3 = names[:3]
        self.extras = names[3:]
        self.status = STATUS_OF[self.kind]
        self.dates = {"target": _dates(self.status, rng), "other": _dates("delivered", rng),
                      "third": _dates("processing", rng)}
        self.when = _when(self.dates["target"][0], rng)
        self.when2 = _when(self.dates["other"][0], rng)
        self.flaw = rng.choice(FLAWS)
        if self.kind == "reschedule":
            due = dt.date.fromisoformat(self.dates["target"][1])
            days = [TODAY + dt.timedelta(days=k) for k in range(1, 15)]
            days = [d for d in days if d.weekday() != 6 and d != due and d > due]
            self.day, self.day2 = rng.sample(days, 2)
        self.asks = {k: rng.random() < 0.5 for k in ("first", "return_other", "cancel_other", "cancel_instead")}
        self.phrasing = rng.randrange(5)
        self.words = {k: rng.randrange(4) for k in list(FOLLOW) + list(CHANGE) + ["refund"]}

    def messages(self) -> list[str]:
        fill = {"item": SHORT[self.item], "item2": SHORT[self.item2], "item3": SHORT[self.item3],
                "when": self.when, "when2": self.when2, "flaw": self.flaw}
        if self.kind == "reschedule":
            fill.update(day=_spoken_day(self.day), day2=_spoken_day(self.day2))
        first = FIRST[self.kind][self.phrasing].format(**fill)
        if self.kind in ("cancel", "return") and self.asks["first"]:
            first += ASK_REFUND[self.words["refund"]]
        out = [first]
        for t in self.turns:
            table = FOLLOW if t in FOLLOW else CHANGE
            text = table[t][self.words[t]].format(**fill)
            if t in ("return_other", "cancel_other", "cancel_instead") and self.asks[t]:
                text += ASK_REFUND[(self.words["refund"] + 1) % 4]
            out.append(text)
        return out


def _shop(plan: _Plan, rng: random.Random) -> tuple[ShopState, dict[str, Any], dict[str, Any]]:
    """The world of one task: the customer, their twin (another customer whose orders fit the same
    messages) and 12-16 others, some with the same items. Returns the state and, for the customer and
    the twin, what their references need (ids, order numbers, facts)."""
    names = _Names(rng)
    customers: dict[str, Customer] = {}
    orders: dict[str, Order] = {}
    people = []
    for _ in range(2):  # the customer and the twin
        c = _new_customer(names)
        customers[c.id] = c
        extra = rng.sample(plan.extras, 3)
        more = rng.randint(0, 1)
        if plan.kind == "cancel" or "cancel_instead" in plan.turns:
            more = 0  # "cancel my bath mat order" is the whole order only where the bath mat is all of it
        target = _order_of(names, c.id, plan.status, [plan.item] + extra[:more], c.address,
                           *plan.dates["target"])
        other = _order_of(names, c.id, "delivered", [plan.item2] + extra[1:1 + rng.randint(0, 1)], c.address,
                          *plan.dates["other"])
        third = _order_of(names, c.id, "processing", [plan.item3], c.address, *plan.dates["third"])
        noise = [_order_of(names, c.id, s, [extra[2]], c.address, *_dates(s, rng))
                 for s in rng.sample(["old", "cancelled", "delivered"], rng.randint(0, 1))]
        for o in (target, other, third, *noise):
            orders[o.number] = o
        moving, _ = names.address()
        people.append({"customer": c, "target": target, "other": other, "third": third, "moving": moving,
                       "phone": names.phone()})
    catalog = [n for n, _, _ in CATALOG]
    for _ in range(rng.randint(12, 16)):
        c = _new_customer(names)
        customers[c.id] = c
        for _ in range(rng.randint(1, 3)):
            status = rng.choice(["processing", "shipped", "delivered", "delivered", "old", "cancelled"])
            pool = [plan.item, plan.item2, plan.item3] if rng.random() < 0.5 else catalog
            items = rng.sample(pool, 1) + rng.sample(catalog, rng.randint(0, 1))
            o = _order_of(names, c.id, status, list(dict.fromkeys(items)), c.address, *_dates(status, rng))
            orders[o.number] = o
    state = ShopState(today=TODAY.isoformat(), customers=dict(sorted(customers.items())),
                      orders=dict(sorted(orders.items())))
    return state, people[0], people[1]


def _script(plan: _Plan, who: dict[str, Any]) -> tuple[list[list[ToolCall]], dict[str, str], list[str]]:
    """The reference calls per user turn, the facts and the numbers to communicate, for one customer."""
    c: Customer = who["customer"]
    target: Order = who["target"]
    facts = {"email": c.email} if plan.ident == "email" else {"order number": target.number}
    facts["postcode"] = c.postcode
    communicate: list[str] = []
    find = (call("find_customer", email=c.email) if plan.ident == "email"
            else call("get_order", order_number=target.number))
    first = [find, call("verify_customer", customer_id=c.id, postcode=c.postcode)]
    if plan.kind == "redirect":
        facts["moving address"] = who["moving"]
        first.append(call("change_delivery_address", order_number=target.number, address=who["moving"]))
    elif plan.kind == "cancel":
        first.append(call("cancel_order", order_number=target.number))
        if plan.asks["first"]:
            communicate.append(money(_total(target)))
    elif plan.kind == "return":
        first.append(call("return_item", order_number=target.number, item=plan.item))
        if plan.asks["first"]:
            communicate.append(money(PRICE[plan.item]))
    else:
        first.append(call("reschedule_delivery", order_number=target.number, date=plan.day.isoformat()))
    turns = [first]
    due = dt.date.fromisoformat(target.delivery) + dt.timedelta(days=REROUTE_DAYS)  # after the redirect
    for t in plan.turns:
        if t == "when_arrive":
            turns.append([call("get_order", order_number=target.number)])
            communicate.append(_said_date(due.isoformat()))
        elif t == "account_address":
            turns.append([call("update_account_address", customer_id=c.id, address=who["moving"])])
        elif t == "phone":
            facts["mobile phone"] = who["phone"]
            turns.append([call("update_account_phone", customer_id=c.id, phone=who["phone"])])
        elif t == "return_other":
            turns.append([call("get_customer", customer_id=c.id),
                          call("return_item", order_number=who["other"].number, item=plan.item2)])
            if plan.asks["return_other"]:
                communicate.append(money(PRICE[plan.item2]))
        elif t == "cancel_other":
            turns.append([call("get_customer", customer_id=c.id),
                          call("cancel_order", order_number=who["third"].number)])
            if plan.asks["cancel_other"]:
                communicate.append(money(_total(who["third"])))
        elif t == "cancel_instead":
            turns.append([call("cancel_order", order_number=target.number)])
            if plan.asks["cancel_instead"]:
                communicate.append(money(_total(target)))
        elif t == "revert":
            turns.append([call("get_customer", customer_id=c.id),
                          call("change_delivery_address", order_number=target.number, address=c.address)])
            due += dt.timedelta(days=REROUTE_DAYS)
        elif t == "restore":
            turns.append([call("restore_order", order_number=target.number)])
        elif t == "keep":
            turns.append([call("cancel_return", order_number=target.number, item=plan.item)])
        elif t == "move_again":
            turns.append([call("reschedule_delivery", order_number=target.number, date=plan.day2.isoformat())])
    return turns, facts, list(dict.fromkeys(communicate))


def _conversation(messages: list[str], turns: list[list[ToolCall]], facts: dict[str, str], communicate: list[str],
                  name: str) -> Conversation:
    return Conversation(turns=[UserTurn(message=m, solution=s, checks=("state",)) for m, s in zip(messages, turns)],
                        facts=facts, communicate=communicate,
                        persona=f"{name}, a customer of Fernhill Home calling its support line")


def _build(i: int) -> Task:
    plan = _Plan(i)
    state, me, twin = _shop(plan, plan.rng)
    messages = plan.messages()
    turns, facts, communicate = _script(plan, me)
    t_turns, t_facts, t_communicate = _script(plan, twin)
    return Task(
        id=f"service-{i:03d}", initial_state=state,
        conversation=_conversation(messages, turns, facts, communicate, me["customer"].name),
        metadata={"kind": "user", "phrasing": plan.phrasing, "request": plan.kind, "turns": [plan.kind, *plan.turns],
                  "conversation_twin": {"facts": t_facts, "communicate": t_communicate,
                                        "persona": twin["customer"].name,
                                        "turns": [[c.to_json() for c in s] for s in t_turns]}})


def tasks() -> list[Task]:
    """The family's tasks: :data:`N_TASKS` conversations, each drawn from its own seed."""
    return [_build(i) for i in range(N_TASKS)]


def twin_task(task: Task) -> Task:
    """The twin of ``task``: the same world and the same user messages, another customer's facts and
    the reference for that customer, with its expected final state (and per-turn references) filled
    in, as the family would register it."""
    twin = task.metadata["conversation_twin"]
    conv = task.conversation
    assert conv is not None
    turns = [[ToolCall(c["name"], c["arguments"]) for c in s] for s in twin["turns"]]
    out = Task(id=task.id + "-twin", initial_state=task.initial_state,
               conversation=_conversation([t.message for t in conv.turns], turns, twin["facts"],
                                          twin["communicate"], twin["persona"]),
               metadata={k: v for k, v in task.metadata.items() if k != "conversation_twin"})
    state = SPEC.start_state(out)
    errors = SPEC.replay_turns(out, state)
    if errors:
        raise RuntimeError(f"the twin of {task.id} does not replay: {errors}")
    out.expected_state_hash = state_hash(state)
    return out


SYSTEM_PROMPT = (  # (formatted with the domain: braces doubled)
    "You are the {domain} agent of Fernhill Home, an online homeware shop. Today is "
    f"{TODAY:%A} {TODAY.day} {TODAY:%B} {TODAY.year}. A customer is talking to you. Look things up and make "
    "changes with the tools. Before changing anything on a customer's account or orders, verify who they are "
    "with verify_customer. Ask the customer for anything you need that only they know. Call tools with "
    "<tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>. Reply without a tool call to talk to "
    "the customer: to ask them something, or to tell them what you did."
)


def oracle_transcript(task_id: str) -> str:
    """The reference agent's episode on one task (the scripted oracle: it asks for the facts each call
    needs, makes the calls, and answers), as ``role: content`` lines: what
    ``docs/transcripts/service_line.txt`` holds."""
    from envfactory.checks.scripted import OraclePolicy, play
    from envfactory.episode import Episode

    ep = Episode(SPEC)
    try:
        play(ep, OraclePolicy(), task_id)
        return "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in ep.transcript())
    finally:
        ep.close()


SPEC = register(
    ToolEnvSpec(
        name="ServiceLine-v0",
        domain="customer service",
        description="An online shop's support line: a customer with orders to redirect, cancel, return or "
                    "reschedule, who holds the facts (email, order number, postcode, new address) the agent "
                    "must ask for, over several requests and changes of mind.",
        state_type=ShopState,
        tools=TOOLS,
        tasks=tasks,
        system_prompt=SYSTEM_PROMPT,
        max_turns=30,
        metadata={"conversation_twin": twin_task},
    )
)
