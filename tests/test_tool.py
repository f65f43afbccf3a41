"""Tools: schemas from type hints and docstrings; validation before the tool runs; never raises."""

import json
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from envfactory import State, ToolError, tool


class S(State):
    n: int = 0
    log: list[str] = []


@tool
def add(state: S, amount: int, note: str = "", scale: float = 1.0,
        mode: Literal["fast", "slow"] = "fast") -> str:
    """Add to the counter.

    Args:
        amount: How much to add.
        note: A note to log.
        scale: Multiplier.
        mode: Speed.
    """
    state.n += int(amount * scale)
    if note:
        state.log.append(note)
    return f"n={state.n}"


@tool
def explode(state: S) -> str:
    """Always fails with a bug."""
    raise ZeroDivisionError("division by zero")


@tool
def refuse(state: S) -> str:
    """Always refuses."""
    raise ToolError("not allowed today")


def test_schema_from_hints_and_docstring():
    fn = add.schema()["function"]
    assert fn["name"] == "add"
    assert fn["description"] == "Add to the counter."
    p = fn["parameters"]
    assert p["type"] == "object" and p["additionalProperties"] is False
    assert p["required"] == ["amount"]
    assert p["properties"]["amount"] == {"type": "integer", "description": "How much to add."}
    assert p["properties"]["scale"]["type"] == "number"
    assert p["properties"]["mode"]["enum"] == ["fast", "slow"]
    assert p["properties"]["note"]["default"] == ""


def test_property_named_title_survives_title_stripping():
    @tool
    def f(state: S, title: str) -> str:
        """Make a thing.

        Args:
            title: The title.
        """
        return title

    p = f.parameters
    assert p["required"] == ["title"] and list(p["properties"]) == ["title"]
    # the property named "title" survives; pydantic's auto-generated "title" keys do not
    assert p["properties"]["title"] == {"description": "The title.", "type": "string"}
    assert "title" not in p


@pytest.mark.parametrize(
    "args, fragment",
    [
        ({}, "missing required argument 'amount'"),
        ({"amount": 1, "bogus": 2}, "unexpected argument 'bogus'"),
        ({"amount": "5"}, "argument 'amount'"),
        ({"amount": True}, "argument 'amount'"),
        ({"amount": 1.5}, "argument 'amount'"),
        ({"amount": 1, "mode": "warp"}, "argument 'mode'"),
        ([1, 2], "must be a JSON object"),
        ("amount=1", "must be a JSON object"),
    ],
)
def test_invalid_arguments_become_error_observations(args, fragment):
    s = S()
    out = add.invoke(s, args)
    assert not out.ok and out.kind == "invalid_arguments"
    assert out.content.startswith("Error:") and fragment in out.content
    assert s.n == 0  # the tool did not run


def test_valid_arguments_fast_and_full_paths_agree():
    s = S()
    assert add.invoke(s, {"amount": 2}).content == "n=2"
    assert add.invoke(s, {"amount": 2, "scale": 2}).content == "n=6"  # int accepted for float
    assert add.invoke(s, {"amount": 1, "mode": "slow", "note": "x"}).content == "n=7"
    assert s.log == ["x"]


def test_tool_errors_and_bugs_are_observations():
    out = refuse.invoke(S(), {})
    assert (out.ok, out.kind, out.content) == (False, "tool_error", "Error: not allowed today")
    out = explode.invoke(S(), {})
    assert not out.ok and out.kind == "exception"
    assert "ZeroDivisionError" in out.content and "explode" in out.content


def test_tool_definition_errors_are_named():
    with pytest.raises(TypeError, match="needs a type hint"):
        @tool
        def bad(state, x) -> str:
            """Doc."""
    with pytest.raises(TypeError, match="needs a description"):
        @tool
        def nodoc(state, x: int) -> str:
            return ""


@tool
def scalars(state: S, a: int, b: float = 0.5, c: str = "", d: bool = False) -> str:
    """Echo the arguments as the tool received them, with their types.

    Args:
        a: An integer.
        b: A number.
        c: A string.
        d: A flag.
    """
    return json.dumps([[type(v).__name__, v] for v in (a, b, c, d)])


_VALUES = st.one_of(st.integers(-3, 3), st.floats(allow_nan=False, allow_infinity=False, width=16),
                    st.booleans(), st.text(max_size=2), st.none(), st.lists(st.integers(), max_size=1))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), _VALUES, max_size=5))
def test_scalar_fast_paths_accept_and_convert_exactly_what_pydantic_does(args) -> None:
    # invoke skips pydantic for scalar signatures (an exact-type pass-through, then a
    # converting check); both must agree with the arguments model on every input
    assert scalars._exact == {"a": int, "b": float, "c": str, "d": bool}
    out = scalars.invoke(S(), dict(args))
    try:
        kwargs = scalars.args_model.model_validate(args).__dict__
    except ValidationError:
        assert (out.ok, out.kind) == (False, "invalid_arguments")
        return
    assert out.ok and out.content == scalars.fn(S(), **kwargs)
