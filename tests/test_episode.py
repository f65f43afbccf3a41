"""The episode protocol: termination, truncation, sparse reward from the true state, errors."""

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

import envfactory
from envfactory import EpisodeError, ActionTypeError, ToolCall

INC = '<tool_call>{"name": "increment", "arguments": {"by": 1}}</tool_call>'


def test_opening_messages_and_tools():
    env = envfactory.make("Counter-v0")
    msgs = env.reset("counter-0-2")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "exactly 2" in msgs[1]["content"]
    names = [s["function"]["name"] for s in env.tool_schemas()]
    assert names == ["increment", "reset_counter", "read_counter", "finish"]


def test_reward_is_sparse_and_comes_from_the_state():
    env = envfactory.make("Counter-v0")
    env.reset("counter-0-2")
    r = env.step(INC)
    assert (r.reward, r.terminated, r.truncated) == (0.0, False, False)
    assert r.messages[0]["content"] == "1"
    r = env.step("The counter shows 2 now, trust me.")  # a claim, the state says 1
    assert r.terminated and r.reward == 0.0 and r.info["success"] is False
    env.reset("counter-0-2")
    env.step(INC)
    env.step([ToolCall("increment", {"by": 1})])
    r = env.step("Done.")
    assert r.terminated and r.reward == 1.0 and r.info["answer"] == "Done."


def test_finish_tool_ends_the_episode_with_its_answer():
    env = envfactory.make("Bank-v0")
    env.reset("bank-000")
    r = env.step('<tool_call>{"name": "get_balance", "arguments": {"account_id": "ACC-200"}}</tool_call>')
    assert r.messages[0]["content"] == "430.75"
    r = env.step('<tool_call>{"name": "finish", "arguments": {"answer": "It is 430.75"}}</tool_call>'
                 '<tool_call>{"name": "deposit", "arguments": {"account_id": "ACC-200", "amount": 1}}</tool_call>')
    assert r.terminated and r.reward == 1.0
    assert "ignored" in r.messages[1]["content"]  # calls after finish do not run
    assert env.state.bank.accounts["ACC-200"].balance_cents == 43_075


def test_answer_facts_are_required():
    env = envfactory.make("Bank-v0")
    env.reset("bank-000")
    env.step('<tool_call>{"name": "get_balance", "arguments": {"account_id": "ACC-200"}}</tool_call>')
    assert env.step("I checked the balance.").reward == 0.0


def test_truncation_at_the_turn_limit():
    env = envfactory.make("Counter-v0", max_turns=3)
    env.reset("counter-0-12")
    results = [env.step(INC) for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True]
    assert results[-1].reward == 0.0 and results[-1].info["success"] is False
    with pytest.raises(EpisodeError, match="ended"):
        env.step(INC)


def test_protocol_errors_are_named():
    env = envfactory.make("Counter-v0")
    with pytest.raises(EpisodeError, match="reset"):
        env.step(INC)
    env.reset(0)
    with pytest.raises(ActionTypeError, match="action must be"):
        env.step(42)
    with pytest.raises(KeyError, match="no task"):
        env.reset("nope")
    with pytest.raises(KeyError, match="out of range"):
        env.reset(10_000)


def test_same_seed_same_episode():
    def play(seed):
        env = envfactory.make("Helpdesk-v0")
        env.reset(seed=seed)
        env.step('<tool_call>{"name": "list_agents", "arguments": {}}</tool_call>')
        env.step("done")
        return env.transcript(), env.state.hash()

    assert play(7) == play(7)
    assert any(play(7)[0][1] != play(s)[0][1] for s in range(8, 20))  # seeds pick different tasks


_FAST_PATH_ACTIONS = [
    '<tool_call>{"name": "increment", "arguments": {"by": 2}}</tool_call>',
    '<tool_call>{"name": "increment", "arguments": {"by": 99}}</tool_call>',  # a tool error
    '<tool_call>{"name": "increment", "arguments": {"by": "x"}}</tool_call>',  # invalid arguments
    '<tool_call>{"name": "read_counter", "arguments": {}}</tool_call><tool_call>{"name": "reset_counter", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',  # unknown tool: the long path
    '<tool_call>{"name": "increment", "arguments": {}}',  # unclosed: the long path
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c9", "function": {"name": "increment", "arguments": "{}"}}]},
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(range(len(_FAST_PATH_ACTIONS))), min_size=1, max_size=8), st.integers(1, 5))
def test_the_one_role_fast_path_does_what_the_general_turn_does(picks, max_turns) -> None:
    # Episode.step takes a short path for one role's usual turn; the general turn (a team's:
    # act and step_round) must produce the same results, transcript, log and snapshot.
    fast = envfactory.make("Counter-v0", max_turns=max_turns)
    slow = envfactory.make("Counter-v0", max_turns=max_turns)
    assert fast.reset(0) == slow.reset(0) == fast.transcript()
    for k, i in enumerate(picks):
        if fast.done:
            break
        a = _FAST_PATH_ACTIONS[i]
        general = slow.act("agent_0", a) if k % 2 else slow.step_round({"agent_0": a})["agent_0"]
        assert fast.step(a).to_json() == general.to_json()
    assert fast.snapshot() == slow.snapshot()
    assert fast.status.log == slow.status.log and fast.transcript() == slow.transcript()


def test_an_answer_fact_must_have_been_shown_not_guessed_or_echoed() -> None:
    # Bank-v0 bank-000 asks for ACC-200's balance (430.75). Before the rule, the answer alone
    # earned reward: a guess from nowhere, or one planted by the agent in an error echo.
    env = envfactory.make("Bank-v0")
    env.reset("bank-000")
    assert env.step("The balance is 430.75.").info["success"] is False
    env.reset("bank-000")
    echo = env.step('<tool_call>{"name": "get_balance", "arguments": {"account_id": "430.75"}}</tool_call>')
    assert "430.75" in echo.messages[0]["content"]  # the agent's own argument, echoed back
    assert env.step("430.75").info["success"] is False
    env.reset("bank-000")
    env.step('<tool_call>{"name": "get_balance", "arguments": {"account_id": "ACC-200"}}</tool_call>')
    assert env.step("It is 430.75.").info["success"] is True
    # a total the agent computes is not in any result: such tasks opt out (answer_seen=False)
    task = env.spec.task("bank-011")
    assert task.answer_seen is False and task.answer_facts == ["1380.75"]
    env.reset("bank-011")
    for c in task.solution:
        env.step(c.to_hermes())
    assert env.step("1380.75").info["success"] is True


def test_answer_facts_match_whole_values_and_a_list_of_candidates_is_no_answer() -> None:
    # Before: facts were substrings ("2" was in "12" and in "ACC-200") and an answer listing
    # every enum member contained the fact, so both earned reward.
    from envfactory.task import fact_in

    assert not fact_in("2", "12 accounts") and not fact_in("2", "acc-200")
    assert not fact_in("10", "10.5") and not fact_in("10", "100") and fact_in("10", "it is 10.")
    assert fact_in("430.75", "$430.75.") and fact_in("mon", "on monday")
    task = envfactory.spec("ProjectBoard-v0").task("projectboard-0-025")  # the column of ISS-4: doing
    assert task.answer_facts == ["doing"] and set(task.answer_rivals) == {"backlog", "done", "review", "todo"}
    assert task.answer_ok("Done. It is in doing.")  # one rival word in passing is allowed
    assert not task.answer_ok("backlog todo doing review done")  # every candidate: no answer
    env = envfactory.make("ProjectBoard-v0")
    env.reset(task.id)
    for c in task.solution:
        env.step(c.to_hermes())
    assert env.step("It could be backlog, todo, doing or review.").info["success"] is False
