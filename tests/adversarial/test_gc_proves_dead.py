"""``envfactory gc`` removes only what it can prove dead (issue 28), without Docker: the engine is a
fake listing container records as ``client.api.containers`` does. A container whose owner label
names another host (an engine shared between machines) stays, whatever its pid, unless ``--all``."""

from __future__ import annotations

import os
import socket

import pytest

from envfactory import cli
from envfactory.runtime import pool
from envfactory.runtime.container import LABEL

HOST = socket.gethostname()
NO_PID = 2 ** 22 + 12345  # above Linux's largest pid_max: no process here has it


class _API:
    def __init__(self, rows: list[dict]) -> None:
        self.rows, self.removed = rows, []

    def containers(self, all: bool = False, filters: dict | None = None) -> list[dict]:
        wanted = dict(f.split("=", 1) for f in (filters or {}).get("label", []))
        return [r for r in self.rows if all and wanted.items() <= r["Labels"].items()]

    def remove_container(self, cid: str, force: bool = False) -> None:
        self.removed.append(cid)


class _Client:
    def __init__(self, rows: list[dict]) -> None:
        self.api = _API(rows)


def _row(cid: str, owner: str | None) -> dict:
    labels = {LABEL: "1", "org.envfactory.env": "Counter-v0"}
    if owner is not None:
        labels["org.envfactory.owner"] = owner
    return {"Id": cid * 8, "Names": [f"/{cid}"], "Labels": labels}


ROWS = {
    "deadhere": f"{HOST}:{NO_PID}",          # this host, its process gone: provably dead
    "livehere": f"{HOST}:{os.getpid()}",     # this process: alive
    "elsewhere": f"other-{HOST}:1",         # another host: its owner may be alive there
    "elsedead": f"other-{HOST}:{NO_PID}",   # no such pid *here* proves nothing about that host
    "nolabel": None,                         # no owner label: cannot be proven anything
    "garbled": f"{HOST}:not-a-pid",
}


def _client() -> _Client:
    return _Client([_row(cid, owner) for cid, owner in ROWS.items()])


def test_gc_removes_only_what_this_host_can_prove_dead():
    client = _client()
    removed = pool._gc(client, everything=False)
    assert [r["name"] for r in removed] == ["deadhere"]
    assert client.api.removed == ["deadhere" * 8]


def test_gc_all_removes_every_envfactory_container():
    client = _client()
    removed = pool._gc(client, everything=True)
    assert sorted(r["name"] for r in removed) == sorted(ROWS)


@pytest.mark.parametrize("owner, dead", [
    (f"{HOST}:{NO_PID}", True),
    (f"{HOST}:{os.getpid()}", False),
    (f"other-{HOST}:{NO_PID}", False),
    (f"{HOST}.example:{NO_PID}", False),   # a longer name is another host
    (f"x:{HOST}:{NO_PID}", False),
    ("", False),
    (f":{NO_PID}", False),
])
def test_provably_dead_is_about_this_host_only(owner, dead):
    assert pool.provably_dead(owner, HOST) is dead


@pytest.mark.parametrize("argv, everything", [(["gc"], False), (["gc", "--all"], True),
                                              (["gc", "--everything"], True)])
def test_the_cli_removes_other_hosts_containers_only_when_told(monkeypatch, capsys, argv, everything):
    seen = []
    monkeypatch.setattr(pool, "gc", lambda **kw: seen.append(kw) or [])
    assert cli.main(argv) == 0
    assert seen == [{"everything": everything}]
    assert "nothing to remove" in capsys.readouterr().out
