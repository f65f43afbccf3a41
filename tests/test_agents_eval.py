"""`envfactory eval`: success rates with Wilson intervals, per-episode counts, report and plots
(scripted baselines through the same policy objects and play() as teams)."""

from __future__ import annotations

import json
import math

import pytest

import envfactory
from agents.eval import evaluate
from envfactory.checks.scripted import OraclePolicy
from envfactory.cli import main
from envfactory.evaluation.eval import episode_row, wilson


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson(8, 10)
    assert math.isclose(lo, 0.4902, abs_tol=1e-4) and math.isclose(hi, 0.9433, abs_tol=1e-4)
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0
    lo, hi = wilson(0, 5)
    assert 0.4 < hi < 0.5


def test_scripted_baselines_bound_the_scale() -> None:
    oracle = evaluate(["Counter-v0", "Bank-v0"], "oracle", episodes=4)
    noop = evaluate(["Counter-v0", "Bank-v0"], "noop", episodes=4)
    assert oracle["totals"]["success_rate"] == 1.0 and noop["totals"]["success_rate"] == 0.0
    assert oracle["totals"]["mean_tool_calls"] > 0 and noop["totals"]["mean_tool_calls"] == 0
    assert [e["name"] for e in oracle["environments"]] == ["Counter-v0", "Bank-v0"]
    assert len(oracle["episodes"]) == 8
    row = oracle["episodes"][0]
    assert row["turns"] == row["tool_calls"] + 1 and row["ended_by"] == "answer" and row["error"] is None
    claim = evaluate(["Counter-v0"], "claim", episodes=2)  # claims earn nothing
    assert claim["totals"]["success_rate"] == 0.0 and claim["totals"]["mean_tool_calls"] == 0
    given = evaluate(["Counter-v0"], OraclePolicy(), episodes=2)  # a policy object, not a spec
    assert given["policy"] == "OraclePolicy" and given["totals"]["success_rate"] == 1.0


def test_eval_plays_the_eval_split_unless_told_otherwise() -> None:
    spec = envfactory.spec("Bank-v0")
    n_eval = len(spec.tasks_in("eval"))
    doc = evaluate(["Bank-v0"], "oracle", episodes=n_eval + 2)  # cycles within the split
    played = [r["task"] for r in doc["episodes"]]
    assert doc["split"] == "eval" and {spec.split(t) for t in played} == {"eval"}
    assert len(set(played)) == n_eval
    every = evaluate(["Bank-v0"], "noop", episodes=len(spec.get_tasks()), split=None)
    assert {spec.split(r["task"]) for r in every["episodes"]} == {"sft", "rl", "eval"}
    rl = evaluate(["Bank-v0"], "noop", episodes=3, split="rl")
    assert {spec.split(r["task"]) for r in rl["episodes"]} == {"rl"}
    with pytest.raises(ValueError, match="split"):
        evaluate(["Bank-v0"], "noop", episodes=1, split="test")


def test_a_crashing_policy_fails_its_episode_only() -> None:
    class Crash:
        name = "crash"

        def act(self, episode, agent, seed):
            raise RuntimeError("boom")

    doc = evaluate(["Counter-v0"], Crash(), episodes=2)
    assert doc["totals"]["failed_episodes"] == 2 and doc["totals"]["success_rate"] == 0.0
    assert doc["episodes"][0]["error"] == "RuntimeError: boom"
    ep = envfactory.make("Counter-v0")
    assert episode_row(ep, OraclePolicy(), 0)["success"] is True


def test_cli_eval_with_the_tiny_model_writes_a_report(tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    report = tmp_path / "report"
    trajs = tmp_path / "t.jsonl"
    code = main(["eval", "--env", "Counter-v0,FileSystem-v0", "--policy", "tiny", "--episodes", "2",
                 "--max-new-tokens", "16", "--max-turns", "2", "--json", "--report", str(report),
                 "--trajectories", str(trajs)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["totals"]["episodes"] == 4 and doc["totals"]["failed_episodes"] == 0
    for e in doc["environments"]:
        assert 0.0 <= e["ci95"][0] <= e["success_rate"] <= e["ci95"][1] <= 1.0
        assert e["mean_turns"] >= 1
    assert {"turns", "tool_calls", "parse_errors", "sampled_tokens"} <= set(doc["episodes"][0])
    md = (report / "report.md").read_text()
    assert "| Counter-v0 | 2 |" in md and "![success.png](success.png)" in md
    for png in ("success.png", "episodes.png"):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(trajs.read_text().splitlines()) == 4


def test_cli_eval_errors_name_the_problem(capsys) -> None:
    assert main(["eval", "--env", "Nope-v0", "--policy", "oracle", "--episodes", "1", "--json"]) == 2
    assert "Nope-v0" in json.loads(capsys.readouterr().out)["error"]
    assert main(["eval", "--env", "Counter-v0", "--policy", "gpt:foo", "--episodes", "1", "--json"]) == 2
    assert "unknown policy spec" in json.loads(capsys.readouterr().out)["error"]
