"""Importing a large database class with ``from_class``: the build (tools, read-only observation,
tasks) and a fork plus its first call, against ``copy.deepcopy`` of the same state in the same run.

The fixture is a τ²-bench-retail-like class (:class:`RetailDB`): one attribute holding a dict of
tables (users, orders, products), each a dict of records, several MB as JSON; tools read or write
one record, and report failure by returning an error dict (as the suite's tools do). ``tasks``
:class:`~envfactory.factory.from_class.ClassTask` share one configuration object (one database),
a fifth of them read-only with the facts the user must be told.

``--shape pydantic`` imports a τ²-shaped class instead (:class:`RetailTools`, as τ²-bench's
retail toolkit): its database one pydantic model (:class:`RetailModelDB`) of tables of nested
pydantic records held in one attribute, tools that change records in place, return them and
raise on failure (``--users 2400 --tasks 114``: about 5.5 MB, τ²-retail's 114 tasks).
``--writes`` times repeated writing calls at 1,000 and 4,000 users, interleaved
(:func:`bench_repeated_writes`).

Run: ``python -m benchmarks.bigdb_import [--users N] [--tasks N] [--copy-on-write state] [--shape pydantic]``
(``envfactory bench bigdb``). It measures ``from_class(copy_on_write="containers")``, the option
for multi-MB databases of dicts or pydantic models (a call copies only what it reaches), unless told
``state`` (the default of ``from_class``: a fork's first call copies the state whole, and the quota's
measure walks it after each writing call).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import time
from typing import Any

from pydantic import BaseModel

__all__ = ["RetailDB", "retail_db", "retail_tasks", "retail_spec", "bench_bigdb", "bench_repeated_writes",
           "RetailModelDB", "RetailTools", "retail_model_db", "retail_model_tasks"]


class RetailDB:
    """A retail store's database: users, their orders, the products."""

    def __init__(self, db: dict[str, Any]) -> None:
        self.db = db

    def get_user_details(self, user_id: str) -> dict[str, Any]:
        """A user's profile and order ids.

        Args:
            user_id: The user.
        """
        user = self.db["users"].get(user_id)
        return {"error": f"no user {user_id}"} if user is None else user

    def get_order_details(self, order_id: str) -> dict[str, Any]:
        """An order.

        Args:
            order_id: The order, like '#W0000001'.
        """
        order = self.db["orders"].get(order_id)
        return {"error": f"no order {order_id}"} if order is None else order

    def get_product_details(self, product_id: str) -> dict[str, Any]:
        """A product and its variants.

        Args:
            product_id: The product.
        """
        product = self.db["products"].get(product_id)
        return {"error": f"no product {product_id}"} if product is None else product

    def cancel_pending_order(self, order_id: str, reason: str) -> dict[str, Any]:
        """Cancel an order that has not shipped.

        Args:
            order_id: The order.
            reason: 'no longer needed' or 'ordered by mistake'.
        """
        order = self.db["orders"].get(order_id)
        if order is None:
            return {"error": f"no order {order_id}"}
        if order["status"] != "pending":
            return {"error": "only a pending order can be cancelled"}
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        return order

    def modify_user_address(self, user_id: str, address1: str, city: str, zip: str) -> dict[str, Any]:
        """Change a user's default address.

        Args:
            user_id: The user.
            address1: Street and number.
            city: City.
            zip: Postal code.
        """
        user = self.db["users"].get(user_id)
        if user is None:
            return {"error": f"no user {user_id}"}
        user["address"] = {"address1": address1, "city": city, "zip": zip, "country": user["address"]["country"]}
        return user


_CITIES = ["Austin", "Denver", "Boston", "Seattle", "Chicago", "Phoenix", "Portland", "Atlanta"]


def retail_db(users: int = 4000, seed: int = 0) -> dict[str, Any]:
    """A database of ``users`` users, three orders each and ``users // 8`` products (about 1.5 KB
    of JSON per user: 4000 users are about 4.8 MB, 4200 about 5.1 MB)."""
    rng = random.Random(seed)
    products = {}
    for p in range(max(1, users // 8)):
        pid = f"P{p:05d}"
        products[pid] = {"product_id": pid, "name": f"product {p}", "variants": {
            f"{pid}-{v}": {"item_id": f"{pid}-{v}", "options": {"color": rng.choice(["red", "blue", "black"]),
                                                                "size": rng.choice("SML")},
                           "available": rng.random() < 0.8, "price": round(rng.uniform(5, 500), 2)}
            for v in range(4)}}
    pids = list(products)
    db: dict[str, Any] = {"users": {}, "orders": {}, "products": products}
    n = 0
    for u in range(users):
        uid = f"user_{u:05d}"
        orders = []
        for _ in range(3):
            n += 1
            oid = f"#W{n:07d}"
            items = []
            for _ in range(rng.randint(1, 3)):
                pid = rng.choice(pids)
                vid = rng.choice(list(products[pid]["variants"]))
                items.append({"product_id": pid, "item_id": vid, "price": products[pid]["variants"][vid]["price"]})
            db["orders"][oid] = {"order_id": oid, "user_id": uid, "items": items,
                                 "status": rng.choice(["pending", "pending", "delivered", "processed"]),
                                 "payment": {"method": f"credit_card_{u}", "amount": round(sum(i["price"] for i in items), 2)}}
            orders.append(oid)
        db["users"][uid] = {"user_id": uid, "name": {"first": f"First{u}", "last": f"Last{u}"},
                            "email": f"user{u}@example.com",
                            "address": {"address1": f"{rng.randint(1, 999)} Main St", "city": rng.choice(_CITIES),
                                        "zip": f"{rng.randint(10000, 99999)}", "country": "USA"},
                            "orders": orders}
    return db


def retail_tasks(db: dict[str, Any], n: int = 60) -> list[Any]:
    """``n`` tasks on one database (one configuration object shared by all): cancel a pending
    order, change an address, and (one in five) read-only questions with the answer's facts."""
    from envfactory.factory.from_class import ClassTask
    from envfactory.task import call

    config = {"db": db}
    pending = [o for o, v in db["orders"].items() if v["status"] == "pending"]
    out = []
    for i in range(n):
        if i % 5 == 4:
            oid = pending[i]
            order = db["orders"][oid]
            out.append(ClassTask(f"ask-{i}", f"What did I pay for order {oid}?", config,
                                 [call("get_order_details", order_id=oid)],
                                 answer_facts=[f"{order['payment']['amount']:.2f}".rstrip("0").rstrip(".")]))
        elif i % 2:
            oid = pending[i]
            out.append(ClassTask(f"cancel-{i}", f"Cancel my order {oid}: I ordered it by mistake.", config,
                                 [call("get_order_details", order_id=oid),
                                  call("cancel_pending_order", order_id=oid, reason="ordered by mistake")]))
        else:
            uid = f"user_{i:05d}"
            out.append(ClassTask(f"move-{i}", f"I am {uid}; my address is now 1 Elm St, Tulsa 74101.", config,
                                 [call("modify_user_address", user_id=uid, address1="1 Elm St", city="Tulsa",
                                       zip="74101")]))
    return out


def retail_spec(users: int = 4000, tasks: int = 60, **options: Any) -> Any:
    """The environment ``from_class`` makes of :class:`RetailDB` with ``tasks`` tasks."""
    from envfactory.factory.from_class import from_class

    db = retail_db(users)
    return from_class(RetailDB, name="BigRetail-v0", domain="retail", tasks=retail_tasks(db, tasks), **options)


# -- a τ²-shaped class: the database one pydantic model of pydantic records ---------------------------
class Address(BaseModel):
    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class UserName(BaseModel):
    first_name: str
    last_name: str


class PaymentMethod(BaseModel):
    source: str
    id: str
    brand: str | None = None
    last_four: str | None = None
    balance: float | None = None


class User(BaseModel):
    user_id: str
    name: UserName
    address: Address
    email: str
    payment_methods: dict[str, PaymentMethod]
    orders: list[str]


class Variant(BaseModel):
    item_id: str
    options: dict[str, str]
    available: bool
    price: float


class Product(BaseModel):
    name: str
    product_id: str
    variants: dict[str, Variant]


class OrderItem(BaseModel):
    name: str
    product_id: str
    item_id: str
    price: float
    options: dict[str, str]


class OrderPayment(BaseModel):
    transaction_type: str
    amount: float
    payment_method_id: str


class Order(BaseModel):
    order_id: str
    user_id: str
    address: Address
    items: list[OrderItem]
    status: str
    payment_history: list[OrderPayment]
    cancel_reason: str | None = None


class RetailModelDB(BaseModel):
    """τ²-bench retail's database shape: one model of tables of nested models."""

    products: dict[str, Product]
    users: dict[str, User]
    orders: dict[str, Order]


class RetailTools:
    """A retail store's tools over one pydantic database (``self.db``), as τ²-bench's toolkits
    are: they read and change its records in place, return records, and raise on failure."""

    def __init__(self, db: RetailModelDB) -> None:
        self.db = db

    def _user(self, user_id: str) -> User:
        if user_id not in self.db.users:
            raise ValueError("User not found")
        return self.db.users[user_id]

    def _order(self, order_id: str) -> Order:
        if order_id not in self.db.orders:
            raise ValueError("Order not found")
        return self.db.orders[order_id]

    def get_user_details(self, user_id: str) -> User:
        """A user's profile, payment methods and order ids.

        Args:
            user_id: The user.
        """
        return self._user(user_id)

    def get_order_details(self, order_id: str) -> Order:
        """An order.

        Args:
            order_id: The order, like '#W0000001'.
        """
        return self._order(order_id)

    def get_product_details(self, product_id: str) -> Product:
        """A product and its variants.

        Args:
            product_id: The product.
        """
        if product_id not in self.db.products:
            raise ValueError("Product not found")
        return self.db.products[product_id]

    def cancel_pending_order(self, order_id: str, reason: str) -> Order:
        """Cancel an order that has not shipped; its payment is refunded (a gift card at once).

        Args:
            order_id: The order.
            reason: 'no longer needed' or 'ordered by mistake'.
        """
        order = self._order(order_id)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in ("no longer needed", "ordered by mistake"):
            raise ValueError("Invalid reason")
        refunds = []
        for payment in order.payment_history:
            refunds.append(OrderPayment(transaction_type="refund", amount=payment.amount,
                                        payment_method_id=payment.payment_method_id))
            method = self._user(order.user_id).payment_methods[payment.payment_method_id]
            if method.source == "gift_card" and method.balance is not None:
                method.balance = round(method.balance + payment.amount, 2)
        order.payment_history.extend(refunds)
        order.status = "cancelled"
        order.cancel_reason = reason
        return order

    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str, state: str,
                            country: str, zip: str) -> User:
        """Change a user's default address.

        Args:
            user_id: The user.
            address1: Street and number.
            address2: Apartment or suite.
            city: City.
            state: State.
            country: Country.
            zip: Postal code.
        """
        user = self._user(user_id)
        user.address = Address(address1=address1, address2=address2, city=city, state=state, country=country,
                               zip=zip)
        return user

    def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str, state: str,
                                     country: str, zip: str) -> Order:
        """Change where a pending order ships.

        Args:
            order_id: The order.
            address1: Street and number.
            address2: Apartment or suite.
            city: City.
            state: State.
            country: Country.
            zip: Postal code.
        """
        order = self._order(order_id)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be modified")
        order.address = Address(address1=address1, address2=address2, city=city, state=state, country=country,
                                zip=zip)
        return order


def retail_model_db(users: int = 4000, seed: int = 0) -> RetailModelDB:
    """A :class:`RetailModelDB` of ``users`` users (two payment methods, three orders each) and
    ``users // 8`` products (about 1.55 KB of JSON per user: 4000 users are about 6.2 MB)."""
    rng = random.Random(seed)
    products: dict[str, Product] = {}
    for p in range(max(1, users // 8)):
        pid = f"P{p:05d}"
        products[pid] = Product(name=f"product {p}", product_id=pid, variants={
            f"{pid}-{v}": Variant(item_id=f"{pid}-{v}", options={"color": rng.choice(["red", "blue", "black"]),
                                                                 "size": rng.choice("SML")},
                                  available=rng.random() < 0.8, price=round(rng.uniform(5, 500), 2))
            for v in range(4)})
    pids = list(products)
    users_t: dict[str, User] = {}
    orders_t: dict[str, Order] = {}
    n = 0
    for u in range(users):
        uid = f"user_{u:05d}"
        address = Address(address1=f"{rng.randint(1, 999)} Main St", address2=f"Suite {rng.randint(1, 99)}",
                          city=rng.choice(_CITIES), country="USA", state="TX", zip=f"{rng.randint(10000, 99999)}")
        methods = {f"credit_card_{u}": PaymentMethod(source="credit_card", id=f"credit_card_{u}", brand="visa",
                                                     last_four=f"{rng.randint(0, 9999):04d}"),
                   f"gift_card_{u}": PaymentMethod(source="gift_card", id=f"gift_card_{u}",
                                                   balance=round(rng.uniform(0, 200), 2))}
        oids = []
        for _ in range(3):
            n += 1
            oid = f"#W{n:07d}"
            items = []
            for _ in range(rng.randint(1, 3)):
                pid = rng.choice(pids)
                variant = products[pid].variants[rng.choice(list(products[pid].variants))]
                items.append(OrderItem(name=products[pid].name, product_id=pid, item_id=variant.item_id,
                                       price=variant.price, options=dict(variant.options)))
            method = rng.choice(list(methods))
            orders_t[oid] = Order(order_id=oid, user_id=uid, address=address.model_copy(), items=items,
                                  status=rng.choice(["pending", "pending", "delivered", "processed"]),
                                  payment_history=[OrderPayment(transaction_type="payment",
                                                                amount=round(sum(i.price for i in items), 2),
                                                                payment_method_id=method)])
            oids.append(oid)
        users_t[uid] = User(user_id=uid, name=UserName(first_name=f"First{u}", last_name=f"Last{u}"), address=address,
                            email=f"user{u}@example.com", payment_methods=methods, orders=oids)
    return RetailModelDB(products=products, users=users_t, orders=orders_t)


def retail_model_tasks(db: RetailModelDB, n: int = 114) -> list[Any]:
    """``n`` tasks on one :class:`RetailModelDB` (one configuration object): cancel a pending
    order, move a user, re-address a pending order, and (one in five) read-only questions."""
    from envfactory.factory.from_class import ClassTask
    from envfactory.task import call

    config = {"db": db}
    pending = [o for o, v in db.orders.items() if v.status == "pending"]
    where = {"address1": "1 Elm St", "address2": "Apt 2", "city": "Tulsa", "state": "OK", "country": "USA",
             "zip": "74101"}
    out = []
    for i in range(n):
        oid = pending[i]
        if i % 5 == 4:
            order = db.orders[oid]
            out.append(ClassTask(f"ask-{i}", f"What did I pay for order {oid}?", config,
                                 [call("get_order_details", order_id=oid)],
                                 answer_facts=[f"{order.payment_history[0].amount:.2f}".rstrip("0").rstrip(".")]))
        elif i % 3 == 0:
            out.append(ClassTask(f"cancel-{i}", f"Cancel my order {oid}: I ordered it by mistake.", config,
                                 [call("get_order_details", order_id=oid),
                                  call("cancel_pending_order", order_id=oid, reason="ordered by mistake")]))
        elif i % 3 == 1:
            uid = db.orders[oid].user_id
            out.append(ClassTask(f"move-{i}", f"I am {uid}; my address is now 1 Elm St, Apt 2, Tulsa OK 74101.", config,
                                 [call("get_user_details", user_id=uid),
                                  call("modify_user_address", user_id=uid, **where)]))
        else:
            out.append(ClassTask(f"ship-{i}", f"Ship my order {oid} to 1 Elm St, Apt 2, Tulsa OK 74101.", config,
                                 [call("get_order_details", order_id=oid),
                                  call("modify_pending_order_address", order_id=oid, **where)]))
    return out


def _stats(key: str, samples_s: list[float], unit: float = 1e3) -> dict[str, float]:
    """``key_min``, ``key_median``, ``key_max`` (a flat section, as ``envfactory bench`` prints them)."""
    return {f"{key}_min": round(min(samples_s) * unit, 3), f"{key}_median": round(statistics.median(samples_s) * unit, 3),
            f"{key}_max": round(max(samples_s) * unit, 3)}


def bench_bigdb(users: int = 4200, tasks: int = 60, forks: int = 20, copy_on_write: str = "containers",
                shape: str = "dict") -> dict[str, Any]:
    """Build (``from_class`` + every task, the DB and the task list made before it: the fixture,
    timed apart) and fork + first call (a read and a write), each against ``copy.deepcopy`` of
    the database in the same run (ratios), with min/median/max and the load average; then the
    first judgment of six tasks (where their expected states are hashed).

    ``shape="pydantic"``: the τ²-shaped class instead (:class:`RetailTools`: one
    :class:`RetailModelDB` model of nested models, tools that raise on failure), read-only
    observation on as for the other."""
    from envfactory.episode import Episode
    from envfactory.task import call

    out: dict[str, Any] = {"bigdb_loadavg_before": [round(x, 2) for x in os.getloadavg()], "bigdb_shape": shape}
    t0 = time.perf_counter()
    db: Any = retail_db(users) if shape == "dict" else retail_model_db(users)
    out["bigdb_db_fixture_s"] = round(time.perf_counter() - t0, 3)
    out["bigdb_db_json_mb"] = round((len(json.dumps(db)) if shape == "dict" else len(db.model_dump_json())) / 1e6, 2)
    out["bigdb_tasks"] = tasks
    out["bigdb_copy_on_write"] = copy_on_write
    deep = []
    for _ in range(3):
        t0 = time.perf_counter()
        copy.deepcopy(db)
        deep.append(time.perf_counter() - t0)
    deep_med = statistics.median(deep)
    out.update(_stats("bigdb_deepcopy_ms", deep))

    from envfactory.factory.from_class import from_class

    t0 = time.perf_counter()
    # the suite's own tasks, as an importer holds them before importing
    task_list = retail_tasks(db, tasks) if shape == "dict" else retail_model_tasks(db, tasks)
    out["bigdb_tasks_fixture_s"] = round(time.perf_counter() - t0, 3)
    t0, c0 = time.perf_counter(), time.process_time()
    spec = from_class(RetailDB if shape == "dict" else RetailTools, name="BigRetail-v0", domain="retail",
                      tasks=task_list, copy_on_write=copy_on_write)  # type: ignore[arg-type]
    built = time.perf_counter() - t0
    spec.get_tasks()
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    out["bigdb_from_class_s"] = round(built, 3)
    out["bigdb_build_s"] = round(total, 3)  # the import: from_class and every task built (not the DB's generation)
    out["bigdb_build_cpu_s"] = round(cpu, 3)  # this process's CPU time: what the load does not inflate
    out["bigdb_build_vs_deepcopy_ratio"] = round(total / deep_med, 1)

    ep = Episode(spec)
    task = spec.get_tasks()[1]
    ep.reset(task.id)
    ep.step(task.solution[0].to_hermes())
    first = call("get_user_details", user_id="user_00007").to_hermes()
    where: dict[str, Any] = {"address1": "2 Oak", "city": "Reno", "zip": "89501"}
    if shape != "dict":
        where.update(address2="", state="NV", country="USA")
    write = call("modify_user_address", user_id="user_00009", **where).to_hermes()
    fork_s: list[float] = []
    read_s: list[float] = []
    write_s: list[float] = []
    for k in range(forks):
        t0 = time.perf_counter()
        child = ep.fork()
        t1 = time.perf_counter()
        child.step(first if k % 2 == 0 else write)
        t2 = time.perf_counter()
        fork_s.append(t1 - t0)
        (read_s if k % 2 == 0 else write_s).append(t2 - t0)
        child.close()
    out.update(_stats("bigdb_fork_ms", fork_s))
    out.update(_stats("bigdb_fork_first_read_ms", read_s))
    out.update(_stats("bigdb_fork_first_write_ms", write_s))
    out["bigdb_fork_first_read_vs_deepcopy_ratio"] = round(statistics.median(read_s) / deep_med, 4)
    out["bigdb_fork_first_write_vs_deepcopy_ratio"] = round(statistics.median(write_s) / deep_med, 4)
    ep.close()

    # judging, where the expected states' hashes went (a task's first judgment hashes its
    # reference's final state; the very first one also writes the whole shared database once)
    judge_s = []
    for t in [x for x in spec.get_tasks() if x.check is None][:6]:
        ep = Episode(spec)
        ep.reset(t.id)
        for c in t.solution:
            ep.step(c.to_hermes())
        t0 = time.perf_counter()
        ep.step("Done.")
        judge_s.append(time.perf_counter() - t0)
        ep.close()
    out["bigdb_first_judgment_s"] = round(judge_s[0], 3)
    out.update(_stats("bigdb_next_tasks_first_judgment_ms", judge_s[1:]))
    out["bigdb_loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def bench_repeated_writes(sizes: tuple[int, ...] = (1000, 4000), writes: int = 40, rounds: int = 7,
                          copy_on_write: str = "containers", shape: str = "dict") -> dict[str, Any]:
    """Repeated writing calls (not only a fork's first) on the imported class at several database
    sizes, interleaved in one run: each size's episode wrote once, was forked, and both its sides
    then write ``writes`` times a round (the state quota measures each call). Medians of the
    per-step time (µs) per size, their min-max over ``rounds`` rounds, and each size's ratio to
    the smallest (what grows with the database rather than with the change)."""
    from envfactory.episode import Episode
    from envfactory.factory.from_class import from_class
    from envfactory.task import call

    out: dict[str, Any] = {"writes_loadavg_before": [round(x, 2) for x in os.getloadavg()], "writes_shape": shape}
    sides: dict[int, list[Any]] = {}
    more = {} if shape == "dict" else {"address2": "", "state": "OK", "country": "USA"}
    for n in sizes:
        db: Any = retail_db(n) if shape == "dict" else retail_model_db(n)
        spec = from_class(RetailDB if shape == "dict" else RetailTools, name="BigRetail-v0",  # type: ignore[arg-type]
                          domain="retail", tasks=retail_tasks(db, 10) if shape == "dict" else retail_model_tasks(db, 10),
                          copy_on_write=copy_on_write, read_only=None, max_turns=10 ** 6)  # type: ignore[arg-type]
        ep = Episode(spec)
        ep.reset(spec.get_tasks()[1].id)
        ep.step(call("modify_user_address", user_id="user_00003", address1="1 Elm", city="Tulsa",
                     zip="74101", **more).to_hermes())
        sides[n] = [ep, ep.fork()]
        out[f"writes_db_json_mb_{n}"] = round((len(json.dumps(db)) if shape == "dict" else len(db.model_dump_json()))
                                              / 1e6, 2)
    calls = [call("modify_user_address", user_id=f"user_{(k * 37) % min(sizes):05d}", address1=f"{k} Oak",
                  city="Reno", zip="89501", **more).to_hermes() for k in range(writes)]
    per: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(rounds):
        for n in (sizes if r % 2 == 0 else tuple(reversed(sizes))):  # (interleaved, order alternated)
            times = []
            for k, c in enumerate(calls):
                e = sides[n][k % 2]
                t0 = time.perf_counter()
                e.step(c)
                times.append(time.perf_counter() - t0)
            per[n].append(statistics.median(times))
    base = statistics.median(per[sizes[0]])
    for n in sizes:
        out.update(_stats(f"write_step_us_{n}", per[n], 1e6))
        out[f"write_step_vs_{sizes[0]}_ratio_{n}"] = round(statistics.median(per[n]) / base, 2)
    for pair in sides.values():
        for e in pair:
            e.close()
    out["writes_loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=4200)
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--forks", type=int, default=20)
    parser.add_argument("--copy-on-write", choices=["containers", "state"], default="containers")
    parser.add_argument("--shape", choices=["dict", "pydantic"], default="dict",
                        help="the database as dicts of dict records (RetailDB) or as one pydantic model of "
                             "pydantic records (RetailTools, τ²-bench's shape)")
    parser.add_argument("--writes", action="store_true",
                        help="time repeated writes at 1,000 and 4,000 users instead (bench_repeated_writes)")
    args = parser.parse_args()
    if args.writes:
        print(json.dumps(bench_repeated_writes(copy_on_write=args.copy_on_write, shape=args.shape), indent=1))
        return
    print(json.dumps(bench_bigdb(args.users, args.tasks, args.forks, args.copy_on_write, args.shape), indent=1))


if __name__ == "__main__":
    main()
