"""Coordination evaluation: metrics, contributions, cross-play, the report, the CLI, model teams."""

import importlib.util
import json
import subprocess
import sys

import pytest

import envfactory
from envfactory.checks.scripted import OraclePolicy, play
from envfactory.evaluation import eval as team_eval
from envfactory.evaluation.eval import POLICY_GROUP, build_policies, evaluate, summarize, wilson


def test_wilson_interval():
    assert wilson(0, 0) == [0.0, 1.0]
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert wilson(10, 10)[1] == 1.0 and wilson(10, 10)[0] == pytest.approx(0.7225, abs=1e-3)


def test_summarize_counts_rounds_messages_and_coordination_errors():
    def row(success, rounds, messages, conflicts=0, permission=0, redundant=0, error=None):
        return {"success": success, "rewards": {"a_0": float(success)}, "rounds": rounds, "ended_by": "finish",
                "turns": 2 * rounds, "tool_calls": 5, "tool_errors": conflicts + permission, "parse_errors": 0,
                "messages": messages, "conflicts": conflicts, "permission_errors": permission,
                "redundant": redundant, "error": error}

    rows = [row(True, 3, 2), row(True, 5, 4, conflicts=2, redundant=1), row(False, 9, 6, permission=1, error="x")]
    m = summarize(rows, ["a_0"])
    assert m["success_rate"] == pytest.approx(2 / 3, abs=1e-4) and m["rounds_to_success"] == 4.0
    assert m["ci95"] == wilson(2, 3) and m["failed_episodes"] == 1 and m["mean_tool_calls"] == 5.0
    assert m["messages_per_success"] == 6.0 and m["messages_per_episode"] == 4.0
    assert m["conflicts_per_episode"] == pytest.approx(2 / 3, abs=1e-3)
    assert m["permission_errors_per_episode"] == pytest.approx(1 / 3, abs=1e-3)
    assert m["redundant_per_episode"] == pytest.approx(1 / 3, abs=1e-3)
    assert m["reward"] == {"a_0": pytest.approx(2 / 3, abs=1e-3)} and m["ended_by"] == {"finish": 3}
    assert "rounds_to_success" not in summarize(rows)  # the coordination metrics are a team's


def test_scripted_team_evaluation():
    doc = evaluate(["MultiRooms-v0", "MultiDeal-v0"], ["oracle", "random", "noop"], episodes=2)
    assert doc["summary"]["oracle"]["aec"]["success_rate"] == 1.0
    assert doc["summary"]["noop"]["parallel"]["success_rate"] == 0.0
    rooms, deal = doc["environments"]
    assert rooms["teams"]["oracle"]["aec"]["rounds_to_success"] < rooms["teams"]["oracle"]["parallel"]["rounds_to_success"]
    assert rooms["teams"]["oracle"]["aec"]["messages_per_success"] == 3.0
    assert rooms["teams"]["random"]["aec"]["episodes"] == 2 * rooms["tasks"]   # stochastic: 2 seeds per task
    assert rooms["teams"]["oracle"]["aec"]["episodes"] == rooms["tasks"]       # deterministic: once per task
    # every agent of the oracle team is necessary; a no-op team has nothing to lose
    assert all(c["contribution"] == 1.0 for c in rooms["contribution"]["oracle"].values())
    assert all(c["contribution"] == 0.0 for c in rooms["contribution"]["noop"].values())
    cross = rooms["cross_play"]
    assert cross["oracle"]["oracle"] == 1.0 and cross["oracle"]["noop"] == 0.0 and cross["noop"]["oracle"] == 0.0
    assert 0 < deal["teams"]["oracle"]["aec"]["reward"]["trader_0"] < 1  # mixed motive: a share, not all


def test_a_crashing_policy_fails_its_episodes_not_the_evaluation():
    class Crash:
        name, stochastic = "crash", False

        def act(self, episode, agent, seed):
            raise RuntimeError("boom")

    seen = []
    doc = evaluate(["MultiRecords-v0"], ["oracle", Crash()], modes=["aec"], progress=seen.append)
    crash = doc["summary"]["crash"]["aec"]
    assert crash["failed_episodes"] == crash["episodes"] > 0 and crash["success_rate"] == 0.0
    assert doc["summary"]["oracle"]["aec"]["failed_episodes"] == 0
    assert any("episodes failed, e.g. RuntimeError: boom" in m for m in seen)


def test_cli_eval_team_writes_json_markdown_and_plots(tmp_path):
    out = subprocess.run([sys.executable, "-m", "envfactory.cli", "eval-team", "MultiSupport-v0", "MultiMeeting-v0",
                          "--policies", "oracle,noop", "--out", str(tmp_path), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [e["name"] for e in doc["environments"]] == ["MultiSupport-v0", "MultiMeeting-v0"]
    saved = json.loads((tmp_path / "team_eval.json").read_text())
    assert saved["summary"] == doc["summary"]
    md = (tmp_path / "team_eval.md").read_text()
    assert "## MultiMeeting-v0" in md and "Cross-play" in md and "plots/success_aec.svg" in md
    svg = (tmp_path / "plots" / "crossplay_MultiSupport-v0.svg").read_text()
    assert svg.startswith("<svg") and "oracle" in svg
    via_eval = subprocess.run([sys.executable, "-m", "envfactory.cli", "eval", "--env", "MultiDeal-v0", "--policy",
                               "oracle,noop", "--episodes", "1", "--report", str(tmp_path / "e"), "--json"],
                              capture_output=True, text=True)
    assert via_eval.returncode == 0, via_eval.stderr
    assert json.loads(via_eval.stdout)["summary"]["oracle"]["aec"]["success_rate"] == 1.0
    assert (tmp_path / "e" / "team_eval.md").exists()
    bad = subprocess.run([sys.executable, "-m", "envfactory.cli", "eval-team", "Counter-v0", "--policies", "noop"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "single-agent" in bad.stderr


class _EchoPolicy:
    """A stand-in model policy: says what it was asked to, from the agent's own transcript."""

    stochastic = True

    def __init__(self, model, *, name, max_new_tokens):
        self.model, self.name, self.max_new_tokens = model, name, max_new_tokens

    def act(self, episode, agent, seed):
        return f"{self.model} saw {len(episode.transcript(agent))} messages"


class _EntryPoint:
    value = "tests.test_multi_eval:_EchoPolicy"

    def load(self):
        return _EchoPolicy


def test_model_policies_come_through_the_entry_point_group_or_as_objects(monkeypatch):
    monkeypatch.setattr(team_eval, "policy_factories", lambda: {"echo": _EntryPoint()})
    [scripted, model, given] = build_policies(["noop", "echo:m-1", OraclePolicy()], model_tasks=1, max_new_tokens=7)
    assert (scripted.name, scripted.stochastic, scripted.max_tasks) == ("noop", False, None)
    assert model.name == "echo:m-1" and model.policy.model == "m-1" and model.policy.max_new_tokens == 7
    assert model.stochastic and model.max_tasks == 1
    assert given.name == "oracle" and not given.stochastic
    doc = evaluate(["MultiRecords-v0"], ["oracle", "echo"], episodes=1, modes=["aec"])
    assert doc["environments"][0]["teams"]["echo"]["tasks"] == 2  # model policies play model_tasks tasks
    assert doc["summary"]["echo"]["aec"]["success_rate"] == 0.0
    assert doc["summary"]["oracle"]["aec"]["success_rate"] == 1.0
    with pytest.raises(KeyError, match="unknown policy 'nope'"):
        build_policies(["nope"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None or importlib.util.find_spec("agents") is None,
                    reason="model teams need the agents package and torch (the 'train' extra)")
def test_tiny_model_team_plays_through_the_agents_policy():
    from conftest import _missing

    if "tiny" not in team_eval.policy_factories():
        _missing("the 'tiny' policy", f"no entry point 'tiny' in the '{POLICY_GROUP}' group (pip install -e .)")
    [entry] = build_policies(["tiny"], max_new_tokens=8)
    llm = entry.policy
    ep = envfactory.make_multi("MultiRecords-v0", max_turns=2)
    out = play(ep, {"reader_0": llm, "writer_0": OraclePolicy()}, 0, mode="parallel", seed=0)
    assert out.rounds >= 1 and out.success is False
    said = [m for m in ep.transcript("reader_0") if m["role"] == "assistant"]
    assert said and all(isinstance(m["content"], str) for m in said)
    # the prompt the model saw is the agent's own view, rendered with its role's tools
    ids = llm.renderer.opening(ep.transcript("reader_0"), ep.tool_schemas("reader_0"))
    text = llm.policy.tokenizer.decode(ids)
    assert "search_employees" in text and "update_employee" not in text
