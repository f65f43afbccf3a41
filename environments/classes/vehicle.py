"""An electric car's control unit."""

from typing import Literal


class Vehicle:
    """An electric car: doors, climate, charging, drive mode and navigation."""

    def __init__(self, battery=80, doors=None, cabin_temp=21, mode="comfort", destinations=None,
                 route=None, charging=False):
        self.battery = battery
        self.doors = dict(doors or {"driver": "locked", "passenger": "locked", "trunk": "closed"})
        self.cabin_temp = cabin_temp
        self.mode = mode
        self.destinations = dict(destinations or {"office": 18, "airport": 42, "gym": 6})
        self.route = list(route or [])
        self.charging = charging

    def status(self) -> str:
        """Report battery, doors, cabin temperature, drive mode and route."""
        doors = ", ".join(f"{k}={v}" for k, v in sorted(self.doors.items()))
        route = " -> ".join(self.route) or "none"
        return (f"battery {self.battery}%, doors: {doors}, cabin {self.cabin_temp}C, "
                f"mode {self.mode}, charging {self.charging}, route: {route}")

    def set_door(self, door: str, position: Literal["locked", "unlocked", "open", "closed"]) -> str:
        """Lock, unlock, open or close a door or the trunk.

        Args:
            door: driver, passenger or trunk.
            position: locked, unlocked, open or closed.
        """
        if door not in self.doors:
            raise KeyError(f"no door {door!r}")
        if self.doors[door] == position:
            raise ValueError(f"{door} is already {position}")
        self.doors[door] = position
        return f"{door} {position}"

    def set_cabin_temperature(self, celsius: int) -> str:
        """Set the cabin climate target.

        Args:
            celsius: Target temperature, 16 to 28.
        """
        if not 16 <= celsius <= 28:
            raise ValueError("cabin target must be 16 to 28")
        self.cabin_temp = celsius
        return f"cabin set to {celsius}C"

    def set_drive_mode(self, mode: Literal["eco", "comfort", "sport"]) -> str:
        """Choose the drive mode.

        Args:
            mode: eco, comfort or sport.
        """
        if self.mode == mode:
            raise ValueError(f"already in {mode} mode")
        self.mode = mode
        return f"drive mode {mode}"

    def add_stop(self, destination: str) -> str:
        """Append a saved destination to the route (needs enough battery: 1% per km).

        Args:
            destination: A saved destination name, e.g. 'office'.
        """
        if destination not in self.destinations:
            raise KeyError(f"unknown destination {destination!r}")
        need = sum(self.destinations[d] for d in self.route) + self.destinations[destination]
        if need > self.battery:
            raise ValueError(f"route would need {need}% battery; only {self.battery}% left")
        self.route.append(destination)
        return f"route: {' -> '.join(self.route)}"

    def clear_route(self, reason: str) -> str:
        """Remove every stop from the route.

        Args:
            reason: Why the route is cleared (logged).
        """
        if not self.route:
            raise ValueError("the route is already empty")
        self.route = []
        return f"route cleared ({reason})"

    def save_destination(self, name: str, distance_km: int) -> str:
        """Save a new destination.

        Args:
            name: Destination name.
            distance_km: Distance in kilometres, 1 to 300.
        """
        if name in self.destinations:
            raise ValueError(f"{name} is already saved")
        if not 1 <= distance_km <= 300:
            raise ValueError("distance must be 1 to 300 km")
        self.destinations[name] = distance_km
        return f"saved {name} ({distance_km} km)"
