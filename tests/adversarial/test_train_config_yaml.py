"""A training config is hostile input too (issue 27): a YAML alias bomb in ``envfactory train
--config FILE`` is refused at once, by name, through the spec-file loader's alias budget."""

from __future__ import annotations

import time

import pytest

from agents.train_config import TrainerConfig


def _bomb(levels: int, width: int = 9) -> str:
    """Anchors inside a known key (``seed``), so no unknown-key check stops it before it is read:
    its error message alone would be ``width ** levels`` words long (9 levels: gigabytes)."""
    lines = ["seed: [&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"  , &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "]\n"


def test_alias_bomb_config_is_refused_quickly(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(7))  # 9**7 nodes expanded: safe to run without the budget too (it then fails)
    assert len(path.read_bytes()) < 500
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"bomb\.yaml: the YAML expands to more than .* aliases"):
        TrainerConfig.from_file(path)
    assert time.perf_counter() - t0 < 1.0

    path.write_text(_bomb(9))  # a few hundred bytes, 9**9 nodes expanded
    with pytest.raises(ValueError, match="expands to more than"):
        TrainerConfig.from_file(path)


def test_recursive_alias_config_is_an_error_not_a_hang(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("a: &a [*a]\nenvs: *a\n")
    with pytest.raises(ValueError, match="loop.yaml"):
        TrainerConfig.from_file(path)


def test_configs_with_a_few_aliases_and_plain_ones_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("common: &envs [Counter-v0]\nenvs: *envs\nseed: 3\n")
    with pytest.raises(ValueError, match="common"):  # an unknown key is still named, after the budget
        TrainerConfig.from_file(path)
    path.write_text("envs: &envs [Counter-v0]\nseed: 3\n")
    cfg = TrainerConfig.from_file(path)
    assert cfg.envs == ["Counter-v0"] and cfg.seed == 3
    (tmp_path / "empty.yaml").write_text("")
    assert TrainerConfig.from_file(tmp_path / "empty.yaml") == TrainerConfig()
