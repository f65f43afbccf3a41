"""The state quota's measure (envfactory.quotas.state_size): a model of scalars is counted in one
pass, and that count is the general walk's, whatever the strings hold."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from envfactory import quotas
from envfactory.state import State
from envfactory.tooling import tool

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=20), st.text(alphabet=st.characters(min_codepoint=0x80), max_size=5))


class Flat(State):
    a: object = None
    bb: object = None
    ccc: object = None


@settings(max_examples=300, deadline=None)
@given(scalars, scalars, scalars)
def test_a_model_of_scalars_counts_what_the_walk_counts(a, bb, ccc) -> None:
    state = Flat(a=a, bb=bb, ccc=ccc)
    assert quotas._SIZERS.get(Flat, quotas._model_size) is quotas._model_size
    assert quotas.state_size(state) == quotas._model_size(state, None) == quotas._walk(state, None)


def test_a_model_holding_a_container_is_walked() -> None:
    state = Flat(a=["x" * 10], bb={"k": 1}, ccc="é")
    assert quotas.state_size(state) == quotas._walk(state, None) > 10


class Measured(State):
    n: int = 0


Measured.__state_size__ = staticmethod(lambda state, limit=None: 10 if state.n < 3 else 1 << 40)  # type: ignore[attr-defined]


@tool
def bump(state: Measured) -> str:
    """Add one."""
    state.n += 1
    return str(state.n)


def test_a_state_class_s_own_measure_is_what_the_quota_checks() -> None:
    """``__state_size__`` on the class decides the quota (copy-on-write states bring theirs):
    chosen once per class, for ``state_size`` and for the check after each call alike."""
    state = Measured()
    assert quotas.state_size(state) == 10
    for expected in (1, 2):
        out, state = quotas.invoke_within_quota(bump, state, {})
        assert out.ok and out.content == str(expected)
    out, state = quotas.invoke_within_quota(bump, state, {})  # the measure says it is now over the quota
    assert not out.ok and out.kind == "quota"


def test_numbers_and_keys_count_what_a_dump_writes() -> None:
    """Issue 63: an int of 4,000 digits counted 8 bytes, a non-ASCII key of a million characters
    16, so a list repeating one such value wrote hundreds of times the quota. Now each counts at
    least half of what a dump writes (the quota is half a wire frame)."""
    import json

    big = 10 ** 4000
    for value in (big, -big, {"é" * 1000: 1}, {big: 1}, 1.2345678901234567e-308, [0.1] * 100, 2 ** 62):
        state = Flat(a=[value] * 10)
        written = len(json.dumps(state.model_dump(mode="json"), ensure_ascii=False).encode())
        assert quotas.state_size(state) * 2 >= written, (str(value)[:20], quotas.state_size(state), written)
        flat = Flat(a=value) if not isinstance(value, (dict, list)) else None
        if flat is not None:
            assert quotas._model_size(flat, None) == quotas._walk(flat, None)
