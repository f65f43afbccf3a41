"""A spec file is hostile input too: a YAML alias bomb is refused at once, by name."""

from __future__ import annotations

import time

import pytest

from envfactory import SpecError
from envfactory.factory.from_spec import load_spec_file


def _bomb(levels: int = 9, width: int = 9) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines.append(f"name: Bomb-v0\ndomain: x\nentities: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_quickly(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    assert len(path.read_bytes()) < 700  # the attack: a few hundred bytes, 9**9 nodes expanded
    t0 = time.perf_counter()
    with pytest.raises(SpecError, match="expands to more than"):
        load_spec_file(path)
    assert time.perf_counter() - t0 < 1.0  # before the fix: over a minute


def test_recursive_alias_is_an_error_not_a_hang(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("a: &a [*a]\nname: Loop-v0\n")
    with pytest.raises(SpecError):
        load_spec_file(path)


def test_a_few_aliases_still_load(tmp_path):
    """Anchors and aliases in moderation are ordinary YAML: the budget does not refuse them."""
    path = tmp_path / "ok.yaml"
    path.write_text(_bomb(levels=2, width=3))
    with pytest.raises(SpecError) as info:  # not a spec, but it got past the YAML
        load_spec_file(path)
    assert "expands" not in str(info.value) and "invalid spec" in str(info.value)
