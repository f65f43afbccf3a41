"""Environments built from unchanged plain classes (environments/classes/) with from_class.

Each initial configuration is drawn from a seeded RNG, so every synthesized task
starts from its own variant of the world.
"""

from __future__ import annotations

import random

from envfactory import register
from envfactory.factory.from_class import Synthesis, from_class

from .classes.brokerage import Brokerage
from .classes.chat import ChatWorkspace
from .classes.git_repo import GitRepo
from .classes.lab import LabNotebook
from .classes.smart_home import SmartHome
from .classes.social import SocialFeed
from .classes.spreadsheet import Spreadsheet
from .classes.vehicle import Vehicle

NEW_NAMES = ["studio", "attic", "patio", "garden", "cellar", "nursery"]


def _home(rng: random.Random) -> dict:
    rooms = rng.sample(["kitchen", "living", "bedroom", "office", "hall", "bath"], 4)
    return {"lights": {r: rng.choice([0, 20, 60, 100]) for r in rooms},
            "thermostats": {r: rng.randint(17, 22) for r in rooms[:2]},
            "locks": {d: rng.random() < 0.5 for d in ("front", "back", "garage")},
            "mode": rng.choice(["home", "night"])}


def _vehicle(rng: random.Random) -> dict:
    return {"battery": rng.randint(40, 100), "cabin_temp": rng.randint(18, 24),
            "mode": rng.choice(["eco", "comfort", "sport"]),
            "destinations": dict(rng.sample([("office", 18), ("airport", 42), ("gym", 6),
                                             ("school", 9), ("mall", 14), ("harbor", 31)], 4))}


def _brokerage(rng: random.Random) -> dict:
    prices = {s: round(rng.uniform(5, 300), 2) for s in ("ACME", "GLOBO", "INITECH", "UMBR", "HOOLI")}
    held = rng.sample(sorted(prices), 2)
    return {"cash": float(rng.choice([2000, 5000, 10000])), "prices": prices,
            "positions": {s: rng.randint(1, 40) for s in held}}


def _repo(rng: random.Random) -> dict:
    files = {p: f"v{rng.randint(1, 9)}" for p in rng.sample(
        ["README.md", "app.py", "setup.cfg", "docs/intro.md", "lib/util.py", "tests/test_app.py"], 4)}
    return {"files": files, "commits": {"c1": {"message": "initial", "parent": None, "tree": dict(files)}},
            "branches": {"main": "c1"}}


def _sheet(rng: random.Random) -> dict:
    items = rng.sample(["rent", "food", "travel", "gym", "books", "power", "water"], 4)
    cells = {"A1": "item", "B1": "amount"}
    for i, item in enumerate(items, 2):
        cells[f"A{i}"], cells[f"B{i}"] = item, rng.randint(10, 900)
    return {"sheets": {"Budget": cells, "Notes": {"A1": "todo"}}}


def _chat(rng: random.Random) -> dict:
    users = ["ana", "ben", "chloe", "dev", "eve"]
    chans = {"general": {"members": users[:4], "topic": "all hands"},
             rng.choice(["ops", "infra"]): {"members": rng.sample(users, 2), "topic": "incidents"},
             rng.choice(["design", "sales"]): {"members": rng.sample(users, 3), "topic": "weekly sync",
                                               "messages": [{"author": "ana", "text": "kickoff at 10"}]}}
    return {"users": users, "channels": chans}


def _social(rng: random.Random) -> dict:
    people = ["kai", "lou", "mia", "noor", "oli"]
    texts = ["Sunrise hike today", "New album is out", "Coffee tips thread", "Marathon done"]
    posts = {f"p{i}": {"author": rng.choice(people + ["you"]), "text": t} for i, t in enumerate(texts, 1)}
    return {"people": people, "following": rng.sample(people, 2), "posts": posts}


def _lab(rng: random.Random) -> dict:
    return {"reagents": {"buffer": rng.choice([100, 300, 500]), "ethanol": rng.choice([30, 200]),
                         "enzyme": rng.randint(1, 6)},
            "samples": {f"S{i}": {"volume": rng.randint(10, 60), "status": "raw", "log": []}
                        for i in range(1, rng.randint(3, 5))}}


def _from_class(*args, arguments, **kwargs):
    # The built-in class environments keep the detailed error text ("Error: tool 'x' failed:
    # ValueError: ...") and read-only by name unless listed: the pinned pretraining corpus and
    # every figure measured with the embedded model were made with them; new environments get
    # the class's own message and read-only by observation by default. Likewise strict argument
    # checks (new environments pass arguments as the class would receive them).
    kwargs.setdefault("read_only", None)
    kwargs.setdefault("validation", "strict")
    return from_class(*args, errors="detailed", synthesis=Synthesis(arguments=arguments), **kwargs)


def _specs():
    yield _from_class(SmartHome, name="SmartHome-v0", domain="smart_home", config=_home,
                     arguments={"room": "keys:lights", "zone": "keys:thermostats", "door": "keys:locks",
                                "brightness": [0, 10, 30, 50, 75, 90, 100], "celsius": list(range(15, 26)),
                                "name": ["movie", "dinner", "reading", "party"]})
    yield _from_class(Vehicle, name="Vehicle-v0", domain="vehicle", config=_vehicle,
                     arguments={"door": "keys:doors", "destination": "keys:destinations",
                                "celsius": list(range(16, 29)), "reason": ["trip cancelled", "new plan"],
                                "name": NEW_NAMES, "distance_km": [3, 7, 12, 25, 40]},
                     read_only={"status"})
    yield _from_class(Brokerage, name="Trading-v0", domain="trading", config=_brokerage,
                     arguments={"symbol": "keys:prices", "sell.symbol": "keys:positions",
                                "quantity": [1, 2, 3, 5, 10], "order_id": "keys:orders",
                                "limit": [10.0, 25.5, 50.0, 99.9, 150.0]},
                     read_only={"quote", "portfolio"})
    yield _from_class(GitRepo, name="GitRepo-v0", domain="version_control", config=_repo,
                     arguments={"path": "keys:files", "write.path": ["CHANGELOG.md", "app.py", "docs/intro.md",
                                                                     "lib/util.py", "notes.txt"],
                                "content": ["fix typo", "v2", "TODO: tests", "hello"],
                                "message": ["fix typo", "add notes", "update docs", "release 1.1"],
                                "name": ["feature", "hotfix", "release"], "branch": "keys:branches"},
                     read_only={"status", "log"})
    yield _from_class(Spreadsheet, name="Spreadsheet-v0", domain="spreadsheet", config=_sheet,
                     arguments={"sheet": "keys:sheets", "cell": "keys:sheets.*", "set_number.cell":
                                ["B8", "C2", "D4", "B9"], "set_text.cell": ["A8", "C1", "D1"],
                                "column": ["A", "B", "C"], "target": ["C1", "D2", "B10"],
                                "value": [5, 42, 120, 999], "text": ["total", "q3", "checked"],
                                "name": ["Q1", "Q2", "Archive"]})
    yield _from_class(ChatWorkspace, name="TeamChat-v0", domain="messaging", config=_chat,
                     arguments={"channel": "keys:channels", "user": "values:users.*",
                                "author": "values:users.*", "index": [0, 1],
                                "name": ["launch", "random", "oncall"],
                                "topic": ["release planning", "incident review", "lunch"],
                                "text": ["deploy at 5pm", "standup moved", "great work all"]},
                     read_only={"list_channels", "read_channel"})
    yield _from_class(SocialFeed, name="Social-v0", domain="social", config=_social,
                     arguments={"person": "values:people.*", "post_id": "keys:posts",
                                "text": ["Weekend trip photos", "Reading list", "Nice one!"]},
                     read_only={"timeline"})
    yield _from_class(LabNotebook, name="LabBench-v0", domain="lab", config=_lab,
                     arguments={"sample_id": "keys:samples", "register_sample.sample_id": ["S7", "S8", "S9"],
                                "new_id": ["S10", "S11"], "protocol": "keys:protocols",
                                "reagent": "keys:reagents", "ml": [10, 50, 100, 250],
                                "volume": [2, 5, 8, 15]},
                     read_only={"inventory", "sample_info"})


for _spec in _specs():
    register(_spec)
