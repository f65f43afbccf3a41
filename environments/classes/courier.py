"""A courier desk whose tracking numbers come from a seeded random generator (a third-party style API).

Unchanged by envfactory: it loads its scenario after construction, draws tracking
numbers from its own ``random.Random`` and keeps a counter of the next pickup slot.
"""

import random
from typing import Dict, List, Optional


class CourierDesk:
    """Send parcels to recipients and follow them: quotes, shipments, cancellations."""

    RATES = {"standard": 4.5, "express": 11.0, "overnight": 19.5}

    def __init__(self) -> None:
        self._random = random.Random(0)
        self.recipients: Dict[str, Dict[str, str]] = {}
        self.shipments: Dict[str, Dict[str, object]] = {}
        self.issued = set()
        self.next_pickup: int = 1
        self.budget: float = 0.0

    def _load_scenario(self, scenario: dict) -> None:
        self._random = random.Random(scenario.get("seed", 0))
        self.recipients = {k: dict(v) for k, v in scenario.get("recipients", {}).items()}
        self.shipments = {k: dict(v) for k, v in scenario.get("shipments", {}).items()}
        self.issued = set(self.shipments)
        self.next_pickup = scenario.get("next_pickup", 1)
        self.budget = float(scenario.get("budget", 50.0))

    def _tracking(self) -> str:
        while True:
            code = "TRK" + str(self._random.randint(100000, 999999))
            if code not in self.issued:
                self.issued.add(code)
                return code

    def list_recipients(self) -> Dict[str, List[str]]:
        """Everyone the desk can ship to."""
        return {"recipients": sorted(self.recipients)}

    def get_recipient(self, name: str) -> Dict[str, str]:
        """A recipient's address and city.

        Args:
            name: The recipient's name.
        """
        if name not in self.recipients:
            raise KeyError(f"unknown recipient {name}")
        return dict(self.recipients[name])

    def quote(self, service: str, parcels: int = 1) -> Dict[str, float]:
        """The price of a shipment.

        Args:
            service: 'standard', 'express' or 'overnight'.
            parcels: How many parcels.
        """
        if service not in self.RATES:
            raise ValueError(f"unknown service {service}; choose standard, express or overnight")
        return {"price": round(self.RATES[service] * parcels, 2)}

    def ship(self, recipient: str, item: str, service: str = "standard") -> Dict[str, object]:
        """Send an item to a recipient; the price comes out of the budget.

        Args:
            recipient: The recipient's name.
            item: What is sent (a document title or a description).
            service: 'standard', 'express' or 'overnight'.
        """
        if recipient not in self.recipients:
            raise KeyError(f"unknown recipient {recipient}")
        price = self.quote(service)["price"]
        if price > self.budget:
            raise ValueError(f"insufficient budget: {self.budget:.2f} left, {price:.2f} needed")
        self.budget = round(self.budget - price, 2)
        code = self._tracking()
        self.shipments[code] = {"recipient": recipient, "item": item, "service": service,
                                "status": "booked", "pickup": self.next_pickup}
        self.next_pickup += 1
        return {"tracking": code, "price": price, "pickup_slot": self.shipments[code]["pickup"]}

    def track(self, tracking: str) -> Dict[str, object]:
        """A shipment's recipient, item, service and status.

        Args:
            tracking: The tracking number.
        """
        if tracking not in self.shipments:
            raise KeyError(f"no shipment {tracking}")
        return {"tracking": tracking, **self.shipments[tracking]}

    def list_shipments(self, status: Optional[str] = None) -> Dict[str, List[str]]:
        """Tracking numbers, optionally only those with a status.

        Args:
            status: 'booked', 'in_transit', 'delivered' or 'cancelled'.
        """
        return {"shipments": sorted(k for k, v in self.shipments.items() if status is None or v["status"] == status)}

    def cancel(self, tracking: str) -> str:
        """Cancel a booked shipment; its price goes back into the budget.

        Args:
            tracking: The tracking number.
        """
        s = self.shipments.get(tracking)
        if s is None:
            raise KeyError(f"no shipment {tracking}")
        if s["status"] != "booked":
            raise ValueError(f"shipment {tracking} is {s['status']} and can no longer be cancelled")
        s["status"] = "cancelled"
        self.budget = round(self.budget + self.RATES[str(s["service"])], 2)
        return f"cancelled {tracking}"
