"""A class imported unchanged becomes a working, verified environment."""

from __future__ import annotations

import ast
import inspect

import pytest

import envfactory
from envfactory.factory.from_class import Synthesis, from_class
from envfactory import Episode
from envfactory.checks.verify import verify_spec
from environments.classes import brokerage
from environments.classes.brokerage import Brokerage


def _spec():
    return from_class(Brokerage, name="BrokerTest-v0", domain="trading",
                      config={"cash": 1000.0, "prices": {"ACME": 10.0, "UMBR": 99.5}, "positions": {}},
                      synthesis=Synthesis(n_tasks=12, arguments={
                          "symbol": "keys:prices", "sell.symbol": "keys:positions", "quantity": [1, 2, 3],
                          "order_id": "keys:orders", "limit": [9.5, 20.0]}))


def test_class_module_knows_nothing_of_envfactory():
    tree = ast.parse(inspect.getsource(brokerage))
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m.startswith("envfactory") for m in imported)


def test_class_becomes_an_environment_and_stays_unchanged():
    before = dict(vars(Brokerage))
    spec = _spec()
    assert dict(vars(Brokerage)) == before  # nothing added, replaced or wrapped
    names = {t["function"]["name"] for t in spec.tool_schemas()}
    assert {"quote", "portfolio", "buy", "sell", "place_limit_order", "cancel_order", "watch"} <= names
    buy = next(t for t in spec.tool_schemas() if t["function"]["name"] == "buy")["function"]
    assert buy["parameters"]["properties"]["quantity"] == {"type": "integer",
                                                           "description": "Number of shares (1 to 1000)."}
    assert set(spec.state_type.model_fields) >= {"cash", "prices", "positions", "orders", "watchlist"}

    env = Episode(spec)
    env.reset(0)
    r = env.step('<tool_call>{"name": "buy", "arguments": {"symbol": "ACME", "quantity": 3}}</tool_call>')
    assert "bought 3 ACME" in r.messages[0]["content"]
    assert env.state.cash == 970.0 and env.state.positions == {"ACME": 13}  # 10 by default + 3
    r = env.step('<tool_call>{"name": "sell", "arguments": {"symbol": "UMBR", "quantity": 1}}</tool_call>')
    assert r.messages[0]["content"].startswith("Error") and env.state.cash == 970.0  # class error -> observation
    child = env.fork()
    child.step('<tool_call>{"name": "watch", "arguments": {"symbol": "UMBR"}}</tool_call>')
    assert child.state.watchlist == ["UMBR"] and env.state.watchlist == []


def test_class_environment_passes_verification_with_synthesized_tasks():
    spec = _spec()
    tasks = spec.get_tasks()
    assert len(tasks) == 12 and len({t.difficulty for t in tasks}) >= 3
    report = verify_spec(spec, make_env=lambda: Episode(spec))
    assert report.verified, report.failures


def test_library_class_environments_are_registered():
    for name in ("SmartHome-v0", "Vehicle-v0", "Trading-v0", "GitRepo-v0", "Spreadsheet-v0",
                 "TeamChat-v0", "Social-v0", "LabBench-v0"):
        assert envfactory.spec(name).metadata["source"].startswith("class environments.classes.")


def test_the_documented_spelling_calls_the_factory_whatever_was_imported_first() -> None:
    """`envfactory.factory.from_class(...)` (the README's spelling) and `from envfactory.factory import
    from_class`: importing the same-named submodule makes it the package's attribute; it must still call."""
    import envfactory.factory as factory
    from envfactory.factory import from_class as imported, from_spec

    spec = factory.from_class(Brokerage, name="BrokerTwice-v0", domain="trading", synthesis=Synthesis(n_tasks=3),
                              config={"cash": 1000.0, "positions": {}, "prices": {"ACME": 10.0}})
    again = imported(Brokerage, name="BrokerThrice-v0", domain="trading", synthesis=Synthesis(n_tasks=3),
                     config={"cash": 1000.0, "positions": {}, "prices": {"ACME": 10.0}})
    assert spec.name == "BrokerTwice-v0" and again.name == "BrokerThrice-v0"
    assert [t["function"]["name"] for t in spec.tool_schemas()] == [t["function"]["name"] for t in again.tool_schemas()]
    assert callable(from_spec) and callable(factory.from_mcp)


def test_options_are_grouped_by_what_they_shape() -> None:
    """A class's own options live in its Service, task synthesis in Synthesis; the call says which is which."""
    from envfactory import SpecError
    from envfactory.factory import Service

    config = {"cash": 1000.0, "positions": {}, "prices": {"ACME": 10.0, "UMBR": 99.5}}
    spec = from_class(Service(Brokerage, prefix="b_", exclude=["cancel_order"]), name="BrokerGrouped-v0",
                      domain="trading", config=config,
                      synthesis=Synthesis(n_tasks=4, seed=3, arguments={"symbol": ["ACME"], "quantity": [1]}))
    names = {t["function"]["name"] for t in spec.tool_schemas()} - {"finish"}
    assert names and all(n.startswith("b_") for n in names) and "b_cancel_order" not in names
    tasks = spec.get_tasks()
    assert len(tasks) == 4
    again = from_class(Service(Brokerage, prefix="b_", exclude=["cancel_order"]), name="BrokerGrouped-v1",
                       domain="trading", config=config,
                       synthesis=Synthesis(n_tasks=4, seed=3, arguments={"symbol": ["ACME"], "quantity": [1]}))
    assert [t.instruction for t in again.get_tasks()] == [t.instruction for t in tasks]  # the seed decides
    for removed in ("n_tasks", "prefix", "exclude", "init", "templates", "read_share"):
        with pytest.raises(TypeError, match=removed):
            from_class(Brokerage, name="X-v0", domain="x", config=config, **{removed: None})
    with pytest.raises(SpecError, match=r"Service\(cls, loader=\.\.\.\)"):
        from_class([Brokerage, Service(Brokerage, key="other")], name="Y-v0", domain="x", loader="load")
