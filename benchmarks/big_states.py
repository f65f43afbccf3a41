"""Large third-party-style states for the bigstate benchmarks (``core.bench_bigstate``,
``snapshot_big``) and their tests: an object tree with parent pointers, a cursor and an RNG, and a
database of pydantic records. Plain classes, as a user's own code would be."""

from __future__ import annotations



class BenchNode:
    def __init__(self, name: str, parent: "BenchNode | None", size: int) -> None:
        self.name = name
        self.parent = parent
        self.size = size
        self.children: list[BenchNode] = []


class BenchTree:
    """A third-party-style object tree (parent pointers, a cursor, an RNG): ~``nodes`` objects."""

    def __init__(self) -> None:
        self.root: BenchNode
        self._cursor: BenchNode

    def _load_scenario(self, config: dict) -> None:
        import random

        self._rng = random.Random(config.get("seed", 0))
        self.root = BenchNode("root", None, 0)
        frontier, made = [self.root], 1
        while made < config["nodes"]:
            nxt = []
            for parent in frontier:
                for k in range(10):
                    if made >= config["nodes"]:
                        break
                    child = BenchNode(f"{parent.name}.{k}", parent, self._rng.randint(1, 999))
                    parent.children.append(child)
                    nxt.append(child)
                    made += 1
            frontier = nxt
        self._cursor = self.root

    def enter(self, index: int) -> str:
        """Move the cursor to a child.

        Args:
            index: The child's position.
        """
        self._cursor = self._cursor.children[index]
        return self._cursor.name

    def grow(self, name: str) -> str:
        """Add a child under the cursor.

        Args:
            name: Its name.
        """
        self._cursor.children.append(BenchNode(name, self._cursor, self._rng.randint(1, 999)))
        return f"{len(self._cursor.children)} children"


def _record_model() -> type:
    from pydantic import BaseModel

    class Customer(BaseModel):
        id: int
        name: str
        email: str
        balance: float
        tags: list[str] = []

    return Customer


BenchCustomer = _record_model()
BenchCustomer.__qualname__ = BenchCustomer.__name__ = "BenchCustomer"


class BenchCustomerDB:
    """A third-party-style database of pydantic records."""

    def __init__(self, records: int = 0) -> None:
        self.records = {i: BenchCustomer(id=i, name=f"c{i}", email=f"c{i}@example.com", balance=float(i % 97),
                                     tags=["vip"] if i % 13 == 0 else []) for i in range(records)}

    def credit(self, customer_id: int, amount: float) -> float:
        """Add to a balance.

        Args:
            customer_id: The customer.
            amount: How much.
        """
        rec = self.records[customer_id]
        rec.balance += amount
        return rec.balance
