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
