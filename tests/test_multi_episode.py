"""The multi-agent episode: turns, permissions, messages, endings, rewards, fork/snapshot/restore."""

import json

import pytest

import envfactory
from envfactory import EpisodeError, StepResult
from envfactory.checks.scripted import OraclePolicy, RandomPolicy, episode_trace, play


def call(name, /, **args):
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


def test_turn_order_is_enforced():
    ep = envfactory.make_multi("MultiRecords-v0")
    with pytest.raises(EpisodeError, match="reset"):
        ep.act("reader_0", "hi")
    ep.reset(0)
    assert ep.status.next_agent == "reader_0"
    with pytest.raises(EpisodeError, match="reader_0's turn"):
        ep.act("writer_0", "hi")


def test_tools_of_another_role_are_refused_with_a_hint():
    ep = envfactory.make_multi("MultiRecords-v0")
    ep.reset(0)
    r = ep.act("reader_0", call("update_employee", employee_id="E-102", field="team", value="x", request_id="M-1"))
    assert r.messages[0]["content"].startswith("Error: permission denied")
    assert "writer_0" in r.messages[0]["content"]
    assert ep.status.log[-1]["kind"] == "permission" and not r.done
    r = ep.act("writer_0", call("get_employee", employee_id="E-102"))
    assert "reader_0" in r.messages[0]["content"] and ep.state.employees["E-102"].team == "data"


def test_direct_and_broadcast_messages_reach_the_right_agents_and_cannot_be_forged():
    ep = envfactory.make_multi("MultiRooms-v0")
    ep.reset(0)
    ep.act("sales_0", call("send_message", to="eng_0", content="need atlas at 11"))
    assert "need atlas at 11" in ep.observation("eng_0")  # what eng_0 sees before its turn
    ep.act("eng_0", call("send_message", to="all", content="I take birch at 10"))
    assert any("need atlas at 11" in m["content"] for m in ep.transcript("eng_0") if m["role"] == "user")
    assert "need atlas at 11" not in ep.observation("hr_0")
    assert "birch" in ep.observation("hr_0") and "birch" in ep.observation("sales_0")
    assert "birch" not in ep.observation("eng_0").split("</tool_response>")[-1]
    letters = ep.state.mail.letters
    assert [(m.sender, m.to) for m in letters] == [("sales_0", "eng_0"), ("eng_0", "all")]
    r = ep.act("hr_0", call("send_message", to="hr_0", content="me"))
    assert "yourself" in r.messages[0]["content"]
    # letters are delivered into the recipient's conversation at its next turn
    ep.act("sales_0", "waiting")
    assert any("birch" in m["content"] for m in ep.transcript("sales_0") if m["role"] == "user")


def test_every_member_means_the_same_for_any_number_of_roles_or_names_the_one_to_use():
    team = envfactory.make_multi("MultiRecords-v0")
    with pytest.raises(EpisodeError, match=r"transcript\(agent\)"):
        team.transcript()
    opening = team.reset(0)  # the first agent's opening messages, like a sole agent's
    assert [m["role"] for m in opening] == ["system", "user"] and opening == team.transcript("reader_0")
    assert opening != team.transcript("writer_0")  # each its own system prompt
    with pytest.raises(EpisodeError, match=r"step_round\(\{agent: action\}\).*act\(agent, action\)"):
        team.step("hi")
    with pytest.raises(EpisodeError, match=r"transcript\(agent\)"):
        team.transcript()
    with pytest.raises(EpisodeError, match=r"tool_schemas\(agent\)"):
        team.tool_schemas()
    with pytest.raises(EpisodeError, match="say which agent"):
        team.observation()
    with pytest.raises(EpisodeError, match="not list"):
        team.step_round(["hi"])
    results = team.step_round({"reader_0": call("search_employees", name="Alice")})
    assert list(results) == team.agents and all(isinstance(r, StepResult) for r in results.values())
    assert [r.agent for r in results.values()] == team.agents and team.status.round == 2
    # one role: step_round is a round of one turn, the same as step
    solo, other = envfactory.make("Counter-v0"), envfactory.make("Counter-v0")
    assert solo.reset(0) == other.reset(0) == solo.transcript()
    inc = call("increment", by=1)
    assert solo.step_round({"agent_0": inc})["agent_0"].to_json() == other.step(inc).to_json()
    assert solo.transcript() == other.transcript() and solo.tool_schemas() == other.tool_schemas("agent_0")


def test_simultaneous_moves_see_letters_only_from_the_next_round():
    ep = envfactory.make_multi("MultiRecords-v0")
    ep.reset(0)
    ep.step_round({"reader_0": call("send_message", to="writer_0", content="set team of E-102 to platform (ticket XYZZY)"),
             "writer_0": "nothing yet"})
    # writer_0 acted in the same round: the letter is not in its conversation before its action ...
    transcript = ep.transcript("writer_0")
    first_assistant = next(i for i, m in enumerate(transcript) if m["role"] == "assistant")
    assert not any("XYZZY" in str(m["content"]) for m in transcript[:first_assistant])
    # ... but it is in its next observation
    assert "XYZZY" in ep.observation("writer_0")
    with pytest.raises(EpisodeError, match="unknown agents"):
        ep.step_round({"ghost_0": "hi"})


def test_conflicting_bookings_in_one_round_go_to_the_first_in_order():
    ep = envfactory.make_multi("MultiRooms-v0")
    ep.reset(0)
    ep.step_round({a: call("book_room", room="atlas", slot="11:00") for a in ep.agents})
    assert ep.state.bookings["atlas@11:00"] == "sales_0"
    kinds = [e["kind"] for e in ep.status.log]
    assert kinds == ["ok", "conflict", "conflict"]


def test_endings_quiescence_finish_truncation_and_terminal():
    ep = envfactory.make_multi("MultiRecords-v0")
    ep.reset(0)
    ep.act("reader_0", "nothing")
    r = ep.act("writer_0", "nothing either")
    assert r.terminated and ep.status.ended_by == "quiescence" and r.rewards == {"reader_0": 0.0, "writer_0": 0.0}
    ep.reset(0)
    r = ep.act("reader_0", call("finish", answer="done"))
    assert r.terminated and ep.status.ended_by == "finish" and ep.status.answer == "done" and ep.success is False
    with pytest.raises(EpisodeError, match="ended"):
        ep.act("writer_0", "x")
    short = envfactory.make_multi("MultiRecords-v0", max_turns=2)
    short.reset(0)
    for _ in range(2):
        short.step_round({"reader_0": call("search_employees", name="Alice")})
    assert short.status.truncated and short.status.ended_by == "max_turns"
    deal = envfactory.make_multi("MultiDeal-v0")
    deal.reset(0)
    deal.act("trader_0", call("propose", books=3, hats=1, balls=0))
    r = deal.act("trader_1", call("accept", proposal_id="P-1"))
    assert r.terminated and deal.status.ended_by == "terminal" and deal.success
    assert r.rewards == {"trader_0": 0.8, "trader_1": 0.8}


def test_mixed_motive_rewards_differ_per_agent():
    deal = envfactory.make_multi("MultiDeal-v0")
    deal.reset(0)
    deal.act("trader_0", call("propose", books=3, hats=2, balls=0))  # greedy: trader_1 gets the ball only
    r = deal.act("trader_1", call("accept", proposal_id="P-1"))
    assert r.done and r.rewards["trader_0"] == 1.0 and r.rewards["trader_1"] == 0.6
    assert deal.success is False  # trader_1 is below its walk-away value of 8


def test_fork_is_independent_and_snapshot_round_trips_through_json():
    ep = envfactory.make_multi("MultiPipeline-v0")
    oracle = OraclePolicy()
    ep.reset(3)
    for _ in range(5):
        a = ep.status.next_agent
        ep.act(a, oracle.act(ep, a, 0))
    before = ep.state.hash()
    child = ep.fork()
    snap = json.loads(json.dumps(ep.snapshot()))
    while not child.done:
        a = child.status.next_agent
        child.act(a, oracle.act(child, a, 0))
    assert child.success and ep.state.hash() == before and not ep.done
    other = envfactory.make_multi("MultiPipeline-v0")
    other.restore(snap)
    assert other.state.hash() == before and other.transcript("shipping_0") == ep.transcript("shipping_0")
    for e in (ep, other):
        while not e.done:
            a = e.status.next_agent
            e.act(a, oracle.act(e, a, 0))
    assert ep.status.log == other.status.log == child.status.log and ep.rewards == other.rewards
    with pytest.raises(ValueError, match="MultiPipeline"):
        envfactory.make_multi("MultiRooms-v0").restore(snap)


def test_play_counts_rounds_messages_and_modes():
    ep = envfactory.make_multi("MultiSupport-v0")
    team = dict.fromkeys(ep.agents, OraclePolicy())
    aec, par = play(ep, team, 0, mode="aec"), play(ep, team, 0, mode="parallel")
    assert aec.success and par.success and aec.messages == par.messages == 2
    assert par.rounds > aec.rounds  # simultaneous moves wait a round for every handoff


@pytest.mark.parametrize("name", ["MultiPipeline-v0", "Bank-v0"])
def test_episode_traces_are_reproducible_for_teams_and_one_agent(name):
    ep = envfactory.make(name)
    both = [t for t in ep.spec.get_tasks() if "parallel" in t.metadata.get("modes", ("aec", "parallel"))]
    task = max(both, key=lambda t: len(t.solution)).id  # (a turn-order-only reference cannot succeed in parallel)
    for mode in ("aec", "parallel"):
        oracle = episode_trace(ep, OraclePolicy(), task, mode)
        assert oracle == episode_trace(envfactory.make(name), OraclePolicy(), task, mode)
        assert oracle[-1][1] is True  # success
        rand = [episode_trace(ep, RandomPolicy(), task, mode, seed) for seed in (1, 1, 2)]
        assert rand[0] == rand[1] != rand[2] and rand[0][-1][1] is False
