"""A smart-home hub: lights, thermostats, locks and scenes."""

from typing import Literal


class SmartHome:
    """A home automation hub controlling lights, thermostats and door locks."""

    def __init__(self, lights=None, thermostats=None, locks=None, scenes=None, mode="home"):
        self.lights = dict(lights or {"kitchen": 0, "living": 40, "bedroom": 0})
        self.thermostats = dict(thermostats or {"living": 20, "bedroom": 18})
        self.locks = dict(locks or {"front": True, "garage": True, "back": False})
        self.scenes = dict(scenes or {})
        self.mode = mode

    def list_devices(self) -> str:
        """List every light (brightness %), thermostat (target °C) and lock."""
        out = [f"light {k}: {v}%" for k, v in sorted(self.lights.items())]
        out += [f"thermostat {k}: {v}C" for k, v in sorted(self.thermostats.items())]
        out += [f"lock {k}: {'locked' if v else 'unlocked'}" for k, v in sorted(self.locks.items())]
        return "\n".join(out) + f"\nmode: {self.mode}"

    def set_light(self, room: str, brightness: int) -> str:
        """Set a room's light brightness (0 turns it off).

        Args:
            room: The room, e.g. 'kitchen'.
            brightness: Brightness in percent, 0 to 100.
        """
        if room not in self.lights:
            raise KeyError(f"no light in room {room!r}")
        if not 0 <= brightness <= 100:
            raise ValueError("brightness must be between 0 and 100")
        self.lights[room] = brightness
        return f"{room} light at {brightness}%"

    def set_thermostat(self, zone: str, celsius: int) -> str:
        """Set a thermostat's target temperature.

        Args:
            zone: The thermostat's zone, e.g. 'living'.
            celsius: Target temperature, 10 to 28.
        """
        if zone not in self.thermostats:
            raise KeyError(f"no thermostat in zone {zone!r}")
        if not 10 <= celsius <= 28:
            raise ValueError("target must be between 10 and 28")
        self.thermostats[zone] = celsius
        return f"{zone} thermostat set to {celsius}C"

    def lock(self, door: str) -> str:
        """Lock a door.

        Args:
            door: The door, e.g. 'front'.
        """
        if door not in self.locks:
            raise KeyError(f"no lock on door {door!r}")
        if self.locks[door]:
            raise ValueError(f"{door} is already locked")
        self.locks[door] = True
        return f"{door} locked"

    def unlock(self, door: str) -> str:
        """Unlock a door (not allowed while the home is in 'away' mode).

        Args:
            door: The door, e.g. 'front'.
        """
        if door not in self.locks:
            raise KeyError(f"no lock on door {door!r}")
        if self.mode == "away":
            raise ValueError("doors stay locked in away mode; switch mode first")
        if not self.locks[door]:
            raise ValueError(f"{door} is already unlocked")
        self.locks[door] = False
        return f"{door} unlocked"

    def save_scene(self, name: str) -> str:
        """Save the current light levels as a named scene.

        Args:
            name: Scene name.
        """
        if name in self.scenes:
            raise ValueError(f"scene {name!r} exists")
        self.scenes[name] = dict(self.lights)
        return f"scene {name} saved"

    def set_mode(self, mode: Literal["home", "away", "night"]) -> str:
        """Switch the home mode; 'away' locks every door.

        Args:
            mode: home, away or night.
        """
        self.mode = mode
        if mode == "away":
            for d in self.locks:
                self.locks[d] = True
        return f"mode {mode}"
