"""RecordsDesk-v0: two unchanged third-party-style classes in one episode, through from_class.

:class:`~environments.classes.archive.RecordsArchive` (a folder tree with a
current-folder pointer, loaded by ``_load_scenario``) and
:class:`~environments.classes.courier.CourierDesk` (tracking numbers from its own
seeded ``random.Random``, loaded by ``_load_scenario``) share an episode; neither
is modified, subclassed or wrapped by hand. Every task has its own configuration
drawn from a seeded RNG. Tasks that only read (the answer is in a tool result)
succeed only if the agent made those reads and reports what they returned
(``from_class``'s read requirement, plus answer facts).
"""

from __future__ import annotations

import random

from envfactory import register
from envfactory.factory.from_class import ClassTask, Service, from_class
from envfactory.task import call

from .classes.archive import RecordsArchive
from .classes.courier import CourierDesk

FOLDERS = {
    "finance": ["budget", "invoices", "payroll", "audit"],
    "legal": ["contract", "nda", "patent", "lease"],
    "hr": ["handbook", "policy", "roster", "benefits"],
    "ops": ["runbook", "inventory", "schedule", "vendors"],
}
WORDS = ["amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
         "kelp", "lumen", "marble", "nectar", "onyx", "pepper", "quartz", "raven", "saffron", "tundra"]
TAGS = ["urgent", "review", "archive", "signed", "draft"]
PEOPLE = {"ana": "Lisbon", "bo": "Oslo", "cruz": "Quito", "dara": "Dakar", "eli": "Perth", "fay": "Tbilisi"}
SERVICES = ["standard", "express", "overnight"]
STATUSES = ["booked", "in_transit", "delivered"]
N_PER_KIND = 7


def _config(rng: random.Random) -> dict:
    folders: dict = {}
    for folder, docs in FOLDERS.items():
        chosen = rng.sample(docs, 3)
        folders[folder] = {d: {"kind": "doc", "body": f"{d} code {rng.choice(WORDS)}-{rng.randint(10, 99)}",
                               "tags": rng.sample(TAGS, rng.randint(0, 2))} for d in chosen}
    folders["ops"]["old"] = {}
    people = rng.sample(sorted(PEOPLE), 4)
    shipments = {}
    for _ in range(3):
        code = f"TRK{rng.randint(100000, 999999)}"
        shipments[code] = {"recipient": rng.choice(people), "item": rng.choice(WORDS), "service":
                           rng.choice(SERVICES), "status": rng.choice(STATUSES), "pickup": 0}
    return {"archive": {"folders": folders},
            "courier": {"seed": rng.randint(0, 10 ** 6), "budget": rng.choice([30.0, 45.0, 60.0]),
                        "recipients": {p: {"city": PEOPLE[p], "address": f"{rng.randint(1, 99)} {rng.choice(WORDS)} st"}
                                       for p in people},
                        "shipments": shipments}}


def _docs(cfg: dict) -> list[tuple[str, str, dict]]:
    return [(f, d, node) for f, items in cfg["archive"]["folders"].items()
            for d, node in items.items() if node.get("kind") == "doc"]


def _task(kind: str, i: int, rng: random.Random) -> ClassTask:
    cfg = _config(rng)
    docs = _docs(cfg)
    folder, doc, node = rng.choice(docs)
    path = f"/{folder}/{doc}"
    people = sorted(cfg["courier"]["recipients"])
    tid = f"records-{kind}-{i}"
    if kind == "read":
        code = node["body"].split()[-1]
        return ClassTask(tid, f"What is the code written in the document {path}? Reply with the code.", cfg,
                         [call("read_document", path=path)], answer_facts=[code])
    if kind == "city":
        who = rng.choice(people)
        return ClassTask(tid, f"Which city does the recipient {who} live in?", cfg,
                         [call("get_recipient", name=who)], answer_facts=[cfg["courier"]["recipients"][who]["city"]])
    if kind == "track":
        code, s = rng.choice(sorted(cfg["courier"]["shipments"].items()))
        return ClassTask(tid, f"What is the status of shipment {code}, and who is it for?", cfg,
                         [call("track", tracking=code)], answer_facts=[s["status"], s["recipient"]])
    if kind == "tag":
        tag = rng.choice([t for t in TAGS if t not in node["tags"]])
        return ClassTask(tid, f"Tag the document {path} as '{tag}'.", cfg,
                         [call("tag_document", path=path, tag=tag)])
    if kind == "move":
        dest = rng.choice([f for f in FOLDERS if f != folder and doc not in cfg["archive"]["folders"][f]])
        return ClassTask(tid, f"Move the document {path} into the folder /{dest}, then open /{dest} and "
                         "leave it as your current folder.", cfg,
                         [call("move_document", path=path, folder=f"/{dest}"), call("open_folder", path=f"/{dest}")])
    if kind == "ship":
        who, service = rng.choice(people), rng.choice(SERVICES[:2])
        return ClassTask(tid, f"Send the document titled '{doc}' to {who} by {service} courier "
                         f"(the item is '{doc}').", cfg,
                         [call("ship", recipient=who, item=doc, service=service)])
    if kind == "cancel":
        booked = [c for c, s in sorted(cfg["courier"]["shipments"].items()) if s["status"] == "booked"]
        if not booked:
            code = next(iter(sorted(cfg["courier"]["shipments"])))
            cfg["courier"]["shipments"][code]["status"] = "booked"
            booked = [code]
        code = rng.choice(booked)
        return ClassTask(tid, f"Cancel shipment {code}.", cfg, [call("cancel", tracking=code)])
    if kind == "ship_tagged":
        tag = rng.choice(TAGS)
        for f, d, n in docs:  # exactly one document carries the tag: the chosen one
            if tag in n["tags"]:
                n["tags"].remove(tag)
        node["tags"].append(tag)
        then = rng.choice([t for t in TAGS if t not in node["tags"]])
        who = rng.choice(people)
        return ClassTask(tid, f"Find the one document tagged '{tag}', send it to {who} by standard courier "
                         f"(the item is its title), then also tag it '{then}'.", cfg,
                         [call("find_tagged", tag=tag), call("ship", recipient=who, item=doc, service="standard"),
                          call("tag_document", path=path, tag=then)])
    raise ValueError(kind)


KINDS = ["read", "city", "track", "tag", "move", "ship", "cancel", "ship_tagged"]


def _tasks() -> list[ClassTask]:
    out = []
    for kind in KINDS:
        for i in range(N_PER_KIND):
            out.append(_task(kind, i, random.Random(f"records/{kind}/{i}")))
    return out


def _spec():
    return from_class(
        [Service(RecordsArchive, loader="_load_scenario", key="archive",
                 read_only=["current_folder", "list_items", "read_document", "find_tagged"]),
         Service(CourierDesk, loader="_load_scenario", key="courier")],
        name="RecordsDesk-v0", domain="records",
        description="A records archive (folders, documents, tags, a current folder) and a courier desk "
                    "(shipments with tracking numbers).",
        config=_config(random.Random("records/probe")), tasks=_tasks, max_turns=12,
        validation="strict",  # (as built before lax became from_class's default: its tasks unchanged)
        # the archive's current folder is private (``_cwd``) and the "move" tasks ask for it; the
        # courier's RNG decides the next tracking number: the whole state is what these tasks mean
        compare="all")


register(_spec())
