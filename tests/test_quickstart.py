"""The quickstart pipeline end to end, on a tiny budget: splits, paired arms, statistics, report."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import envfactory  # noqa: E402
from agents.quickstart import QuickstartConfig, check_splits, run_quickstart  # noqa: E402


@pytest.mark.slow
def test_quickstart_measures_every_arm_on_evaluation_tasks_only(tmp_path) -> None:
    cfg = QuickstartConfig(seeds=[0, 1], arms=["arpo", "grpo"], pretrained=False, sft_tasks=4, sft_epochs=1,
                           rl_steps=1, M=2, N=1, tasks_per_step=1, max_new_tokens=8, eval_tasks=2,
                           eval_samples=2, output_dir=str(tmp_path))
    s = run_quickstart(cfg)
    spec = envfactory.spec(cfg.env)
    assert all(spec.split(t) == "eval" for t in s["tasks"]["eval"]) and len(s["tasks"]["eval"]) == 2
    for stage in ("before", "sft", "arpo", "grpo"):
        assert len(s["success"][stage]) == 2 and len(s["grids"][stage]) == 2 and len(s["grids"][stage][0]) == 2
    assert set(s["compare"]) == {"arpo_minus_sft", "grpo_minus_sft", "sft_minus_before", "arpo_minus_grpo"}
    assert all(len(c["ci"]) == 2 and c["seeds"] == 2 and c["tasks"] == 2 for c in s["compare"].values())
    assert json.loads((tmp_path / "summary.json").read_text())["arms"] == ["arpo", "grpo"]
    assert "Paired differences" in (tmp_path / "report.md").read_text()


def test_overlapping_splits_and_unknown_arms_are_errors() -> None:
    with pytest.raises(ValueError, match="RL and evaluation"):
        check_splits(["a"], ["b", "c"], ["c"])
    with pytest.raises(ValueError, match="arms"):
        QuickstartConfig(arms=["ppo"])
