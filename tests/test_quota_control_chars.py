"""The state quota counts a string as a dump writes it, control characters included (issue 63).

Before, a control character counted one byte while a dump writes it as six (``\\u0000``) or two
(``\\n``, ``\\"``, ``\\\\``): a state of 10 MB of ``"\\x00"`` passed the 32 MiB quota and dumped
to 60 MB. Now the full walk, the ledger of a large tracked state and the copy-on-write measure of
an imported class count every string as the ASCII dump writes it (``len(json.dumps(s))``: the
container's replies), which is never less than the bytes of the canonical dump (UTF-8)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings, strategies as st

from envfactory import Episode, call, quotas
from envfactory.factory.from_class import ClassTask, from_class
from envfactory.state import State, canonical_json, state_hash
from envfactory.tooling import tool

NASTY = ["\x00" * 300, "a\nb\tc\r\x0b\x0c", 'say "hi" \\ bye', "\x1f\x7f", "é\x00ü", "\U0001f600\n",
         "x" * 400 + "\x01", '"' * 300, "plain"]
# (a state's strings: no lone surrogate, which pydantic's dump refuses; the string test has them)
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40) | st.sampled_from(NASTY)


class Doc(State):
    text: str = ""
    items: list[str] = []
    table: dict[str, str] = {}
    tags: set[str] = set()
    blob: Any = None


def _ascii_dump(state: State) -> int:
    """What the container's reply writes of the state (ASCII, compact)."""
    return len(json.dumps(state.model_dump(mode="json"), ensure_ascii=True, separators=(",", ":")))


def _canonical_bytes(state: State) -> int:
    return len(canonical_json(state).encode())


def _check(state: Doc) -> int:
    size = quotas.state_size(state)
    assert size == quotas._walk(state, None)
    written = _ascii_dump(state)
    # an upper bound of what either dump writes, within a few bytes a container (its last comma)
    assert written <= size <= written + 8, (size, written)
    canonical = _canonical_bytes(state)
    assert canonical <= size, (size, canonical)
    return size


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(), max_size=600) | st.sampled_from(NASTY + ["\ud800x", "\udfff" * 300]))
def test_a_string_counts_what_a_dump_writes(s: str) -> None:
    assert quotas._str_size(s) == len(json.dumps(s)) == quotas._leaf(s)
    assert quotas._key_size(s) == len(json.dumps(s)) + 2


@settings(max_examples=200, deadline=None)
@given(texts, st.lists(texts, max_size=6), st.dictionaries(texts, texts, max_size=6))
def test_the_walk_counts_strings_of_control_characters_as_a_dump_writes_them(text, items, table) -> None:
    _check(Doc(text=text, items=items, table=table))
    _check(Doc(blob={"nested": [text, {"k": items}], text: table}))


def test_ten_thousand_nul_characters_count_sixty_thousand_bytes() -> None:
    """The bug's shape: before, 10,002 bytes counted for 60,002 written (six times the quota)."""
    state = Doc(text="\x00" * 10_000, items=["\n" * 1000, '"\\' * 500], table={"\x00" * 100: "\x1f" * 100})
    size = _check(state)
    assert size >= 60_000 + 2_000 + 2_000 + 600 + 600


# -- the ledger (a large tracked state: each writing call counted by what it changed) -------------
@tool
def put(state: Doc, key: str, text: str) -> str:
    """Write ``text`` into the state in every kind of container.

    Args:
        key: Where.
        text: What.
    """
    state.table[key] = text
    state.items.append(text)
    state.tags.add(text)
    state.text = text
    return "ok"


@tool
def drop(state: Doc, key: str) -> str:
    """Remove what ``put`` wrote at ``key``.

    Args:
        key: Where.
    """
    text = state.table.pop(key)
    state.items.remove(text)
    state.tags.discard(text)
    return "ok"


def _ledger(state: Any) -> Any:
    j = quotas._journal(state)
    return None if j is None else j.ledger


def test_the_ledger_counts_control_characters_as_the_walk_does() -> None:
    state = Doc(table={f"r{i}": f"row {i}" for i in range(200)}, items=[f"i{i}" for i in range(50)])
    quotas.track(state)
    for i in range(quotas.ADOPT_AFTER + 1):  # found large by the first writing calls, adopted by the next
        out, state = quotas.invoke_within_quota(put, state, {"key": f"w{i}", "text": f"w{i}"})
        assert out.ok
    lg = _ledger(state)
    assert lg is not None and lg.total == quotas._walk(state, None)
    for i, text in enumerate(NASTY + ["\x00" * 5000, "\n\"\\" * 700]):
        key = text[:50] + str(i)  # a key of control characters too
        out, state = quotas.invoke_within_quota(put, state, {"key": key, "text": text})
        assert out.ok
        assert _ledger(state) is lg, f"the ledger gave up at {text[:10]!r}"
        assert lg.total == quotas._walk(state, None), repr(text[:10])
        _check(state)
        if i % 2:
            out, state = quotas.invoke_within_quota(drop, state, {"key": key})
            assert out.ok and lg.total == quotas._walk(state, None), repr(text[:10])
    assert _ledger(state) is lg


# -- a call over the quota by control characters is refused ---------------------------------------
@tool
def fill(state: Doc, n: int) -> str:
    """Write ``n`` NUL characters.

    Args:
        n: How many.
    """
    state.text = "\x00" * n
    return "filled"


def test_a_call_writing_nul_characters_past_the_quota_is_refused(monkeypatch) -> None:
    """6 MiB of NUL characters write 36 MiB: over an 8 MiB quota (before: counted 6 MiB, kept)."""
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", 8 << 20)
    for tracked in (True, False):
        state = Doc(text="before", items=["x"] * 10)
        if tracked:
            quotas.track(state)
        before = state_hash(state)
        out, state = quotas.invoke_within_quota(fill, state, {"n": 6 << 20})
        assert not out.ok and out.kind == "quota" and out.content.startswith(quotas.STATE_QUOTA_PREFIX), out.content
        assert "it was not applied" in out.content
        assert state_hash(state) == before and state.text == "before"
        out, state = quotas.invoke_within_quota(fill, state, {"n": 1 << 20})  # 6 MiB written: within it
        assert out.ok and len(state.text) == 1 << 20


# -- the copy-on-write measure of an imported class ------------------------------------------------
class Notes:
    """Notes (an imported class)."""

    def __init__(self, n: int = 0) -> None:
        self.pages = {f"p{i}": {"title": f"page {i}", "lines": [f"line {j}" for j in range(3)]} for i in range(n)}
        self.log: list[str] = []

    def write(self, page: str, text: str) -> str:
        """Write a page.

        Args:
            page: The page.
            text: Its text.
        """
        self.pages[page] = {"title": text, "lines": [text, text[:3]]}
        self.log.append(text)
        return "ok"

    def fill(self, n: int) -> str:
        """Write ``n`` NUL characters to the log.

        Args:
            n: How many.
        """
        self.log.append("\x00" * n)
        return "filled"


class _Plain:
    def __init__(self, d: dict[str, Any]) -> None:
        self.__dict__ = d


def _cow_spec(mode: str) -> Any:
    return from_class(Notes, name=f"NotesCc{mode}-v0", domain="t", copy_on_write=mode, max_turns=100,
                      tasks=[ClassTask("t", "Write.", {"n": 300}, [call("write", page="p1", text="x")])])


def test_the_copy_on_write_measure_counts_control_characters_as_the_walk_does() -> None:
    for mode in ("containers", "state"):
        ep = Episode(_cow_spec(mode))
        ep.reset("t")
        for i, text in enumerate(NASTY[:-1] + ["\x00" * 3000]):
            assert ep.step(call("write", page=text[:20] + str(i), text=text).to_hermes()).messages[0]["content"] == "ok"
            if i % 3 == 0:
                ep = ep.fork()
            plain = json.loads(json.dumps(dict(ep.state.__dict__)))
            size = quotas.state_size(ep.state)
            assert size == quotas.state_size(_Plain(plain)) - 16, (mode, repr(text[:10]))
            written = len(json.dumps({k: v for k, v in plain.items()}, separators=(",", ":")))
            assert written <= size, (mode, size, written)


def test_an_imported_class_writing_nul_characters_past_the_quota_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", 8 << 20)
    for mode in ("containers", "state"):
        ep = Episode(_cow_spec(mode))
        ep.reset("t")
        before = state_hash(ep.state)
        said = ep.step(call("fill", n=6 << 20).to_hermes()).messages[0]["content"]
        assert said.startswith(quotas.STATE_QUOTA_PREFIX) and "it was not applied" in said, (mode, said[:200])
        assert state_hash(ep.state) == before
        assert ep.step(call("fill", n=1000).to_hermes()).messages[0]["content"] == "filled"


class Pages:
    """Pages (an imported class)."""

    def __init__(self, n: int = 0) -> None:
        self.pages: dict[str, Any] = {f"p{i}": f"page {i}" for i in range(n)}
        self.pages["big"] = ["\x00" * 20_000]

    def drop(self, page: str) -> str:
        """Drop a page.

        Args:
            page: The page.
        """
        del self.pages[page]
        return "dropped"

    def write(self, page: str, text: str) -> str:
        """Write a page.

        Args:
            page: The page.
            text: Its text.
        """
        self.pages[page] = text
        return "ok"


def test_the_copy_on_write_measure_stops_past_its_limit_but_not_on_what_a_call_removed(monkeypatch) -> None:
    """The measure of ``copy_on_write="containers"`` stops past its limit (it walked every path of
    a nest: tests/adversarial/test_session_quotas.py); what a call took out does not stop it: a
    state over a lowered quota that drops its largest page (120 KB of NUL characters) is within it
    again."""
    from envfactory.factory.classes.cow import cow_state_size

    spec = from_class(Pages, name="PagesCc-v0", domain="t", copy_on_write="containers", max_turns=20,
                      tasks=[ClassTask("t", "Drop.", {"n": 2000}, [call("drop", page="big")])])
    ep = Episode(spec)
    ep.reset("t")
    assert ep.step(call("write", page="p1", text="x").to_hermes()).messages[0]["content"] == "ok"
    ep = ep.fork()
    size = quotas.state_size(ep.state)
    assert size > 120_002 + 20_000  # the NUL page writes 120,002 bytes
    assert cow_state_size(ep.state, 1000) > 1000
    monkeypatch.setattr(quotas, "MAX_STATE_BYTES", size - 100_000)  # over it now; within it without "big"
    assert ep.step(call("drop", page="big").to_hermes()).messages[0]["content"] == "dropped"
    assert quotas.state_size(ep.state) == size - 120_002 - 3 - 7 <= quotas.MAX_STATE_BYTES
